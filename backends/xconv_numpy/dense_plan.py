"""The dense loops' plan of a call: what :mod:`.dense` needs that does not depend on the data, cached per configuration.

The grids' geometry (x channels-last per group, dy in rows interleaved with a margin: see :func:`plan`), the input
gradient's phases with their taps, tap offsets and per-row tap ranges (rows skip the taps that read only dy's zero
rows: :func:`row_taps`), the weight gradient's rows and segments, the copy tables, and the samples per block. A
call's job templates are kept on its plan (``templates``), so that they live exactly as long as the tables they
point into.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES

from . import native
from .grid.geometry import padded

#: Bytes of dy and x that one segment of the weight-gradient loop takes (kept in cache across its tasks).
DW_SEGMENT_BYTES = 256 << 10


def _rows(m: int, lead, dims, first, sample: int, step=None, strides=None) -> np.ndarray:
    """Flat offsets of rows (sample n < m, leading indices j_k < lead) of grids with spatial dims ``dims``
    and ``sample`` elements per sample: n*sample + sum_k (first_k + j_k * step_k) * stride_k, the last
    dim at first[-1] (``step`` 1 by default; ``strides`` those of C order over ``dims`` by default)."""
    gs = strides or [math.prod(dims[i + 1:]) for i in range(len(dims))]
    step = step or (1,) * len(dims)
    idx = np.full((m,) + tuple(lead), first[-1] * gs[-1], np.int64)
    idx += (np.arange(m, dtype=np.int64) * sample).reshape((m,) + (1,) * len(lead))
    for k, n in enumerate(lead):
        shape = [1] * (len(lead) + 1)
        shape[k + 1] = n
        idx += ((first[k] + np.arange(n, dtype=np.int64) * step[k]) * gs[k]).reshape(shape)
    return idx.ravel()


def _box_complement(dims, first, size, lead: int):
    """Slices (``lead`` leading full axes, then one per dim of ``dims``) that together cover, once each,
    the positions of a grid of ``dims`` outside the box [first, first + size)."""
    out = []
    for k in range(len(dims)):
        inner = tuple(slice(a, a + n) for a, n in zip(first[:k], size[:k]))
        rest = (slice(None),) * (len(dims) - k - 1)
        for sl in (slice(0, first[k]), slice(first[k] + size[k], dims[k])):
            if sl.stop > sl.start:
                out.append((slice(None),) * lead + inner + (sl,) + rest)
    return out


def _phase_plan(S, X, Y, s, d, k, pre, gY):
    """Per phase rho of the strided input (xi = s*m + rho on the x grid): the taps reading it, their flat
    offsets on the dy grid (o = m - q, q = (t*d - rho) / s), and the range of m holding input positions."""
    taps = list(np.ndindex(*k))
    plan = []
    for rho in np.ndindex(*s):
        idx = [i for i, t in enumerate(taps) if all((tk * dk - r) % sk == 0 for tk, dk, r, sk in zip(t, d, rho, s))]
        offs = [sum((tk * dk - r) // sk * g for tk, dk, r, sk, g in zip(taps[i], d, rho, s, gY)) for i in idx]
        lo = [-(-(a - r) // sk) for a, r, sk in zip(pre, rho, s)]
        hi = [(a + n - 1 - r) // sk for a, n, r, sk in zip(pre, S, rho, s)]
        if any(h < lo_ for lo_, h in zip(lo, hi)):
            continue                                     # no input position in this phase
        plan.append((rho, idx, np.array(offs or [0], np.int64), lo, [h - lo_ + 1 for lo_, h in zip(lo, hi)]))
    return plan


def row_taps(idx, lo, lead, O, k, d, rho, s) -> np.ndarray:
    """Per row of a dx phase (leading indices m = lo + j, j < lead, in C order): the range [t0, t1) of the phase's
    taps (``idx``, flat tap indices) that can read dy there, the smallest holding every tap whose leading dims
    read inside dy (0 <= m - q < O, q = (t d - rho) / s); (0, 0) where none does. The others read only the dy
    grid's zero rows: skipped, they change no bit of the sums (their terms are +0, as a sum never is -0)."""
    nl = len(lead)
    if nl == 0 or not idx:
        return np.array([[0, len(idx)]], np.int64).repeat(math.prod(lead), 0)
    taps = list(np.ndindex(*k))
    q = np.array([[(taps[i][a] * d[a] - rho[a]) // s[a] for a in range(nl)] for i in idx], np.int64)    # (T, nl)
    m = np.stack(np.meshgrid(*[lo[a] + np.arange(n, dtype=np.int64) for a, n in enumerate(lead)], indexing="ij"),
                 -1).reshape(-1, nl)                                                                    # (rows, nl)
    r = m[:, None, :] - q[None]
    valid = ((r >= 0) & (r < np.array(O[:nl], np.int64))).all(-1)                                            # (rows, T)
    any_ = valid.any(1)
    t0 = np.where(any_, valid.argmax(1), 0)
    t1 = np.where(any_, len(idx) - valid[:, ::-1].argmax(1), 0)
    return np.stack([t0, t1], 1).astype(np.int64)


def inside(base, step: int, n: int, row_len: int) -> np.ndarray:
    """Per tap, the positions [j0, j1) of a row of ``row_len`` whose column ``step j + base`` (``base`` one per tap)
    lies in [0, n): (T, 2) int64, j0 <= j1, both within [0, row_len]."""
    base = np.asarray(base, np.int64).reshape(-1)
    j0 = np.clip(-(base // step), 0, row_len)                             # step j + base >= 0
    return np.stack([j0, np.clip((n - 1 - base) // step + 1, j0, row_len)], 1).astype(np.int64)   # ... < n


def dx_cols(idx, k, d, rho, s, lo: int, n: int, row_len: int) -> np.ndarray:
    """Per tap of a dx phase (``idx``, flat tap indices): the positions [j0, j1) of a row (position j at m = lo + j of
    the last dim) whose dy column m - q (q = (t d - rho) / s) lies in dy's ``n`` columns (:func:`inside`); the others
    read the dy grid's zeros, and the loops skip their terms (csrc/direct_dx_block.h: +0 terms, as the weights are
    finite there and a sum is never -0, so no bit changes). (T, 2) int64."""
    taps = list(np.ndindex(*k))
    q = np.array([(taps[i][-1] * d[-1] - rho[-1]) // s[-1] for i in idx], np.int64).reshape(-1)
    return inside(lo - q, 1, n, row_len)


def run_width(cols: np.ndarray, row_len: int) -> np.ndarray:
    """Per tap, the positions of a row of ``row_len`` the loops run given its range ``cols`` (T, 2) of
    :func:`dx_cols`: none where the range is empty, else all but up to two at each end (csrc/direct_dx_block.h skips
    at most two at each end of a block; the blocks inside a row skip nothing at their inner ends)."""
    lo, hi = cols[:, 0], cols[:, 1]
    return np.where(hi > lo, row_len - np.minimum(lo, 2) - np.minimum(row_len - hi, 2), 0)


def frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _grids(p: ConvParams) -> tuple:
    """(S, O, kernel, dilation, stride, padding before, X, Y): the spatial dims of x, dy and the grids
    (:func:`plan`)."""
    S, O, k, d = tuple(p.input_shape[2:]), tuple(p.output_shape[2:]), tuple(p.kernel), tuple(p.dilation)
    st, pre, X = tuple(p.stride), tuple(a for a, _ in p.padding), padded(p)
    qmax = tuple((kk - 1) * dd // ss for kk, dd, ss in zip(k, d, st))
    return S, O, k, d, st, pre, X, tuple(max(-(-xx // ss), o + q) for xx, ss, o, q in zip(X, st, O, qmax))


@functools.lru_cache(maxsize=256)
def dx_tap_share(p: ConvParams) -> float:
    """The share of the input gradient's (position, tap) terms the loops run, each row skipping the taps that read
    only dy's zero rows (:func:`row_taps`) and each tap the positions that read only its zero columns, at most
    two at each end of a row (:func:`dx_cols`, :func:`run_width`): 1.0 where nothing is skipped (the cost model's, a
    function of the geometry)."""
    S, O, k, d, st, pre, X, Y = _grids(p)
    gY = [math.prod(Y[i + 1:]) for i in range(p.nd)]
    run = total = 0
    for rho, idx, _, lo, cnt in _phase_plan(S, X, Y, st, d, k, pre, gY):
        taps = row_taps(idx, lo, cnt[:-1], O, k, d, rho, st)
        upto = np.concatenate([[0], np.cumsum(run_width(dx_cols(idx, k, d, rho, st, lo[-1], O[-1], cnt[-1]),
                                                        cnt[-1]))])            # positions run by taps [0, t)
        run += int((upto[taps[:, 1]] - upto[taps[:, 0]]).sum())
        total += len(taps) * len(idx) * cnt[-1]
    return run / total if total else 1.0


def _dw_in_input(p: ConvParams) -> tuple:
    """Per tap (flat, C order) of ``p``'s weight gradient: the positions [lo, hi) of a dy row whose x column is in the
    input (last dim), and per dy row of one sample (leading dims, C order) and tap whether its x row is (K, rows)."""
    S, O, k, d, st, pre = (tuple(p.input_shape[2:]), tuple(p.output_shape[2:]), tuple(p.kernel), tuple(p.dilation),
                           tuple(p.stride), tuple(a for a, _ in p.padding))
    taps = np.array(list(np.ndindex(*k)), np.int64).reshape(-1, len(k))                    # (K, nd)
    cols = inside(taps[:, -1] * d[-1] - pre[-1], st[-1], S[-1], O[-1])     # o * s + t d - pre in [0, S)
    lead = np.indices(O[:-1]).reshape(len(O) - 1, -1).T if len(O) > 1 else np.zeros((1, 0), np.int64)
    xi = lead[None] * np.array(st[:-1], np.int64) + (taps[:, None, :-1] * np.array(d[:-1], np.int64)
                                                     - np.array(pre[:-1], np.int64))      # (K, rows, nd - 1)
    return cols, ((xi >= 0) & (xi < np.array(S[:-1], np.int64))).all(-1)


def _dw_taps(off: np.ndarray, cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The weight gradient loops' tap table (csrc/direct_conv.c, dw_rows): the taps' offsets ``off``, per tap the
    positions [lo, hi) of a row it runs (``cols``, (K, 2)), the rows R of a sample, then per row of a sample and tap
    (bytes, K a row) whether it runs (``rows``, (K, R); row r of a block as row r % R)."""
    K = len(off)
    flags = np.ascontiguousarray(rows.T, np.uint8).ravel()                                  # (R, K)
    table = np.zeros(3 * K + 1 + -(-flags.size // 8), np.int64)
    table[:K], table[K:3 * K], table[3 * K] = off, cols.ravel(), rows.shape[1]
    table[3 * K + 1:].view(np.uint8)[:flags.size] = flags
    return frozen(table)


def _share(cols: np.ndarray, rows: np.ndarray, width: int) -> float:
    """The share of (position, tap) terms that ``cols`` and ``rows`` (:func:`_dw_in_input`) run, rows of ``width``."""
    return float((rows * (cols[:, 1:] - cols[:, :1])).sum() / (rows.size * width))


@functools.lru_cache(maxsize=256)
def dw_tap_share(p: ConvParams) -> float:
    """The share of the weight gradient's (position, tap) terms the loops run where dy is finite (the others multiply
    x's padding: :func:`_dw_taps`): 1.0 where no tap reads padding. A function of the geometry; the cost model's dense
    estimate does not scale by it (docs/numpy-backend.md)."""
    return _share(*_dw_in_input(p), p.output_shape[-1])


@functools.lru_cache(maxsize=64)       # above a real model's dense configurations (ResNet-18: 12)
def plan(p: ConvParams, need_dx: bool, need_dw: bool, budget: int) -> SimpleNamespace:
    """What :func:`.dense.backward` needs that does not depend on the data (cached): the grids' geometry, samples per
    block (``nb``), per-phase row tables and tap offsets of dx, the dw rows and segment, the copy tables.

    x grid: ``X = S + pre + post`` per dim, flattened, x at ``[pre, pre + S)``, per group channels-last (dw loads
    16 channels; a group's positions contiguous). dy grid: ``Y = max(ceil(X/s), O + q_max)`` per dim (the last
    rounded up by :func:`row_pitch`), dy at ``[0, O)``, rows interleaved: per sample a margin of M zeros (the largest
    tap offset), then per row of the grid (its leading dims, C order) every channel's Y[-1] positions, channel co at
    ``co * ldy`` (``ldy = Y[-1]``; ``rp = Co * ldy`` floats a row, ``dy_sample`` a sample). The samples per block
    (``nb``) count :func:`channel_major_floats` per sample, the grid's before its rows were interleaved: the weight
    gradient adds its blocks in order, so its bits stay those of the blocks it had. A block of positions reads its
    channels a few hundred bytes apart, not a grid apart: a channel-major grid put each of 64 channels on a page of
    its own (4x64x64x64 -> 32 3x3 forward, one thread, 94 -> 118 G multiply-adds/s; 128 channels 75 -> 106).
    """
    nd, g = p.nd, p.groups
    N, C = p.input_shape[:2]
    Co = p.output_shape[1]
    S, O, k, d, st, pre, X, Y = _grids(p)
    cm_floats = channel_major_floats(S, X, Y, st, d, k, pre, need_dx)
    if p.workspace_limit is None:                        # a limited call's grid never holds more than it did
        Y = Y[:-1] + (row_pitch(Y[-1]),)
    f = SimpleNamespace(nd=nd, g=g, N=N, C=C, Co=Co, S=S, O=O, st=st, pre=pre, Cg=C // g, Cog=Co // g,
                        K=math.prod(k), out_dt=DTYPES[p.dtype], X=X, Y=Y)
    gX = [math.prod(X[i + 1:]) for i in range(nd)]
    f.ldy = ldy = Y[-1]                                  # channel stride of the dy grid within a row
    f.rp = rp = Co * ldy                                 # floats per row of the dy grid (all channels)
    gY = [math.prod(Y[i + 1:-1]) * rp for i in range(nd - 1)] + [1]        # the dy grid's strides per dim
    f.Xn, f.Yn, f.Sn = Xn, Yn, Sn = math.prod(X), math.prod(Y), math.prod(S)
    phases = _phase_plan(S, X, Y, st, d, k, pre, gY) if need_dx else []
    f.M = M = max([int(ph[2].max()) for ph in phases] + [0])
    f.dy_sample = dy_sample = -(-(M + Yn // Y[-1] * rp) // 16) * 16        # samples 64-byte aligned
    per_sample = 4 * (Co * cm_floats + C * Xn * need_dw + C * Sn * (need_dx and f.out_dt != np.float32))
    nb = max(1, min(N, budget // max(per_sample, 1)))
    f.nb = nb = -(-N // -(-N // nb))                     # as many blocks, of even sizes
    # copy tasks per sample: ranges of dy grid rows and of x positions, so that the workers share a block of
    # few samples (at least 4 tasks per block where the rows allow)
    f.copy_parts = max(1, min(-(-4 // nb), Yn // Y[-1], Sn))
    f.x_pad_slices = _box_complement(X, pre, S, lead=1)
    # per row of the dy grid: where its values start in one sample's dy, or -1 (a row of padding)
    f.dy_rows = np.full(Yn // Y[-1], -1, np.int64)
    f.dy_rows[_rows(1, O[:-1], Y, (0,) * nd, 0) // Y[-1]] = _rows(1, O[:-1], O, (0,) * nd, 0)
    f.dx_jobs = []                                       # per phase: taps, their offsets, rows in and out
    for rho, idx, offs, lo, cnt in phases:
        lead = cnt[:-1]
        rin = np.empty((nb * math.prod(lead), 3), np.int64)    # per row: where it reads, its taps [t0, t1)
        rin[:, 0] = _rows(nb, lead, Y, lo, dy_sample, strides=gY) + M
        rin[:, 1:] = np.tile(row_taps(idx, lo, lead, O, k, d, rho, st), (nb, 1))
        first = [ss * l + r - a for ss, l, r, a in zip(st, lo, rho, pre)]
        rout = _rows(nb, lead, S, first, C * Sn, st)
        cols = dx_cols(idx, k, d, rho, st, lo[-1], O[-1], cnt[-1])
        table = np.concatenate([offs, cols.ravel()]) if idx else offs       # offsets, then per tap its positions
        f.dx_jobs.append(SimpleNamespace(taps=idx, offs=frozen(table),
                                         rin=frozen(rin.ravel()), rout=frozen(rout),
                                         row_len=cnt[-1], rows=len(rin) // nb))
    f.dx_order = sorted(range(len(f.dx_jobs)), key=lambda j: -len(f.dx_jobs[j].taps) * f.dx_jobs[j].rows)
    if need_dw:
        off_w = np.array([sum(t * dd * gg for t, dd, gg in zip(tt, d, gX)) for tt in np.ndindex(*k)], np.int64)
        cols, rows = _dw_in_input(p)                     # the terms whose x is in the input
        f.dw_skips = _share(cols, rows, O[-1]) < 1      # whether a table of those skips anything
        every = _dw_taps(off_w, np.array([[0, O[-1]]] * f.K, np.int64), np.ones_like(rows))
        f.dw_taps = (every, _dw_taps(off_w, cols, rows) if f.dw_skips else every)    # by dense.skips_padding
        # rows of dy (O[-1] positions each, not the grid's flat rows: those also cover the padding columns,
        # 3-14% more work on the suite for zeros, 7% slower on the dilated case)
        f.rdy = _rows(nb, O[:-1], Y, (0,) * nd, dy_sample, strides=gY) + M
        f.rx = _rows(nb, O[:-1], X, (0,) * nd, g * Xn, st)
        f.dw_len, f.dw_step = O[-1], st[-1]
        f.dw_rows = len(f.rdy) // nb
        # positions per segment of the dw loop: its dy (C_out/g channels) and x (C_in/g, at the stride) in ~256 KiB
        f.dw_seg = int(min(1024, max(16, DW_SEGMENT_BYTES // (4 * (f.Cog + f.Cg * f.dw_step)))))
        f.dw_blocks = f.K * (f.Cog // 16) * (f.Cg // 16)
        # where each x position goes in its grid, and the grid positions left zero
        f.x_pos = (_rows(1, S[:-1], X, pre, 0)[:, None] + np.arange(S[-1], dtype=np.int64)).ravel()
        free = np.ones(Xn, bool)
        free[f.x_pos] = False
        f.x_pad = np.flatnonzero(free).astype(np.int64)
        for name in ("rdy", "rx", "x_pos", "x_pad"):
            frozen(getattr(f, name))
    frozen(f.dy_rows)
    f.ldx = grid_row(f.Cg) if p.workspace_limit is None else f.Cg     # floats per position of the x grids
    f.templates = {}                                     # the call's job templates (dense.backward)
    return f


@functools.lru_cache(maxsize=256)
def dx_units(T: int, Cog: int, Cg: int) -> int:
    """Channel units per group of the input-gradient loops' items (csrc/direct_conv.c's xconv_dx_units: Cg / 32 where
    the rows run channel block by channel block, else 1): a job list splits g x units x rows items."""
    return int(native.library().xconv_dx_units(T, Cog, Cg))


@functools.lru_cache(maxsize=256)
def taps_rows(T: int, Cog: int) -> bool:
    """Whether the input-gradient loops run a row of T taps over Cog dy channels a few taps at a time (csrc/
    direct_conv.c's xconv_dx_taps_rows: the AVX2 build, a tap's weights for 16 channels within 24 KiB and the row's
    past 32 KiB; else block by block)."""
    return bool(native.library().xconv_dx_taps_rows(T, Cog))


def channel_major_floats(S, X, Y, st, d, k, pre, need_dx: bool) -> int:
    """Floats per channel of the channel-major dy grid the loops had before its rows were interleaved (a margin of the
    largest tap offset, then the grid, rounded up to an odd number of 64-byte lines): what :func:`plan`'s samples per
    block count, so that they (and the weight gradient's order of adding blocks) did not change with the layout. Co
    times it is at least an interleaved grid's floats per sample whose rows are not padded (:func:`plan` under a
    workspace limit): its margin is at most Co times the channel-major one, and it is rounded once, not per channel."""
    gY = [math.prod(Y[i + 1:]) for i in range(len(Y))]
    phases = _phase_plan(S, X, Y, st, d, k, pre, gY) if need_dx else []
    return padded_row(max([int(ph[2].max()) for ph in phases] + [0]) + math.prod(Y))


def row_pitch(n: int) -> int:
    """Floats per channel of a row of the dy grid for rows of n positions: n below 128 (rows of a few hundred bytes
    spread a block's channels over the cache sets), else :func:`padded_row` (an odd number of 64-byte lines: rows of
    a power-of-two number of lines would put every channel's row in one set)."""
    return n if n < 128 else padded_row(n)


def grid_row(n: int) -> int:
    """Floats per position of the x grids of the weight-gradient loops for n channels per group: :func:`padded_row`
    from 128 channels (512-byte positions: a channel block's loads would fall in one cache set of 8 or fewer),
    else n (weight gradient, one thread, G multiply-adds/s: 2x256x14x14 -> 256 3x3 49 -> 57, 2x128x4x14x14 -> 128
    3x3x3 66 -> 75). The plan (:func:`plan`) pads only calls without a workspace limit: the samples per block (the
    plan's budget) count n, and a limited call's scratch must stay what it was counted as."""
    return padded_row(n) if n >= 128 else n


def padded_row(n: int) -> int:
    """Floats per row of the dx loops' weights (T, Cog, rows of n channels) as the one-region call copies them: n
    rounded up to an odd number of 64-byte lines. A channel block's weights are then spread over every cache set;
    at n = 256 (1 KiB rows) they fell in one set of 16 and were read from memory again for every row of dy
    (2x256x14x14 -> 256 3x3 forward, one thread: 56 G multiply-adds/s against 79 at 128 channels)."""
    lines = -(-n // 16)
    return 16 * (lines + 1 - lines % 2)
