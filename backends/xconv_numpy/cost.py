"""Estimated time of one output of a call on each candidate path, from the call's configuration alone.

The path table asks :func:`cheapest` which of the paths that can serve a call's forward output ("y"),
input gradient ("dx") or weight gradient ("dw") should: the one with the least estimated time. The
estimates read the shapes, strides and kernel only (never a clock, the thread count or the mask), and the rates of
the kind of CPU (:data:`RATES`: read from the CPU's vendor and the build, or named by ``XCONV_NUMPY_CPU``), so the
choice, and with it the bits, is a pure function of the configuration, the build and that kind. Each output is
costed on its own and its path is the full call's (dx's and dw's chosen together, :func:`backward_pair`), so which
outputs a call asks for cannot change how one of them is computed.

The model, per path of the table (the names of ``paths.PATHS``; seconds on one core, then divided by the cores
the path keeps busy, :data:`CORES` assumed):

- ``colgemm`` (im2col columns and BLAS products, :mod:`.colgemm`): each product of sizes (m, n, k) runs at
  ``BLAS_MACS * e(m) e(n) e(k)`` multiply-adds per second (BLAS_MACS and LOOP_MACS below: ``Rates.blas_macs``,
  ``Rates.loop_macs``), ``e(d) = d / (d + BLAS_HALF)`` (thin products run below peak), plus ``COPY`` per element of
  the columns it builds or folds back;
- ``colgemm``'s column elements past ``COPY_CACHED`` cost ``COPY_BIG`` each (a 1-D k=5 layer of 16x1024
  positions: 81 ms against the dense loops' 58);
- ``dense`` (the dense C loops, csrc/direct_conv.c; the forward through the dual call's input gradient): ``LOOP_MACS *
  Q / (Q + LOOP_Q0)`` multiply-adds per second, Q the output positions per sample (the loops vectorize and block along
  a sample's positions: a 2x2 output runs them at a fifth of their rate; 3-D outputs of few short rows pad their grids
  more: a larger Q0), times up to ``Rates.loop_big_weights`` when one group's weights outgrow a core's L2
  (:func:`big_weights`); for dx and the forward only the multiply-adds the loops run (``dense_plan.dx_tap_share``:
  taps that read only padding rows are skipped); the forward at strides above 1 (``dense_strided``, the AVX-512 build)
  over the output positions, the tap rows inside x only (``dense_strided.tap_share``), plus x's phase rows at ``COPY``
  per element, without ``loop_big_weights`` on output rows of ``Rates.loop_long_row`` or more (Zen 4: 64; Intel: never
  exempt); the forward also its copy of the weights (``WEIGHT_COPY`` per element: cold in a model);
- ``small-c-blocks`` (the small path's stride-1 loops, csrc/small_grid.c, in sample blocks): the forward's, the small
  path's estimate over the cores (times ``Rates.stem_grid`` where the stem loops serve the forward); the backward
  is not weighed: it replaces ``small-c`` where the model picks that
  for an output and the samples make two or more blocks (``paths.cost_pick``);
- ``grid-forward`` (the grid engine's x-columns forward): colgemm's product model, columns only for kernels with
  several taps;
- ``small-c`` / ``small-cols`` (the small paths: one core, ``SMALL_CALL`` per call): at stride 1 its loops at ``R *
  Q/(Q+Q0) * K/(K+K0)`` per output (:data:`SMALL_LOOPS`: they block over taps, so few taps, above all for the weight
  gradient, run them slowly: a 1x1 MobileNet projection at 3x3 pixels measured 1.5 ms against colgemm's 0.14), else
  colgemm's model on one core; ``small-cols`` weighed against the others ``Rates.small_cols_call`` more (its Python
  steps in a model step);
- ``pointwise`` (1x1, stride 1, no padding): per-sample products, no copies; where ``Rates.pointwise_fwd`` is set
  the forward's at that times their estimate, one job per sample and group in rounds of the cores;
- every other path pays ``CALL`` per output.

Constants fitted (least squares on log time) to 45 real-model layer shapes x 4 outputs measured one core at a time
(thread CPU time; AMD Zen 4, AVX-512 build, OpenBLAS SkylakeX kernel): ResNet-18 at 64 and 224 pixels, MobileNetV2 0.5
expansion and projection 1x1s, U-Net 3x3s and its 2x2 stride-2 transposed convolutions, the wav2vec 1-D encoder, a 3-D
conv net. RMS error of log time: colgemm 0.19, direct 0.32, small 0.23 (forward), 0.47 (dx), 0.30 (dw) (a factor of
about 1.2-1.6). benchmarks/models.py --breakdown shows each layer's path and rate.

The dense loops' refit of issue 25's second pass (the rates per output on ResNet-18's shapes) is in
docs/numpy-backend.md, *The cost model*.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math

from xconv import settings

from . import dense as dense_loops
from . import dense_strided, native
from . import stem as stem_loops
from .dense_plan import dx_tap_share
from .grid import pointwise_planned
from .cost_rates import Rates
from .small import macs  # noqa: F401  (cost.macs: the count the estimates and the path table read)

#: Cores the estimates assume (a constant, not the machine's count: the choice must not depend on it).
CORES = 2
BLAS_HALF = 16
COPY = 0.25e-9
#: Per element of column matrices past COPY_CACHED elements (they leave the caches: the products slow down too).
COPY_BIG = 1e-9
COPY_CACHED = 1 << 20
#: Per weight element of the dense forward's tap-major copy of the weights each call: read, then written, at COPY each
#: (colgemm reads them in place). In a model a layer's weights are cold at each call (the layers before streamed
#: theirs): Zen 4, two threads, a 64 MB sweep before each call, median of 30, ms (dense / colgemm): 2x512x7x7 -> 512
#: 3x3 forward 3.69 / 3.24 (estimated 2.75 / 3.18 without this term: fitted on warm calls), 8x512x4x4 -> 256 2.38 /
#: 2.27 (2.06 / 2.11); the loops stay ahead at 2x256x14x14 -> 256 (3.06 / 4.13) and 8x256x4x4 -> 256 (1.11 / 1.20).
WEIGHT_COPY = 2 * COPY
#: Q0 of the dense loops per number of spatial dims (3-D: short rows of few planes pad the grid more: a 2x7x7 output
#: ran them at 29 GMAC/s against 47-51 at 4x14x14 and 8x28x28).
LOOP_Q0 = {1: 10, 2: 10, 3: 70}


#: Per kind of CPU (:data:`xconv.settings.NUMPY_CPUS`), its rates:
#:
#: - ``zen4``, the first fit (AMD EPYC Zen 4, AVX-512 executed as two 256-bit halves): OpenBLAS about 45 G
#:   multiply-adds/s per core, the dense loops 50 on long rows, 512x512x3x3 at 2x7x7 at 9 (50 ms against colgemm's
#:   14), the speech encoder's 4x512x1599 -> 512 3-tap stride 2 at 50 (26 ms on two cores): every kind of CPU not
#:   named below takes these;
#: - ``avx2``, the AVX2 build on any CPU (fitted on an AMD EPYC Zen 3, OpenBLAS Haswell; two threads, ms, loops or
#:   blas-grid / colgemm / torch): Zen 4's but for 2^19 weights costing the 8-float blocks 1.5x in 2-D and 3-D too
#:   (8x256x4x4 256 3x3 backward 7.3 / 4.4 / 4.2, 2x256x14x14 14.5 / 9.7 / 9.1, 3-D 2x128x2x7x7 -> 256 9.7 / 6.2 /
#:   5.7; 128x128x3x3x3 stays), colgemm's forward at any width in up to CORES sample chunks, blas-grid's at 1.2x
#:   (speech 4x512x799 21.9 / 16.6), the small loops in sample blocks 2x where the stem loops serve a forward
#:   (``Rates.stem_grid``). ``XCONV_NUMPY_CPU=avx2`` names these rates, not the instruction set;
#: - ``intel-avx512`` (Intel Xeon, family 6 model 207, two 512-bit FMA units per core; the AVX-512 build, OpenBLAS
#:   SkylakeX): OpenBLAS 80-83 G multiply-adds/s per core, the loops 75, down to 15 with 512x512x3x3 weights (their
#:   factor from 2^19 elements rising over two octaves to 1.8, the step where a sample's x or dy passes 1 MB);
#:   colgemm's forward at any width and in chunks, the grid engine's forward 1.5x, the stem loops 75e9 (the
#:   measurements: docs/numpy-backend.md, *Rates per kind of CPU*).
_ZEN4 = Rates(blas_macs=45e9, loop_macs=50e9, loop_weights=1 << 19, loop_big_weights=1.5, loop_long_row=64,
           stem_macs=45e9, grid_forward=1.0, forward_chunks=1, forward_columns=4096, loop_weights_2d=1 << 20,
           small_cols_call=60e-6, split_call=250e-6, strided_q0=5, loop_big_weights_fwd=1.2,
           pointwise_fwd=0.8)
RATES = {
    "zen4": _ZEN4,
    "avx2": dataclasses.replace(_ZEN4, loop_weights_2d=1 << 19, grid_forward=1.2, forward_chunks=CORES,
                                forward_columns=1 << 62, loop_big_weights_fwd=1.0, stem_grid=2.0),
    "intel-avx512": Rates(blas_macs=80e9, loop_macs=75e9, loop_weights=1 << 19, loop_big_weights=1.8,
                          loop_long_row=None, stem_macs=75e9, grid_forward=1.5, forward_chunks=CORES,
                          forward_columns=1 << 62, loop_weights_ramp=2, loop_sample_bytes=1 << 20),
}


@functools.cache
def _vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's vendor string (``cpuinfo``'s first vendor_id; "" where it cannot be read)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def detected_cpu() -> str:
    """The kind of CPU whose rates this process takes unless ``XCONV_NUMPY_CPU`` names one: ``intel-avx512`` on an
    Intel CPU running the AVX-512 build of the compiled loops, ``avx2`` wherever the AVX2 build runs, else ``zen4``
    (the first fit). Read from the CPU and the build, never a clock: the pick stays a function of the configuration
    and the build."""
    lib = native.library()
    build = None if lib is None else native.isa(lib)
    if build == "avx512" and _vendor() == "GenuineIntel":
        return "intel-avx512"
    return "avx2" if build == "avx2" else "zen4"


#: The kind one path choice reads (:func:`choosing`): the one its cache key holds, however often an estimate asks.
_CHOOSING = contextvars.ContextVar("xconv_numpy_cost_kind", default=None)


def cpu_kind() -> str:
    """The kind of CPU whose rates the estimates use: within :func:`choosing`, its kind; else ``$XCONV_NUMPY_CPU``,
    else :func:`detected_cpu`."""
    return _CHOOSING.get() or settings.current().numpy_cpu or detected_cpu()


@contextlib.contextmanager
def choosing(named: str | None):
    """Within the block (this thread or task) every estimate uses the kind ``named`` (a setting's value, None: the
    detected kind): one path choice reads the kind once, the one its cache key holds, even if the environment
    changes meanwhile."""
    token = _CHOOSING.set(named or detected_cpu())
    try:
        yield
    finally:
        _CHOOSING.reset(token)


def rates() -> Rates:
    """The rates of :func:`cpu_kind`."""
    return RATES[cpu_kind()]


CALL = 20e-6
SMALL_CALL = 3e-6
#: What ``small-cols`` costs a call more than its estimate where the model weighs it against the other paths
#: (:func:`small_cols`; ``Rates.small_cols_call``, this value on ``zen4``): it runs its columns, its one BLAS product
#: on one core and the layout back from Python, with
#: no kept job list, and in a model step each of those Python steps runs on caches the previous layer evicted (issue
#: 25, eighth session, Zen 4, calls timed inside training steps, ms, small-cols against colgemm's kept templates:
#: ResNet-18's strided 1x1 shortcuts forward 0.28-0.32 / 0.16-0.19 and backward 0.42-0.60 / 0.31-0.37 on two
#: threads, 0.29-0.32 / 0.21-0.29 and 0.43-0.58 / 0.42-0.50 on one; MobileNetV2's 1x1s at 3x3 forward 0.17-0.26 /
#: 0.15-0.19, backward 0.21-0.46 / 0.22-0.32; alone, in a loop, small-cols had been the faster, 0.14-0.20 against
#: 0.16-0.25). Calls the small path keeps by size (:data:`SMALL_MACS`) are not weighed: no surcharge there.
SMALL_COLS_CALL = 60e-6
#: What a backward costs more when its dx and dw run on two paths (:func:`backward_pair`; ``Rates.split_call``, this
#: value on ``zen4``): the second path's own dispatch, scratch and region, and its own pass over dy. ResNet-18's
#: 8x256x4x4 256 3x3, two threads, ms: the dense loops' dx 0.98 and colgemm's dw 1.24 alone, 2.43-2.49 in one call
#: (0.2-0.27 over their sum); either path for both 2.19-2.23. Once the loops skipped the padding's columns (issue 25's
#: twelfth session): dx 0.74-0.88 and dw 0.93-1.04 alone, 2.43-2.48 in one call (0.5 over their sum), either path for
#: both 1.82-2.1 (alternating in one process, min of 60: a tie). The model keeps one path there from about 160 µs:
#: 250 µs, half the excess measured, not the 100 µs it was.
SPLIT_CALL = 250e-6
#: Calls the small path serves with at most this many multiply-adds per output stay there, unestimated: the
#: threads of the other paths cost more than the arithmetic (a 1x1 at 32x16x4x4: 0.39 ms small, 0.87 pointwise).
SMALL_MACS = 1 << 19
#: The small path's stride-1 loops per output: (multiply-adds per second, Q0, K0): rate R * Q/(Q+Q0) * K/(K+K0).
SMALL_LOOPS = {"y": (50e9, 4, 2), "dx": (40e9, 8, 2), "dw": (60e9, 12, 8)}
#: The grid loops run in sample blocks (small-c-blocks, forward and backward) of at least this many output elements each.
GRID_BLOCK_ELEMENTS = 1 << 15


def _blas(m: int, n: int, k: int) -> float:
    """Seconds of one core for a product of sizes (m, n, k)."""
    return m * n * k / (rates().blas_macs * _e(m) * _e(n) * _e(k))


def _e(d: int) -> float:
    return d / (d + BLAS_HALF)


def _sizes(p):
    N, C = p.input_shape[:2]
    Co = p.output_shape[1]
    g = p.groups
    K = math.prod(p.kernel)
    Q = math.prod(p.output_shape[2:])
    return N, C // g, Co // g, g, K, Q


def colgemm(p, output: str, cores: int = CORES, call: float = CALL) -> float:
    N, Cg, Cog, g, K, Q = _sizes(p)
    m, n, k = {"y": (Cog, N * Q, Cg * K), "dw": (Cog, Cg * K, N * Q), "dx": (Cg * K, N * Q, Cog)}[output]
    products = g * _blas(m, n, k)
    elements = g * Cg * K * N * Q + g * Cog * N * Q
    copies = COPY * min(elements, COPY_CACHED) + COPY_BIG * max(0, elements - COPY_CACHED)
    return call + (products + copies) / _colgemm_blocks(p, cores)


def _colgemm_blocks(p, cores: int = CORES) -> int:
    """The blocks (cores) :func:`colgemm` divides a product of ``p`` over (every output's product has the same
    multiply-adds)."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    return min(cores, max(1, g * Cog * Cg * K * N * Q >> 22))


#: The builds whose stride-1 dense forward takes ``Rates.loop_big_weights_fwd``: AVX-512; the AVX2 build where its
#: rows run taps at a time (dense.taps_at_a_time; block by block it lost: 2x512x7x7 -> 512 3x3 13.8 / 6.6 ms).
BIG_WEIGHTS_FWD_ISAS = ("avx512",)


def big_weights(p, r: Rates, forward: bool = False) -> float:
    """The dense loops' time factor for one group's weights of W elements (see :class:`Rates`): 1 below the
    threshold T (``r.loop_weights``; for 2-D and 3-D kernels ``r.loop_weights_2d`` where set); from there
    ``r.loop_big_weights`` (the stride-1 ``forward``'s: ``r.loop_big_weights_fwd`` where set and the build is one
    of :data:`BIG_WEIGHTS_FWD_ISAS` or runs the rows taps at a time, dense.taps_at_a_time), or, with a ramp and
    where a sample's x and dy (float32) fit in ``r.loop_sample_bytes``, 1 + (that factor - 1) * min(1, log2(W / T) /
    loop_weights_ramp)."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    W = Cog * Cg * K
    least = r.loop_weights if len(p.kernel) == 1 or r.loop_weights_2d is None else r.loop_weights_2d
    if W < least:
        return 1.0
    factor, lib = r.loop_big_weights, native.library() if forward else None
    if lib is not None and r.loop_big_weights_fwd is not None \
            and (native.isa(lib) in BIG_WEIGHTS_FWD_ISAS or dense_loops.taps_at_a_time(p)):
        factor = r.loop_big_weights_fwd
    sample = 4 * max(p.input_shape[1] * math.prod(p.input_shape[2:]), p.output_shape[1] * Q)
    if r.loop_weights_ramp <= 0 or (r.loop_sample_bytes is not None and sample > r.loop_sample_bytes):
        return factor
    return 1 + (factor - 1) * min(1.0, math.log2(W / least) / r.loop_weights_ramp)


def loops(p, output: str, cores: int = CORES, call: float = CALL) -> float:
    """The dense C loops (any output)."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    macs = N * g * Cog * Cg * K * Q * (dx_tap_share(p) if output == "dx" else 1.0)
    q0, r = LOOP_Q0[len(p.kernel)], rates()
    return call + big_weights(p, r) * macs / (r.loop_macs * Q / (Q + q0)) / cores


def small(p, output: str) -> float:
    """The small path (one core, little per-call work): its grid loops at stride 1 (whose weight gradient blocks
    over taps: few taps run it at a fraction of the rate), else its columns and one BLAS product."""
    if all(s == 1 for s in p.stride) and math.prod(p.kernel) > 1:
        N, Cg, Cog, g, K, Q = _sizes(p)
        rate, q0, k0 = SMALL_LOOPS[output]
        return SMALL_CALL + N * g * Cog * Cg * K * Q / (rate * Q / (Q + q0) * K / (K + k0))
    return colgemm(p, output, 1, SMALL_CALL)


#: The pointwise path's time per call outside its products, for the gradients (their chunks of samples in Python,
#: the weights' copy, one product call per sample): measured 55-75 us on two threads (forward, before its job table
#: was kept per configuration: 8x16x12x12 -> 96 119 us, 8x96x12x12 -> 16 106, 8x32x6x6 -> 192 116, 8x96x6x6 -> 32
#: 100; the small path's columns and one product 103, 116, 90, 67), against CALL's 20. Float32 calls run their sgemm
#: jobs from a table kept per configuration (grid/pointwise_planned.py): CALL (the same four forwards: 58, 55, 56,
#: 46 us; backward 8x16x12x12 -> 96 240 -> 139, 8x16x24x24 -> 96 610 -> 272, 8x48x6x6 -> 288 338 -> 210).
POINTWISE_CALL = 60e-6


def pointwise(p, output: str) -> float:
    """Per-sample products on the native layout (1x1, stride 1, no padding): no copies, thin when Q is small; where
    ``Rates.pointwise_fwd`` is set, the forward's table (one job per sample and group, up to 64 samples) in
    ceil(N * g / CORES) rounds of the cores."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    m, n, k = {"y": (Cog, Q, Cg), "dw": (Cg, Cog, Q), "dx": (Cg, Q, Cog)}[output]
    planned = pointwise_planned.takes(p)[output == "dw"]           # its job tables kept: float32, within bounds
    call = CALL if planned else POINTWISE_CALL
    rate = rates().pointwise_fwd
    if output == "y" and rate is not None and pointwise_planned.builds_forward(p):      # measured: Rates.pointwise_fwd
        return call + rate * -(-N * g // CORES) * _blas(m, n, k)
    return call + N * g * _blas(m, n, k) / CORES


def grid_block_samples(p) -> int:
    """Samples per block of the small loops in sample blocks (grid_blocks.py, forward and backward): blocks of at least
    GRID_BLOCK_ELEMENTS output elements (the last may hold fewer), at most 8 blocks."""
    N = p.input_shape[0]
    per = math.prod(p.output_shape[1:])
    return max(1, -(-GRID_BLOCK_ELEMENTS // max(per, 1)), -(-N // 8))


def grid(p, output: str) -> float:
    """The small path's stride-1 loops in sample blocks on the cores (forward; one block: the small path itself)."""
    blocks = -(-p.input_shape[0] // grid_block_samples(p))
    factor = rates().stem_grid if output == "y" and stem_loops.serves(p) else 1.0     # Rates.stem_grid
    return CALL + (small(p, output) - SMALL_CALL) / min(CORES, blocks) * factor


def blas_grid(p, output: str) -> float:
    """The grid engine's x-columns forward (fast.py): one product per chunk of grid lines, columns only for taps."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    m, n, k = Cog, N * Q, Cg * K
    products = g * _blas(m, n, k)
    elements = g * Cg * K * N * Q if K > 1 else 0
    copies = COPY * min(elements, COPY_CACHED) + COPY_BIG * max(0, elements - COPY_CACHED)
    return CALL + rates().grid_forward * (products + copies) / CORES


def dense_forward(p, output: str = "y") -> float:
    """The forward through the dense loops' input gradient (:func:`dense.fprop`): at stride 1 the loops' model over
    the input positions per sample (the dual convolution's output) (measured, one core, ms, against the small path's loops in sample blocks: 3-D 32->64 at 8x28x28 14.4 vs 15.6,
    64->128 at 4x14x14 7.4 vs 8.5, 128->128 15.1 vs 16.8; 2-D 64 at 16x16 1.62 vs 1.74, 128 at 8x8 1.78 vs 1.80)."""
    N, Cg, Cog, g, K, Q = _sizes(p)
    q0, r = LOOP_Q0[len(p.kernel)], rates()
    big = big_weights(p, r)
    weights = WEIGHT_COPY * g * Cog * Cg * K          # their tap-major copy, each call (dense_weights.tap_major)
    if any(s != 1 for s in p.stride):          # x's phase rows copied, then the loops over the output's positions
        if not dense_strided.computes(p):
            return math.inf
        long_row = r.loop_long_row is not None and p.output_shape[-1] >= r.loop_long_row
        big = 1.0 if long_row else big
        copies = COPY * dense_strided.phase_floats(p)
        if p.output_shape[-1] < dense_loops.STRIDED_MIN_ROW:    # short rows (dense.STRIDED_SHORT_ROW): their own Q0,
            if r.strided_q0 is None:                             # where the kind has one (else never picked)
                return math.inf
            q0 = r.strided_q0
        sums = big * dense_strided.tap_share(p) * N * g * Cog * Cg * K * Q / (r.loop_macs * Q / (Q + q0))
        return CALL + (sums + copies + weights) / CORES
    S = math.prod(p.input_shape[2:])
    big = big_weights(p, r, forward=True)
    share = dx_tap_share(dense_loops.dual(p)) if dense_loops.computes_fprop(p) else 1.0
    return CALL + (big * share * N * g * Cog * Cg * K * Q / (r.loop_macs * S / (S + q0)) + weights) / CORES


def dense(p, output: str) -> float:
    """The dense loops: their backward outputs, or the forward through the dual call's input gradient."""
    return dense_forward(p) if output == "y" else loops(p, output)


#: The stem loops' multiply-adds per second and core (``Rates.stem_macs``; Zen 4: 45e9), times Co / (Co + STEM_K0):
#: a block of fewer output channels reuses each loaded input vector less; their weight gradient STEM_DW times
#: slower; STEM_CALL per call (two job phases). Fitted on two threads, Zen 4, AVX-512 build (ms, forward / weight
#: gradient): ResNet's 7x7 stem at 8x3x64x64 1.07 / 1.83, MobileNetV2's 3x3 s2 at 8x3x96x96 0.46 / 0.57, 3x3 s1
#: 4x3x64x64 -> 32 0.36-0.57 / 0.62, 4x3x32x32 -> 16 - / 0.17 (the small loops 0.11: they keep it), the 3-D 3x3x3
#: stem at 2x3x8x56x56 2.1 / 2.9 (the small loops' weight gradient 10.4, estimated 2.8).
STEM_K0 = 16
STEM_DW = 1.2
STEM_CALL = 40e-6


def stem(p, output: str = "y") -> float:
    """The stem loops (forward, weight gradient): the sums at their rate, plus the copy of the input rows into their
    stride phases (per output row for the forward), over the cores."""
    N, C, Co, g, K, Q = _sizes(p)
    kw, sw, ow = p.kernel[-1], p.stride[-1], p.output_shape[-1]
    phase_rows = sw * stem_loops.phase_row_length(p) * (      # elements copied into stride phases
        math.prod(p.input_shape[:-1]) if output == "dw"          # x's rows, once per call
        else N * Q // ow * C * (K // kw))                        # each output row's tap rows
    sums = macs(p) / (rates().stem_macs * Co / (Co + STEM_K0)) * (STEM_DW if output == "dw" else 1.0)
    return STEM_CALL + (sums + COPY * phase_rows) / CORES


def small_cols(p, output: str) -> float:
    """``small-cols``: the small path's estimate plus ``Rates.small_cols_call`` (its Python steps in a model)."""
    return small(p, output) + rates().small_cols_call


#: the path table's name (paths.PATHS) -> estimate(p, output)
ESTIMATES = {"small-c": small, "small-cols": small_cols, "colgemm": colgemm, "dense": dense, "small-c-blocks": grid,
             "pointwise": pointwise, "grid-forward": blas_grid, "stem": stem}


def together(p, name: str) -> float:
    """Estimated seconds of dx and dw in one call of path ``name`` (the dense loops or colgemm): the two outputs'
    estimates less what one call shares between them: its fixed cost per call, and for colgemm its channel-major
    copy of dy (each output's estimate counts it; the columns are not shared: dw builds x's, dx folds its own back)."""
    both = ESTIMATES[name](p, "dx") + ESTIMATES[name](p, "dw")
    if name != "colgemm":
        return both - CALL
    N, Cg, Cog, g, K, Q = _sizes(p)
    return both - CALL - COPY * g * Cog * N * Q / _colgemm_blocks(p)


def backward_pair(p, dx_candidates, dw_candidates) -> tuple[str, str]:
    """(dx's path, dw's path) of a backward of ``p``, the full call's whatever the mask: each output's cheapest on its
    own, unless they are the dense loops and colgemm and one of the two, where it can run both, costs less for both
    together (:func:`together`) than the two apart plus ``Rates.split_call`` (:data:`SPLIT_CALL`); ties keep them
    apart. Other pairs stay apart: above all the stem loops' weight gradient, a first layer's only gradient. Kinds
    without ``split_call`` (None) keep each output's own cheapest."""
    a, b = cheapest(p, "dx", dx_candidates), cheapest(p, "dw", dw_candidates)
    split = rates().split_call
    if a == b or {a, b} != {"dense", "colgemm"} or split is None:
        return a, b
    apart = ESTIMATES[a](p, "dx") + ESTIMATES[b](p, "dw") + split
    shared = [name for name in ("dense", "colgemm") if name in dx_candidates and name in dw_candidates]
    best = min(shared, key=lambda name: together(p, name), default=None)
    if best is not None and together(p, best) < apart:
        return best, best
    return a, b


def cheapest(p, output: str, candidates) -> str:
    """The candidate (path names of :data:`ESTIMATES`) with the least estimated time for ``output``; ties go to
    the earlier one."""
    return min(candidates, key=lambda name: ESTIMATES[name](p, output))
