"""The forward at strides above 1 through the dense loops' input-gradient rows (csrc/direct_conv.c), on x's rows in
their stride phases (csrc/stem.c's phase rows).

    y[n, co, oh, ow] = sum over taps t, then input channels ci, of
                       x[n, ci, s_h oh + kh d_h - p_h, s_w ow + kw d_w - p_w] * w[co, ci, kh, kw]

Each input row (n, c, h) is copied once into its ``s_w`` phase rows of ``lq`` floats (phase q's element j is
``x[.., s_w j + q - p_w]``, zeros outside the row), the rows interleaved (per input row h, every channel's phase rows:
a register block reads its channels ``s_w lq`` floats apart, not a plane apart), so tap (kh, kw) of output row
(n, oh) reads a contiguous run at a constant offset from the row's start: the dx loops' form, with x's phase rows as
their dy grid and the weights in the dual's tap-major layout (:func:`.dense.tap_major` with flip: taps in reverse
order). A row runs only the tap rows whose input row lies inside x (the others read only the top or bottom padding:
their terms are +0, and skipping them changes no bit: a sum is never -0), and each tap only the positions whose input
column does (:func:`tap_cols`; at most two positions at each end of a block). Each output element is one job's sum in
one order whatever the workers, so the bits depend on the configuration and the values only. Served
(:func:`computes`): float32, 1-D and 2-D, not transposed, a stride above 1, output channels per group a multiple of
16; the weights finite (fast.fprop detours a non-finite weight, as for the stride-1 forward).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from xconv import ConvParams

from . import small_c
from .aligned import empty_result
from .dense_plan import dx_units, frozen, inside, run_width
from .dense_weights import ROW_TASKS_PER_WORKER
from .jobs import Jobs
from .native import address
from .workers import even_ranges

#: Jobs per worker of the phase copies (the sums: dense_weights.ROW_TASKS_PER_WORKER).
TASKS_PER_WORKER = 2


def computes(p: ConvParams) -> bool:
    """Whether :func:`fprop` computes ``p``'s forward (see the module docstring): also at most 64 stride phases (each
    input row is copied into all of its ``s_w`` phases: the scratch grows with the stride) and 4096 taps."""
    return (p.dtype == "float32" and not p.transposed and p.nd <= 2 and any(s > 1 for s in p.stride)
            and math.prod(p.stride) <= 64 and math.prod(p.kernel) <= 4096
            and min(p.output_shape) > 0 and min(p.input_shape) > 0 and (p.output_shape[1] // p.groups) % 16 == 0)


def _lifted(p: ConvParams) -> tuple:
    """(H, W, Ho, Wo, KH, KW, s_h, s_w, d_h, d_w, p_h, p_w) of ``p`` as 2-D (a 1-D call: one row)."""
    one = (1,) if p.nd == 1 else ()
    (H, W), (Ho, Wo) = one + tuple(p.input_shape[2:]), one + tuple(p.output_shape[2:])
    (KH, KW), (sh, sw), (dh, dw) = one + tuple(p.kernel), one + tuple(p.stride), one + tuple(p.dilation)
    (ph, pw) = (0,) * (2 - p.nd) + tuple(a for a, _ in p.padding)
    return H, W, Ho, Wo, KH, KW, sh, sw, dh, dw, ph, pw


@functools.lru_cache(maxsize=64)
def plan(p: ConvParams, nb: int | None = None) -> SimpleNamespace:
    """The call's tables for blocks of ``nb`` samples (None: all N; cached): the phase rows' length ``lq``, the
    channel stride ``ldy`` of x's phase rows and their stride ``rs`` per input row (all channels' phase rows of one
    input row together), the taps' offsets (reverse tap order: the flipped weights'), per output row (n, oh) of a
    block where it reads and its tap range (``rin``, triples) and where it writes (``rout``)."""
    N, C = p.input_shape[0] if nb is None else nb, p.input_shape[1]
    H, W, Ho, Wo, KH, KW, sh, sw, dh, dw, ph, pw = _lifted(p)
    K = KH * KW
    lq = Wo + (KW - 1) * dw // sw                       # a row's widest read: Wo positions past the farthest tap
    ldy = sw * lq                                       # one channel's phase rows of one input row
    rs = C * ldy                                        # one input row's, every channel's
    t = K - 1 - np.arange(K)                            # tap t' of the flipped weights is tap K - 1 - t'
    kh, kw = t // KW, t % KW
    offs = -((kh * dh - ph) * rs + (kw * dw) % sw * lq + (kw * dw) // sw)
    n, oh = np.divmod(np.arange(N * Ho, dtype=np.int64), Ho)
    top = sh * oh - ph                                  # the input row of tap row 0
    kh0 = np.clip(np.where(top >= 0, 0, (-top + dh - 1) // dh), 0, KH)    # the first tap row with top + kh dh >= 0
    kh1 = np.clip(np.where(H - 1 - top < 0, 0, (H - 1 - top) // dh + 1), 0, KH)    # past the last <= H - 1
    empty = kh1 <= kh0
    rin = np.stack([n * H * rs + sh * oh * rs,
                    np.where(empty, 0, K - kh1 * KW), np.where(empty, 0, K - kh0 * KW)], 1).astype(np.int64)
    rout = (n * p.output_shape[1] * Ho * Wo + oh * Wo).astype(np.int64)
    offs = np.concatenate([offs, tap_cols(kw, dw, sw, pw, W, Wo).ravel()])
    return SimpleNamespace(N=N, C=C, H=H, Ho=Ho, Wo=Wo, K=K, lq=lq, ldy=ldy, rs=rs, offs=frozen(offs.astype(np.int64)),
                           rin=frozen(rin.ravel()), rout=frozen(rout))


def tap_cols(kw: np.ndarray, dw: int, sw: int, pw: int, W: int, Wo: int) -> np.ndarray:
    """Per tap (its column ``kw``): the output positions [j0, j1) whose input column s_w ow + kw d_w - p_w lies in
    x's W columns (:func:`.dense_plan.inside`); the others read the phase rows' zeros, and the loops skip their terms
    (csrc/direct_dx_block.h: +0 terms, as the weights are finite here and a sum is never -0, so no bit changes)."""
    return inside(kw * dw - pw, sw, W, Wo)


def phase_floats(p: ConvParams) -> int:
    """Floats of x's phase rows for the whole call (the cost model's copy; the scratch holds a block's)."""
    f = plan(p)
    return f.N * f.H * f.rs


def block_samples(p: ConvParams, limit: int | None) -> int:
    """Samples per block: all of them, or as many as a workspace ``limit`` holds (at least one: a sample that does
    not fit is refused by the lease, naming the bytes). A function of the configuration and the limit only."""
    N = p.input_shape[0]
    if limit is None:
        return N
    return max(1, min(N, (limit - 64) // (4 * phase_floats(p) // N)))


def tap_share(p: ConvParams) -> float:
    """The share of the (output position, tap) terms the loops run (rows skip tap rows outside x, taps the positions
    reading x's padding columns, at most two at each end of a row: :func:`.dense_plan.run_width`): the cost
    model's."""
    f = plan(p)
    upto = np.concatenate([[0], np.cumsum(run_width(f.offs[f.K:].reshape(f.K, 2), f.Wo))])  # run by taps [0, t)
    return float((upto[f.rin[2::3]] - upto[f.rin[1::3]]).sum()) / (len(f.rout) * f.K * f.Wo)


def block_jobs(f, g: int, m: int, xr, geo, phases, wt, y, workers: int, ready: int = 0) -> tuple:
    """(x's phase copies, the row sums) of a block of ``m`` samples of plan ``f``, x's at ``xr`` (float32,
    C-contiguous) with its geometry ``geo``, its phase rows in ``phases``, the weights ``wt`` in the dual's tap-major
    layout, y's samples at ``y``: the copies in phase 0, the sums once those and ``ready`` other phase-0 jobs are done."""
    Cg, Cog, Q = f.C // g, wt.shape[-1], f.Ho * f.Wo
    parts = even_ranges(m * f.C * f.H, TASKS_PER_WORKER * workers)
    copies, sums = Jobs(), Jobs()
    copies.split("stem_phases", (address(xr), address(phases), address(geo), 0, 0, f.lq, 1), 3, parts, signal=0)
    sums.split("dx_rows", (address(phases), f.ldy, Cg * f.ldy, address(wt), wt.strides[2] // 4, wt.strides[0] // 4,
                           address(f.offs), f.K, Cg, Cog, address(y), Q, Cog * Q, 1, address(f.rin), address(f.rout),
                           m * f.Ho, 0, 0, f.Wo), 17,
               even_ranges(g * m * f.Ho * dx_units(f.K, Cg, Cog), ROW_TASKS_PER_WORKER * workers),
               wait=(0, ready + len(parts)))
    return copies, sums


def fprop(x, wt, bias, p: ConvParams, workers: int, lease):
    """y = conv(x, w) + bias for :func:`computes` calls, ``wt`` the weights in the dual's tap-major layout
    (g, K, C_in/g, C_out/g) float32 with unit-stride rows (:func:`.dense.tap_major` with flip; rows may be padded);
    x's phase rows in ``lease``, by blocks of samples within its limit (:func:`block_samples`: the same sums,
    whatever the blocks)."""
    g, N = p.groups, p.input_shape[0]
    f = plan(p, block_samples(p, lease.limit))
    xr, geo = small_c.im2col_input(x, p, np.float32)
    phases = lease.empty((f.N * f.H * f.rs,), np.dtype(np.float32))
    y = empty_result(p.output_shape, np.float32)
    for n0 in range(0, N, f.N):
        m = min(f.N, N - n0)
        Jobs.concatenated(block_jobs(f, g, m, xr[n0:], geo, phases, wt, y[n0:], workers)).run(workers)
    if bias is not None:
        y += np.asarray(bias, np.float32).reshape((1, -1) + (1,) * p.nd)
    return y
