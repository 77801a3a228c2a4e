"""A lane's repeated depthwise calls on the loops across channels (:mod:`.depthwise_cv`) from kept job templates.

:mod:`.depthwise_cv` builds its job list (gather or weight-gradient jobs over ranges of (sample, 16-channel block)
items) and the addresses of its pair tables on every call: with the caches cold, as a model step leaves them, about a
third of a MobileNetV2 depthwise layer's Python (a converted 8x96x12x12 forward, the loops made no-ops: 337 us). Between
a converted layer's repeated calls only the arrays' addresses change: :func:`fprop_runner` and :func:`backward_runner`
keep, per configuration and worker count, the first call's jobs as a :class:`.jobs.Template` (addresses held as
offsets from x or dy, the result and the weights) and run it on later calls: the same jobs, so the same bits. A call
that is not the template's (an array not C-contiguous float32 of the configuration's shape, a forward weight that is
not finite: the plane loops take those) returns None, and the caller runs the dispatch, which decides as always.
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import depthwise_cv
from .finite import all_finite
from .native import address
from .plans import per_params

_F32 = np.dtype(np.float32)


def _plain(a: np.ndarray, shape) -> bool:
    return a.dtype == _F32 and a.flags.c_contiguous and a.flags.aligned and a.shape == shape


def _takes(p: ConvParams) -> bool:
    """Whether the dispatch runs ``p`` (float32) on the loops across channels: as :func:`.depthwise.fprop` and
    :func:`.depthwise.backward` (without db) decide, the forward's weights aside (checked per call)."""
    return p.dtype == "float32" and depthwise_cv.serves(p)


@per_params
def fprop_runner(p: ConvParams):
    """``run(x, w, bias, workers) -> y`` for the depthwise forward of ``p`` on the loops across channels, or None
    where they do not serve ``p`` (None instead of y: see the module docstring)."""
    if not _takes(p):
        return None
    t = depthwise_cv.tables(p)
    N, shape_x, shape_w = p.input_shape[0], tuple(p.input_shape), tuple(p.weight_shape)
    grid_in, grid_out = (t.H, t.W), (t.Ho, t.Wo)
    size, step = depthwise_cv.gather_scratch(t, grid_in, grid_out), p.stride[-1]
    kept: dict = {}                                      # workers -> Template (kept with t: its tables' addresses)

    def run(x, w, bias, workers: int):
        if not (_plain(x, shape_x) and _plain(w, shape_w)) or not all_finite(w):
            return None
        y = np.empty((N, t.C, t.Ho, t.Wo), np.float32)
        wt = depthwise_cv.weights(w, t)
        addresses = (address(x), address(y), address(wt))
        template = kept.get(workers)
        if template is None:
            jobs = depthwise_cv.gather_jobs(x, y, wt, t, t.f_rows, t.f_cols, t.f_reg, step, grid_in, grid_out, workers)
            template = kept[workers] = jobs.template({0: 0, 4: 1, 7: 2}, addresses)
        template.run(addresses, workers, size)
        if bias is not None:                             # as depthwise_cv.fprop adds it
            y += np.asarray(bias, np.float32).reshape((1, -1, 1, 1))
        return y.reshape(p.output_shape)
    return run


@per_params
def backward_runner(p: ConvParams):
    """``run(dy, x, w, need_dx, need_dw, workers) -> (dx, dw)`` (None where not needed) for the depthwise backward of
    ``p`` without db on the loops across channels, or None where they do not serve ``p``; None instead of the results
    where a call is not the template's."""
    if not _takes(p):
        return None
    t = depthwise_cv.tables(p)
    N, shape_x, shape_dy, shape_w = p.input_shape[0], tuple(p.input_shape), tuple(p.output_shape), \
        tuple(p.weight_shape)
    grid_in, grid_out = (t.Ho, t.Wo), (t.H, t.W)     # dgrad: from dy to dx
    dx_size, dw_size = depthwise_cv.gather_scratch(t, grid_in, grid_out), depthwise_cv.wgrad_scratch(t)
    kept: dict = {}                                  # (output, workers) -> Template

    def run(dy, x, w, need_dx: bool, need_dw: bool, workers: int):
        if not (_plain(dy, shape_dy) and _plain(x, shape_x) and _plain(w, shape_w)):
            return None
        dx = dw = None
        if need_dx:
            dx = np.empty((N, t.C, t.H, t.W), np.float32)
            wt = depthwise_cv.weights(w, t)
            addresses = (address(dy), address(dx), address(wt))
            template = kept.get(("dx", workers))
            if template is None:
                jobs = depthwise_cv.gather_jobs(dy, dx, wt, t, t.d_rows, t.d_cols, t.d_reg, 1, grid_in, grid_out,
                                                workers)
                template = kept["dx", workers] = jobs.template({0: 0, 4: 1, 7: 2}, addresses)
            template.run(addresses, workers, dx_size)
            dx = dx.reshape(shape_x)
        if need_dw:
            dwp = np.empty((N, t.C, t.K), np.float32)
            addresses = (address(x), address(dy), address(dwp))
            template = kept.get(("dw", workers))
            if template is None:
                jobs = depthwise_cv.wgrad_jobs(x, dy, dwp, t, N, workers)
                template = kept["dw", workers] = jobs.template({0: 0, 1: 1, 14: 2}, addresses)
            template.run(addresses, workers, dw_size)
            dw = dwp.sum(axis=0).reshape(shape_w)           # per-sample partials in sample order, as depthwise_cv
        return dx, dw
    return run
