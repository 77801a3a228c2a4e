"""Direct convolution backward in compiled C loops (csrc/direct_conv.c), for channel counts per group
that are multiples of 16.

im2col + BLAS loses most where one GEMM dimension is 16-32 channels (BLAS packing costs as much
as the arithmetic) and spends 20-40% on column copies elsewhere. These loops compute the sums
directly, register-blocked. Per sample, x is copied into zero-padded channels-last grids (one per
group) and dy into a zero-padded channel-major grid (geometry: :func:`_plan`); every tap is then a
constant flat offset:

- dx, per phase rho of the strided input (``xi = s*m + rho``; one phase at stride 1):
  ``dx[c, s*m + rho - pre] = sum over the phase's taps t of sum_co dy_grid[co, m - q_t] w[co, c, t]``,
  ``q_t = (t*d - rho) / s``: 8-14 positions x 32 input channels (or 12 x 16) per register block, each row
  only the taps that can read dy (the others read the grid's zero rows: :func:`_row_taps`);
- ``dw[co, c, t] = sum_n sum_o dy_grid[co, o] x_grid[s*o + t*d, c]``: 8 x 32 (or 16 x 16) channel
  blocks, dy broadcast and x loaded 16 channels at a time, row by row of dy, over cache-sized
  segments of positions;
- db in float64 while dy is copied.

Each output element is computed by one task in a fixed order; tasks are ranges of (group, row)
items (dx) and (group, tap, channel block) items (dw); blocks of samples add their dw in block
order. So results are bitwise reproducible and do not depend on the number of workers. Sums run
in float32 (float16 and bfloat16 are computed in float32, as on the BLAS path); float64 keeps the
BLAS path. By default stride 1, and stride 2 with 32k input channels per group, use these loops
(see :func:`serves`).

The C file is built at install, once per instruction set, and the best build the CPU runs is loaded with
ctypes (see :mod:`.native`), whose calls release the GIL. Without the builds (installed without a
compiler), or with ``XCONV_NUMPY_C=0``, :func:`serves` is False and the BLAS path runs.
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
from .jobs import Jobs
from .native import address
from .workers import even_ranges

#: Tasks per worker and kind (dx rows, dw blocks) in each block of samples: more balance the workers, fewer cost less.
TASKS_PER_WORKER = 2
#: Bytes of dy and x that one segment of the weight-gradient loop takes (kept in cache across its tasks).
DW_SEGMENT_BYTES = 256 << 10
#: The switch of these loops (the settings field of ``$XCONV_NUMPY_C``).
SWITCH = "numpy_c"


#: Builds whose dense loops are used. The loops work on 16-float vectors (GCC vector extensions): one AVX-512
#: register; the AVX2 build has blocks of 8-float vectors (csrc/direct_conv.c, DENSE_V8: the same sums in the same
#: order, the AVX-512 build's bits; one core, AVX2 stand-in on Zen 4: 35-52 GMAC/s against 43-62 at AVX-512; the
#: 16-float blocks ran 30x slower there). The baseline build emulates the vectors and ran 30-60x slower than the
#: BLAS path (measured on the suite's 3x3 cases), so there these shapes take the BLAS path.
DENSE_ISAS = ("avx512", "avx2")


def available() -> bool:
    """Whether the compiled loops can run (built at install, an AVX-512 or AVX2 build loaded, not disabled by
    XCONV_NUMPY_C=0)."""
    return native.part_on(SWITCH) and native.isa(native.library()) in DENSE_ISAS


def build_error() -> str | None:
    """Why the loops could not be loaded or are not used (None if they are, or were not tried)."""
    lib = native.library()
    if lib is not None and native.isa(lib) not in DENSE_ISAS:
        return f"the {native.isa(lib)} build emulates the loops' vectors: BLAS path instead"
    return native.load_error()


def computes(p: ConvParams) -> bool:
    """Whether these loops compute ``p``'s backward: not float64, not empty, a kernel of 2 to 4096 taps, at most
    64 stride phases (the plan lists taps and phases one by one), and channels per group that are multiples of
    16 (any dilation, padding)."""
    if p.dtype == "float64" or min(p.input_shape) == 0 or math.prod(p.kernel) > 4096 or math.prod(p.stride) > 64:
        return False
    Cg, Cog = p.input_shape[1] // p.groups, p.output_shape[1] // p.groups
    return Cg % 16 == 0 and Cog % 16 == 0 and math.prod(p.kernel) > 1


def serves(p: ConvParams) -> bool:
    """Whether the fast path uses these loops for ``p`` by default (``paths.force("dense")`` takes them for all they
    compute): stride 1, and strides of at most 2 with C_in/g a multiple of 32 (8x32 weight-gradient blocks).
    Measured against the BLAS path (2 workers, ms): 3x3 stride 2 at 256, 64->128, 32 channels 25 vs 28, 4.9 vs 6.8,
    4.6 vs 5.5; 16 channels 3.0 vs 3.0; 3x3 stride 3 at 32 channels 6.4 vs 5.7 (x loads at the stride waste most of
    each cache line)."""
    if not computes(p):
        return False
    if any(s != 1 for s in p.stride):
        if max(p.stride) > 2 or (p.input_shape[1] // p.groups) % 32:
            return False
    return available()


def _rows(m: int, lead, dims, first, sample: int, step=None) -> np.ndarray:
    """Flat offsets of rows (sample n < m, leading indices j_k < lead) of grids with spatial dims ``dims``
    and ``sample`` elements per sample: n*sample + sum_k (first_k + j_k * step_k) * stride_k, the last
    dim at first[-1] (``step`` 1 by default)."""
    gs = [math.prod(dims[i + 1:]) for i in range(len(dims))]
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


def _row_taps(idx, lo, lead, O, k, d, rho, s) -> np.ndarray:
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
                 -1).reshape(-1, nl)                                                                          # (rows, nl)
    r = m[:, None, :] - q[None]
    valid = ((r >= 0) & (r < np.array(O[:nl], np.int64))).all(-1)                                            # (rows, T)
    any_ = valid.any(1)
    t0 = np.where(any_, valid.argmax(1), 0)
    t1 = np.where(any_, len(idx) - valid[:, ::-1].argmax(1), 0)
    return np.stack([t0, t1], 1).astype(np.int64)

def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _grids(p: ConvParams) -> tuple:
    """(S, O, kernel, dilation, stride, padding before, X, Y): the spatial dims of x, dy and the grids (see _plan)."""
    S, O, k, d = tuple(p.input_shape[2:]), tuple(p.output_shape[2:]), tuple(p.kernel), tuple(p.dilation)
    st, pre, X = tuple(p.stride), tuple(a for a, _ in p.padding), padded(p)
    qmax = tuple((kk - 1) * dd // ss for kk, dd, ss in zip(k, d, st))
    return S, O, k, d, st, pre, X, tuple(max(-(-xx // ss), o + q) for xx, ss, o, q in zip(X, st, O, qmax))


@functools.lru_cache(maxsize=256)
def dx_tap_share(p: ConvParams) -> float:
    """The share of the input gradient's (position, tap) terms the loops run, each row skipping the taps that read
    only dy's zero rows (:func:`_row_taps`): 1.0 where no row skips (the cost model's, a function of the geometry)."""
    S, O, k, d, st, pre, X, Y = _grids(p)
    gY = [math.prod(Y[i + 1:]) for i in range(p.nd)]
    run = total = 0
    for rho, idx, _, lo, cnt in _phase_plan(S, X, Y, st, d, k, pre, gY):
        taps = _row_taps(idx, lo, cnt[:-1], O, k, d, rho, st)
        run += int((taps[:, 1] - taps[:, 0]).sum()) * cnt[-1]
        total += len(taps) * len(idx) * cnt[-1]
    return run / total if total else 1.0


@functools.lru_cache(maxsize=64)       # above a real model's dense configurations (ResNet-18: 12)
def _plan(p: ConvParams, need_dx: bool, need_dw: bool, budget: int) -> SimpleNamespace:
    """What :func:`backward` needs that does not depend on the data (cached): the grids' geometry, samples per
    block (``nb``), per-phase row tables and tap offsets of dx, the dw rows and segment, the copy tables.

    x grid: ``X = S + pre + post`` per dim, flattened, x at ``[pre, pre + S)``, per group channels-last (dw loads
    16 channels; a group's positions contiguous). dy grid: ``Y = max(ceil(X/s), O + q_max)`` per dim, dy at
    ``[0, O)``, channel-major with a margin of M (the largest tap offset) before each channel row.
    """
    nd, g = p.nd, p.groups
    N, C = p.input_shape[:2]
    Co = p.output_shape[1]
    S, O, k, d, st, pre, X, Y = _grids(p)
    f = SimpleNamespace(nd=nd, g=g, N=N, C=C, Co=Co, S=S, O=O, st=st, pre=pre, Cg=C // g, Cog=Co // g,
                        K=math.prod(k), out_dt=DTYPES[p.dtype], X=X, Y=Y)
    gX = [math.prod(X[i + 1:]) for i in range(nd)]
    gY = [math.prod(Y[i + 1:]) for i in range(nd)]
    f.Xn, f.Yn, f.Sn = Xn, Yn, Sn = math.prod(X), math.prod(Y), math.prod(S)
    phases = _phase_plan(S, X, Y, st, d, k, pre, gY) if need_dx else []
    f.M = M = max([int(ph[2].max()) for ph in phases] + [0])
    ldy = -(-(M + Yn) // 16) * 16                        # channel stride of the dy grid: an odd multiple of
    f.ldy = ldy = ldy + 16 * ((ldy // 16) % 2 == 0)      # 64 bytes, so 16 channel rows fall in 16 cache sets
    per_sample = 4 * (Co * ldy + C * Xn * need_dw + C * Sn * (need_dx and f.out_dt != np.float32))
    nb = max(1, min(N, budget // max(per_sample, 1)))
    f.nb = nb = -(-N // -(-N // nb))                     # as many blocks, of even sizes
    # copy tasks per sample: ranges of dy grid rows and of x positions, so that the workers share a block of
    # few samples (at least 4 tasks per block where the rows allow)
    f.copy_parts = max(1, min(-(-4 // nb), Yn // Y[-1], Sn))
    f.dy_pad = _box_complement(Y, (0,) * nd, O, lead=1)
    f.x_pad_slices = _box_complement(X, pre, S, lead=1)
    # per row of the dy grid: where its values start in one sample's dy, or -1 (a row of padding)
    f.dy_rows = np.full(Yn // Y[-1], -1, np.int64)
    f.dy_rows[_rows(1, O[:-1], Y, (0,) * nd, 0) // Y[-1]] = _rows(1, O[:-1], O, (0,) * nd, 0)
    f.dx_jobs = []                                       # per phase: taps, their offsets, rows in and out
    for rho, idx, offs, lo, cnt in phases:
        lead = cnt[:-1]
        rin = np.empty((nb * math.prod(lead), 3), np.int64)    # per row: where it reads, its taps [t0, t1)
        rin[:, 0] = _rows(nb, lead, Y, lo, Co * ldy) + M
        rin[:, 1:] = np.tile(_row_taps(idx, lo, lead, O, k, d, rho, st), (nb, 1))
        first = [ss * l + r - a for ss, l, r, a in zip(st, lo, rho, pre)]
        rout = _rows(nb, lead, S, first, C * Sn, st)
        f.dx_jobs.append(SimpleNamespace(taps=idx, offs=_frozen(offs), rin=_frozen(rin.ravel()), rout=_frozen(rout),
                                         row_len=cnt[-1], rows=len(rin) // nb))
    f.dx_order = sorted(range(len(f.dx_jobs)), key=lambda j: -len(f.dx_jobs[j].taps) * f.dx_jobs[j].rows)
    if need_dw:
        f.off_w = np.array([sum(t * dd * gg for t, dd, gg in zip(tt, d, gX)) for tt in np.ndindex(*k)], np.int64)
        # rows of dy (O[-1] positions each, not the grid's flat rows: those also cover the padding columns,
        # 3-14% more work on the suite for zeros, 7% slower on the dilated case)
        f.rdy = _rows(nb, O[:-1], Y, (0,) * nd, Co * ldy) + M
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
        for name in ("off_w", "rdy", "rx", "x_pos", "x_pad"):
            _frozen(getattr(f, name))
    _frozen(f.dy_rows)
    return f


def _readable(a: np.ndarray) -> bool:
    """Whether the copy loops read ``a`` (one sample) where it lies: float32, C-contiguous, aligned."""
    return a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned


def _dy_to_grid(dyn, grid_n, f, db_n) -> None:
    """One sample of dy (another dtype or layout) into its zero-padded channel-major grid by NumPy; its db partial
    (float64) in part 0, zeros in the others."""
    M, Yn = f.M, f.Yn
    grid_n[:, :M] = 0
    grid_n[:, M + Yn:] = 0
    grid = grid_n[:, M:M + Yn].reshape((f.Co,) + f.Y)
    for sl in f.dy_pad:
        grid[sl] = 0
    grid[(slice(None),) + tuple(slice(0, o) for o in f.O)] = dyn
    if db_n is not None:
        db_n[0] = grid_n[:, M:M + Yn].sum(axis=1, dtype=np.float64)    # padding adds zeros
        db_n[1:] = 0


def _x_to_grid(xn, grid_n, f) -> None:
    """One sample of x (another dtype or layout) into its zero-padded channels-last grids by NumPy."""
    grid = grid_n.reshape((f.g,) + f.X + (f.Cg,))
    for sl in f.x_pad_slices:
        grid[sl] = 0
    grid[(slice(None),) + tuple(slice(a, a + n) for a, n in zip(f.pre, f.S))] = \
        xn.reshape((f.g, f.Cg) + f.S).transpose((0,) + tuple(range(2, f.nd + 2)) + (1,))


def _add_taps(dx, dy, w, which, p: ConvParams) -> None:
    """dx += the terms dy[n, co, o] * w[co, c, t] of the weights where ``which`` is True, for the (o, t) pairs the
    convolution defines only (an infinite weight never meets the dy grid's zeros: as on the exact path)."""
    g = p.groups
    Cg, Cog = p.input_shape[1] // g, p.output_shape[1] // g
    S, O = p.input_shape[2:], p.output_shape[2:]
    for co, ci, *t in np.argwhere(which):
        c = co // Cog * Cg + ci
        src, dst = [slice(None), co], [slice(None), c]
        for tk, s, d, (pre, _), n_in, n_out in zip(t, p.stride, p.dilation, p.padding, S, O):
            lo = max(0, -(-(pre - tk * d) // s))                   # outputs o with 0 <= o*s + t*d - pre < n_in
            hi = min(n_out - 1, (n_in - 1 + pre - tk * d) // s)
            if hi < lo:
                break
            src.append(slice(lo, hi + 1))
            dst.append(slice(lo * s + tk * d - pre, hi * s + tk * d - pre + 1, s))
        else:
            dx[tuple(dst)] += dy[tuple(src)] * w[(co, ci, *t)]


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool, workers: int, budget: int, lease,
             wdx=None):
    """(dx, dw, db) of ``p`` (see :func:`computes`), None where not needed; scratch about ``budget`` bytes or one
    sample, taken from ``lease`` (``lease.empty(shape, dtype)``: uninitialized buffers). db is summed in float64 while
    dy is copied into its grid: per sample and copy part, then in that order. ``wdx``: w already in the dx loops'
    layout (g, K, Cog, Cg) float32 and finite (the forward's :func:`tap_major`; w itself is then not read)."""
    f = _plan(p, True, True, budget)                    # the full call's plan: blocks (dw's sum order) for any mask
    w_given, finite = w, None
    if need_dx and wdx is None and not np.isfinite(w).all():    # the loops multiply the dy grid's zeros by every weight:
        finite = np.isfinite(w)                          # they run with zeros for the non-finite ones, whose terms
        w = np.where(finite, w, 0).astype(w.dtype)       # are added after (see _add_taps)
    g, N, C, Co, Cg, Cog, K, S, O = f.g, f.N, f.C, f.Co, f.Cg, f.Cog, f.K, f.S, f.O
    M, ldy, Xn, Sn, nb = f.M, f.ldy, f.Xn, f.Sn, f.nb
    f32 = np.dtype(np.float32)
    # scratch from the caller's lease (kept between calls: no page faults); padding zeroed per sample in copy_in
    dyG = lease.empty((nb, Co, ldy), f32)
    xG = lease.empty((nb, g, Xn, Cg), f32) if need_dw else None
    if need_dx:
        dx = np.empty(p.input_shape, f.out_dt)
        dxb = dx if f.out_dt == f32 else lease.empty((nb, C) + S, f32)
    if need_dw:
        dw_part = lease.empty((g, K, Cog, Cg), f32)
        dw_acc = lease.empty((g, K, Cog, Cg), f32) if nb < N else None        # the sum of several blocks

    db_parts = np.empty((N, f.copy_parts, Co), np.float64) if need_db else None    # per sample and copy part
    if need_dx:                                          # per dx phase: its taps' weights (g, T, Cog, Cg)
        if wdx is None:
            wdx = tap_major(w, g, False, workers)
        if wdx is None:
            wdx = np.asarray(w, f32).reshape(g, Cog, Cg, K).transpose(0, 3, 1, 2)          # (g, K, Cog, Cg)
        w_jobs = [wdx if job.taps == list(range(K)) and wdx.flags.c_contiguous else
                  np.ascontiguousarray(wdx[:, job.taps]) for job in f.dx_jobs]
    for n0 in range(0, N, nb):
        n1 = min(n0 + nb, N)
        m = n1 - n0
        jobs = Jobs()
        # one run per block: the copies (phase 0), then the sums, which wait for all of the copies; the longest
        # sums first (dw, then dx phases by number of taps), so that the threads finish together. A sample of
        # another dtype or layout is copied here by NumPy instead (no converted copy: the same scratch)
        dy_copies, x_copies = [], []                     # one row of arguments per copy job
        for i in range(m):
            n = n0 + i
            if _readable(dy[n]):
                dy_copies += [[address(dy[n]), Co, math.prod(O), address(f.dy_rows), len(f.dy_rows), f.Y[-1], O[-1],
                               M, ldy, r0, r1, address(dyG[i]), address(db_parts[n, part]) if need_db else 0]
                              for part, (r0, r1) in enumerate(even_ranges(len(f.dy_rows), f.copy_parts))]
            else:
                _dy_to_grid(dy[n], dyG[i], f, db_parts[n] if need_db else None)
            if need_dw and _readable(x[n]):
                x_copies += [[address(x[n]), Sn, 0, C, Cg, Xn * Cg, address(f.x_pos), u0, u1, address(f.x_pad),
                              len(f.x_pad) if part == 0 else 0, address(xG[i])]
                             for part, (u0, u1) in enumerate(even_ranges(Sn, f.copy_parts))]
            elif need_dw:
                _x_to_grid(x[n], xG[i], f)
        for kind, rows in (("dy_to_grid", dy_copies), ("x_to_grid", x_copies)):
            if rows:
                jobs.rows(kind, rows, signal=0)
        copies = (0, len(jobs))
        if need_dw:
            jobs.split("dw_rows", (address(dyG), ldy, Cog * ldy, address(xG), Cg, Xn * Cg, f.dw_step, address(f.off_w),
                                   Cog, Cg, address(f.rdy), address(f.rx), m * f.dw_rows, f.dw_len, f.dw_seg,
                                   address(dw_part), K * Cog * Cg, f.dw_blocks), 18,
                       even_ranges(g * f.dw_blocks, TASKS_PER_WORKER * workers), wait=copies)
        if need_dx:
            base = address(dxb) + 4 * ((n0 if dxb is dx else 0) * C * Sn)
            for j in f.dx_order:
                job = f.dx_jobs[j]
                jobs.split("dx_rows", (address(dyG), ldy, Cog * ldy, address(w_jobs[j]), Cg,
                                       len(job.taps) * Cog * Cg, address(job.offs), len(job.taps), Cog, Cg, base, Sn,
                                       Cg * Sn, f.st[-1], address(job.rin), address(job.rout), m * job.rows, 0, 0,
                                       job.row_len), 17,
                           even_ranges(g * m * job.rows, TASKS_PER_WORKER * workers), wait=copies)
        jobs.run(workers)
        if need_dx and dxb is not dx:
            dx[n0:n1] = dxb[:m]
        if need_dw:                                      # blocks added in order
            if nb < N:
                if n0 == 0:
                    dw_acc[...] = dw_part
                else:
                    dw_acc += dw_part
    if need_dw:
        total = dw_acc if nb < N else dw_part
        dw = _taps_last(total, workers).reshape(p.weight_shape).astype(f.out_dt, copy=False)
    else:
        dw = None
    db = db_parts.reshape(-1, Co).sum(axis=0).astype(f.out_dt) if need_db else None
    if finite is not None:
        _add_taps(dx, dy, w_given, ~finite, p)
    return (dx if need_dx else None), dw, db


# ---------------------------------------------------------------------------------------------
# The weights in the loops' layout


@functools.lru_cache(maxsize=64)
def _positions(B: int, K: int, flip: bool, step: int) -> np.ndarray:
    """Where xconv_x_to_grid puts each weight read: flip, position u = b K + t goes to (K-1-t) B + b; else position t
    goes to t * step."""
    if flip:
        u = np.arange(B * K, dtype=np.int64)
        return _frozen((K - 1 - u % K) * B + u // K)
    return _frozen(np.arange(K, dtype=np.int64) * step)


def tap_major(w, g: int, flip: bool, workers: int):
    """``w`` (g A, B, *kernel) in the dx loops' tap-major layout by one transposing copy in C (csrc/direct_conv.c's
    xconv_x_to_grid, on up to ``workers`` threads), or None where w is not float32, C-contiguous and aligned, A and B
    multiples of 16 (the caller then copies by NumPy):

    - flip=False: ``out[gi, t, a, b] = w[gi A + a, b, t]`` (the weights of the input gradient);
    - flip=True: ``out[gi, t, b, a] = w[gi A + a, b, K - 1 - t]`` (the dual's, for the forward: :func:`dual`).

    Bits are copied, so the result equals NumPy's transposes (which took 3-7x longer: 0.25 ms for 256 x 256 x 3 x 3)."""
    A, B, K = w.shape[0] // g, w.shape[1], math.prod(w.shape[2:])
    if not (_readable(w) and A % 16 == 0 and B % 16 == 0):
        return None
    out = np.empty((g, K) + ((B, A) if flip else (A, B)), np.float32)
    jobs, parts = Jobs(), max(1, TASKS_PER_WORKER * workers)
    if flip:                # channels a of every group (rows of B K reads), positions u = b K + t: in 16 x 16 tiles
        rows = [[address(w), B * K, 0, g * A, A, K * B * A, address(_positions(B, K, True, 0)), u0, u1, 0, 0,
                 address(out)] for u0, u1 in even_ranges(B * K, parts)]
    else:                   # per group: channels a B + b (K reads each), positions t (the loops' scalar tail)
        pos = address(_positions(B, K, False, A))
        rows = [[address(w) + 4 * gi * A * B * K, K, 16 * c0, 16 * c1, B, B, pos, 0, K, 0, 0,
                 address(out) + 4 * gi * K * A * B]
                for gi in range(g) for c0, c1 in even_ranges(A * B // 16, max(1, parts // g))]
    jobs.rows("x_to_grid", rows)
    jobs.run(workers)
    return out

def _taps_last(total: np.ndarray, workers: int) -> np.ndarray:
    """The weight gradient's sums (g, K, Cog, Cg), float32 C-contiguous, as (g, Cog, Cg, K): one transposing copy in
    C (csrc/direct_conv.c's xconv_taps_last) on up to ``workers`` threads (bits copied)."""
    g, K, A, B = total.shape
    out = np.empty((g, A, B, K), np.float32)
    jobs, R = Jobs(), A * B
    parts = max(1, TASKS_PER_WORKER * workers // g)
    jobs.rows("taps_last", [[address(total) + 4 * gi * K * R, K, R, address(out) + 4 * gi * K * R, 16 * r0, 16 * r1]
                            for gi in range(g) for r0, r1 in even_ranges(R // 16, parts)])
    jobs.run(workers)
    return out

# ---------------------------------------------------------------------------------------------
# The forward through the input-gradient loops


def dual(p: ConvParams) -> ConvParams:
    """The convolution whose input gradient is ``p``'s forward (stride 1): input and output shapes swapped, each
    group's weights transposed and flipped (``w'[g Cg + c, co, t] = w[g Cog + co, c, K-1-t]``), padding
    ``d (k-1) - pad`` on each side."""
    pad = tuple(((k - 1) * d - a, (k - 1) * d - b) for k, d, (a, b) in zip(p.kernel, p.dilation, p.padding))
    Co, C = p.output_shape[1], p.input_shape[1]
    return p.replace(input_shape=tuple(p.output_shape), output_shape=tuple(p.input_shape),
                     weight_shape=(C, Co // p.groups) + tuple(p.kernel), padding=pad)


def computes_fprop(p: ConvParams) -> bool:
    """Whether :func:`fprop` computes ``p``'s forward: float32, stride 1, not transposed, padding at most the
    kernel's reach on each side (the dual's padding is not negative), and :func:`computes` for the dual."""
    if p.dtype != "float32" or p.transposed or any(s != 1 for s in p.stride) or min(p.output_shape) == 0:
        return False
    if any((k - 1) * d < max(a, b) for k, d, (a, b) in zip(p.kernel, p.dilation, p.padding)):
        return False
    return computes(dual(p))


def fprop(x, w, bias, p: ConvParams, workers: int, budget: int, lease):
    """y = conv(x, w) + bias for :func:`computes_fprop` calls: the input gradient of :func:`dual` with x as its dy
    (each output element one fixed order of the dx loops, whatever the workers), then the bias added in float32.
    ``budget``: the working-set bytes of the dual's backward (as for :func:`backward`); w finite (fast.fprop takes
    the columns path for a non-finite weight)."""
    g, nd = p.groups, len(p.kernel)
    Co, Cg = w.shape[0], w.shape[1]
    wdx = tap_major(w, g, True, workers)                 # the dual's weights in the loops' layout, one C copy
    if wdx is not None:
        wq = None
    else:
        flip = (Ellipsis,) + (slice(None, None, -1),) * nd
        wq = np.ascontiguousarray(w.reshape((g, Co // g, Cg) + w.shape[2:]).swapaxes(1, 2)[flip])
        wq = wq.reshape((g * Cg, Co // g) + w.shape[2:])
    y, _, _ = backward(x, None, wq, dual(p), True, False, False, workers, budget, lease, wdx=wdx)
    if bias is not None:
        y += np.asarray(bias, np.float32).reshape((1, -1) + (1,) * nd)
    return y
