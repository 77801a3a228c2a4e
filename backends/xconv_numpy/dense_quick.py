"""A lane's repeated dense calls straight from the job template the first call kept (no per-call decisions).

:func:`.dense.backward` (and the stride-1 forward, the backward of :func:`.dense.dual`) runs a call of one block of
samples from a job template kept on its plan (:func:`.dense._run_planned`). Between a converted layer's repeated calls
nothing it decides changes but the arrays' addresses, yet each call decides it all again in Python: 50-80 µs of a
model step's convolution, as much as a small layer's loops. Inside a model each call also finds the caches cold (the
layers before it streamed their weights and activations through them), and every Python call then costs a few µs
more than it does hot: :func:`runner`'s checks are written in line. :func:`runner` makes, once per configuration and
mask, a function that takes the arrays, leases the same scratch and runs the kept template: the same jobs on the same
kinds of buffers, so the same bits. Where a call is not the template's (another dtype or layout, weights the copy
jobs do not take, no template kept yet for the workers and budget of this call, or a weight found not finite in its
copy) it returns None and the caller runs :func:`.dense.backward` / :func:`.dense.fprop`, which decide as always.
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import dense, jobs
from .aligned import empty_result, line_aligned
from .dense_plan import padded_row, plan
from .grid.scratch import ARENA

_F32 = np.dtype(np.float32)


def runner(p: ConvParams, need_dx: bool, need_dw: bool, flip: bool = False):
    """``run(dy, x, w, workers, budget) -> (dx, dw)`` (None where not asked) for :func:`.dense.backward` of ``p``
    without db, or, with ``flip``, w the forward's weights of which ``p`` is the dual (dx is then the forward's
    output, x is not read); None instead of the results where the call is not its kept template's (see the module
    docstring). None instead of a runner for calls under a workspace limit or not in float32 (the templates' are
    float32 calls of leases without a limit)."""
    if p.workspace_limit is not None or p.dtype != "float32" or not (need_dx or need_dw):
        return None
    N = p.input_shape[0]
    # (budget, plan(p, True, True, budget), whether its dx copies the weights among its jobs, their padded row): one
    # tuple, replaced whole, so that a thread reads one budget's values together
    last = [(None, None, False, 0)]

    def run(dy, x, w, workers: int, budget: int):
        # Checks and lookups in line, not by helper calls: inside a model the caches are cold at each call and
        # every Python call costs a few µs more (the module docstring).
        kept_plan = last[0]
        if kept_plan[0] != budget:
            f = plan(p, True, True, budget)
            kept_plan = last[0] = (budget, f, len(f.dx_jobs) == 1 and f.dx_jobs[0].taps == list(range(f.K)),
                                   padded_row(f.Cg))
        _, f, copies_weights, row = kept_plan
        if f.nb < N or not (dy.dtype == _F32 and (fl := dy.flags).c_contiguous and fl.aligned):     # _readable(dy)
            return None
        if need_dw and not (x.dtype == _F32 and (fl := x.flags).c_contiguous and fl.aligned):
            return None
        g, K, Cog, Cg = f.g, f.K, f.Cog, f.Cg
        if need_dx and not (copies_weights and w.dtype == _F32 and (fl := w.flags).c_contiguous and fl.aligned
                            and (w.shape[0] // g) % 16 == 0 and w.shape[1] % 16 == 0):   # dense._copies_weights
            return None
        dx = empty_result(p.input_shape, _F32) if need_dx else None
        dw = np.empty((g, Cog, Cg, K), _F32) if need_dw else None
        bufs, (dyG, xG, dw_part) = ARENA.views(((f.nb, f.dy_sample),     # what dense.backward leases, in its order
                                                (f.nb, g, f.Xn, f.ldx) if need_dw else None,
                                                (g, K, Cog, Cg) if need_dw else None), _F32)
        try:
            w_copy = (w, line_aligned((g, K, Cog, row))[..., :Cg], flip, np.zeros(1, np.int64)) \
                if need_dx else None
            skip = need_dw and dense.skips_padding(f, dy)
            kept = f.templates.get((need_dx, need_dw, False, workers, flip if need_dx else None, need_dw, skip))
            # (dense._kept_template's key: no flip without the weights' copy)
            if kept is None:
                return None
            jobs._execute_template(kept[0], (dy, x, dyG, xG, None, dw_part, dx, *([w_copy[1]] if need_dx else []),
                                             w if need_dx else None, dw, w_copy[3] if need_dx else None), workers, 0)
        finally:
            ARENA.give(bufs)
        if need_dx and w_copy[3][0]:                    # w not finite: dense.backward decides again
            return None
        return dx, (None if dw is None else dw.reshape(p.weight_shape))
    return run
