"""Depthwise loops across channels (csrc/depthwise_cv.c): the depthwise path's loops for small planes.

The plane loops of :mod:`.depthwise` vectorize along a plane's rows, so a 3x3, 6x6 or 12x12 plane (MobileNet's
later stages) runs mostly in scalar tails, one plane at a time: 2-3x torch's time (measured). Here 16 channels of
one sample are transposed to position-major order and every sum runs on 16-channel vectors, whatever the plane:

- ``y[a, b] = sum over (kh, i) in rows(a), (kw, j) in cols(b) of w[kh, kw] * x[i, j]`` (the taps that read the
  input: ``i = a*s + kh*d - pad`` inside it), and ``dx`` the same sum over dy (the (tap, dy position) pairs that
  reach ``i``), four output columns at once where their pairs are the same shifted;
- ``dw[t]`` per sample: the sum of ``dy[a, b] * x[a*s + kh*d - pad, b*s + kw*d - pad]`` over the dy positions that
  read the input, four partial sums (``b mod 4``); the per-sample partials are added in sample order.

The sums skip the terms that multiply a padding zero; where such a term is NaN on the exact path (an infinite or
NaN weight in the forward, an infinite or NaN dy in the weight gradient: 0 * inf) the forward runs the plane loops
instead, and the weight gradient adds the skipped terms of the blocks whose dy is not finite. Taps in ascending
order; tasks are ranges of (sample, 16-channel block) items and never split a sum, so results depend on the
shapes and values only, never on the workers. Used for float32, 1-D and 2-D, one output channel per input
channel, C a multiple of 16, planes up to :data:`MAX_WIDTH` wide (32 on the AVX-512 build, 16 on the AVX2 build)
(:func:`serves`).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing

from . import native
from .aligned import empty_result
from .finite import all_finite
from .jobs import Jobs
from .native import address
from .plans import per_params
from .workers import even_ranges

#: Planes at most this wide take these loops, per build (the plane loops vectorize wider rows well: on the AVX-512
#: build 48-wide planes ran as fast there, measured on MobileNetV2's layers). On the AVX2 build (Intel Xeon model 207
#: held to AVX2, µs, forward / backward with dx and dw, these loops against the plane loops, one thread): 8x96x12x12
#: 159 / 278 vs 251 / 430, 4x32x16x16 90 / 150 vs 107 / 163, but 8x96x24x24 588 / 1288 vs 590 / 1012 and 8x16x48x48
#: 396 / 880 vs 387 / 706: planes up to 16 wide there. (Before the AVX2 build held its 16-channel vectors as two AVX
#: halves, csrc/depthwise_cv.c, these loops ran 4-5x the AVX-512 build's time and took planes up to 8 wide only.)
MAX_WIDTH = {"avx512": 32, "avx2": 16}
#: Planes (input or output, e.g. behind a large padding) of more positions take the plane loops: the pair tables are
#: built per row and column in Python, and a plane's transposed copies are per-worker scratch.
MAX_POSITIONS = 1 << 16
#: Builds these loops run on (MAX_WIDTH's): their 16-float vectors are one AVX-512 register, two AVX ones (the AVX2
#: build holds them as two halves and transposes its planes in 8 x 8 tiles, csrc/depthwise_cv.c). Not the baseline
#: build (SSE2: not measured).
ISAS = tuple(MAX_WIDTH)


def serves(p: ConvParams) -> bool:
    """Whether these loops compute ``p`` (called for calls the depthwise path computes); the forward also needs finite
    weights (:func:`fprop_serves`)."""
    C = p.input_shape[1]
    return (p.dtype == "float32" and p.nd in (1, 2) and p.output_shape[1] == C and C % 16 == 0
            and math.prod(p.input_shape[2:]) <= MAX_POSITIONS and math.prod(p.output_shape[2:]) <= MAX_POSITIONS
            and native.library() is not None and p.input_shape[-1] <= MAX_WIDTH.get(native.isa(native.library()), 0))


def fprop_serves(p: ConvParams, w: np.ndarray) -> bool:
    """Whether the forward of ``p`` with weights ``w`` runs here: the forward skips the padding terms, which are
    ``w * 0``: NaN for an infinite or NaN weight (as on the exact path), so such weights take the plane loops."""
    return serves(p) and all_finite(w)


def _pairs(n_out: int, n_in: int, k: int, s: int, d: int, pre: int, dgrad: bool):
    """Per output index its (tap, source index) pairs in tap order, as CSR (offsets, flat pairs). Forward: the source
    is the input, ``i = o*s + t*d - pre`` inside it; dgrad: the output is dx, the source dy, ``o*s + t*d - pre = i``."""
    off, flat = [0], []
    for o in range(n_out):
        for t in range(k):
            if dgrad:
                num = o + pre - t * d
                src = num // s if num >= 0 and num % s == 0 else -1
                ok = 0 <= src < n_in
            else:
                src = o * s + t * d - pre
                ok = 0 <= src < n_in
            if ok:
                flat += [t, src]
        off.append(len(flat) // 2)
    return np.array(off, np.int64), np.array(flat or [0, 0], np.int64)


def _regular(off, flat, n_out: int, step: int) -> np.ndarray:
    """reg[b]: columns b .. b+3 have b's taps, their sources moved by ``step`` per column."""
    reg = np.zeros(max(n_out, 1), np.int64)
    pairs = [flat[2 * off[b]:2 * off[b + 1]].reshape(-1, 2) for b in range(n_out)]
    for b in range(n_out - 3):
        base = pairs[b]
        reg[b] = all(len(pairs[b + q]) == len(base) and (pairs[b + q][:, 0] == base[:, 0]).all()
                     and (pairs[b + q][:, 1] == base[:, 1] + q * step).all() for q in range(1, 4))
    return reg


class _Tables:
    """The pair tables of one configuration (2-D; 1-D as height 1), forward and dgrad, and dw's ranges."""

    def __init__(self, p: ConvParams):
        two = (lambda t: (1,) + tuple(t)) if p.nd == 1 else tuple
        self.C = p.input_shape[1]
        self.H, self.W = two(p.input_shape[2:])
        self.Ho, self.Wo = two(p.output_shape[2:])
        (kh, kw), (sh, sw), (dh, dw) = two(p.kernel), two(p.stride), two(p.dilation)
        (ph, _), (pw, _) = ((0, 0),) * (p.nd == 1) + tuple(p.padding)
        self.KH, self.KW, self.K = kh, kw, kh * kw
        H, W, Ho, Wo = self.H, self.W, self.Ho, self.Wo
        self.f_rows = _pairs(Ho, H, kh, sh, dh, ph, False)
        self.f_cols = _pairs(Wo, W, kw, sw, dw, pw, False)
        self.f_reg = _regular(*self.f_cols, Wo, sw)
        self.d_rows = _pairs(H, Ho, kh, sh, dh, ph, True)
        self.d_cols = _pairs(W, Wo, kw, sw, dw, pw, True)
        self.d_reg = _regular(*self.d_cols, W, 1)
        # dw: per tap row the dy rows [alo, ahi) whose input row a*s + kh*d - ph lies inside x; columns likewise
        self.alo, self.ahi = _ranges(Ho, H, kh, sh, dh, ph)
        self.blo, self.bhi = _ranges(Wo, W, kw, sw, dw, pw)
        self.geo = np.array([sh, sw, dh, dw, ph, pw], np.int64)
        for a in (*self.f_rows, *self.f_cols, self.f_reg, *self.d_rows, *self.d_cols, self.d_reg, self.alo, self.ahi,
                  self.blo, self.bhi, self.geo):
            a.flags.writeable = False


def _ranges(n_out: int, n_in: int, k: int, s: int, d: int, pre: int):
    lo, hi = np.zeros(k, np.int64), np.zeros(k, np.int64)
    for t in range(k):
        a0 = min(n_out, max(0, -(-(pre - t * d) // s)))            # first o with o*s + t*d - pre >= 0
        last = n_in - 1 + pre - t * d                              # o*s <= last: inside the input
        lo[t], hi[t] = a0, max(a0, min(n_out, last // s + 1) if last >= 0 else 0)
    return lo, hi


@per_params
def tables(p: ConvParams) -> _Tables:
    return _Tables(p)


def _f32(a: np.ndarray, shape) -> np.ndarray:
    """``a`` as a C-contiguous float32 array of ``shape`` (a view when it already is one)."""
    return np.ascontiguousarray(a, np.float32).reshape(shape)


def _items(t: _Tables, N: int, workers: int):
    """Ranges of (sample, 16-channel block) items: one, or 4 per worker (taken in turn: they balance the workers)."""
    n = N * (t.C // 16)
    return even_ranges(n, 1 if workers == 1 else min(n, 4 * workers))


def _gather_args(src, dst, wt, t: _Tables, rows, cols, reg, step, shape_in, shape_out) -> tuple:
    """xconv_dwcv_gather's arguments before its item range: src at 0, dst at 4, wt at 7 (the rest: the tables of
    ``t``, kept alive by the caller)."""
    (Hi, Wi), (Ho, Wo) = shape_in, shape_out
    return (address(src), t.C, Hi, Wi, address(dst), Ho, Wo, address(wt), t.KW, address(rows[0]), address(rows[1]),
            address(cols[0]), address(cols[1]), address(reg), step)


def gather_jobs(src, dst, wt, t: _Tables, rows, cols, reg, step, shape_in, shape_out, workers) -> Jobs:
    """The job list of dst = the gather sums of src (forward: x -> y; dgrad: dy -> dx) with tap-major weights wt
    (arguments: :func:`_gather_args`)."""
    jobs = Jobs()
    jobs.split("dwcv_gather", _gather_args(src, dst, wt, t, rows, cols, reg, step, shape_in, shape_out), 15,
               _items(t, src.shape[0], workers))
    return jobs


def gather_scratch(t: _Tables, shape_in, shape_out) -> int:
    """Floats of scratch per worker of the gather jobs."""
    return (shape_in[0] * shape_in[1] + shape_out[0] * shape_out[1]) * 16


def _gather(src, dst, wt, t: _Tables, rows, cols, reg, step, shape_in, shape_out, workers) -> int:
    """dst = the gather sums of src (forward: x -> y; dgrad: dy -> dx); returns the scratch bytes. One worker: one C
    call (no job list) over every item, as the one job of a one-worker list runs them."""
    size = gather_scratch(t, shape_in, shape_out)
    if workers == 1:
        scratch = np.empty(size, np.float32)
        native.library().xconv_dwcv_gather(*_gather_args(src, dst, wt, t, rows, cols, reg, step, shape_in, shape_out),
                                           0, src.shape[0] * (t.C // 16), address(scratch))
        return scratch.nbytes
    return gather_jobs(src, dst, wt, t, rows, cols, reg, step, shape_in, shape_out, workers).run(workers, size)


def _wgrad_args(xs, dys, dwp, t: _Tables) -> tuple:
    """xconv_dwcv_wgrad's arguments before its item range: x at 0, dy at 1, dwp at 14."""
    return (address(xs), address(dys), t.C, t.H, t.W, t.Ho, t.Wo, t.KH, t.KW, address(t.geo), address(t.alo),
            address(t.ahi), address(t.blo), address(t.bhi), address(dwp))


def wgrad_jobs(xs, dys, dwp, t: _Tables, N: int, workers: int) -> Jobs:
    """The job list of the per-sample weight-gradient partials dwp (N, C, K) (arguments: :func:`_wgrad_args`)."""
    jobs = Jobs()
    jobs.split("dwcv_wgrad", _wgrad_args(xs, dys, dwp, t), 15, _items(t, N, workers))
    return jobs


def wgrad_scratch(t: _Tables) -> int:
    """Floats of scratch per worker of the weight-gradient jobs."""
    return (t.H * t.W + t.Ho * t.Wo + t.K) * 16


def weights(w, t: _Tables) -> np.ndarray:
    """(K, C): the weights tap-major, so that 16 channels of one tap are one vector."""
    return np.ascontiguousarray(np.asarray(w, np.float32).reshape(t.C, t.K).T)


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias (bias added in float32 after the sums)."""
    t = tables(p)
    N = p.input_shape[0]
    xs = _f32(x, (N, t.C, t.H, t.W))
    y = empty_result((N, t.C, t.Ho, t.Wo), np.float32)
    scratch = _gather(xs, y, weights(w, t), t, t.f_rows, t.f_cols, t.f_reg, p.stride[-1], (t.H, t.W),
                      (t.Ho, t.Wo), workers)
    tracing.workspace(scratch + (0 if xs is x or xs.base is x else xs.nbytes))     # x converted: a copy
    if bias is not None:
        y += np.asarray(bias, np.float32).reshape((1, -1, 1, 1))
    return y.reshape(p.output_shape)


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, workers: int):
    """(dx, dw), None where not needed."""
    t = tables(p)
    N = p.input_shape[0]
    dys = _f32(dy, (N, t.C, t.Ho, t.Wo))
    dx = dw = None
    scratch = 0
    if need_dx:
        dx = empty_result((N, t.C, t.H, t.W), np.float32)
        scratch = _gather(dys, dx, weights(w, t), t, t.d_rows, t.d_cols, t.d_reg, 1, (t.Ho, t.Wo), (t.H, t.W),
                          workers)
        dx = dx.reshape(p.input_shape)
    if need_dw:
        xs = _f32(x, (N, t.C, t.H, t.W))
        dwp = np.empty((N, t.C, t.K), np.float32)
        size = wgrad_scratch(t)
        if workers == 1:
            ws = np.empty(size, np.float32)
            native.library().xconv_dwcv_wgrad(*_wgrad_args(xs, dys, dwp, t), 0, N * (t.C // 16), address(ws))
            used = ws.nbytes
        else:
            used = wgrad_jobs(xs, dys, dwp, t, N, workers).run(workers, size)
        scratch = max(scratch, used + dwp.nbytes)
        dw = dwp.sum(axis=0).reshape(p.weight_shape)              # per-sample partials in sample order
    tracing.workspace(scratch)
    return dx, dw

