"""The forward of a network's stem: few input channels per output, direct C loops along output rows (csrc/stem.c).

A stem (3 colour channels, a 7x7 or 3x3 kernel, stride 2: ResNet's, MobileNet's) gives im2col + BLAS a product
whose inner dimension is only ``C * taps`` (27-147) over a wide output, and columns several times the size of
x; the grid forward copies as much. Here

    y[n, k, o] = sum over tap rows (c, kd, kh) in order, then kw in order, of w[k, c, kd, kh, kw] * x[n, c, ...]

is summed in registers, 12 output channels x 32 positions of a row at a time (AVX-512; 6 x 32 elsewhere), from
each input row copied once per output row into its stride phases (every tap a contiguous load), the bias added
last. Rows are C jobs (:mod:`.jobs`) on the workers; each output element is one sum in one order whatever thread
runs its row, so the bits depend on the configuration and the values only. float32 compute (float16 and bfloat16
computed in float32 as elsewhere; float64 is not served), one group, any stride, dilation, padding and 1-, 2- or
3-D. Padding zeros are multiplied: non-finite inputs detour to ``columns`` (paths.py).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES

from . import jobs, native, small_c
from .plans import per_params

#: Most input channels served: a stem's (colour, grey, audio); with more, the products of the other paths have a
#: deep enough inner dimension for BLAS.
MAX_CHANNELS = 4
#: Most scratch floats per thread (the phase rows of one output row's tap rows).
MAX_SCRATCH = 1 << 16
#: Jobs per worker (rows of the output in equal ranges).
JOBS_PER_WORKER = 4


def serves(p: ConvParams) -> bool:
    """Whether this path computes ``p``'s forward: the compiled loops and their jobs built, float32 compute, one group
    of at most MAX_CHANNELS input channels, a row's scratch within MAX_SCRATCH."""
    return (not p.transposed and p.groups == 1 and p.dtype != "float64" and native.library() is not None
            and p.input_shape[1] <= MAX_CHANNELS and scratch_floats(p) <= MAX_SCRATCH)


@per_params
def scratch_floats(p: ConvParams) -> int:
    """Scratch floats per thread (csrc/stem.c's xconv_stem_scratch)."""
    lib = native.library()
    return int(lib.xconv_stem_scratch(native.address(small_c.col2im_geometry(p)))) if lib is not None else 1 << 62


def bound(p: ConvParams) -> int:
    """Scratch bytes at most (not leased): every worker's phase rows, and the float32 copies of x and w."""
    from .blas import MAX_WORKERS
    return 4 * (MAX_WORKERS * scratch_floats(p) + math.prod(p.input_shape) + math.prod(p.weight_shape))


def _rows(p: ConvParams) -> int:
    return p.input_shape[0] * math.prod(p.output_shape[2:-1])


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias (inputs finite), rows of the output in jobs on up to ``workers`` threads."""
    x, geo = small_c.im2col_input(x, p, np.float32)
    w = np.ascontiguousarray(w, np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    y = np.empty(p.output_shape, np.float32)
    rows, scratch = _rows(p), scratch_floats(p)
    tracing.note(workspace_bytes=4 * workers * scratch)
    run = jobs.Jobs()
    run.split("stem_rows", (native.address(x), native.address(w), 0 if b is None else native.address(b),
                            native.address(y), native.address(geo), p.output_shape[1]), 6,
              jobs.ranges(rows, JOBS_PER_WORKER * workers))
    run.run(workers, scratch)
    return y if p.dtype == "float32" else y.astype(DTYPES[p.dtype])
