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

import numpy as np

from xconv import ConvParams
from xconv.dtypes import accumulation_dtype

from .lazy import Lazy
from .workers import even_ranges, run

#: Inputs that need converting (another dtype, or not C-contiguous) are converted a block of samples
#: at a time: at most this many bytes, and at most half the bytes of the call's inputs and outputs.
BLOCK_BYTES = 8 << 20

def _compile():
    from . import direct_kernels

    return dict(backward=direct_kernels.backward_planes, fprop=direct_kernels.fprop_planes)


_KERNELS = Lazy(_compile, "XCONV_NUMPY_DIRECT")


def available() -> bool:
    """Whether the compiled loops can run (Numba importable, not disabled by XCONV_NUMPY_DIRECT=0)."""
    return _KERNELS.available()


def kernels():
    """The compiled loops (dict with "backward", "fprop"); None when unavailable."""
    return _KERNELS.get() if available() else None


def import_error() -> str | None:
    """Why the compiled loops could not be loaded (None if they were, or were not tried)."""
    return _KERNELS.error


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


def _setup(p: ConvParams):
    """The compiled loops, the plan and the compute dtype of a call."""
    return kernels(), _Plan(p), accumulation_dtype(p.dtype)


def _native(a, cdt) -> bool:
    return a.dtype == cdt and a.flags.c_contiguous


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool, workers: int):
    """(dx, dw, db), None where not needed, of a depthwise convolution ``p`` (see :func:`serves`); at
    least one of dx and dw must be needed (db is summed on the way, from the same plane copies).

    Inputs in the compute dtype and C-contiguous are read in place; others are converted a block
    of samples at a time (so extra memory stays about BLOCK_BYTES), and so is dx when its dtype
    is not the compute dtype.
    """
    kern, plan, cdt = _setup(p)
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
    kern, plan, cdt = _setup(p)
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
