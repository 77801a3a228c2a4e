"""Small calls: one gather and one matrix product per gradient, from index tables planned once per configuration.

At digits sizes (8x8 images, a few channels) a call's time is its per-call work in Python, not its
arithmetic: the grid path of :mod:`.fast` plans chunks, leases scratch and runs workers for a few
thousand multiply-adds. Here each configuration's plan (cached) holds two index tables, and a call is
a fixed handful of NumPy operations, on the calling thread:

- ``x`` is copied channel-major, ``(C, N*P + 1)`` (P input positions per sample), its last column
  zero; the table ``fidx`` (K taps x N x Q output positions) gives, per tap and output position,
  the flat input position it reads, or that zero (padding). ``cols = x[:, fidx]`` is the im2col
  matrix ``(groups, C/g * K, N*Q)``; ``y = W @ cols`` (W as stored, ``(groups, C_out/g, C/g * K)``)
  and ``dW = dy @ cols^T`` with dy copied channel-major ``(C_out, N*Q + 1)``.
- ``dx`` gathers dy the same way: ``bidx`` gives, per tap and input position, the output position
  whose tap reads it (when the stride divides), or the zero column; ``dx = W' @ cols_dy`` with
  ``W'`` the weight transposed to ``(groups, C/g, C_out/g * K)``.

Each sum has the compute dtype (float32, float64 for float64) and a fixed order for given shapes, so
results are bitwise reproducible. The zeros multiply weights and dy values (0 * inf is NaN), so the
backend sends backward calls with non-finite inputs to :mod:`.columns` before this path (as for the
grid). :func:`serves` takes calls whose gathered matrices are small (:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES, accumulation_dtype

#: Calls whose largest gathered matrix (x or dy columns) holds at most this many elements run here (measured on
#: the digits layers: 1.5-6x faster than the grid path up to 590k elements, the grouped 32x16x8x8 layer).
MAX_ELEMENTS = 1 << 20
#: Use (True), never use (False) or choose by size (None) this path for the calls it can compute.
ENABLED = None


def serves(p: ConvParams, need_dx: bool = False) -> bool:
    """Whether ``p`` (direct, not empty) is small enough for this path (see the module docstring)."""
    if ENABLED is False or p.transposed or min(p.input_shape) == 0 or p.output_shape[1] == 0:
        return False
    return ENABLED is True or _elements(p, need_dx) <= MAX_ELEMENTS


def _elements(p: ConvParams, need_dx: bool) -> int:
    K, N = math.prod(p.kernel), p.input_shape[0]
    x_cols = p.input_shape[1] * K * N * math.prod(p.output_shape[2:])
    dy_cols = p.output_shape[1] * K * N * math.prod(p.input_shape[2:]) if need_dx else 0
    return max(x_cols, dy_cols)


class _Plan:
    """The sizes of one configuration, and its index tables (built on first use, read only; the stride-1
    grid columns need none)."""

    def __init__(self, p: ConvParams):
        N, C = p.input_shape[:2]
        Co = p.output_shape[1]
        self.p = p
        self.g = g = p.groups
        self.N, self.C, self.Co, self.Cg, self.Cog = N, C, Co, C // g, Co // g
        self.K = math.prod(p.kernel)
        self.P, self.Q = math.prod(p.input_shape[2:]), math.prod(p.output_shape[2:])

    def _geometry(self):
        p = self.p
        k = p.kernel
        taps = np.array(list(np.ndindex(*k)), np.int64).reshape(self.K, len(k))        # (K, nd)
        pre = np.array([a for a, _ in p.padding], np.int64)
        return taps, pre, np.array(p.stride, np.int64), np.array(p.dilation, np.int64)

    @functools.cached_property
    def fidx(self) -> np.ndarray:
        """fprop / dW: per tap and output position (all samples), the input position read, or N*P (the zero)."""
        taps, pre, st, dl = self._geometry()
        S, O = self.p.input_shape[2:], self.p.output_shape[2:]
        opos = np.array(list(np.ndindex(*O)), np.int64).reshape(self.Q, len(O))
        ipos = opos[None] * st + taps[:, None] * dl - pre                               # (K, Q, nd)
        inside = np.all((ipos >= 0) & (ipos < np.array(S)), axis=2)
        flat = np.ravel_multi_index(tuple(np.clip(ipos, 0, np.array(S) - 1).transpose(2, 0, 1)), S)
        return _per_sample(np.where(inside, flat, -1), self.N, self.P)

    @functools.cached_property
    def bidx(self) -> np.ndarray:
        """dx: per tap and input position (all samples), the output position whose tap reads it, or N*Q."""
        taps, pre, st, dl = self._geometry()
        S, O = self.p.input_shape[2:], self.p.output_shape[2:]
        ip = np.array(list(np.ndindex(*S)), np.int64).reshape(self.P, len(S))
        o, rem = np.divmod(ip[None] + pre - taps[:, None] * dl, st)                    # (K, P, nd)
        ok = np.all((rem == 0) & (o >= 0) & (o < np.array(O)), axis=2)
        flat = np.ravel_multi_index(tuple(np.clip(o, 0, np.array(O) - 1).transpose(2, 0, 1)), O)
        return _per_sample(np.where(ok, flat, -1), self.N, self.Q)


def _per_sample(idx: np.ndarray, N: int, n: int) -> np.ndarray:
    """(K, M) positions within one sample (-1: none) as (K, N*M) flat positions in a (N*n + 1) row whose
    last element is the zero."""
    K, M = idx.shape
    flat = idx[:, None, :] + (np.arange(N, dtype=np.int64) * n)[None, :, None]
    flat = np.where(idx[:, None, :] < 0, N * n, flat)
    out = np.ascontiguousarray(flat.reshape(K, N * M).astype(np.intp))
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=16)         # index tables: up to 8 bytes per column of a call (< 16 MiB each)
def _plan(p: ConvParams) -> _Plan:
    return _Plan(p)


def _channel_major(t: np.ndarray, N: int, C: int, n: int, cdt) -> np.ndarray:
    """``t`` (N, C, *spatial) as a (C, N*n + 1) array of the compute dtype, its last column zero."""
    out = np.empty((C, N * n + 1), cdt)
    out[:, :N * n].reshape(C, N, n)[...] = t.reshape(N, C, n).transpose(1, 0, 2)
    out[:, N * n] = 0
    return out


def _columns(src: np.ndarray, idx: np.ndarray, g: int) -> np.ndarray:
    """src (C, ...) gathered at idx (K, M): (g, C/g * K, M), rows channel-major then tap."""
    C = src.shape[0]
    return np.take(src, idx, axis=1).reshape(g, (C // g) * idx.shape[0], idx.shape[1])


def _from_channel_major(a: np.ndarray, N: int, shape, dt) -> np.ndarray:
    """(g, C/g, N*n) as an (N, C, *spatial) array of dtype ``dt``."""
    out = np.empty(shape, dt)
    C = shape[1]
    out.reshape(N, C, -1)[...] = a.reshape(C, N, -1).transpose(1, 0, 2)
    return out


# ---------------------------------------------------------------------------------------------
# Stride 1: the columns as one strided copy of a zero-padded grid (long contiguous runs), not a gather


class _Grid:
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
        out = np.empty(shape, dt)
        out[...] = grid[(slice(None), slice(None)) + tuple(slice(0, n) for n in shape[2:])].swapaxes(0, 1)
        return out


def _unit_stride(p: ConvParams) -> bool:
    return all(s == 1 for s in p.stride)


@functools.lru_cache(maxsize=64)
def _grids(p: ConvParams):
    """(x grid, dy grid for dx) of a stride-1 convolution (see _Grid)."""
    S, O, k, d = p.input_shape[2:], p.output_shape[2:], p.kernel, p.dilation
    pre = [a for a, _ in p.padding]
    xg = _Grid([n + a + b for n, (a, b) in zip(S, p.padding)], pre, k, d, [0] * len(S), O[0])
    # dx[i] = sum_t dyp[B + i + t*d] w[k-1-t], dy at A in dyp: A = max(0, (k-1)d - pre), B = pre + A - (k-1)d
    A = [max(0, (kk - 1) * dd - a) for kk, dd, a in zip(k, d, pre)]
    B = [a + aa - (kk - 1) * dd for a, aa, kk, dd in zip(pre, A, k, d)]
    dims = [b + n + (kk - 1) * dd for b, n, kk, dd in zip(B, S, k, d)]
    dyg = _Grid(dims, A, k, d, B, S[0])
    keep = [min(o, L - a) for o, L, a in zip(O, dims, A)]        # dy beyond: reads only padding, adds nothing
    return xg, dyg, keep


def fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias."""
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    if _unit_stride(p):
        xg, _, _ = _grids(p)
        cols = xg.columns(xg.fill(x, f.N, f.C, p.input_shape[2:], cdt), f.N, f.g)
    else:
        cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), f.fidx, f.g)
    wm = np.asarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K)
    y = np.matmul(wm, cols)                                        # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    if _unit_stride(p):
        return xg.crop(y, f.N, p.output_shape, DTYPES[p.dtype])
    return _from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype])


def _backward_unit_stride(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    xg, dyg, keep = _grids(p)
    dx = dw = None
    if need_dw:
        cols = xg.columns(xg.fill(x, f.N, f.C, p.input_shape[2:], cdt), f.N, f.g)     # (g, Cg*K, N*R)
        # dy on the x grid's output positions (zeros at the others): (Co, N, O_1, *Sp[1:])
        dz = np.zeros((f.Co, f.N, xg.rows), cdt)
        dz.reshape((f.Co, f.N, p.output_shape[2]) + xg.dims[1:])[
            (slice(None), slice(None)) + tuple(slice(0, o) for o in p.output_shape[2:])] = dy.swapaxes(0, 1)
        dw = np.matmul(dz.reshape(f.g, f.Cog, f.N * xg.rows), cols.transpose(0, 2, 1))
        dw = dw.reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        cols = dyg.columns(dyg.fill(dy, f.N, f.Co, keep, cdt), f.N, f.g)               # (g, Cog*K, N*R')
        nd = p.nd
        flip = (Ellipsis,) + (slice(None, None, -1),) * nd                                  # taps reversed
        wf = np.asarray(w, cdt).reshape((f.g, f.Cog, f.Cg) + tuple(p.kernel))[flip]
        wt = np.ascontiguousarray(wf.swapaxes(1, 2)).reshape(f.g, f.Cg, f.Cog * f.K)
        dx = dyg.crop(np.matmul(wt, cols), f.N, p.input_shape, out_dt)
    return dx, dw


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw), None where not needed."""
    if _unit_stride(p):
        return _backward_unit_stride(dy, x, w, p, need_dx, need_dw)
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    dyc = _channel_major(dy, f.N, f.Co, f.Q, cdt)                  # (Co, N*Q + 1)
    dx = dw = None
    if need_dw:
        cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), f.fidx, f.g)     # (g, Cg*K, N*Q)
        dyg = dyc[:, :f.N * f.Q].reshape(f.g, f.Cog, f.N * f.Q)
        dw = np.matmul(dyg, cols.transpose(0, 2, 1)).reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        cols_dy = _columns(dyc, f.bidx, f.g)                       # (g, Cog*K, N*P)
        wt = np.asarray(w, cdt).reshape(f.g, f.Cog, f.Cg, f.K).transpose(0, 2, 1, 3).reshape(
            f.g, f.Cg, f.Cog * f.K)
        dx = _from_channel_major(np.matmul(wt, cols_dy), f.N, p.input_shape, out_dt)
    return dx, dw
