"""The NumPy backend object: the reference semantics on NumPy arrays, on the CPU."""

from __future__ import annotations

import functools

import numpy as np

import xconv
from xconv import Backend, Capabilities, tracing
from xconv.dtypes import accumulation_dtype

from . import blas, fast, invariant, lane_runner, reference, status
from .budget import check_im2col
from .blas import single_threaded_blas as pinned_blas_workers


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
    Every call is run-to-run deterministic; ``deterministic="batch_invariant"`` computes forward
    outputs and input gradients one sample at a time (:mod:`.invariant`). The math is always
    "keep_dtype" (no TF32; float16 and bfloat16 are accumulated in float32).
    """

    array_families = ("numpy",)
    capabilities = Capabilities(transposed=False,  # transposed convolution comes from the core's mapping
                                batch_invariant=True,  # per sample (see .invariant)
                                mask_invariant=True, layout_invariant=True)  # docs/semantics.md, Determinism

    def __init__(self, exact: bool = False):
        self.exact = exact
        self.name = "numpy-exact" if exact else "numpy"
        self.priority = -1 if exact else 0  # selection by array family picks the fast one

    def version(self) -> str:
        base = f"xconv {xconv.__version__}, numpy {np.__version__}"
        return base if self.exact else f"{base}, {status.describe()}"

    def devices(self) -> tuple[str, ...]:
        return ("cpu",)

    def _acc(self, p):
        return accumulation_dtype(p.dtype, self.exact)

    # NaN and infinity propagate as the reference defines (docs/semantics.md), silently, as in PyTorch:
    # NumPy's floating-point warnings are off in the primitives.

    # The reference runs its matrix products with one BLAS thread (a threaded BLAS may split a
    # long dot product across threads, which changes its rounding with the thread count).

    def _begin(self, p, op: str) -> bool:
        """Note the delivered guarantees; for numpy-exact check (and report) its column buffer against the
        workspace limit. True when this call runs per sample (batch_invariant, more than one sample)."""
        per_sample = p.deterministic == "batch_invariant" and p.input_shape[0] > 1
        if p.deterministic and not blas.pinned():      # docs/semantics.md, Determinism: refuse, never break it
            raise xconv.UnsupportedError(
                f"{self.name}: deterministic={p.deterministic!r} needs BLAS at one thread per call, and this process's "
                f"BLAS cannot be held there ({blas.control()}); set OMP_NUM_THREADS=1 or use a pthreads OpenBLAS "
                f"(NumPy's wheels), or pass deterministic=False")
        if tracing.active():
            level = "batch_invariant" if p.deterministic == "batch_invariant" else "run_to_run"
            tracing.note(math="keep_dtype", deterministic=level if blas.pinned() else "none")   # see blas.control
            if per_sample and op in ("fprop", "dgrad", "backward"):
                tracing.note("per-sample (batch_invariant)")
        if self.exact and op != "bgrad":   # float64 im2col: a chunk of columns, x or dx, the result
            q = invariant.one_sample(p) if per_sample and op in ("fprop", "dgrad") else p
            ops = ("dgrad", "wgrad") if op == "backward" else (op,)
            check_im2col(self.name, q, ops, 8, "reference im2col (float64)")
        return per_sample

    @_quiet
    def fprop(self, x, w, bias, p):
        if self._begin(p, "fprop"):
            return invariant.fprop(self._fprop, x, w, bias, p)
        return self._fprop(x, w, bias, p)

    @_quiet
    def dgrad(self, dy, w, p):
        if self._begin(p, "dgrad"):
            return invariant.dgrad(self._dgrad, dy, w, p)
        return self._dgrad(dy, w, p)

    @_quiet
    def wgrad(self, x, dy, p):
        self._begin(p, "wgrad")
        return self._wgrad(x, dy, p)

    @_quiet
    def bgrad(self, dy, p):
        self._begin(p, "bgrad")
        return self._bgrad(dy, p)

    @_quiet
    def backward(self, dy, x, w, p, mask):
        if self._begin(p, "backward"):
            return invariant.backward(self._backward, dy, x, w, p, mask)
        return self._backward(dy, x, w, p, mask)

    def _fprop(self, x, w, bias, p):
        if self.exact:
            with pinned_blas_workers():
                return reference.fprop(x, w, bias, p, self._acc(p))
        return fast.fprop(x, w, bias, p)

    def _dgrad(self, dy, w, p):
        if self.exact:
            with pinned_blas_workers():
                return reference.dgrad(dy, w, p, self._acc(p))
        return fast.dgrad(dy, w, p)

    def _wgrad(self, x, dy, p):
        if self.exact:
            with pinned_blas_workers():
                return reference.wgrad(x, dy, p, self._acc(p))
        return fast.wgrad(x, dy, p)

    def _bgrad(self, dy, p):
        if self.exact:
            return reference.bgrad(dy, p, self._acc(p))
        return fast.bgrad(dy, p)

    #: Its lane serves op "dgrad" (:meth:`xconv.backend.Backend.lane`): the transposed forwards' runner.
    lane_dgrad = True

    def lane(self, p, op, mask=None):
        """A runner for a lane's repeated calls of ``p`` (:meth:`xconv.backend.Backend.lane`): the fast path's on the
        paths chosen once (:func:`.lane_runner.runner`); None for numpy-exact, where a call of ``p`` is refused or runs
        per sample (:meth:`_begin`: deterministic without a BLAS held at one thread, batch_invariant), and for an
        object whose primitives are not these (a subclass or an instance that overrides one: the runner would skip
        its override)."""
        if self.exact or (p.deterministic and not blas.pinned()) or (
                p.deterministic == "batch_invariant" and p.input_shape[0] > 1) or self._overridden():
            return None
        return lane_runner.runner(p, op, mask)

    def _overridden(self) -> bool:
        """Whether a primitive a runner stands in for is not NumpyBackend's own (on the class or the instance)."""
        names = ("fprop", "backward", "dgrad", "wgrad", "bgrad", "_fprop", "_backward", "_dgrad", "_begin")
        return any(name in vars(self) or getattr(type(self), name) is not getattr(NumpyBackend, name)
                   for name in names)

    def _backward(self, dy, x, w, p, mask):
        if self.exact:
            return super().backward(dy, x, w, p, mask)          # the public primitives (subclasses may wrap them)
        return fast.backward(dy, x, w, p, mask)
