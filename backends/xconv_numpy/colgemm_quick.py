"""A lane's repeated colgemm calls from job templates kept per configuration and worker count (and mask).

:func:`.colgemm.fprop` builds its job list in Python on every call (the products' blocks and their sgemm arguments,
the column copies' ranges, x's geometry): about 100-160 µs of a deep ResNet layer's call, against 1 ms of work. Between
a converted layer's repeated calls only the arrays' addresses change. :func:`fprop_runner` keeps, per worker count, the
first call's jobs as a :class:`.jobs.Template` (addresses held as offsets from the weights, the columns, the result
and x) and runs it on later calls with the same scratch leased as :func:`.colgemm.fprop` leases it: the same jobs, so
the same bits. A call that is not the template's (not float32 C-contiguous x and w, a configuration run in several
chunks or off the C jobs, a block sgemm would not take) returns None, and the caller runs :func:`.colgemm.fprop`.

:func:`backward_runner` does the same for :func:`.colgemm.backward` of one chunk of samples: dy copied channel-major
as there, then dW's job list (x's column copies, the products) and dx's (the products into the same columns, col2im),
each a template on (x, the columns, dy's copy, dW, w, dx): 150-250 µs of Python a call before (ResNet-18's deep
layers, eight calls a training step).
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import colgemm, jobs, small
from .aligned import empty_result
from .grid.scratch import ARENA, Lease
from .plans import per_params

_F32 = np.dtype(np.float32)


def _never(x, w, bias, workers):
    return None


def _plain(a: np.ndarray) -> bool:
    return a.dtype == _F32 and a.flags.c_contiguous and a.flags.aligned


@per_params
def fprop_runner(p: ConvParams):
    """``run(x, w, bias, workers) -> y`` for :func:`.colgemm.fprop` of ``p`` (None instead of y where the call is
    not its template's: see the module docstring)."""
    if (p.dtype != "float32" or not colgemm.runs_as_jobs(p) or not colgemm.fits(p, False, False, True)
            or len(colgemm._forward_chunks(p)[0]) != 1):
        return _never
    f = small.plan(p)
    direct, one_tap = colgemm._direct(p), colgemm._one_tap(p)
    kept: dict = {}                                 # workers -> (template, threads, geometry kept alive) or None

    def run(x, w, bias, workers: int):
        # _plain(x) and _plain(w), and a lease, in line: inside a model each call finds the caches cold, and every
        # Python call then costs a few µs (dense_quick's docstring)
        if not (x.dtype == _F32 and w.dtype == _F32 and (fx := x.flags).c_contiguous and fx.aligned
                and (fw := w.flags).c_contiguous and fw.aligned):
            return None
        wm = w.reshape(f.g, f.Cog, f.Cg * f.K)
        bufs, (yc, cols) = ARENA.views((None if direct else (f.g, f.Cog, f.N * f.Q),   # what colgemm.fprop leases,
                                        (f.C * f.K, f.N * f.Q)), _F32)                  # in its order
        try:
            y = empty_result(p.output_shape, _F32) if direct else yc
            bases = (wm, cols, y, x)
            entry = kept.get(workers, False)
            if entry is False:
                entry = kept[workers] = _template(x, p, f, direct, wm, cols, y, workers, bases)
            if entry is None:
                return None
            template, threads, _geometry = entry
            if one_tap:                             # the columns are x's channel-major copy (colgemm's own step)
                small.channel_major_into(x, cols.reshape(f.C, f.N, f.Q))
            jobs._execute_template(template, bases, threads, 0)             # template.run(bases, threads)
            return colgemm.finish_forward(y, bias, p, f, direct)
        finally:
            ARENA.give(bufs)
    return run


def _template(x, p: ConvParams, f, direct: bool, wm, cols, y, workers: int, bases):
    """(the jobs of this call as a template, their threads, x's geometry they read), or None where sgemm would not
    take a block: the blocks and job lists :func:`.colgemm._fprop` builds (bases: 0 the weights, 1 the columns, 2 the
    result, 3 x; x's geometry kept at its address)."""
    c3 = cols.reshape(f.g, f.Cg * f.K, f.N * f.Q)
    calls = jobs.sgemm_calls(colgemm.sample_views(wm, c3, y, f) if direct else colgemm._block_views(wm, c3, y))
    if calls is None:
        return None
    (copies, products), threads, alive = colgemm.column_jobs(x, p, f, _F32, cols, calls, workers)
    # alive: (x itself, run() takes only aligned float32 x, and its geometry), or () for a one-tap call
    parts = ([] if copies is None else [(copies, {0: 3, 1: 1})]) + [(products, {6: 0, 8: 1, 10: 2})]
    return jobs.Template.joined(parts, bases), threads, alive[1:]


def _never_backward(dy, x, w, need_dx, need_dw, workers):
    return None


@per_params
def backward_runner(p: ConvParams):
    """``run(dy, x, w, need_dx, need_dw, workers) -> (dx, dw)`` for :func:`.colgemm.backward` of ``p`` (None instead
    of the results where the call is not its templates': see the module docstring)."""
    chunks, by, _ = colgemm._backward_chunks(p)
    if p.dtype != "float32" or not colgemm.runs_as_jobs(p) or by != "samples" or len(chunks) != 1:
        return _never_backward
    f = small.plan(p)
    one_tap = colgemm._one_tap(p)
    kept: dict = {}                                 # (workers, need_dx, need_dw) -> (dW's, dx's, kept alive) or None

    def run(dy, x, w, need_dx: bool, need_dw: bool, workers: int):
        if not (need_dx or need_dw) or not (_plain(dy) and (not need_dw or _plain(x)) and (not need_dx or _plain(w))):
            return None
        key = (workers, need_dx, need_dw)
        entry = kept.get(key, False)
        if entry is None:
            return None
        with Lease() as lease:                      # what colgemm.backward leases, in its order
            bufs = colgemm._Buffers(lease)
            dyc = small.dy_channel_major(dy, f, _F32, bufs.empty("dy"))           # (g, Cog, N*Q)
            dwm = np.empty((f.g, f.Cog, f.Cg * f.K), _F32) if need_dw else None
            cols = bufs.get("cols", (f.C * f.K, f.N * f.Q), _F32)
            dx = empty_result(p.input_shape, _F32) if need_dx else None
            bases = (x if need_dw else None, cols, dyc, dwm, w if need_dx else None, dx)
            if entry is False:
                entry = kept[key] = _backward_templates(x, w, p, f, dyc, dwm, cols, dx, workers, bases)
                if entry is None:
                    return None
            dw_part, dx_part, _alive = entry
            if dw_part is not None:
                if one_tap:                         # the columns are x's channel-major copy (colgemm's own step)
                    small.channel_major_into(x, cols.reshape(f.C, f.N, f.Q))
                dw_part[0].run(bases, dw_part[1])
            if dx_part is not None:
                dx_part[0].run(bases, dx_part[1])
        return dx, (None if dwm is None else dwm.reshape(p.weight_shape))
    return run


def _backward_templates(x, w, p: ConvParams, f, dyc, dwm, cols, dx, workers: int, bases):
    """((dW's template, threads) or None, (dx's template, threads) or None, the geometries they read), or None where
    sgemm would not take a block: the job lists :func:`.colgemm._backward` runs, dW's then dx's (bases: 0 x, 1 the
    columns, 2 dy's copy, 3 dW, 4 w, 5 dx)."""
    c3 = cols.reshape(f.g, f.Cg * f.K, f.N * f.Q)
    dw_part = dx_part = None
    alive = []
    if dwm is not None:
        calls = jobs.sgemm_calls(colgemm._block_views(dyc, c3.transpose(0, 2, 1), dwm))
        if calls is None:
            return None
        (copies, products), threads, kept = colgemm.column_jobs(x, p, f, _F32, cols, calls, workers)
        parts = ([] if copies is None else [(copies, {0: 0, 1: 1})]) + [(products, {6: 2, 8: 1, 10: 3})]
        dw_part = (jobs.Template.joined(parts, bases), threads)
        alive += kept[1:]                           # x's geometry (x itself is the caller's)
    if dx is not None:
        wt = w.reshape(f.g, f.Cog, f.Cg * f.K).transpose(0, 2, 1)                  # (g, Cg*K, Cog)
        made = colgemm.dx_jobs(wt, dyc, c3, dx, p, f, workers)
        if made is None:
            return None
        (products, adds), threads, geo = made
        dx_part = (jobs.Template.joined([(products, {6: 4, 8: 2, 10: 1}), (adds, {0: 1, 1: 5})], bases), threads)
        alive.append(geo)
    return dw_part, dx_part, tuple(alive)
