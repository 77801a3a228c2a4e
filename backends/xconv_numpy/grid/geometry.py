"""The polyphase grid of one direct convolution: phases, taps, valid ranges (see docs/numpy-backend.md)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from xconv import ConvParams
from xconv.dtypes import accumulation_dtype
from ..plans import per_params


def padded(p: ConvParams) -> tuple:
    """Per spatial dim, the zero-padded input's length: size + pre + post."""
    return tuple(n + a + b for n, (a, b) in zip(p.input_shape[2:], p.padding))


def grid_lengths(p: ConvParams) -> tuple:
    """Per spatial dim, the polyphase grid's length: ceil(padded / stride)."""
    return tuple(-(-n // s) for n, s in zip(padded(p), p.stride))


def compute_dtype(p: ConvParams) -> np.dtype:
    """float64 for float64 inputs, else float32 (float16 and bfloat16 are computed in float32)."""
    return accumulation_dtype(p.dtype)



class Geom:
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
        self.L = L = grid_lengths(p)
        self.L1 = L[0]
        self.line = math.prod(L[1:])                       # grid positions per line (first grid dim)
        self.gstride = tuple(math.prod(L[i + 1:]) for i in range(nd))
        # per dim: residues used by some tap, in increasing order; taps as (j, q, r)
        per_dim = [[(j,) + divmod(j * d[i], s[i]) for j in range(self.k[i])] for i in range(nd)]
        residues = [sorted({r for _, _, r in taps}) for taps in per_dim]
        self.full_cover = all(len(res) == st for res, st in zip(residues, s))
        kstride = [math.prod(self.k[i + 1:]) for i in range(nd)]
        self.phases = []                                    # list of (r tuple, [(kflat, off), ...])
        self.tapgrid = []                                   # per phase: per dim (q0, dq, count)
        by_residue = []                                     # per dim: residue -> its taps, in j order
        for taps in per_dim:
            groups = {}
            for t in taps:
                groups.setdefault(t[2], []).append(t)
            by_residue.append(groups)
        for r in itertools.product(*residues):
            lists = [by_residue[i][r[i]] for i in range(nd)]
            taps = []
            for combo in itertools.product(*lists):
                kflat = sum(t[0] * kstride[i] for i, t in enumerate(combo))
                off = sum(t[1] * self.gstride[i] for i, t in enumerate(combo))
                taps.append((kflat, off))
            self.phases.append((r, taps))
            # a phase's taps along a dim are j = j0, j0 + s', ... so their q form an arithmetic progression
            spec = []
            for lst in lists:
                dq = lst[1][1] - lst[0][1] if len(lst) > 1 else 0
                assert all(b[1] - a[1] == dq for a, b in zip(lst, lst[1:]))
                spec.append((lst[0][1], dq, len(lst)))
            self.tapgrid.append(tuple(spec))
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
        # 1x1 kernel, stride 1, no padding: output positions are input positions, no grid needed
        self.pointwise = self.K == 1 and all(st == 1 for st in s) and all(a == b == 0 for a, b in p.padding)
        self.P = math.prod(self.S)

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


def blocks(geo: Geom, grid: np.ndarray, tensor: np.ndarray, e0: int, e1: int, valid):
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



def tap_order(geo: Geom):
    return [kf for _, taps in geo.phases for kf, _ in taps]


@per_params
def geom(p: ConvParams) -> Geom:
    """p's Geom, cached (read only: nothing writes a Geom after __init__)."""
    return Geom(p)


def io_bytes(geo: Geom, itemsize: int, need_dx: bool, need_dw: bool, fprop: bool = False) -> int:
    xs = geo.N * geo.C_in * math.prod(geo.S)
    ys = geo.N * geo.C_out * math.prod(geo.O)
    ws = geo.C_out * geo.Cg * geo.K
    if fprop:
        return itemsize * (xs + ws + ys)
    return itemsize * (ys + (xs if need_dw else 0) + ws * (1 + need_dw) + (xs if need_dx else 0))




def tap_view(geo: Geom, ip: int, grid: np.ndarray, base: int, sign: int, rows: int, spec=None) -> np.ndarray:
    """All of phase ip's tap slices of ``grid`` (G, C, positions) as one strided view (G, J, C, rows).

    Tap i reads grid[:, :, base + sign*off_i : ... + rows]; the offsets are sums of arithmetic
    progressions along each dim, so the taps form a regular (n_1, ..., n_nd) array of slices.
    ``spec`` overrides the phase's per-dim (q0, dq, count).
    """
    G, C = grid.shape[:2]
    spec = geo.tapgrid[ip] if spec is None else spec
    it = grid.itemsize
    start = base + sign * sum(q0 * gs for (q0, _, _), gs in zip(spec, geo.gstride))
    shape = (G,) + tuple(n for _, _, n in spec) + (C, rows)
    strides = ((grid.strides[0],) + tuple(sign * dq * gs * it for (_, dq, _), gs in zip(spec, geo.gstride))
               + (grid.strides[1], grid.strides[2]))
    view = np.lib.stride_tricks.as_strided(grid[:, :, start:], shape=shape, strides=strides, writeable=False)
    return view


def x_columns(geo: Geom, xgs, cols, rows):
    """Fill cols (g, K*Cg, rows) with each tap's shifted slice of its x phase grid (taps in phase order)."""
    Cg = geo.Cg
    jj = 0
    for ip, ((r, taps), xg) in enumerate(zip(geo.phases, xgs)):
        J = len(taps)
        view = tap_view(geo, ip, xg, 0, 1, rows)
        cols[:, jj * Cg:(jj + J) * Cg].reshape(view.shape)[...] = view
        jj += J
