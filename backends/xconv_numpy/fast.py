"""The fast NumPy convolution: large BLAS matrix products on chunked, channel-major "grid" buffers.

:mod:`.reference` defines the math; this module computes the same sums, accumulating in float32
(float64 for float64 inputs), laid out for BLAS. See ``docs/numpy-backend.md`` for the design.

Layout. Per dim, the zero-padded input of length ``Sp = S + pre + post`` is split into ``stride``
phases: phase ``r`` holds ``x_pad[m*s + r]`` for ``m`` in ``[0, L)``, ``L = ceil(Sp / s)``. Tap ``j``
of the kernel reads ``x_pad[i*s + j*d] = phase_{r_j}[i + q_j]`` with ``(q_j, r_j) = divmod(j*d, s)``,
so every tap is a stride-1 shift of one phase. Each phase, the output gradient and the output are
stored on the same grid ``(N, L_1, ..., L_nd)`` flattened, channel-major: an array
``(groups, C/groups, positions)``. On that flat grid a tap is a constant offset
``off_j = sum_d q_j[d] * prod(L[d+1:])`` (positions past the end of a row read the next row; such
positions are "garbage": outside the real output, zero in the output-gradient grid and never
copied out). So a tap's shifted operand is a contiguous slice, and the convolution becomes

- strategy "dy-columns" (A): for each phase, stack the shifted slices of the dy grid for the taps
  of that phase (im2col of dy, ``(J*C_out/g, R)``), then one GEMM gives the phase's input gradient
  and one GEMM its taps' weight gradient: ``dx_p = W_p^T @ cols_p``, ``dW_p += cols_p @ x_p^T``;
- strategy "x-columns" (B): stack the shifted slices of the x phases (im2col of x,
  ``(K*C_in/g, R)``): ``dW += dy @ cols^T``, ``y = W @ cols`` (fprop) and, for the input gradient,
  ``Z = W^T @ dy`` followed by K shifted adds into the phase grids (col2im).

A picks the smaller stack when C_out/g <= C_in/g (the usual case); B when C_in/g is small (a stem
convolution with 3 input channels). Work is done in chunks of grid lines (whole samples when one
fits the working-set budget, else line ranges of one sample with halos carried between chunks),
so the extra memory stays within a budget proportional to the bytes of the call's operands.

Everything here is a fixed sequence of NumPy operations on shapes that depend only on the
convolution's parameters, so results are bitwise reproducible run to run.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES

#: Chunk buffers never exceed this many bytes (bigger chunks stop paying once they leave the cache).
MAX_CHUNK_BYTES = 32 << 20
#: Chunk buffers may use at least this many bytes even for tiny calls (below it chunking only adds overhead).
MIN_CHUNK_BYTES = 1 << 20
#: Chunk buffers get at most this fraction of the bytes of the call's inputs plus outputs.
BUDGET_FRACTION = 0.5


def compute_dtype(p: ConvParams) -> np.dtype:
    """float64 for float64 inputs, else float32 (float16 and bfloat16 are computed in float32)."""
    return np.dtype(np.float64) if p.dtype == "float64" else np.dtype(np.float32)


# ---------------------------------------------------------------------------------------------
# Geometry


class _Geom:
    """The grid, phases and taps of one direct convolution."""

    def __init__(self, p: ConvParams):
        self.p = p
        self.nd = nd = p.nd
        self.N, self.C_in = p.input_shape[:2]
        self.C_out = p.output_shape[1]
        self.g = g = p.groups
        self.Cg, self.Cog = self.C_in // g, self.C_out // g
        self.S, self.O, self.k = tuple(p.input_shape[2:]), tuple(p.output_shape[2:]), tuple(p.kernel)
        self.K = math.prod(self.k)
        s, d = p.stride, p.dilation
        pre = [a for a, _ in p.padding]
        Sp = [n + a + b for n, (a, b) in zip(self.S, p.padding)]
        self.L = L = tuple(-(-n // st) for n, st in zip(Sp, s))
        self.L1 = L[0]
        self.line = math.prod(L[1:])                       # grid positions per line (first grid dim)
        self.gstride = tuple(math.prod(L[i + 1:]) for i in range(nd))
        # per dim: residues used by some tap, in increasing order; taps as (j, q, r)
        per_dim = [[(j,) + divmod(j * d[i], s[i]) for j in range(self.k[i])] for i in range(nd)]
        residues = [sorted({r for _, _, r in taps}) for taps in per_dim]
        self.full_cover = all(len(res) == st for res, st in zip(residues, s))
        kstride = [math.prod(self.k[i + 1:]) for i in range(nd)]
        self.phases = []                                    # list of (r tuple, [(kflat, off), ...])
        for r in itertools.product(*residues):
            taps = []
            for combo in itertools.product(*[[t for t in per_dim[i] if t[2] == r[i]] for i in range(nd)]):
                kflat = sum(t[0] * kstride[i] for i, t in enumerate(combo))
                off = sum(t[1] * self.gstride[i] for i, t in enumerate(combo))
                taps.append((kflat, off))
            self.phases.append((r, taps))
        self.qmax1 = max(j * d[0] // s[0] for j in range(self.k[0]))
        max_off = max(off for _, taps in self.phases for _, off in taps)
        self.halo = -(-max_off // self.line) if self.line else 0   # halo lines covering every tap offset
        # valid grid ranges: (lo, hi, start, step) per dim; grid index m <-> tensor index start + (m-lo)*step
        self.x_valid = {}
        for r, _ in self.phases:
            rng = []
            for i in range(nd):
                lo = max(0, -((r[i] - pre[i]) // s[i]))
                hi = (self.S[i] - 1 + pre[i] - r[i]) // s[i] + 1
                rng.append((lo, max(lo, hi), lo * s[i] + r[i] - pre[i], s[i]))
            self.x_valid[r] = tuple(rng)
        self.y_valid = tuple((0, o, 0, 1) for o in self.O)

    def pieces(self, e0: int, e1: int):
        """Grid lines [e0, e1) (line e = n*L1 + m) inside the batch, as at most three blocks.

        Each block is (n0, n1, m0, m1, i0): lines [m0, m1) of samples n0..n1-1 (several samples
        only when m0 == 0 and m1 == L1), at line offset i0 from e0.
        """
        L1 = self.L1
        lo, hi = max(e0, 0), min(e1, self.N * L1)
        out = []
        e = lo
        while e < hi:
            n, m = divmod(e, L1)
            if m == 0 and hi - e >= L1:
                nb = (hi - e) // L1
                out.append((n, n + nb, 0, L1, e - e0))
                e += nb * L1
            else:
                m1 = min(L1, m + hi - e)
                out.append((n, n + 1, m, m1, e - e0))
                e += m1 - m
        return out


def _blocks(geo: _Geom, grid: np.ndarray, tensor: np.ndarray, e0: int, e1: int, valid):
    """Pairs (grid view, tensor view) of the valid positions of grid lines [e0, e1).

    ``grid`` is (G, C, (e1-e0)*line); ``tensor`` is (N, G, C, *spatial). The tensor view is
    transposed to the grid view's axis order (G, C, n, m, *rest).
    """
    G, C = grid.shape[:2]
    rest = geo.L[1:]
    out = []
    for n0, n1, m0, m1, i0 in geo.pieces(e0, e1):
        lo, hi, start, step = valid[0]
        a, b = max(m0, lo), min(m1, hi)
        if a >= b or any(v[1] <= v[0] for v in valid[1:]):
            continue
        nb, nl = n1 - n0, m1 - m0
        gv = grid[:, :, i0 * geo.line:(i0 + nb * nl) * geo.line].reshape((G, C, nb, nl) + rest)
        gv = gv[(slice(None),) * 3 + (slice(a - m0, b - m0),) + tuple(slice(v[0], v[1]) for v in valid[1:])]
        first = start + (a - lo) * step
        tsl = (slice(n0, n1), slice(None), slice(None), slice(first, first + (b - a - 1) * step + 1, step))
        tsl += tuple(slice(v[2], v[2] + (v[1] - v[0] - 1) * v[3] + 1, v[3]) for v in valid[1:])
        tv = tensor[tsl]
        out.append((gv, tv.transpose((1, 2, 0) + tuple(range(3, tv.ndim)))))
    return out


class _GridBuf:
    """A reusable grid buffer for lines [e0, e1) of one tensor; zeroed only where stale data could remain."""

    def __init__(self, geo: _Geom, G: int, C: int, lines: int, dtype):
        self.geo = geo
        self.buf = np.zeros((G, C, lines * geo.line), dtype=dtype)
        self.alignment = 0   # e0 mod L1 of the previous fill: same alignment => same garbage pattern

    def fill(self, tensor, e0: int, e1: int, valid):
        geo = self.geo
        grid = self.buf[:, :, :(e1 - e0) * geo.line]
        if (e0 - self.alignment) % geo.L1:
            grid.fill(0)
            self.alignment = e0 % geo.L1
        else:
            # lines outside the batch may hold data of an earlier chunk
            before = min(max(-e0, 0), e1 - e0)
            after = max(e1 - max(e0, geo.N * geo.L1), 0)
            if before:
                grid[:, :, :before * geo.line] = 0
            if after:
                grid[:, :, (e1 - e0 - after) * geo.line:] = 0
        for gv, tv in _blocks(geo, grid, tensor, e0, e1, valid):
            gv[...] = tv
        return grid


def _scatter(geo: _Geom, grid, tensor, e0: int, e1: int, valid):
    """Copy the valid positions of grid lines [e0, e1) into ``tensor`` (N, G, C, *spatial), casting."""
    for gv, tv in _blocks(geo, grid, tensor, e0, e1, valid):
        tv[...] = gv


# ---------------------------------------------------------------------------------------------
# Chunk planning


def _budget(nbytes: int) -> int:
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, BUDGET_FRACTION * nbytes)))


def _chunks(geo: _Geom, line_bytes: int, halo_lines: int, budget: int):
    """Line ranges [e0, e1) covering the batch, and the longest range's line count.

    Whole samples per chunk when one sample (plus halo) fits the budget, else equal line ranges
    of one sample.
    """
    L1, N = geo.L1, geo.N
    line_bytes = max(line_bytes, 1)
    if (L1 + halo_lines) * line_bytes <= budget:
        nb = max(1, min(N, (budget - halo_lines * line_bytes) // (L1 * line_bytes)))
        nb = -(-N // -(-N // nb))  # equal-sized sample ranges
        return [(n * L1, min(n + nb, N) * L1) for n in range(0, N, nb)], nb * L1
    nl = max(1, budget // line_bytes - halo_lines)
    nl = -(-L1 // -(-L1 // nl))  # equal-sized line ranges
    return [(n * L1 + a, n * L1 + min(a + nl, L1)) for n in range(N) for a in range(0, L1, nl)], nl


def _matmul(a, b, out):
    return np.matmul(a, b, out=out)


# ---------------------------------------------------------------------------------------------
# Weight layouts


def _w4(w, geo: _Geom, cdt):
    """w as (g, C_out/g, C_in/g, K) in the compute dtype (a view when possible)."""
    return w.astype(cdt, copy=False).reshape(geo.g, geo.Cog, geo.Cg, geo.K)


def _x4(t, G, C):
    """An (N, G*C, *spatial) tensor viewed as (N, G, C, *spatial)."""
    return t.reshape((t.shape[0], G, C) + t.shape[2:])


# ---------------------------------------------------------------------------------------------
# Primitives


def _strategy_a(geo: _Geom, need_dx: bool, need_dw: bool) -> bool:
    """Whether the dy-columns strategy (A) is cheaper than the x-columns one (B)."""
    if need_dx and not need_dw:
        return geo.Cog <= 2 * geo.Cg          # B also pays a col2im of K*Cg per position
    if need_dw and not need_dx:
        return geo.Cog <= geo.Cg
    return geo.Cog <= 2 * geo.Cg


def backward(dy, x, w, p: ConvParams, mask):
    """(dx, dw, db) of a direct convolution, None where the mask bit is False."""
    need_dx, need_dw, need_db = mask
    dx = dw = db = None
    if need_dx or need_dw:
        geo = _Geom(p)
        if _strategy_a(geo, need_dx, need_dw):
            dx, dw = _backward_a(geo, dy, x if need_dw else None, w, need_dx, need_dw)
        else:
            dx, dw = _backward_b(geo, dy, x if need_dw else None, w, need_dx, need_dw)
    if need_db:
        db = bgrad(dy, p)
    return dx, dw, db


def dgrad(dy, w, p: ConvParams):
    return backward(dy, None, w, p, (True, False, False))[0]


def wgrad(x, dy, p: ConvParams):
    return backward(dy, x, None, p, (False, True, False))[1]


def bgrad(dy, p: ConvParams):
    cdt = compute_dtype(p)
    axes = (0,) + tuple(range(2, dy.ndim))
    return np.ascontiguousarray(np.sum(dy, axis=axes, dtype=cdt).astype(DTYPES[p.dtype], copy=False))


def _io_bytes(geo: _Geom, itemsize: int, need_dx: bool, need_dw: bool, fprop: bool = False) -> int:
    xs = geo.N * geo.C_in * math.prod(geo.S)
    ys = geo.N * geo.C_out * math.prod(geo.O)
    ws = geo.C_out * geo.Cg * geo.K
    if fprop:
        return itemsize * (xs + ws + ys)
    return itemsize * (ys + (xs if need_dw else 0) + ws * (1 + need_dw) + (xs if need_dx else 0))


def _new_output(shape, p: ConvParams, zero: bool):
    dt = DTYPES[p.dtype]
    return np.zeros(shape, dt) if zero else np.empty(shape, dt)


def _finish_dw(geo: _Geom, p: ConvParams, parts):
    """Assemble per-tap-group weight gradients into (C_out, C_in/g, *k) of the output dtype.

    ``parts`` is a list of (kflat indices, array (g, Cog, Cg, J)).
    """
    dw = np.empty(p.weight_shape, DTYPES[p.dtype])
    view = dw.reshape(geo.g, geo.Cog, geo.Cg, geo.K)
    for kidx, arr in parts:
        if list(kidx) == list(range(geo.K)):
            view[...] = arr
        else:
            view[..., kidx] = arr
    return dw


def _backward_a(geo: _Geom, dy, x, w, need_dx: bool, need_dw: bool):
    p = geo.p
    cdt = compute_dtype(p)
    it = cdt.itemsize
    g, Cg, Cog, line, h = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo
    nph = len(geo.phases)
    Jmax = max(len(t) for _, t in geo.phases)
    # bytes per grid line: dy grid, columns, dx phase, x phases
    line_bytes = it * line * (g * Cog + g * Jmax * Cog + (g * Cg if need_dx else 0) + (nph * g * Cg if need_dw else 0))
    budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, need_dx, need_dw))
    chunks, lines = _chunks(geo, line_bytes, h, budget)
    R = lines * line
    dy4 = _x4(dy, g, Cog)
    dybuf = _GridBuf(geo, g, Cog, lines + h, cdt)
    cols_flat = np.empty((g, Jmax * Cog * R), cdt)
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover)
        dx4 = _x4(dx, g, Cg)
        dxbuf = np.empty((g, Cg, R), cdt)
        w4 = _w4(w, geo, cdt)
        wts = [np.ascontiguousarray(w4[..., [kf for kf, _ in taps]].transpose(0, 2, 3, 1)).reshape(g, Cg, -1)
               for _, taps in geo.phases]                                  # (g, Cg, J*Cog)
    if need_dw:
        x4 = _x4(x, g, Cg)
        xbufs = [_GridBuf(geo, g, Cg, lines, cdt) for _ in geo.phases]
        accs = [np.zeros((g, len(taps) * Cog, Cg), cdt) for _, taps in geo.phases]
        tmp = np.empty((g, Jmax * Cog, Cg), cdt) if len(chunks) > 1 else None
    for e0, e1 in chunks:
        rows = (e1 - e0) * line
        dyg = dybuf.fill(dy4, e0 - h, e1, geo.y_valid)
        for ip, (r, taps) in enumerate(geo.phases):
            J = len(taps)
            cols = cols_flat[:, :J * Cog * rows].reshape(g, J * Cog, rows)
            for jj, (_, off) in enumerate(taps):
                start = h * line - off
                cols[:, jj * Cog:(jj + 1) * Cog] = dyg[:, :, start:start + rows]
            if need_dx:
                dxg = dxbuf[:, :, :rows]
                _matmul(wts[ip], cols, dxg)
                _scatter(geo, dxg, dx4, e0, e1, geo.x_valid[r])
            if need_dw:
                xg = xbufs[ip].fill(x4, e0, e1, geo.x_valid[r])
                if e0 == chunks[0][0]:
                    _matmul(cols, xg.transpose(0, 2, 1), accs[ip])
                else:
                    t = tmp[:, :J * Cog]
                    _matmul(cols, xg.transpose(0, 2, 1), t)
                    accs[ip] += t
    dw = None
    if need_dw:
        parts = []
        for (r, taps), acc in zip(geo.phases, accs):
            arr = acc.reshape(g, len(taps), Cog, Cg).transpose(0, 2, 3, 1)
            parts.append(([kf for kf, _ in taps], arr))
        dw = _finish_dw(geo, p, parts)
    return (dx if need_dx else None), dw


def _x_columns(geo: _Geom, xgs, cols, rows):
    """Fill cols (g, K*Cg, rows) with each tap's shifted slice of its x phase grid (taps in phase order)."""
    Cg = geo.Cg
    jj = 0
    for (r, taps), xg in zip(geo.phases, xgs):
        for _, off in taps:
            cols[:, jj * Cg:(jj + 1) * Cg] = xg[:, :, off:off + rows]
            jj += 1


def _tap_order(geo: _Geom):
    return [kf for _, taps in geo.phases for kf, _ in taps]


def _backward_b(geo: _Geom, dy, x, w, need_dx: bool, need_dw: bool):
    p = geo.p
    cdt = compute_dtype(p)
    it = cdt.itemsize
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    line_bytes = it * line * (g * Cog + g * K * Cg + nph * g * Cg * (need_dx + need_dw))
    budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, need_dx, need_dw))
    chunks, lines = _chunks(geo, line_bytes, h, budget)
    R = lines * line
    order = _tap_order(geo)
    dy4 = _x4(dy, g, Cog)
    dybuf = _GridBuf(geo, g, Cog, lines, cdt)
    cols_flat = np.empty((g, K * Cg * R), cdt)
    if need_dw:
        x4 = _x4(x, g, Cg)
        xbufs = [_GridBuf(geo, g, Cg, lines + h, cdt) for _ in geo.phases]
        acc = np.zeros((g, Cog, K * Cg), cdt)
        tmp = np.empty_like(acc) if len(chunks) > 1 else None
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover)
        dx4 = _x4(dx, g, Cg)
        wt = np.ascontiguousarray(_w4(w, geo, cdt)[..., order].transpose(0, 3, 2, 1)).reshape(g, K * Cg, Cog)
        dxbufs = [np.zeros((g, Cg, (lines + h) * line), cdt) for _ in geo.phases]
        carry_from = None
    for e0, e1 in chunks:
        rows = (e1 - e0) * line
        dyg = dybuf.fill(dy4, e0, e1, geo.y_valid)
        cols = cols_flat[:, :K * Cg * rows].reshape(g, K * Cg, rows)
        if need_dw:
            xgs = [b.fill(x4, e0, e1 + h, geo.x_valid[r]) for b, (r, _) in zip(xbufs, geo.phases)]
            _x_columns(geo, xgs, cols, rows)
            if e0 == chunks[0][0]:
                _matmul(dyg, cols.transpose(0, 2, 1), acc)
            else:
                _matmul(dyg, cols.transpose(0, 2, 1), tmp)
                acc += tmp
        if need_dx:
            _matmul(wt, dyg, cols)                                  # Z: (g, K*Cg, rows)
            contiguous = carry_from is not None and carry_from == e0
            jj = 0
            for (r, taps), buf in zip(geo.phases, dxbufs):
                dxg = buf[:, :, :rows + h * line]
                if contiguous:                                     # partial sums of the previous chunk's halo
                    dxg[:, :, :h * line] = buf[:, :, prev_rows:prev_rows + h * line]
                    dxg[:, :, h * line:] = 0
                else:
                    dxg.fill(0)
                for _, off in taps:
                    dxg[:, :, off:off + rows] += cols[:, jj * Cg:(jj + 1) * Cg]
                    jj += 1
                _scatter(geo, dxg, dx4, e0, e1, geo.x_valid[r])
            carry_from, prev_rows = e1, rows
    dw = None
    if need_dw:
        dw = _finish_dw(geo, p, [(order, acc.reshape(g, Cog, K, Cg).transpose(0, 1, 3, 2))])
    return (dx if need_dx else None), dw


def fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias, by x-columns (im2col of the x phases) and one GEMM per chunk."""
    geo = _Geom(p)
    cdt = compute_dtype(p)
    it = cdt.itemsize
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    line_bytes = it * line * (g * Cog + g * K * Cg + nph * g * Cg)
    budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, False, False, fprop=True))
    chunks, lines = _chunks(geo, line_bytes, h, budget)
    R = lines * line
    order = _tap_order(geo)
    wm = np.ascontiguousarray(_w4(w, geo, cdt)[..., order].transpose(0, 1, 3, 2)).reshape(g, Cog, K * Cg)
    x4 = _x4(x, g, Cg)
    xbufs = [_GridBuf(geo, g, Cg, lines + h, cdt) for _ in geo.phases]
    cols_flat = np.empty((g, K * Cg * R), cdt)
    ybuf = np.empty((g, Cog, R), cdt)
    y = np.empty(p.output_shape, DTYPES[p.dtype])
    y4 = _x4(y, g, Cog)
    for e0, e1 in chunks:
        rows = (e1 - e0) * line
        xgs = [b.fill(x4, e0, e1 + h, geo.x_valid[r]) for b, (r, _) in zip(xbufs, geo.phases)]
        cols = cols_flat[:, :K * Cg * rows].reshape(g, K * Cg, rows)
        _x_columns(geo, xgs, cols, rows)
        yg = ybuf[:, :, :rows]
        _matmul(wm, cols, yg)
        if bias is not None:
            yg += bias.astype(cdt).reshape(g, Cog, 1)
        _scatter(geo, yg, y4, e0, e1, geo.y_valid)
    return y
