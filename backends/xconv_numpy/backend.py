"""The NumPy backend object: the reference semantics on NumPy arrays, on the CPU."""

from __future__ import annotations

import numpy as np

import xconv
from xconv import Backend, Capabilities
from xconv.dtypes import accumulation_dtype

from . import reference
from .blas import single_threaded_blas


class NumpyBackend(Backend):
    """The reference backend. Always available, always deterministic, also across BLAS thread counts.

    ``exact=True`` accumulates every dtype in float64 (the oracle); the default accumulates
    float16, bfloat16 and float32 in float32 and float64 in float64. Results have the input dtype.
    """

    array_families = ("numpy",)
    capabilities = Capabilities(transposed=False)  # transposed convolution comes from the core's mapping

    def __init__(self, exact: bool = False):
        self.exact = exact
        self.name = "numpy-exact" if exact else "numpy"
        self.priority = -1 if exact else 0  # selection by array family picks the fast one

    def version(self) -> str:
        return f"xconv {xconv.__version__}, numpy {np.__version__}"

    def devices(self) -> tuple[str, ...]:
        return ("cpu",)

    def _acc(self, p):
        return accumulation_dtype(p.dtype, self.exact)

    def fprop(self, x, w, bias, p):
        with single_threaded_blas():
            return reference.fprop(x, w, bias, p, self._acc(p))

    def dgrad(self, dy, w, p):
        with single_threaded_blas():
            return reference.dgrad(dy, w, p, self._acc(p))

    def wgrad(self, x, dy, p):
        with single_threaded_blas():
            return reference.wgrad(x, dy, p, self._acc(p))

    def bgrad(self, dy, p):
        with single_threaded_blas():
            return reference.bgrad(dy, p, self._acc(p))
