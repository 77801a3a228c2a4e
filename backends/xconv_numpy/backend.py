"""The NumPy backend object: the reference semantics on NumPy arrays, on the CPU."""

from __future__ import annotations

import functools

import numpy as np

import xconv
from xconv import Backend, Capabilities
from xconv.dtypes import accumulation_dtype

from . import fast, native, reference
from .blas import single_threaded_blas


def _quiet(method):
    """``method`` run with NumPy's floating-point warnings off (non-finite inputs are not an error)."""
    @functools.wraps(method)
    def run(*args):
        with np.errstate(all="ignore"):
            return method(*args)
    return run


class NumpyBackend(Backend):
    """The NumPy backend. Always available, always deterministic.

    ``exact=True`` runs :mod:`.reference`, accumulating every dtype in float64 (the oracle,
    registered as "numpy-exact"). The default runs :mod:`.fast`: chunked BLAS matrix products,
    accumulating float16, bfloat16 and float32 in float32 and float64 in float64, with extra
    memory bounded by a budget proportional to the call's operands. Results have the input dtype.
    """

    array_families = ("numpy",)
    capabilities = Capabilities(transposed=False)  # transposed convolution comes from the core's mapping

    def __init__(self, exact: bool = False):
        self.exact = exact
        self.name = "numpy-exact" if exact else "numpy"
        self.priority = -1 if exact else 0  # selection by array family picks the fast one

    def version(self) -> str:
        base = f"xconv {xconv.__version__}, numpy {np.__version__}"
        return base if self.exact else f"{base}, {native.describe()}"

    def devices(self) -> tuple[str, ...]:
        return ("cpu",)

    def _acc(self, p):
        return accumulation_dtype(p.dtype, self.exact)

    # NaN and infinity propagate as the reference defines (docs/semantics.md), silently, as in PyTorch:
    # NumPy's floating-point warnings are off in the primitives.

    # The reference runs its matrix products with one BLAS thread (a threaded BLAS may split a
    # long dot product across threads, which changes its rounding with the thread count).

    @_quiet
    def fprop(self, x, w, bias, p):
        if self.exact:
            with single_threaded_blas():
                return reference.fprop(x, w, bias, p, self._acc(p))
        return fast.fprop(x, w, bias, p)

    @_quiet
    def dgrad(self, dy, w, p):
        if self.exact:
            with single_threaded_blas():
                return reference.dgrad(dy, w, p, self._acc(p))
        return fast.dgrad(dy, w, p)

    @_quiet
    def wgrad(self, x, dy, p):
        if self.exact:
            with single_threaded_blas():
                return reference.wgrad(x, dy, p, self._acc(p))
        return fast.wgrad(x, dy, p)

    @_quiet
    def bgrad(self, dy, p):
        if self.exact:
            return reference.bgrad(dy, p, self._acc(p))
        return fast.bgrad(dy, p)

    @_quiet
    def backward(self, dy, x, w, p, mask):
        if self.exact:
            return super().backward(dy, x, w, p, mask)
        return fast.backward(dy, x, w, p, mask)
