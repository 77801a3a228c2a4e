"""The small-call paths without the compiled loops (installed without a C compiler, or ``XCONV_NUMPY_C=0``):
``small-grid`` (stride 1: the columns as one strided copy of a zero-padded grid, :class:`small.Grid`) and
``small-gather`` (any stride: ``cols = x[:, fidx]`` from index tables planned once per configuration), each
with one matrix product per output. Inputs finite (:mod:`.small`).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES, accumulation_dtype

from .plans import per_params
from .small import from_channel_major, grids, plan


def _geometry(p: ConvParams):
    k = p.kernel
    K = math.prod(k)
    taps = np.array(list(np.ndindex(*k)), np.int64).reshape(K, len(k))        # (K, nd)
    pre = np.array([a for a, _ in p.padding], np.int64)
    return taps, pre, np.array(p.stride, np.int64), np.array(p.dilation, np.int64)


@per_params
def fidx(p: ConvParams) -> np.ndarray:
    """fprop / dW: per tap and output position (all samples), the input position read, or N*P (the zero)."""
    f = plan(p)
    taps, pre, st, dl = _geometry(p)
    S, O = p.input_shape[2:], p.output_shape[2:]
    opos = np.array(list(np.ndindex(*O)), np.int64).reshape(f.Q, len(O))
    ipos = opos[None] * st + taps[:, None] * dl - pre                               # (K, Q, nd)
    inside = np.all((ipos >= 0) & (ipos < np.array(S)), axis=2)
    flat = np.ravel_multi_index(tuple(np.clip(ipos, 0, np.array(S) - 1).transpose(2, 0, 1)), S)
    return _per_sample(np.where(inside, flat, -1), f.N, f.P)


@per_params
def bidx(p: ConvParams) -> np.ndarray:
    """dx: per tap and input position (all samples), the output position whose tap reads it, or N*Q."""
    f = plan(p)
    taps, pre, st, dl = _geometry(p)
    S, O = p.input_shape[2:], p.output_shape[2:]
    ip = np.array(list(np.ndindex(*S)), np.int64).reshape(f.P, len(S))
    o, rem = np.divmod(ip[None] + pre - taps[:, None] * dl, st)                    # (K, P, nd)
    ok = np.all((rem == 0) & (o >= 0) & (o < np.array(O)), axis=2)
    flat = np.ravel_multi_index(tuple(np.clip(o, 0, np.array(O) - 1).transpose(2, 0, 1)), O)
    return _per_sample(np.where(ok, flat, -1), f.N, f.Q)


def _per_sample(idx: np.ndarray, N: int, n: int) -> np.ndarray:
    """(K, M) positions within one sample (-1: none) as (K, N*M) flat positions in a (N*n + 1) row whose
    last element is the zero."""
    K, M = idx.shape
    flat = idx[:, None, :] + (np.arange(N, dtype=np.int64) * n)[None, :, None]
    flat = np.where(idx[:, None, :] < 0, N * n, flat)
    out = np.ascontiguousarray(flat.reshape(K, N * M).astype(np.intp))
    out.flags.writeable = False
    return out


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


# ---------------------------------------------------------------------------------------------
# The calls


def grid_fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias at stride 1 (``small-grid``)."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)
    xg, _, _ = grids(p)
    cols = xg.columns(xg.fill(x, f.N, f.C, p.input_shape[2:], cdt), f.N, f.g)
    y = np.matmul(np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K), cols)        # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    return xg.crop(y, f.N, p.output_shape, DTYPES[p.dtype])


def gather_fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias, any stride (``small-gather``)."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)
    cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), fidx(p), f.g)
    y = np.matmul(np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K), cols)        # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    return from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype])


def grid_backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw) at stride 1 (``small-grid``), None where not needed."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    xg, dyg, keep = grids(p)
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
        wf = np.ascontiguousarray(w, cdt).reshape((f.g, f.Cog, f.Cg) + tuple(p.kernel))[flip]
        wt = np.ascontiguousarray(wf.swapaxes(1, 2)).reshape(f.g, f.Cg, f.Cog * f.K)
        dx = dyg.crop(np.matmul(wt, cols), f.N, p.input_shape, out_dt)
    return dx, dw


def gather_backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw), any stride (``small-gather``), None where not needed."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    dyc = _channel_major(dy, f.N, f.Co, f.Q, cdt)                  # (Co, N*Q + 1)
    dx = dw = None
    if need_dw:
        cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), fidx(p), f.g)     # (g, Cg*K, N*Q)
        dyg = dyc[:, :f.N * f.Q].reshape(f.g, f.Cog, f.N * f.Q)
        dw = np.matmul(dyg, cols.transpose(0, 2, 1)).reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        cols_dy = _columns(dyc, bidx(p), f.g)                       # (g, Cog*K, N*P)
        wt = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg, f.K).transpose(0, 2, 1, 3).reshape(
            f.g, f.Cg, f.Cog * f.K)
        dx = from_channel_major(np.matmul(wt, cols_dy), f.N, p.input_shape, out_dt)
    return dx, dw
