"""Compiled direct loops (Numba) for the convolutions that BLAS serves badly: depthwise ones.

A depthwise convolution (one input channel per group; 2-D, 1-D as height 1) does K multiply-adds
per output element and has nothing a matrix product could reuse, so im2col + GEMM mostly moves
memory. These loops take one (sample, input channel) plane at a time, in cache, on the polyphase
grid of :mod:`.fast` (per dim, phase r of the zero-padded input holds ``x_pad[m*s + r]``; tap j
reads phase ``r_j`` at offset ``q_j``, ``(q_j, r_j) = divmod(j*d, s)``), flattened with row length
``Lw``: every tap is then a constant offset ``off_t`` into one phase, and

- ``dx_phase[j] = sum over t of w_t * dy_grid[j - off_t]`` (dy's plane on the grid, zero outside),
  its taps in groups of up to 9 per pass, contributions in a fixed order, then scattered to dx;
- ``dw_t (per sample) = sum over j of dy_grid[j] * x_phase[j + off_t]``, and ``db`` (per sample)
  ``= sum of dy_grid``; the per-sample partials are added in sample order afterwards;
- ``y_grid[j] = sum over t of w_t * x_phase[j + off_t]`` for the forward.

Tasks are ranges of planes and never split a sum, so the results do not depend on the number of
threads; each compiled loop is a fixed sequence of floating-point operations for given shapes,
so they are bitwise reproducible run to run. Sums are compiled with reassociation allowed
(vectorized), in an order fixed at compile time for the machine. Garbage grid positions hold
zeros, as in :mod:`.fast` (a NaN or infinity can reach them as there).

Numba is imported on first use; :func:`available` says whether it could be.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from xconv import ConvParams

from .workers import even_ranges, run

_FASTMATH = {"reassoc", "contract"}
#: Inputs that need converting (another dtype, or not C-contiguous) are converted a block of samples
#: at a time: at most this many bytes, and at most half the bytes of the call's inputs and outputs.
BLOCK_BYTES = 8 << 20

_kernels = None
_import_error: str | None = None


def available() -> bool:
    """Whether the compiled loops can run (Numba importable, not disabled by XCONV_NUMPY_DIRECT=0)."""
    if os.environ.get("XCONV_NUMPY_DIRECT", "1") == "0":
        return False
    return _load() is not None


_LOAD_LOCK = threading.Lock()


def _load():
    global _kernels, _import_error
    with _LOAD_LOCK:
        if _kernels is None and _import_error is None:
            try:
                _kernels = _compile()
            except Exception as e:  # Numba missing or broken: the BLAS path serves these shapes
                _import_error = f"{type(e).__name__}: {e}"
    return _kernels


def _compile():
    import numba

    jit = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, boundscheck=False)

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
        sample's weight-gradient partial, dbp (N, C*m) each sample's bias-gradient partial. The taps are handled in groups of at most 4 sharing a
        phase: group i is (phase, first, count) = groups[i], its taps taps[first:first+count],
        whose offsets in the phase's flat grid are offs[first:first+count]. Scratch (see
        _Plan.scratch): gpad (zeros, F + Lh*Lw + Lw with F the largest offset) holds dy's plane on
        the grid behind F zeros; xph (zeros) and acc (sh*sw, Lh*Lw + Lw) the phases of x and dx.
        """
        N, Co, OH, OW = dy.shape
        C = Co // m
        R = OH * Lw
        ng = sh * sw
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

    return dict(backward=backward_planes, fprop=fprop_planes)


def kernels():
    """The compiled loops (dict with "backward", "fprop"); None when unavailable."""
    return _load() if available() else None


def import_error() -> str | None:
    """Why the compiled loops could not be loaded (None if they were, or were not tried)."""
    return _import_error


def serves(p: ConvParams) -> bool:
    """Whether these loops compute ``p``: one input channel per group, 1-D or 2-D, and Numba available."""
    return p.nd in (1, 2) and p.input_shape[1] == p.groups and min(p.input_shape) > 0 and available()


class _Plan:
    """The 2-D polyphase geometry of a depthwise convolution (1-D as height 1)."""

    def __init__(self, p: ConvParams):
        lift = p.nd == 1
        two = (lambda t: (1,) + tuple(t)) if lift else tuple
        self.in4 = tuple(p.input_shape[:2]) + two(p.input_shape[2:])
        self.out4 = tuple(p.output_shape[:2]) + two(p.output_shape[2:])
        self.kernel = two(p.kernel)
        sh, sw = self.stride = two(p.stride)
        dh, dw = two(p.dilation)
        (ph0, ph1), (pw0, pw1) = ((0, 0),) * lift + tuple(p.padding)
        self.pre = ph0, pw0
        H, W = self.in4[2:]
        self.Lh = -(-(H + ph0 + ph1) // sh)
        self.Lw = -(-(W + pw0 + pw1) // sw)
        taps = [(divmod(kh * dh, sh), divmod(kw * dw, sw)) for kh in range(self.kernel[0]) for kw in range(self.kernel[1])]
        by_phase: dict[int, list[tuple[int, int]]] = {}
        for t, ((qh, rh), (qw, rw)) in enumerate(taps):
            by_phase.setdefault(rh * sw + rw, []).append((t, qh * self.Lw + qw))
        order, groups = [], []
        for r in sorted(by_phase):
            lst = by_phase[r]
            i = 0
            while i < len(lst):                 # groups of 9 taps (one pass each), the rest in 4s
                size = 9 if len(lst) - i >= 9 else min(4, len(lst) - i)
                groups.append((r, len(order), size))
                order.extend(lst[i:i + size])
                i += size
        self.taps = np.array([t for t, _ in order], np.int64)
        self.offs = np.array([off for _, off in order], np.int64)
        self.groups = np.array(groups, np.int64).reshape(-1, 3)
        self.m = p.output_shape[1] // p.input_shape[1]
        self.planes = p.input_shape[0] * p.input_shape[1]
        self.K = len(taps)

    def args(self):
        return (self.m, self.stride[0], self.stride[1], self.pre[0], self.pre[1], self.Lh, self.Lw,
                self.taps, self.offs, self.groups)

    def scratch(self, dtype):
        """One worker's scratch: (gpad, xph, acc), zeroed."""
        ng, size = self.stride[0] * self.stride[1], self.Lh * self.Lw + self.Lw
        F = int(self.offs.max())
        return np.zeros(F + size, dtype), np.zeros((ng, size), dtype), np.zeros((ng, size), dtype)

    def sample_blocks(self, per_sample_bytes: int, io_bytes: int):
        """[n0, n1) blocks of samples whose converted copies fit the block budget (one sample at least)."""
        nb = max(1, min(BLOCK_BYTES, io_bytes // 2) // max(per_sample_bytes, 1))
        return [(n, min(n + nb, self.in4[0])) for n in range(0, self.in4[0], nb)]

    def chunks(self, n0: int, n1: int, workers: int):
        """Plane ranges of samples [n0, n1): about 4 per worker, 8 planes at least. Results do not depend on them."""
        C = self.in4[1]
        a, b = n0 * C, n1 * C
        return [(a + u, a + v) for u, v in even_ranges(b - a, max(1, min((b - a) // 8, 4 * workers)))]


def _native(a, cdt) -> bool:
    return a.dtype == cdt and a.flags.c_contiguous


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool, workers: int):
    """(dx, dw, db), None where not needed, of a depthwise convolution ``p`` (see :func:`serves`); at
    least one of dx and dw must be needed (db is summed on the way, from the same plane copies).

    Inputs in the compute dtype and C-contiguous are read in place; others are converted a block
    of samples at a time (so extra memory stays about BLOCK_BYTES), and so is dx when its dtype
    is not the compute dtype.
    """
    kern = kernels()
    plan = _Plan(p)
    cdt = np.dtype(np.float64) if p.dtype == "float64" else np.dtype(np.float32)
    out_dt = np.dtype(dy.dtype)
    N, C = plan.in4[:2]
    dy4 = dy.reshape(plan.out4)
    x4 = x.reshape(plan.in4) if need_dw else None
    w2 = np.ascontiguousarray(w, dtype=cdt).reshape(plan.out4[1], plan.K) if need_dx else np.zeros((1, plan.K), cdt)
    dx = np.empty(plan.in4, out_dt) if need_dx else None
    dwp = np.empty((N, plan.out4[1], plan.K), cdt) if need_dw else np.zeros((1, 1, 1), cdt)
    dbp = np.empty((N, plan.out4[1]), cdt) if need_db else np.zeros((1, 1), cdt)
    dummy = np.zeros((1, 1, 1, 1), cdt)
    in_place = _native(dy, cdt) and (not need_dw or _native(x, cdt)) and (not need_dx or out_dt == cdt)
    per_sample = cdt.itemsize * (math.prod(plan.out4[1:]) + math.prod(plan.in4[1:]) * (need_dw + need_dx))
    x_bytes, w_bytes = math.prod(p.input_shape) * out_dt.itemsize, math.prod(p.weight_shape) * out_dt.itemsize
    io = dy.nbytes + (x_bytes + w_bytes) * (need_dx + need_dw)      # inputs and outputs of this call
    blocks = [(0, N)] if in_place else plan.sample_blocks(per_sample, io)
    for n0, n1 in blocks:
        dyb = np.ascontiguousarray(dy4[n0:n1], dtype=cdt)
        xb = np.ascontiguousarray(x4[n0:n1], dtype=cdt) if need_dw else dummy
        if not need_dx:
            dxb = dummy
        elif out_dt == cdt:
            dxb = dx[n0:n1]
        else:
            dxb = np.empty((n1 - n0,) + plan.in4[1:], cdt)
        dwb = dwp[n0:n1] if need_dw else dwp
        dbb = dbp[n0:n1] if need_db else dbp

        def task(ws, _i, a, b, dyb=dyb, xb=xb, dxb=dxb, dwb=dwb, dbb=dbb, n0=n0):
            kern["backward"](dyb, xb, w2, dxb, dwb, dbb, need_dx, need_dw, need_db, *plan.args(), *ws,
                             a - n0 * C, b - n0 * C)

        run(plan.chunks(n0, n1, workers), task, lambda: plan.scratch(cdt), workers)
        if need_dx and out_dt != cdt:
            dx[n0:n1] = dxb
    rdx = dx.reshape(p.input_shape) if need_dx else None
    rdw = _sum_samples(dwp).reshape(p.weight_shape).astype(out_dt, copy=False) if need_dw else None
    rdb = _sum_samples(dbp).astype(out_dt, copy=False) if need_db else None
    return rdx, rdw, rdb


def _sum_samples(parts: np.ndarray) -> np.ndarray:
    """The per-sample partials summed over the first axis (a fixed order for given shapes)."""
    return parts.sum(axis=0)


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias for a depthwise convolution ``p`` (see :func:`serves`), x converted by sample blocks."""
    kern = kernels()
    plan = _Plan(p)
    cdt = np.dtype(np.float64) if p.dtype == "float64" else np.dtype(np.float32)
    out_dt = np.dtype(x.dtype)
    N, C = plan.in4[:2]
    x4 = x.reshape(plan.in4)
    w2 = np.ascontiguousarray(w, dtype=cdt).reshape(plan.out4[1], plan.K)
    b = None if bias is None else bias.astype(cdt).reshape((1, -1, 1, 1))
    y = np.empty(plan.out4, out_dt)
    in_place = _native(x, cdt) and out_dt == cdt
    per_sample = cdt.itemsize * (math.prod(plan.out4[1:]) + math.prod(plan.in4[1:]))
    io = x.nbytes + w.nbytes + N * math.prod(plan.out4[1:]) * out_dt.itemsize
    for n0, n1 in ([(0, N)] if in_place else plan.sample_blocks(per_sample, io)):
        xb = np.ascontiguousarray(x4[n0:n1], dtype=cdt)
        yb = y[n0:n1] if out_dt == cdt else np.empty((n1 - n0,) + plan.out4[1:], cdt)

        def task(ws, _i, a, b_, xb=xb, yb=yb, n0=n0):
            kern["fprop"](xb, w2, yb, *plan.args(), *ws, a - n0 * C, b_ - n0 * C)

        run(plan.chunks(n0, n1, workers), task, lambda: plan.scratch(cdt), workers)
        if b is not None:
            yb += b
        if out_dt != cdt:
            y[n0:n1] = yb
    return y.reshape(p.output_shape)
