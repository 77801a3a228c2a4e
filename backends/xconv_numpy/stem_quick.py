"""A lane's repeated stem forwards from one job template (no per-call Python building the job list).

:func:`.stem.fprop` finds x's geometry and builds its row jobs in Python on every call: in a model step, where the
first layer runs right after torch's own operators have had the caches, 0.25-0.4 ms of Python per call against its
0.9 ms of loops (ResNet-18 64's 8x3x64x64 7x7 stride 2; 90 µs hot). :func:`fprop_runner` keeps, per configuration
and worker count, one template of the same row jobs (x C-contiguous, so the geometry it reads is the configuration's), so a call checks its weights (the stem loops take
finite weights only), fills in its arrays' addresses and runs one region: the same jobs, so the same bits. Where a
call is not the template's (x, w or the bias not float32, C-contiguous and aligned; float16 and bfloat16 calls
get no runner) or a weight is not finite, it returns None and the caller runs the dispatch (:func:`.fast._fprop_on`), which decides as
always (the columns detour for such a weight).
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams

from . import jobs, small_c, stem
from .aligned import empty_result
from .dense_weights import _readable
from .finite import all_finite
from .plans import per_params

_F32 = np.dtype(np.float32)
#: The template's bases, by number: x, the weights, the bias (None: no bias, address 0), y.
_X, _W, _B, _Y = range(4)


@per_params
def fprop_runner(p: ConvParams):
    """``run(x, w, bias, workers) -> y`` (None where the call is not the template's, see the module docstring) for
    the stem loops' forward of ``p``, or None where they do not serve ``p`` or its dtype is not float32."""
    if p.dtype != "float32" or not stem.serves(p):
        return None
    xshape, wshape, scratch = tuple(p.input_shape), tuple(p.weight_shape), stem.scratch_floats(p)
    kept: dict = {}                                          # workers -> (template, the geometry its jobs read)

    def run(x, w, bias, workers: int):
        if not (x.shape == xshape and w.shape == wshape and x.dtype == _F32 and w.dtype == _F32     # _readable,
                and (fx := x.flags).c_contiguous and fx.aligned and (fw := w.flags).c_contiguous and fw.aligned  # in
                and (bias is None or _readable(bias))):                                         # line (dense_quick)
            return None
        if not all_finite(w):
            return None                                      # the dispatch detours (fast._fprop_on)
        y = empty_result(p.output_shape, _F32)
        bases = (x, w, bias, y)
        entry = kept.get(workers)
        if entry is None:
            entry = kept[workers] = _template(x, w, bias, y, workers, bases)
        jobs._execute_template(entry[0], bases, workers, scratch)            # entry[0].run(bases, ...)
        return y

    def _template(x, w, bias, y, workers: int, bases):
        """(stem.fprop's row jobs for these arrays as a template, the geometry they read at its address)."""
        xr, geo = small_c.im2col_input(x, p, _F32)           # x itself (float32, C-contiguous: run checked)
        return stem.row_jobs(xr, w, bias, y, geo, p, workers).template({0: _X, 1: _W, 2: _B, 3: _Y}, bases), geo
    return run
