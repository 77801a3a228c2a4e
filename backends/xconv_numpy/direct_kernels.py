"""The compiled loops of :mod:`.direct` (Numba; imported only when they are first needed).

Module-level functions so that Numba's on-disk cache serves later processes (closures would be
recompiled in every process). See :mod:`.direct` for the algorithm and its guarantees.
"""

import numba
import numpy as np

#: Reassociation (vectorized sums, in an order fixed at compile time) and contraction (FMA).
FASTMATH = {"reassoc", "contract"}

jit = numba.njit(nogil=True, cache=True, fastmath=FASTMATH, boundscheck=False)


@jit
def _gather(dst, src, o, a, cnt):
    """dst[j] += sum over k < cnt of a[k] * src[o[k] + j]; cnt in 1..4 or 9 (unrolled: one vectorized pass)."""
    n = dst.shape[0]
    if cnt == 9:
        s0, s1, s2 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n]
        s3, s4, s5 = src[o[3]:o[3] + n], src[o[4]:o[4] + n], src[o[5]:o[5] + n]
        s6, s7, s8 = src[o[6]:o[6] + n], src[o[7]:o[7] + n], src[o[8]:o[8] + n]
        a0, a1, a2, a3, a4, a5, a6, a7, a8 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]
        for j in range(n):
            dst[j] += (a0 * s0[j] + a1 * s1[j] + a2 * s2[j] + a3 * s3[j] + a4 * s4[j] + a5 * s5[j]
                       + a6 * s6[j] + a7 * s7[j] + a8 * s8[j])
    elif cnt == 4:
        s0, s1, s2, s3 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n], src[o[3]:o[3] + n]
        a0, a1, a2, a3 = a[0], a[1], a[2], a[3]
        for j in range(n):
            dst[j] += a0 * s0[j] + a1 * s1[j] + a2 * s2[j] + a3 * s3[j]
    elif cnt == 3:
        s0, s1, s2 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n]
        a0, a1, a2 = a[0], a[1], a[2]
        for j in range(n):
            dst[j] += a0 * s0[j] + a1 * s1[j] + a2 * s2[j]
    elif cnt == 2:
        s0, s1 = src[o[0]:o[0] + n], src[o[1]:o[1] + n]
        a0, a1 = a[0], a[1]
        for j in range(n):
            dst[j] += a0 * s0[j] + a1 * s1[j]
    else:
        s0 = src[o[0]:o[0] + n]
        a0 = a[0]
        for j in range(n):
            dst[j] += a0 * s0[j]


@jit
def _dots(g, src, o, cnt, out):
    """out[k] = sum over i of g[i] * src[o[k] + i] for k < cnt (cnt in 1..4 or 9), in one pass over g."""
    n = g.shape[0]
    z = g.dtype.type(0)
    if cnt == 9:
        s0, s1, s2 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n]
        s3, s4, s5 = src[o[3]:o[3] + n], src[o[4]:o[4] + n], src[o[5]:o[5] + n]
        s6, s7, s8 = src[o[6]:o[6] + n], src[o[7]:o[7] + n], src[o[8]:o[8] + n]
        t0, t1, t2, t3, t4, t5, t6, t7, t8 = z, z, z, z, z, z, z, z, z
        for i in range(n):
            v = g[i]
            t0 += v * s0[i]
            t1 += v * s1[i]
            t2 += v * s2[i]
            t3 += v * s3[i]
            t4 += v * s4[i]
            t5 += v * s5[i]
            t6 += v * s6[i]
            t7 += v * s7[i]
            t8 += v * s8[i]
        out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8] = t0, t1, t2, t3, t4, t5, t6, t7, t8
    elif cnt == 4:
        s0, s1, s2, s3 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n], src[o[3]:o[3] + n]
        t0, t1, t2, t3 = z, z, z, z
        for i in range(n):
            v = g[i]
            t0 += v * s0[i]
            t1 += v * s1[i]
            t2 += v * s2[i]
            t3 += v * s3[i]
        out[0], out[1], out[2], out[3] = t0, t1, t2, t3
    elif cnt == 3:
        s0, s1, s2 = src[o[0]:o[0] + n], src[o[1]:o[1] + n], src[o[2]:o[2] + n]
        t0, t1, t2 = z, z, z
        for i in range(n):
            v = g[i]
            t0 += v * s0[i]
            t1 += v * s1[i]
            t2 += v * s2[i]
        out[0], out[1], out[2] = t0, t1, t2
    elif cnt == 2:
        s0, s1 = src[o[0]:o[0] + n], src[o[1]:o[1] + n]
        t0, t1 = z, z
        for i in range(n):
            v = g[i]
            t0 += v * s0[i]
            t1 += v * s1[i]
        out[0], out[1] = t0, t1
    else:
        s0 = src[o[0]:o[0] + n]
        t0 = z
        for i in range(n):
            t0 += g[i] * s0[i]
        out[0] = t0


@jit
def _copy(dst, src):
    for i in range(dst.shape[0]):
        dst[i] = src[i]


@jit
def _phases(plane, ph, sh, sw, ph0, pw0, Lw, into):
    """Copy a (H, W) plane into (``into``) or back out of its zero-padded polyphase grid
    ph (sh*sw, >= Lh*Lw): plane[y, z] <-> ph[r_y*sw + r_z, a_y*Lw + b_z], (a, r) = divmod(index + pre, s)."""
    H, W = plane.shape
    for y in range(H):
        a, rh = divmod(y + ph0, sh)
        for rw in range(sw):
            z0 = (rw - pw0) % sw
            if z0 >= W:
                continue
            cnt = (W - z0 + sw - 1) // sw
            b0 = (z0 + pw0) // sw
            grid = ph[rh * sw + rw, a * Lw + b0:a * Lw + b0 + cnt]
            if sw == 1:                        # a contiguous row: the copy vectorizes
                if into:
                    _copy(grid, plane[y])
                else:
                    _copy(plane[y], grid)
            elif into:
                _copy(grid, plane[y, z0::sw])
            else:
                _copy(plane[y, z0::sw], grid)


@jit
def _sum(v):
    """The sum of v's elements, accumulated in its dtype (vectorized: a fixed order per machine)."""
    t = v.dtype.type(0)
    for i in range(v.shape[0]):
        t += v[i]
    return t


@jit
def _to_grid(plane, g, Lw):
    """Copy a (OH, OW) plane into rows of length Lw of g (the extra columns are left as they are)."""
    OH, OW = plane.shape
    for oh in range(OH):
        dst = g[oh * Lw:oh * Lw + OW]
        src = plane[oh]
        for i in range(OW):
            dst[i] = src[i]


@jit
def backward_planes(dy, x, w, dx, dwp, dbp, need_dx, need_dw, need_db, m, sh, sw, ph0, pw0, Lh, Lw,
                    taps, offs, groups, gpad, xph, acc, p0, p1):
    """Planes p0..p1-1 (flat n*C + c over input channels) of a depthwise backward.

    dy (N, C*m, OH, OW); x and dx (N, C, H, W); w (C*m, K); dwp (N, C*m, K) receives each
    sample's weight-gradient partial, dbp (N, C*m) each sample's bias-gradient partial. The taps
    are handled in groups (9, or at most 4) sharing a phase: group i is (phase, first, count) =
    groups[i], its taps taps[first:first+count], whose offsets in the phase's flat grid are
    offs[first:first+count]. Scratch (see
    _Plan.scratch): gpad (zeros, F + Lh*Lw + Lw with F the largest offset) holds dy's plane on
    the grid behind F zeros; xph (zeros) and acc (sh*sw, Lh*Lw + Lw) the phases of x and dx.
    """
    N, Co, OH, OW = dy.shape
    C = Co // m
    R = OH * Lw
    F = gpad.shape[0] - acc.shape[1]
    g = gpad[F:F + R]
    o = np.empty(9, np.int64)
    a = np.empty(9, dy.dtype)
    out = np.empty(9, dy.dtype)
    for pi in range(p0, p1):
        n = pi // C
        c = pi - n * C
        if need_dw:
            _phases(x[n, c], xph, sh, sw, ph0, pw0, Lw, True)
        if need_dx:
            acc[:, :] = 0
        for mo in range(m):
            co = c * m + mo
            _to_grid(dy[n, co], g, Lw)
            if need_db:
                dbp[n, co] = _sum(g)
            for gi in range(groups.shape[0]):
                r, k0, cnt = groups[gi, 0], groups[gi, 1], groups[gi, 2]
                if need_dw:
                    for k in range(cnt):
                        o[k] = offs[k0 + k]
                    _dots(g, xph[r], o, cnt, out)
                    for k in range(cnt):
                        dwp[n, co, taps[k0 + k]] = out[k]
                if need_dx:
                    for k in range(cnt):
                        o[k] = F - offs[k0 + k]
                        a[k] = w[co, taps[k0 + k]]
                    _gather(acc[r, :Lh * Lw], gpad, o, a, cnt)
        if need_dx:
            _phases(dx[n, c], acc, sh, sw, ph0, pw0, Lw, False)


@jit
def fprop_planes(x, w, y, m, sh, sw, ph0, pw0, Lh, Lw, taps, offs, groups, gpad, xph, acc, p0, p1):
    """Planes p0..p1-1 (flat n*C + c over input channels) of a depthwise forward: y (N, C*m, OH, OW).

    Scratch as for backward_planes (acc unused)."""
    N, Co, OH, OW = y.shape
    C = Co // m
    R = OH * Lw
    g = gpad[:R]
    o = np.empty(9, np.int64)
    a = np.empty(9, y.dtype)
    for pi in range(p0, p1):
        n = pi // C
        c = pi - n * C
        _phases(x[n, c], xph, sh, sw, ph0, pw0, Lw, True)
        for mo in range(m):
            co = c * m + mo
            g[:] = 0
            for gi in range(groups.shape[0]):
                r, k0, cnt = groups[gi, 0], groups[gi, 1], groups[gi, 2]
                for k in range(cnt):
                    o[k] = offs[k0 + k]
                    a[k] = w[co, taps[k0 + k]]
                _gather(g, xph[r], o, a, cnt)
            dst = y[n, co]
            for oh in range(OH):
                row = dst[oh]
                src = g[oh * Lw:oh * Lw + OW]
                for i in range(OW):
                    row[i] = src[i]
