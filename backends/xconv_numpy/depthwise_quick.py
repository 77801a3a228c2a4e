"""A lane's repeated depthwise calls on the loops across channels (:mod:`.depthwise_cv`) from kept job templates.

:mod:`.depthwise_cv` builds its job list (gather or weight-gradient jobs over ranges of (sample, 16-channel block)
items) and the addresses of its pair tables on every call. Between a converted layer's repeated calls only the arrays'
addresses change: :func:`fprop_runner` and :func:`backward_runner` keep, per configuration and worker count, the first
call's jobs as a :class:`.jobs.Template` (addresses held as offsets from x or dy, the result and the weights) and run
it on later calls: the same jobs, so the same bits. Measured with the caches cold, as a model step leaves them (the
loops made no-ops, 8 MB touched between calls), the lane's Python before the loops: 8x96x12x12 forward 191 -> 132
µs, its weight gradient 191 -> 126. x and dy of another layout are copied to C order first, as the dispatch copies
them (the same values, so the same bits); a call of another dtype or shape, or a forward whose weights are not finite
(the dispatch runs those on the plane loops: a padding term is then inf * 0), returns None, and the caller runs the
dispatch, which decides as always.
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import depthwise_cv, jobs
from .aligned import empty_result
from .finite import all_finite
from .plans import per_params

_F32 = np.dtype(np.float32)


def _c_order(a: np.ndarray, shape):
    """``a`` as a C-contiguous aligned float32 array (copied where it is not one, as depthwise_cv copies it), or None
    where its dtype or shape is not the configuration's."""
    if a.dtype != _F32 or a.shape != shape:
        return None
    return a if a.flags.c_contiguous and a.flags.aligned else np.ascontiguousarray(a)


@per_params
def fprop_runner(p: ConvParams):
    """``run(x, w, bias, workers) -> y`` for the depthwise forward of ``p`` on the loops across channels, or None
    where they do not serve ``p`` (:func:`.depthwise_cv.serves`, as :func:`.depthwise.fprop` decides; the weights are
    checked per call) (None instead of y: see the module docstring)."""
    if not depthwise_cv.serves(p):
        return None
    t = depthwise_cv.tables(p)
    N, shape_x, shape_w = p.input_shape[0], tuple(p.input_shape), tuple(p.weight_shape)
    grid_in, grid_out = (t.H, t.W), (t.Ho, t.Wo)
    size, step = depthwise_cv.gather_scratch(t, grid_in, grid_out), p.stride[-1]
    kept: dict = {}                                      # workers -> Template (kept with t: its tables' addresses)

    def run(x, w, bias, workers: int):
        x, w = _c_order(x, shape_x), _c_order(w, shape_w)
        if x is None or w is None or not all_finite(w):
            return None
        y = empty_result((N, t.C, t.Ho, t.Wo), np.float32)
        wt = depthwise_cv.weights(w, t)
        bases = (x, y, wt)
        template = kept.get(workers)
        if template is None:
            made = depthwise_cv.gather_jobs(x, y, wt, t, t.f_rows, t.f_cols, t.f_reg, step, grid_in, grid_out, workers)
            template = kept[workers] = made.template({0: 0, 4: 1, 7: 2}, bases)
        jobs._execute_template(template, bases, workers, size)             # template.run(bases, workers, size)
        if bias is not None:                             # as depthwise_cv.fprop adds it
            y += np.asarray(bias, np.float32).reshape((1, -1, 1, 1))
        return y.reshape(p.output_shape)
    return run


@per_params
def backward_runner(p: ConvParams):
    """``run(dy, x, w, need_dx, need_dw, workers) -> (dx, dw)`` (None where not needed) for the depthwise backward of
    ``p`` without db on the loops across channels, or None where they do not serve ``p``; None instead of the results
    where a call is not the template's."""
    if not depthwise_cv.serves(p):
        return None
    t = depthwise_cv.tables(p)
    N, shape_x, shape_dy, shape_w = p.input_shape[0], tuple(p.input_shape), tuple(p.output_shape), \
        tuple(p.weight_shape)
    grid_in, grid_out = (t.Ho, t.Wo), (t.H, t.W)     # dgrad: from dy to dx
    dx_size, dw_size = depthwise_cv.gather_scratch(t, grid_in, grid_out), depthwise_cv.wgrad_scratch(t)
    kept: dict = {}                                  # (output, workers) -> Template

    def run(dy, x, w, need_dx: bool, need_dw: bool, workers: int):
        dy, x, w = _c_order(dy, shape_dy), _c_order(x, shape_x), _c_order(w, shape_w)
        if dy is None or x is None or w is None:
            return None
        dx = dw = None
        if need_dx:
            dx = empty_result((N, t.C, t.H, t.W), np.float32)
            wt = depthwise_cv.weights(w, t)
            bases = (dy, dx, wt)
            template = kept.get(("dx", workers))
            if template is None:
                jobs = depthwise_cv.gather_jobs(dy, dx, wt, t, t.d_rows, t.d_cols, t.d_reg, 1, grid_in, grid_out,
                                                workers)
                template = kept["dx", workers] = jobs.template({0: 0, 4: 1, 7: 2}, bases)
            template.run(bases, workers, dx_size)
            dx = dx.reshape(shape_x)
        if need_dw:
            dwp = np.empty((N, t.C, t.K), np.float32)
            bases = (x, dy, dwp)
            template = kept.get(("dw", workers))
            if template is None:
                jobs = depthwise_cv.wgrad_jobs(x, dy, dwp, t, N, workers)
                template = kept["dw", workers] = jobs.template({0: 0, 1: 1, 14: 2}, bases)
            template.run(bases, workers, dw_size)
            dw = dwp.sum(axis=0).reshape(shape_w)           # per-sample partials in sample order, as depthwise_cv
        return dx, dw
    return run
