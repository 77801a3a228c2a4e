"""A lane's repeated dense calls straight from the job template the first call kept (no per-call decisions).

:func:`.dense.backward` (and the stride-1 forward, the backward of :func:`.dense.dual`) runs a call of one block of
samples from a job template kept on its plan (:func:`.dense._run_planned`). Between a converted layer's repeated calls
nothing it decides changes but the arrays' addresses, yet each call decides it all again in Python: 50-80 µs of a
model step's convolution, as much as a small layer's loops. :func:`runner` makes, once per configuration and mask,
a function that takes the arrays, leases the same scratch and runs the kept template: the same jobs on the same
kinds of buffers, so the same bits. Where a call is not the template's (another dtype or layout, weights the copy
jobs do not take, no template kept yet for the workers and budget of this call, or a weight found not finite in its
copy) it returns None and the caller runs :func:`.dense.backward` / :func:`.dense.fprop`, which decide as always.
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import dense
from .dense_plan import padded_row, plan
from .dense_weights import _readable
from .grid.scratch import Lease

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
    last = [None, None]                                 # (budget, plan(p, True, True, budget)): no hash of p a call

    def run(dy, x, w, workers: int, budget: int):
        f = last[1]
        if last[0] != budget:
            f = plan(p, True, True, budget)
            last[:] = budget, f
        if f.nb < N or not _readable(dy) or (need_dw and not _readable(x)) or (
                need_dx and not dense._copies_weights(f, w, flip)):
            return None
        g, K, Cog, Cg = f.g, f.K, f.Cog, f.Cg
        dx = np.empty(p.input_shape, _F32) if need_dx else None
        dw = np.empty((g, Cog, Cg, K), _F32) if need_dw else None
        with Lease() as lease:                           # what dense.backward leases, in its order
            dyG = lease.empty((f.nb, f.dy_sample), _F32)
            xG = lease.empty((f.nb, g, f.Xn, f.ldx), _F32) if need_dw else None
            dw_part = lease.empty((g, K, Cog, Cg), _F32) if need_dw else None
            w_copy = (w, np.empty((g, K, Cog, padded_row(Cg)), _F32)[..., :Cg], flip, np.zeros(1, np.int64)) \
                if need_dx else None
            kept, _, bases = dense._kept_template(f, dy, x, dyG, xG, (dx, dx, dw_part, None),
                                                  [w_copy[1]] if need_dx else [], workers, w_copy, dw,
                                                  need_dw and dense.skips_padding(f, dy))
            if kept is None:
                return None
            kept[0].run(bases, workers)
        if need_dx and w_copy[3][0]:                    # w not finite: dense.backward decides again
            return None
        return dx, (None if dw is None else dw.reshape(p.weight_shape))
    return run
