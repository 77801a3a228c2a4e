"""Small calls: which calls are small, and what every small-call path shares (sizes, grids, layouts).

At digits sizes (8x8 images, a few channels) a call's time is its per-call work, not its arithmetic: the
grid engine plans chunks, leases scratch and runs workers for a few thousand multiply-adds. A small call is
a few C loops or a handful of NumPy operations on the calling thread, planned once per configuration. Four
paths of the table (:mod:`.paths`) compute small calls; :func:`paths.choose` picks among them:

- ``small-c`` (:mod:`.small_c`, csrc/small_grid.c), stride 1: x (and dy, for dx) copied onto zero-padded
  channel-major grids (:class:`Grid`), on which every tap is a fixed flat offset; y, dx (dy's grid with the
  kernel flipped), dW and db are vector loops over consecutive grid positions in one C call;
- ``small-cols`` (:mod:`.small_c`, csrc/small_cols.c), any stride: x's im2col columns by one C loop,
  ``y = W @ cols`` and ``dW = dy @ cols^T`` by BLAS, ``dx`` by ``W^T @ dy`` and a C col2im;
- ``small-grid`` (:mod:`.small_numpy`), stride 1 without the compiled loops: the grid's columns by one
  strided NumPy copy;
- ``small-gather`` (:mod:`.small_numpy`), any stride without the compiled loops: ``cols = x[:, fidx]``
  from index tables per configuration.

Each sum has the compute dtype (float32, float64 for float64) and a fixed order for given shapes and build,
so results are bitwise reproducible. The grids multiply zeros the definition never multiplies (0 * inf is NaN), so
calls with non-finite inputs run in :mod:`.columns` instead: ``small-c`` checks what it reads on the way and says
so; for ``small-grid`` and ``small-gather`` the backend checks first. ``small-cols`` keeps them: its columns are the
definition's windows of x_pad (padding zeros are terms there too) and its dx adds back only the terms that land
inside x. :func:`serves` takes calls whose im2col matrices would be small
(:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams

from . import native
from .aligned import empty_result
from .grid.geometry import padded
from .plans import per_params

#: Calls whose largest gathered matrix (x or dy columns) holds at most this many elements run here (measured on
#: the digits layers: 1.5-6x faster than the grid path up to 590k elements, the grouped 32x16x8x8 layer).
MAX_ELEMENTS = 1 << 20


def computes(p: ConvParams) -> bool:
    """Whether this path can compute ``p``: direct, not empty."""
    return not (p.transposed or min(p.input_shape) == 0 or p.output_shape[1] == 0)


def serves(p: ConvParams, need_dx: bool = False) -> bool:
    """Whether ``p`` is small enough for this path (see the module docstring; ``paths.force("small-paths")`` takes it
    for all it computes)."""
    return computes(p) and elements(p, need_dx) <= MAX_ELEMENTS


#: One input channel per group and at least this many outputs per input channel: the small path's compiled
#: loops beat the depthwise ones (a (32, 1, 8, 8) input to 16 or 32 channels: 1.1-4x faster, measured).
DEPTHWISE_MULTIPLIER = 8


#: A depthwise-shaped call's input gradient at a stride above 1 runs here (x's columns, ``W^T @ dy``) only up to this
#: many multiply-adds; past it dy's columns count, as at stride 1, and the depthwise loops keep it (two threads, Intel
#: Xeon, ms, dx and dw, small-cols or the model's pick against the depthwise loops: the digits model's transposed
#: 4x4 stride 2, 64x1x8x8 -> 32, 2^19 multiply-adds, 0.19 vs 0.45; 32x1x28x28 -> 32 k3 s2, 1.8M, 0.46 vs 0.36;
#: 64x1x28x28 -> 32 k5 s2 2.4 vs 1.37; 4x1x16000 -> 512 k10 s5 10.4 vs 7.2).
DEPTHWISE_DX_MACS = 1 << 19


def macs(p: ConvParams) -> int:
    """Multiply-adds of one output of ``p`` (forward, dx or dw: the same count)."""
    N, C = p.input_shape[:2]
    return N * math.prod(p.output_shape[1:]) * (C // p.groups) * math.prod(p.kernel)


def before_depthwise(p: ConvParams, need_dx: bool = False) -> bool:
    """Whether a depthwise-shaped ``p`` (one input channel per group) runs here rather than in the depthwise loops:
    many outputs per input channel, small (for dx past :data:`DEPTHWISE_DX_MACS` multiply-adds: dy's columns count,
    whatever the stride), and the compiled copies built."""
    every = need_dx and macs(p) > DEPTHWISE_DX_MACS
    return (p.output_shape[1] >= DEPTHWISE_MULTIPLIER * p.input_shape[1] and compiled_available()
            and computes(p) and elements(p, need_dx, every_path=every) <= MAX_ELEMENTS)


def elements(p: ConvParams, need_dx: bool, every_path: bool = False) -> int:
    """Elements of the call's largest im2col matrix: x's columns, or dy's (for dx) when ``need_dx`` and the small path
    that runs the call computes dx from dy: at stride 1 (``small-c``, ``small-grid``: dy's grid) or without the
    compiled copies (``small-gather``: dy's columns); ``small-cols`` (any stride, the copies built) computes dx as
    ``W^T @ dy`` in x's columns' shape and adds it back (a transposed 4x4 stride-2 32 -> 1 at 64x4x4, the dx of a
    64x1x8x8 -> 32: 2.1M elements of dy's columns, 16K of x's; 0.14 ms there against the depthwise loops' 0.31).
    ``every_path``: dy's columns whatever the path (the memory bound of any small path)."""
    K, N = math.prod(p.kernel), p.input_shape[0]
    x_cols = p.input_shape[1] * K * N * math.prod(p.output_shape[2:])
    from_dy = every_path or unit_stride(p) or not compiled_available()
    dy_cols = p.output_shape[1] * K * N * math.prod(p.input_shape[2:]) if need_dx and from_dy else 0
    return max(x_cols, dy_cols)


#: The switch of the compiled copies (the settings field of ``$XCONV_NUMPY_C``; off: ``small-grid`` and ``small-gather`` serve).
SWITCH = "numpy_c"


def compiled_available() -> bool:
    """Whether the compiled column copies serve (built at install, not disabled by XCONV_NUMPY_C=0)."""
    return native.part_on(SWITCH)


def unit_stride(p: ConvParams) -> bool:
    return all(s == 1 for s in p.stride)


def grid_compiled(p: ConvParams) -> bool:
    """Whether ``p`` can run as one C call on zero-padded grids (stride 1, loops built: the path ``small-c``),
    the call that checks its inputs for infinities and NaNs itself and uses no BLAS."""
    return unit_stride(p) and compiled_available()


class Plan:
    """The sizes of one configuration."""

    def __init__(self, p: ConvParams):
        N, C = p.input_shape[:2]
        Co = p.output_shape[1]
        self.p = p
        self.g = g = p.groups
        self.N, self.C, self.Co, self.Cg, self.Cog = N, C, Co, C // g, Co // g
        self.K = math.prod(p.kernel)
        self.P, self.Q = math.prod(p.input_shape[2:]), math.prod(p.output_shape[2:])


@per_params
def plan(p: ConvParams) -> Plan:
    return Plan(p)


def from_channel_major(a: np.ndarray, N: int, shape, dt, out: np.ndarray | None = None) -> np.ndarray:
    """(g, C/g, N*n) as an (N, C, *spatial) array of dtype ``dt``: ``out`` (C-contiguous, that shape and dtype) when
    given, else a new one."""
    if out is None:
        out = empty_result(shape, dt)
    C = shape[1]
    _swap_rows(a.reshape(C, N, -1), out.reshape(N, C, -1))
    return out


def channel_major_into(t: np.ndarray, out: np.ndarray) -> None:
    """out (C, N, n) = t (N, C, spatial) with its first two axes swapped (in out's dtype)."""
    _swap_rows(t.reshape(out.shape[1], out.shape[0], -1), out)


def dy_channel_major(dy: np.ndarray, f: Plan, cdt, empty=np.empty) -> np.ndarray:
    """dy as (g, C_out/g, N * Q) in the compute dtype, in a new array ``empty(shape, dtype)``."""
    out = empty((f.Co, f.N, f.Q), cdt)
    _swap_rows(dy.reshape(f.N, f.Co, f.Q), out)
    return out.reshape(f.g, f.Cog, f.N * f.Q)


def _swap_rows(src: np.ndarray, dst: np.ndarray) -> None:
    """dst[j, i] = src[i, j] for an (A, B, n) src and a (B, A, n) C-contiguous dst: where both hold one dtype and src
    is C-contiguous, rows of n elements move whole (one ``void`` item each: 2-5x NumPy's element-wise transposing copy
    for rows of 4-16 elements), else element by element (casting). A copy either way: the same values."""
    if src.dtype == dst.dtype and src.flags.c_contiguous and dst.flags.c_contiguous and dst.size:
        row = np.dtype((np.void, src.itemsize * dst.shape[2]))
        dst.view(row)[:, :, 0] = src.view(row)[:, :, 0].T
    else:
        dst[...] = src.transpose(1, 0, 2)


# ---------------------------------------------------------------------------------------------
# Stride 1: zero-padded grids, on which a tap is a fixed flat offset


class Grid:
    """A zero-padded channel-major grid ``(C, (N + 1) * size)`` of one tensor, and its tap windows.

    Per sample the grid holds ``dims`` (per dim: the tensor at ``at``, zeros around it), flattened;
    one more sample of zeros follows (the windows of the last sample read into it). A stride-1
    correlation with kernel ``k`` and dilation ``d`` reads tap t at flat offset sum t_i d_i gs_i, so
    its columns for ``rows`` positions per sample, from offset ``base``, are one strided view.
    """

    def __init__(self, dims, at, k, d, base_at, rows_first: int):
        self.dims, self.at = tuple(dims), tuple(at)
        self.gs = [math.prod(self.dims[i + 1:]) for i in range(len(self.dims))]
        self.size = math.prod(self.dims)
        self.tap = [dd * g for dd, g in zip(d, self.gs)]
        self.k = tuple(k)
        self.base = sum(b * g for b, g in zip(base_at, self.gs))
        self.rows = rows_first * self.gs[0]                 # positions per sample (first dim, whole rows)

    def fill(self, t: np.ndarray, N: int, C: int, keep, cdt) -> np.ndarray:
        buf = np.zeros((C, (N + 1) * self.size), cdt)
        view = buf[:, :N * self.size].reshape((C, N) + self.dims)
        view[(slice(None), slice(None)) + tuple(slice(a, a + n) for a, n in zip(self.at, keep))] = \
            t[(slice(None), slice(None)) + tuple(slice(0, n) for n in keep)].swapaxes(0, 1)
        return buf

    def columns(self, buf: np.ndarray, N: int, g: int) -> np.ndarray:
        """(g, C/g * K, N * rows): channel-major, then tap, then sample and position."""
        C, it = buf.shape[0], buf.itemsize
        view = np.lib.stride_tricks.as_strided(buf[:, self.base:], shape=(C,) + self.k + (N, self.rows),
                                               strides=(buf.strides[0],) + tuple(o * it for o in self.tap)
                                               + (self.size * it, it), writeable=False)
        cols = np.empty(view.shape, buf.dtype)
        np.copyto(cols, view)
        return cols.reshape(g, (C // g) * math.prod(self.k), N * self.rows)

    def crop(self, a: np.ndarray, N: int, shape, dt) -> np.ndarray:
        """(g, C/g, N * rows) positions of this grid as an (N, C, *spatial) array (spatial = shape[2:])."""
        C = shape[1]
        grid = a.reshape((C, N, self.rows // self.gs[0]) + self.dims[1:])
        out = empty_result(shape, dt)
        out[...] = grid[(slice(None), slice(None)) + tuple(slice(0, n) for n in shape[2:])].swapaxes(0, 1)
        return out


@per_params
def grids(p: ConvParams):
    """(x grid, dy grid for dx) of a stride-1 convolution (see Grid)."""
    S, O, k, d = p.input_shape[2:], p.output_shape[2:], p.kernel, p.dilation
    pre = [a for a, _ in p.padding]
    xg = Grid(padded(p), pre, k, d, [0] * len(S), O[0])
    # dx[i] = sum_t dyp[B + i + t*d] w[k-1-t], dy at A in dyp: A = max(0, (k-1)d - pre), B = pre + A - (k-1)d
    A = [max(0, (kk - 1) * dd - a) for kk, dd, a in zip(k, d, pre)]
    B = [a + aa - (kk - 1) * dd for a, aa, kk, dd in zip(pre, A, k, d)]
    dims = [b + n + (kk - 1) * dd for b, n, kk, dd in zip(B, S, k, d)]
    dyg = Grid(dims, A, k, d, B, S[0])
    keep = [min(o, L - a) for o, L, a in zip(O, dims, A)]        # dy beyond: reads only padding, adds nothing
    return xg, dyg, keep
