"""A lane's repeated colgemm forwards from a job template kept per configuration and worker count.

:func:`.colgemm.fprop` builds its job list in Python on every call (the products' blocks and their sgemm arguments,
the column copies' ranges, x's geometry): about 100-160 µs of a deep ResNet layer's call, against 1 ms of work. Between
a converted layer's repeated calls only the arrays' addresses change. :func:`fprop_runner` keeps, per worker count, the
first call's jobs as a :class:`.jobs.Template` (addresses held as offsets from the weights, the columns, the result
and x) and runs it on later calls with the same scratch leased as :func:`.colgemm.fprop` leases it: the same jobs, so
the same bits. A call that is not the template's (not float32 C-contiguous x and w, a configuration run in several
chunks or off the C jobs, a block sgemm would not take) returns None, and the caller runs :func:`.colgemm.fprop`.
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import colgemm, jobs, native, small
from .grid.scratch import Lease
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
        if not (_plain(x) and _plain(w)):
            return None
        wm = w.reshape(f.g, f.Cog, f.Cg * f.K)
        with Lease() as lease:                      # what colgemm.fprop leases, in its order
            bufs = colgemm._Buffers(lease)
            y = np.empty(p.output_shape, _F32) if direct else bufs.get("y", (f.g, f.Cog, f.N * f.Q), _F32)
            cols = bufs.get("cols", (f.C * f.K, f.N * f.Q), _F32)
            addresses = (native.address(wm), native.address(cols), native.address(y), native.address(x))
            entry = kept.get(workers, False)
            if entry is False:
                entry = kept[workers] = _template(x, p, f, direct, wm, cols, y, workers, addresses)
            if entry is None:
                return None
            template, threads, _geometry = entry
            if one_tap:                             # the columns are x's channel-major copy (colgemm's own step)
                small.channel_major_into(x, cols.reshape(f.C, f.N, f.Q))
            template.run(addresses, threads)
            return colgemm.finish_forward(y, bias, p, f, direct)
    return run


def _template(x, p: ConvParams, f, direct: bool, wm, cols, y, workers: int, addresses):
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
    return jobs.Template.joined(parts, addresses), threads, alive[1:]
