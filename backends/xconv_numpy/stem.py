"""A network's stem (few input channels): its forward and weight gradient as direct C loops along rows (csrc/stem.c).

A stem (3 colour channels, a 7x7 or 3x3 kernel, stride 2: ResNet's, MobileNet's) gives im2col + BLAS a product
whose inner dimension is only ``C * taps`` (27-147) over a wide output, and columns several times the size of
x; the grid forward copies as much. Here

    y[n, k, o] = sum over tap rows (c, kd, kh) in order, then kw in order, of w[k, c, kd, kh, kw] * x[n, c, ...]

is summed in registers, 12 output channels x 32 positions of a row at a time (AVX-512; 6 x 32 elsewhere), from
each input row copied once per output row into its stride phases (every tap a contiguous load), the bias added
last. Rows are C jobs (:mod:`.jobs`) on the workers; each output element is one sum in one order whatever thread
runs its row, so the bits depend on the configuration and the values only.

The weight gradient (the first layer's only gradient: its input needs none) sums, per block of output channels and
tap row (c, kd, kh), dy's rows times x's rows in their stride phases (copied once per call) over every output row
in order, in 16 lanes along the row, the lanes added in order at the end: each dW element one job's sum.

float32 compute (float16 and bfloat16 computed in float32 as elsewhere; float64 is not served), one group, any
stride, dilation, padding and 1-, 2- or 3-D. The loops skip tap rows that read padding and multiply the rest of
the padding's zeros: a non-finite weight (forward) or non-finite dy or x (weight gradient) detours to ``columns``
(fast.py, paths.py).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES

from . import jobs, native, small_c
from .aligned import empty_result
from .plans import per_params

#: Most input channels served: a stem's (colour, grey, audio); with more, the products of the other paths have a
#: deep enough inner dimension for BLAS.
MAX_CHANNELS = 4
#: Most scratch floats per thread (the phase rows of one output row's tap rows).
MAX_SCRATCH = 1 << 16
#: Jobs per worker (rows of the output in equal ranges).
JOBS_PER_WORKER = 4
#: The builds the loops serve on (measured on a Zen 4, two threads, ms, stem loops vs the other paths' pick): AVX-512,
#: and AVX2 with 8-float vectors (ResNet's 7x7 stem forward 1.7 vs 3.6, weight gradient 3.6 vs 5.3; MobileNetV2's
#: stem weight gradient 0.58 vs 1.8; the 3-D stem's 3.1 vs 8.5). Not the baseline (SSE2, no FMA: not measured).
ISAS = ("avx512", "avx2")


#: The switch of these loops (the settings field of ``$XCONV_NUMPY_C``), as the other compiled loops'.
SWITCH = "numpy_c"


def built_for() -> str | None:
    """The instruction set of the compiled loops this process runs (None: none loaded, or ``XCONV_NUMPY_C=0``)."""
    return native.isa(native.library()) if native.part_on(SWITCH) else None


def serves(p: ConvParams) -> bool:
    """Whether this path computes ``p``'s forward and weight gradient: the compiled loops built for an ISA of ISAS,
    float32 compute, one group of at most MAX_CHANNELS input channels, output rows of at least 16 positions (one vector), a
    row's scratch within MAX_SCRATCH."""
    return (not p.transposed and p.groups == 1 and p.dtype != "float64" and built_for() in ISAS
            and p.input_shape[1] <= MAX_CHANNELS and p.output_shape[-1] >= 16 and scratch_floats(p) <= MAX_SCRATCH)


@per_params
def scratch_floats(p: ConvParams) -> int:
    """Scratch floats per thread (csrc/stem.c's xconv_stem_scratch)."""
    lib = native.library()
    return int(lib.xconv_stem_scratch(native.address(small_c.col2im_geometry(p)))) if lib is not None else 1 << 62


def bound(p: ConvParams) -> int:
    """Scratch bytes at most (not leased): every worker's phase rows, x's phase rows (weight gradient), and float32
    copies of x, w and dy."""
    from .blas import MAX_WORKERS
    return 4 * (MAX_WORKERS * scratch_floats(p) + _phase_floats(p) + math.prod(p.input_shape)
                + math.prod(p.weight_shape) + math.prod(p.output_shape))


def phase_row_length(p: ConvParams) -> int:
    """Floats of one stride phase of an input row (csrc/stem.c's stem_lq: room for 32-lane blocks past the last output
    and the widest tap)."""
    ow, kw, sw, dw = p.output_shape[-1], p.kernel[-1], p.stride[-1], p.dilation[-1]
    return -(-ow // 32) * 32 + (kw - 1) * dw // sw + 1


def _phase_floats(p: ConvParams) -> int:
    """Floats of x's rows in their stride phases (the weight gradient's copy)."""
    return math.prod(p.input_shape[:-1]) * p.stride[-1] * phase_row_length(p)


def _rows(p: ConvParams) -> int:
    return p.input_shape[0] * math.prod(p.output_shape[2:-1])


def _copies(given, used) -> int:
    """Bytes of the float32 copies made of the inputs (those not used where they lie)."""
    return sum(u.nbytes for g, u in zip(given, used) if u is not None and u is not g)


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias (inputs finite), rows of the output in jobs on up to ``workers`` threads."""
    given = (x, w, bias)
    x, geo = small_c.im2col_input(x, p, np.float32)
    w = np.ascontiguousarray(w, np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    y = empty_result(p.output_shape, np.float32)
    scratch = scratch_floats(p)
    tracing.note(workspace_bytes=4 * workers * scratch + _copies(given, (x, w, b)))
    row_jobs(x, w, b, y, geo, p, workers).run(workers, scratch)
    return y if p.dtype == "float32" else y.astype(DTYPES[p.dtype])


def row_jobs(x, w, b, y, geo, p: ConvParams, workers: int) -> jobs.Jobs:
    """The forward's jobs: y's rows in equal ranges, JOBS_PER_WORKER per worker (x float32 as ``geo`` says it lies,
    w contiguous float32, b None or contiguous float32, y contiguous float32)."""
    run = jobs.Jobs()
    run.split("stem_rows", (native.address(x), native.address(w), 0 if b is None else native.address(b),
                            native.address(y), native.address(geo), p.output_shape[1]), 6,
              jobs.ranges(_rows(p), JOBS_PER_WORKER * workers))
    return run


def wgrad(dy, x, p: ConvParams, workers: int):
    """dW (float32 compute, inputs finite): x's rows in their phases (jobs by rows), then the blocks of output
    channels x tap rows (jobs), on up to ``workers`` threads. Only for calls :func:`serves` (rows of 16 or more)."""
    if not serves(p):
        raise ValueError(f"the stem loops do not serve this call (stem.serves): {p}")
    given = (dy, x)
    x, geo = small_c.im2col_input(x, p, np.float32)
    dy = np.ascontiguousarray(dy, np.float32)
    ph = np.empty(_phase_floats(p), np.float32)
    dw = np.empty(p.weight_shape, np.float32)
    co = p.output_shape[1]
    tracing.note(workspace_bytes=4 * ph.size + _copies(given, (dy, x)))
    xrows = math.prod(p.input_shape[:-1])
    run = jobs.Jobs()
    parts = jobs.ranges(xrows, 2 * workers)
    run.split("stem_phases", (native.address(x), native.address(ph), native.address(geo)), 3, parts, signal=0)
    run.split("stem_wgrad", (native.address(ph), native.address(dy), native.address(dw), native.address(geo), co), 5,
              jobs.ranges(int(native.library().xconv_stem_wjobs(native.address(geo), co)), JOBS_PER_WORKER * workers),
              wait=(0, len(parts)))
    run.run(workers)
    return dw if p.dtype == "float32" else dw.astype(DTYPES[p.dtype])
