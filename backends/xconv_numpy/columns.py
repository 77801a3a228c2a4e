"""The fast path's fallback: the reference's chunked im2col (:mod:`.reference`) in the compute dtype.

The polyphase grid of :mod:`.fast` (and the compiled and depthwise loops on it) serves badly:

- geometries with more than :data:`MAX_PHASES` phases (a patch embedding with kernel = stride = 64
  has 4096, each a grid and buffers of its own), strides whose product exceeds
  :data:`MAX_STRIDE_PRODUCT` (each phase holds few positions; the depthwise loops' scratch grows with
  stride_h x stride_w), kernels of more than :data:`MAX_GRID_TAPS` taps (planned per tap, in Python),
  grids more than :data:`MAX_GRID_RATIO` times larger than the input and output (a padding or
  dilation far beyond the input: 10^9 made the grid ask for exabytes);
- non-finite inputs to a backward call: the grid paths multiply zeros that the definition never
  multiplies (garbage grid positions, taps past the edge of dy), so an infinity there would become a
  NaN the reference does not have (docs/semantics.md, "NaN and infinity"). The pointwise geometry
  (1x1, stride 1, no padding) multiplies only terms of the sums and keeps its own path.

Those run here: im2col chunks of output rows, one matrix product per group and chunk, in the compute
dtype (float32, float64 for float64), memory bounded by the reference's chunk size.
"""

from __future__ import annotations

import math

from xconv import ConvParams
from xconv.dtypes import accumulation_dtype

from . import reference
from .finite import all_finite
from .grid.geometry import grid_lengths
from .blas import single_threaded_blas as pinned_blas_workers
from .plans import per_params

#: Geometries with more polyphase phases than this run here.
MAX_PHASES = 16
#: ... and so do strides whose product exceeds this.
MAX_STRIDE_PRODUCT = 64
#: ... and kernels of more taps than this.
MAX_GRID_TAPS = 4096
#: ... and grids (per sample and channel) larger than this many times the input plus output positions
#: (a padding or dilation far beyond the input: the grid would hold mostly padding).
MAX_GRID_RATIO = 16


def n_phases(p: ConvParams) -> int:
    """The number of polyphase phases of ``p``: per dim, the distinct residues j*d mod s of the taps."""
    return math.prod(min(k, s // math.gcd(s, d)) for k, s, d in zip(p.kernel, p.stride, p.dilation))


@per_params
def serves(p: ConvParams) -> bool:
    """Whether ``p``'s geometry runs here rather than on the grid."""
    grid = math.prod(grid_lengths(p))
    positions = math.prod(p.input_shape[2:]) + math.prod(p.output_shape[2:])
    return (n_phases(p) > MAX_PHASES or math.prod(p.stride) > MAX_STRIDE_PRODUCT
            or math.prod(p.kernel) > MAX_GRID_TAPS or grid > MAX_GRID_RATIO * positions + 4096)


def _pointwise(p: ConvParams) -> bool:
    return math.prod(p.kernel) == 1 and set(p.stride) == {1} and all(a == b == 0 for a, b in p.padding)


def has_nonfinite(p: ConvParams, dy, x, w) -> bool:
    """Whether a grid-path backward call must run here instead because dy, x or w (None: not read) hold a
    NaN or an infinity (the grid multiplies zeros the definition never multiplies). The check is one pass over each
    (:mod:`.finite`); the pointwise path multiplies only real terms."""
    if _pointwise(p):
        return False
    cdt = accumulation_dtype(p.dtype)
    return not all(all_finite(a, cdt) for a in (dy, w, x))


def fprop(x, w, bias, p: ConvParams):
    with pinned_blas_workers():
        return reference.fprop(x, w, bias, p, accumulation_dtype(p.dtype))


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw), None where not needed."""
    cdt = accumulation_dtype(p.dtype)
    with pinned_blas_workers():
        return (reference.dgrad(dy, w, p, cdt) if need_dx else None,
                reference.wgrad(x, dy, p, cdt) if need_dw else None)
