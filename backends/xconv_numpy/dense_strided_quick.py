"""A lane's repeated strided dense forwards from one job template (no per-call Python between the jobs).

:func:`.dense.fprop` at strides above 1 checks the weights for a NaN or an infinity, copies them into the dual's
tap-major layout (one job region) and builds the phase copies and the row sums of :func:`.dense_strided.fprop` as a
job list (a second region): in a model step 0.1-0.3 ms of Python and region set-up per call (ResNet-18 64's 64 -> 128
3x3 stride 2: 0.27-0.29 ms outside its C regions, its sums 0.44). :func:`fprop_runner` keeps, per configuration and
worker count, one template of the same jobs (the weights' copy, which also flags a non-finite weight, and x's phase
copies in phase 0, then the same row sums), so a call fills in its arrays' addresses and runs one region: the same
jobs on the same layouts, so the same bits. Where a call is not the template's (x or w not float32, C-contiguous and
aligned, channels the copy does not take, a workspace limit) or a weight is not finite, it returns None and the
caller runs the dispatch (:func:`.fast._fprop_on`), which decides as always (the columns detour for such a weight).
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import dense_strided, jobs, small_c
from .aligned import empty_result, line_aligned
from .dense_plan import padded_row
from .dense_weights import _tap_major_rows
from .grid.scratch import ARENA
from .jobs import Jobs, Template
from .native import address
from .plans import per_params

_F32 = np.dtype(np.float32)
#: The template's bases, by number: the weights, their tap-major copy, x, x's phase rows, y, the non-finite flag.
_W, _WT, _X, _PH, _Y, _BAD = range(6)


@per_params
def fprop_runner(p: ConvParams):
    """``run(x, w, bias, workers) -> y`` (None where the call is not the template's, see the module docstring) for the
    strided dense forward of ``p``, or None where ``p`` has no template: under a workspace limit (the blocks of
    samples follow the limit), or not a call :func:`.dense_strided.computes`."""
    if p.workspace_limit is not None or not dense_strided.computes(p):
        return None
    g, N, Co = p.groups, p.input_shape[0], p.output_shape[1]
    f = dense_strided.plan(p, N)                             # one block: all samples (no limit)
    Cg, Cog, K = f.C // g, Co // g, f.K
    nd, xshape, wshape = p.nd, tuple(p.input_shape), tuple(p.weight_shape)
    kept: dict = {}                                          # workers -> (template, what its jobs read)
    copy_shapes = (wshape[0] // g) % 16 == 0 and wshape[1] % 16 == 0   # _copyable's shape test (w.shape == wshape)
    row = padded_row(Cog)

    def run(x, w, bias, workers: int):
        # _readable(x) and _copyable(w, g, True), and a lease, in line (dense_quick's docstring)
        if not (x.shape == xshape and w.shape == wshape and x.dtype == _F32 and w.dtype == _F32
                and (fx := x.flags).c_contiguous and fx.aligned and (fw := w.flags).c_contiguous and fw.aligned
                and copy_shapes):
            return None
        wt = line_aligned((g, K, Cg, row))[..., :Cog]      # dense_weights.tap_major(flip, padded)'s
        bad = np.zeros(1, np.int64)
        y = empty_result(p.output_shape, _F32)
        bufs, (phases,) = ARENA.views(((f.N * f.H * f.rs,),), _F32)     # what dense_strided.fprop leases
        try:
            bases = (w, wt, x, phases, y, bad)
            entry = kept.get(workers, False)
            if entry is False:
                entry = kept[workers] = _template(x, w, wt, phases, y, bad, workers, bases)
            jobs._execute_template(entry[0], bases, workers, 0)              # entry[0].run(bases, workers)
        finally:
            ARENA.give(bufs)
        if bad[0]:
            return None                                      # a weight not finite: the dispatch detours
        if bias is not None:                                 # as dense_strided.fprop adds it
            with np.errstate(all="ignore"):
                y += np.asarray(bias, _F32).reshape((1, -1) + (1,) * nd)
        return y

    def _template(x, w, wt, phases, y, bad, workers: int, bases):
        """(the jobs of :func:`.dense.fprop`'s strided route for these arrays as one template, what they read at
        fixed addresses)."""
        xr, geo = small_c.im2col_input(x, p, _F32)           # x itself (plain float32: run checked) and its geometry
        rows, positions = _tap_major_rows(w, wt, g, True, workers)
        rows = [row + [0] * (13 - len(row)) + [address(bad)] for row in rows]
        copy = Jobs()
        copy.rows("x_to_grid", rows, signal=0)
        phase_copies, sums = dense_strided.block_jobs(f, g, N, xr, geo, phases, wt, y, workers, ready=len(rows))
        template = Template.joined([(copy, {0: _W, 11: _WT, 13: _BAD}), (phase_copies, {0: _X, 1: _PH}),
                                    (sums, {0: _PH, 3: _WT, 10: _Y})], bases)
        return template, (geo, positions, f)
    return run
