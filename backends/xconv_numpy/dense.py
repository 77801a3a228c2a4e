"""Direct convolution in compiled C loops (csrc/direct_conv.c; their copies csrc/grid_copy.c), for channel counts per
group that are multiples of 16: the backward, and the float32 forward (:func:`fprop`: at stride 1 the input gradient
of the :func:`dual` call, at larger strides :mod:`.dense_strided`).

im2col + BLAS loses most where one GEMM dimension is 16-32 channels (BLAS packing costs as much
as the arithmetic) and spends 20-40% on column copies elsewhere. These loops compute the sums
directly, register-blocked. Per sample, x is copied into zero-padded channels-last grids (one per
group) and dy into a zero-padded grid of interleaved rows (each row of the grid holds every channel's positions of
that row; geometry: :func:`.dense_plan.plan`); every tap is then a constant flat offset:

- dx, per phase rho of the strided input (``xi = s*m + rho``; one phase at stride 1):
  ``dx[c, s*m + rho - pre] = sum over the phase's taps t of sum_co dy_grid[co, m - q_t] w[co, c, t]``,
  ``q_t = (t*d - rho) / s``: 8-14 positions x 32 input channels (or 12 x 16) per register block, each row
  only the taps that can read dy (the others read the grid's zero rows: :func:`.dense_plan.row_taps`);
- ``dw[co, c, t] = sum_n sum_o dy_grid[co, o] x_grid[s*o + t*d, c]``: 8 x 32 (or 16 x 16) channel
  blocks, dy broadcast and x loaded 16 channels at a time, row by row of dy, over cache-sized
  segments of positions;
- db in float64 while dy is copied.

Each output element is computed by one task in a fixed order; tasks are ranges of (group, row)
items (dx) and (group, tap, channel block) items (dw); blocks of samples add their dw in block
order. So results are bitwise reproducible and do not depend on the number of workers. Sums run
in float32 (float16 and bfloat16 are computed in float32, as on the BLAS path); float64 keeps the
BLAS path. By default strides 1 and 2 may use these loops (channels per group multiples of 16; see
:func:`serves`).

A call of one block of samples whose arrays the copies read in place (C-contiguous, aligned float32, a float32
result) runs the job list kept on its plan (:func:`_run_planned`: made on its first call per mask and worker count,
its addresses held as offsets from the call's arrays, :class:`.jobs.Template`), the weights' transposing copies among
its jobs (:mod:`.dense_weights`; elsewhere they run from templates kept per shape): the same jobs, so the same bits,
without Python per sample or job, in one region of the threads per call.

The C file is built at install, once per instruction set, and the best build the CPU runs is loaded with
ctypes (see :mod:`.native`), whose calls release the GIL. Without the builds (installed without a
compiler), or with ``XCONV_NUMPY_C=0``, :func:`serves` is False and the BLAS path runs.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from xconv import ConvParams

from . import dense_strided, native
from .aligned import empty_result, line_aligned
from .dense_plan import dx_units, padded_row, plan, taps_rows
from .dense_weights import (ROW_TASKS_PER_WORKER, TASKS_PER_WORKER, _copyable, _readable, _taps_last, _taps_last_rows,
                            _tap_major_rows, tap_major, tap_major_any)  # noqa: F401  (tap_major: dense.tap_major)
from .finite import all_finite
from .jobs import Jobs, Template
from .native import address
from .workers import even_ranges

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
    compute): stride 1, and strides of at most 2 (all they compute: channels per group multiples of 16).
    Measured against the BLAS path (2 workers, ms): 3x3 stride 2 at 256, 64->128, 32 channels 25 vs 28, 4.9 vs 6.8,
    4.6 vs 5.5; 3x3 stride 3 at 32 channels 6.4 vs 5.7 (x loads at the stride waste most of each cache line). At 16
    and 48 input channels (16x16 weight-gradient blocks) they once tied (3.0 vs 3.0) and were left to BLAS; issue
    25's fifteenth session, Zen 4, the full backward, min of 7 alternating: CIFAR ResNet's 32x16x32x32 -> 32 3x3
    stride 2 2.45 vs 4.56, 8x16x64x64 -> 32 2.23 vs 4.09, 32x48x16x16 -> 96 3.77 vs 5.04, 8x16x56x56 -> 64 5x5 4.68
    vs 8.93, 3-D 2x16x8x28x28 -> 32 1.44 vs 2.64, 1-D 4x16x1000 -> 32 k5 0.46 vs 0.95 (grad_input alone 1.2-1.7x,
    grad_weight alone 1.5-2.4x): the cost model weighs them there too."""
    if not computes(p):
        return False
    if any(s != 1 for s in p.stride) and max(p.stride) > 2:
        return False
    return available()


def _dy_to_grid(dyn, grid_n, f, db_n) -> None:
    """One sample of dy (another dtype or layout) into its zero-padded grid of interleaved rows by NumPy (the layout
    of :func:`.dense_plan.plan`); its db partial (float64: NumPy's sum of dy's values) in part 0, zeros in the
    others."""
    M, Y, rows = f.M, f.Y, f.Yn // f.Y[-1]
    grid_n[...] = 0
    grid = grid_n[M:M + rows * f.rp].reshape(Y[:-1] + (f.Co, Y[-1]))
    grid[tuple(slice(0, o) for o in f.O[:-1]) + (slice(None), slice(0, f.O[-1]))] = np.moveaxis(dyn, 0, -2)
    if db_n is not None:
        db_n[0] = np.asarray(dyn).reshape(f.Co, -1).sum(axis=1, dtype=np.float64)
        db_n[1:] = 0


def _x_to_grid(xn, grid_n, f) -> None:
    """One sample of x (another dtype or layout) into its zero-padded channels-last grids (g, Xn, f.ldx) by NumPy."""
    grid = grid_n[..., :f.Cg].reshape((f.g,) + f.X + (f.Cg,))              # a view: Xn splits into X
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


#: What :func:`backward` returns where both w and dy hold an inf or a NaN and dx is asked for.
NONFINITE_BOTH = "w and dy not finite"


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool, workers: int, budget: int, lease,
             w_dual=None, check_first: bool = False):
    """(dx, dw, db) of ``p`` (see :func:`computes`), None where not needed; scratch about ``budget`` bytes or one
    sample, taken from ``lease`` (``lease.empty(shape, dtype)``: uninitialized buffers). db is summed in float64 while
    dy is copied into its grid: per sample and copy part, then in that order. ``w_dual``: the forward's float32
    weights of which ``p`` is the :func:`dual` (dx's weights are their :func:`tap_major` copy with flip; w is then
    not read).

    The loops multiply the dy grid's zeros by every weight: for a non-finite weight they run with zeros in its place
    and its terms are added after (:func:`_add_taps`). Whether w is finite is known from its copy where the call's
    one job list copies it (the copy jobs check what they copy), else (or with ``check_first``) from a pass over w
    first. None instead of the results where w (or w_dual) holds an inf or a NaN found in its copy, or w_dual one
    found first: the caller detours (the forward) or calls again with ``check_first``. :data:`NONFINITE_BOTH` where
    w holds one and so does dy (the loops would multiply dy's by the zero in the weight's place, a NaN the
    definition does not have): the caller computes dx on the columns."""
    f = plan(p, True, True, budget)                    # the full call's plan: blocks (dw's sum order) for any mask
    w_given, finite = w, None
    g, N, C, Co, Cg, Cog, K, S = f.g, f.N, f.C, f.Co, f.Cg, f.Cog, f.K, f.S
    f32 = np.dtype(np.float32)
    planned = f.nb >= N and f.out_dt == f32 and _readable(dy) and (not need_dw or _readable(x))
    w_src, flip = (w_dual, True) if w_dual is not None else (w, False)
    in_list = need_dx and planned and not check_first and _copies_weights(f, w_src, flip)
    if need_dx and not in_list and not all_finite(w_src):
        if w_dual is not None:
            return None
        if not all_finite(dy):
            return NONFINITE_BOTH                        # dy's inf times the zero in the weight's place: a NaN
        finite = np.isfinite(w)
        w = w_src = np.where(finite, w, 0).astype(w.dtype)
    Xn, nb = f.Xn, f.nb
    # scratch from the caller's lease (kept between calls: no page faults); padding zeroed per sample in copy_in
    dyG = lease.empty((nb, f.dy_sample), f32)
    xG = lease.empty((nb, g, Xn, f.ldx), f32) if need_dw else None             # positions of f.ldx floats
    if need_dx:
        dx = empty_result(p.input_shape, f.out_dt)
        dxb = dx if f.out_dt == f32 else lease.empty((nb, C) + S, f32)
    if need_dw:
        dw_part = lease.empty((g, K, Cog, Cg), f32)
        dw_acc = lease.empty((g, K, Cog, Cg), f32) if nb < N else None        # the sum of several blocks

    db_parts = np.empty((N, f.copy_parts, Co), np.float64) if need_db else None    # per sample and copy part
    w_copy = None                                        # (w, its copy, flip, odd): by the planned call's first jobs
    if need_dx:                                          # per dx phase: its taps' weights (g, T, Cog, Cg)
        if in_list:                                      # odd[0] set by the copy where w holds an inf or a NaN
            w_copy = (w_src, line_aligned((g, K, Cog, padded_row(Cg)))[..., :Cg], flip, np.zeros(1, np.int64))
            w_jobs = [w_copy[1]]
        else:
            wdx = tap_major_any(w_src, g, flip, workers)                       # (g, K, Cog, Cg)
            w_jobs = [wdx if job.taps == list(range(K)) and wdx.flags.c_contiguous else
                      np.ascontiguousarray(wdx[:, job.taps]) for job in f.dx_jobs]
    outs = (dx if need_dx else None, dxb if need_dx else None, dw_part if need_dw else None, db_parts)
    skip = skips_padding(f, dy) if need_dw else False
    if planned:
        dw = np.empty((g, Cog, Cg, K), f32) if need_dw else None      # the weight gradient, taps last
        _run_planned(f, dy, x, dyG, xG, outs, w_jobs if need_dx else [], workers, w_copy, dw, skip)
        if w_copy is not None and w_copy[3][0]:          # w was not finite: the caller detours, or calls again
            return None                                  # with check_first (its scratch given back first)
        if need_dw:
            dw = dw.reshape(p.weight_shape)
    else:
        for n0 in range(0, N, nb):
            n1 = min(n0 + nb, N)
            m = n1 - n0
            _run_parts(_block_jobs(f, n0, m, dy, x, dyG, xG, outs, w_jobs if need_dx else [], workers, skip=skip),
                       workers)
            if need_dx and dxb is not dx:
                dx[n0:n1] = dxb[:m]
            if need_dw:                                  # blocks added in order
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


#: The arrays a block's jobs point into, by number (a job template's bases): 0 dy, 1 x, 2 the dy grids, 3 the x grids,
#: 4 db's partials, 5 dw's partial, 6 dx (or its block's scratch), then 7 + j: dx phase j's weights.
_DY, _X, _DYG, _XG, _DB, _DW, _DX, _W = range(8)


def skips_padding(f, dy) -> bool:
    """Whether the weight gradient of plan ``f`` runs its tap table that skips the terms of x's padding (``f.dw_taps``):
    where it skips any and dy is finite (an inf or a NaN times the padding's zeros is a NaN of dw, a term of the
    definition; finite, those terms are zeros and skipping them changes no bit)."""
    return f.dw_skips and all_finite(dy)


def _per_sample(a, n0: int, m: int, grid, row, ranges, at: int, db=None, pad: bool = False) -> np.ndarray:
    """The copy jobs' rows of samples [n0, n0 + m) of ``a`` into ``grid`` (one row per sample and range, the
    sample's parts in order): ``row`` with argument 0 sample n's address, ``at`` and ``at`` + 1 the range, 11 the grid
    of block sample i, 12 (``db`` given) db's partials of sample n and part; with ``pad``, argument 10 (an x row's
    count of padding positions, zeroed by the sample's part 0) 0 in the other parts. One table for a block whose
    array is read in place (built sample by sample in Python, a block of 96 samples took 0.5 ms more a call), or
    for one sample (m = 1) where only some are."""
    P = len(ranges)
    t = np.empty((m, P, len(row)), np.int64)
    t[:] = row
    i = np.arange(m)[:, None]
    t[:, :, 0] = address(a) + (n0 + i) * a.strides[0]
    t[:, :, at:at + 2] = np.asarray(ranges, np.int64)
    t[:, :, 11] = address(grid) + i * grid.strides[0]
    if db is not None:
        t[:, :, 12] = address(db) + (n0 + i) * db.strides[0] + np.arange(P) * db.strides[1]
    if pad:
        t[:, 1:, 10] = 0
    return t.reshape(m * P, len(row))


def _copy_tables(a, n0: int, m: int, grid, row, ranges, at: int, by_numpy, db=None, pad: bool = False) -> list:
    """The copy jobs' row tables of samples [n0, n0 + m) of ``a`` (:func:`_per_sample`), in sample order: one table
    when the whole block is read in place, else one per sample read in place; ``by_numpy(n, i)`` copies sample n
    (block sample i) into its grid now where the C copy cannot read it."""
    if _readable(a):
        return [_per_sample(a, n0, m, grid, row, ranges, at, db, pad)]
    tables = []
    for i, n in enumerate(range(n0, n0 + m)):
        if _readable(a[n]):
            tables.append(_per_sample(a, n, 1, grid[i:i + 1], row, ranges, at, db, pad))
        else:
            by_numpy(n, i)
    return tables


def _block_jobs(f, n0: int, m: int, dy, x, dyG, xG, outs, w_jobs, workers: int, first=(), dw_signal=None,
                skip: bool = False) -> list:
    """The jobs of samples [n0, n0 + m) as [(Jobs, {argument: base})] in run order: the parts ``first`` (jobs of
    phase 0: the weights' copy) and the copies (phase 0), then the sums, which wait for all of phase 0; the longest
    sums first (dw, counting in phase ``dw_signal``, then dx phases by number of taps), so that the threads finish
    together; dw with the tap table ``f.dw_taps[skip]`` (:func:`skips_padding`). A sample of another dtype or
    layout is copied here by NumPy instead (no converted copy: the same scratch). Each job's addresses are absolute;
    the mappings say which array each one points into."""
    dx, dxb, dw_part, db_parts = outs
    g, C, Co, Cg, Cog, K, O = f.g, f.C, f.Co, f.Cg, f.Cog, f.K, f.O
    ldy, Xn, Sn, ldx = f.ldy, f.Xn, f.Sn, f.ldx
    dy_row = [0, Co, math.prod(O), address(f.dy_rows), len(f.dy_rows), f.Y[-1], O[-1], f.M, f.dy_sample, 0, 0, 0, 0]
    dy_parts = even_ranges(len(f.dy_rows), f.copy_parts)
    x_row = [0, Sn, 0, C, Cg, Xn * ldx, address(f.x_pos), 0, 0, address(f.x_pad), len(f.x_pad), 0, ldx]
    x_parts = even_ranges(Sn, f.copy_parts)
    dy_copies = _copy_tables(dy, n0, m, dyG, dy_row, dy_parts, 9, db=db_parts,
                             by_numpy=lambda n, i: _dy_to_grid(dy[n], dyG[i], f,
                                                               None if db_parts is None else db_parts[n]))
    x_copies = [] if dw_part is None else _copy_tables(x, n0, m, xG, x_row, x_parts, 7, pad=True,
                                                       by_numpy=lambda n, i: _x_to_grid(x[n], xG[i], f))
    parts = list(first)
    for kind, tables, bases in (("dy_to_grid", dy_copies, {0: _DY, 11: _DYG, 12: _DB}),
                                ("x_to_grid", x_copies, {0: _X, 11: _XG})):
        if tables:
            parts.append((Jobs(), bases))
            parts[-1][0].rows(kind, np.concatenate(tables), signal=0)
    copies = (0, sum(len(jobs) for jobs, _ in parts))
    if dw_part is not None:
        parts.append((Jobs(), {0: _DYG, 3: _XG, 15: _DW}))
        parts[-1][0].split("dw_rows", (address(dyG), ldy, Cog * ldy, address(xG), ldx, Xn * ldx, f.dw_step,
                                       address(f.dw_taps[skip]), Cog, Cg, address(f.rdy), address(f.rx), m * f.dw_rows,
                                       f.dw_len, f.dw_seg, address(dw_part), K * Cog * Cg, f.dw_blocks), 18,
                           even_ranges(g * f.dw_blocks, TASKS_PER_WORKER * workers), wait=copies, signal=dw_signal)
    if dx is not None:
        base = address(dxb) + 4 * ((n0 if dxb is dx else 0) * C * Sn)
        for j in f.dx_order:
            job = f.dx_jobs[j]
            parts.append((Jobs(), {0: _DYG, 3: _W + j, 10: _DX}))
            wj = w_jobs[j]                           # (g, T, Cog, Cg), rows of ldw floats (padded_row)
            parts[-1][0].split("dx_rows", (address(dyG), ldy, Cog * ldy, address(wj), wj.strides[2] // 4,
                                           wj.strides[0] // 4, address(job.offs), len(job.taps), Cog, Cg, base,
                                           Sn, Cg * Sn, f.st[-1], address(job.rin), address(job.rout), m * job.rows, 0,
                                           0, job.row_len), 17,
                               even_ranges(g * m * job.rows * dx_units(len(job.taps), Cog, Cg),
                                           ROW_TASKS_PER_WORKER * workers), wait=copies)
    return parts


def _run_parts(parts, workers: int) -> None:
    """Run the job lists of ``parts`` (see :func:`_block_jobs`) in order, as one list."""
    if parts:
        Jobs.concatenated([jobs for jobs, _ in parts]).run(workers)


def _run_planned(f, dy, x, dyG, xG, outs, w_jobs, workers: int, w_copy=None, dw=None, skip: bool = False) -> None:
    """The call's one block (readable dy and x, a float32 dx) from its job template, made on its first call and kept
    on the plan per mask, worker count and weights' source: the jobs :func:`_block_jobs` makes, each address held as
    its offset from the array it points into (the same jobs, so the same bits; no Python per sample or job). In the
    same list: ``w_copy`` = (w, its copy w_jobs[0], flip, odd) by :func:`tap_major`'s jobs first (odd[0] set where w
    holds an inf or a NaN), and where ``dw`` (g, Cog, Cg, K) is given, the weight gradient's sums into it by
    :func:`_taps_last`'s jobs last (they wait for the dw jobs: phase 1); ``skip``: :func:`skips_padding`. One region
    of the team, not three."""
    dx, dxb, dw_part, db_parts = outs
    w_src, _, flip, odd = (None, None, None, None) if w_copy is None else w_copy
    kept, key, bases = _kept_template(f, dy, x, dyG, xG, outs, w_jobs, workers, w_copy, dw, skip)
    if kept is None:
        src, out, flag = range(len(bases) - 3, len(bases))            # the numbers of w_src's, dw's and odd's
        first, table = [], None
        if w_copy is not None:                  # the copy's rows: w at argument 0, its copy at 11, odd at 13
            rows, table = _tap_major_rows(w_src, w_jobs[0], f.g, flip, workers)
            first.append((Jobs(), {0: src, 11: _W, 13: flag}))
            first[0][0].rows("x_to_grid", [row + [address(odd)] for row in rows], signal=0)
        parts = _block_jobs(f, 0, f.N, dy, x, dyG, xG, outs, w_jobs, workers, first, 1 if dw is not None else None,
                            skip)
        if dw is not None:                      # after every dw job: the sums (g, K, Cog, Cg) into dw, taps last
            n_dw = next(len(jobs) for jobs, bases in parts if bases.get(15) == _DW)
            rows, _ = _taps_last_rows(dw_part, dw, workers)
            parts.append((Jobs(), {0: _DW, 3: out}))
            parts[-1][0].rows("taps_last", rows, wait=(1, n_dw))
        kept = f.templates[key] = (Template.joined(parts, bases), table)           # the table kept alive with it
    kept[0].run(bases, workers)


def _copies_weights(f, w, flip: bool) -> bool:
    """Whether a one-block call of plan ``f`` copies (and checks) w among its own jobs: dx in one job list of every
    tap, w one :func:`tap_major`'s C copy takes."""
    return len(f.dx_jobs) == 1 and f.dx_jobs[0].taps == list(range(f.K)) and _copyable(w, f.g, flip)


def _kept_template(f, dy, x, dyG, xG, outs, w_jobs, workers: int, w_copy=None, dw=None, skip: bool = False) -> tuple:
    """(the template kept on plan ``f`` for this call or None, its key, the call's bases by number: the arrays, None
    for none, whose addresses the template adds) of :func:`_run_planned` (its arguments)."""
    dx, dxb, dw_part, db_parts = outs
    w_src, _, flip, odd = (None, None, None, None) if w_copy is None else w_copy
    key = (dx is not None, dw_part is not None, db_parts is not None, workers, flip, dw is not None, skip)
    return f.templates.get(key), key, (dy, x, dyG, xG, db_parts, dw_part, dxb, *w_jobs, w_src, dw, odd)


# ---------------------------------------------------------------------------------------------
# The forward through the input-gradient loops


@functools.lru_cache(maxsize=256)
def dual(p: ConvParams) -> ConvParams:
    """The convolution whose input gradient is ``p``'s forward (stride 1): input and output shapes swapped, each
    group's weights transposed and flipped (``w'[g Cg + c, co, t] = w[g Cog + co, c, K-1-t]``), padding
    ``d (k-1) - pad`` on each side."""
    pad = tuple(((k - 1) * d - a, (k - 1) * d - b) for k, d, (a, b) in zip(p.kernel, p.dilation, p.padding))
    Co, C = p.output_shape[1], p.input_shape[1]
    return p.replace(input_shape=tuple(p.output_shape), output_shape=tuple(p.input_shape),
                     weight_shape=(C, Co // p.groups) + tuple(p.kernel), padding=pad)


def computes_fprop(p: ConvParams) -> bool:
    """Whether :func:`fprop` computes ``p``'s forward: float32, not transposed; at stride 1 padding at most the
    kernel's reach on each side (the dual's padding is not negative) and :func:`computes` for the dual; at larger
    strides :func:`.dense_strided.computes` (1-D, 2-D; at most 64 stride phases and 4096 taps)."""
    if any(s != 1 for s in p.stride):
        return dense_strided.computes(p)
    if p.dtype != "float32" or p.transposed or min(p.output_shape) == 0:
        return False
    if any((k - 1) * d < max(a, b) for k, d, (a, b) in zip(p.kernel, p.dilation, p.padding)):
        return False
    return computes(dual(p))


#: The strided forward's shortest output rows by default: shorter rows run in blocks of 4, 2 and 1 positions
#: (measured, two threads, ms, against the columns: 8x256x4x4 -> 512 3x3 s2 3.2 vs 0.7, 2x256x14x14 -> 512 6.1 vs
#: 2.2; at 8 positions 8x64x16x16 -> 128 0.54 vs 0.70) ...
STRIDED_MIN_ROW = 8
#: ... except rows of exactly STRIDED_SHORT_ROW in calls of STRIDED_SHORT_ROW_MACS multiply-adds or more, weighed on
#: the kinds of CPU whose rates cost them (``cost.Rates.strided_q0``: Zen 4; elsewhere their estimate is infinite). Issue 25's ninth session: with its kept job
#: template (dense_strided_quick.py) rows of 4 ran ahead of the columns, 8x128x8x8 -> 256 s2, two threads, 0.58-1.07
#: vs 0.73-1.32 ms. Not rows of 2 (8x256x4x4 -> 512: 0.93 vs 0.68), nor small calls: the loops' copies and phases
#: cost a call about 0.1 ms (2x32x24x10 -> 48 1x5 s(3, 2), 0.5 M multiply-adds: 130 µs against the columns' 78),
#: nor strides of 3 (one tap per phase of a 3x3: 16x128x14x13 -> 128 s3 0.96 against 0.76); rows of 5-7 (blocks of
#: 4, 2 and 1) are unmeasured.
STRIDED_SHORT_ROW = 4
STRIDED_SHORT_ROW_MACS = 1 << 22
#: Fewest input channels per group for the strided forward by default: a stem's few keep the stem loops (the same
#: time: MobileNetV2's 8x3x96x96 -> 16 0.25 vs 0.26 ms, ResNet's 8x3x64x64 7x7 0.92 vs 0.89).
STRIDED_MIN_CHANNELS = 16
#: Builds whose strided forward the cost model may pick. The AVX2 build's (8-float blocks, Haswell BLAS kernel) for 2-D
#: kernels of at most STRIDED_AVX2_CHANNELS input channels per group only, since issue 25's eighteenth session (Zen 3,
#: ms, loops / colgemm, two threads: 8x64x16x16 -> 128 3x3 s2 0.87 / 1.28, 2x64x56x56 -> 128 2.30 / 2.74, 2x128x28x28
#: -> 256 2.08 / 2.13; one thread 1.35 / 1.44, 3.66 / 3.63, 3.53 / 3.86; 8x32x32x32 -> 64 1.09 / 1.79, 8x16x64x64 -> 32
#: 1.24 / 2.28): in 1-D it lost (4x160x799 -> 160 3-tap s2 4.0 / 3.7, the speech encoder's 4x512x799 -> 512 23.5 /
#: 19.2; 4x512x3199 53 -> 90 on the Zen 4 stand-in).
STRIDED_ISAS = ("avx512",)
STRIDED_AVX2_CHANNELS = 256


def _strided_build(p: ConvParams) -> bool:
    """Whether the loaded build's strided forward is the cost model's to weigh for ``p`` (see STRIDED_ISAS)."""
    isa = native.isa(native.library())
    return isa in STRIDED_ISAS or (isa == "avx2" and len(p.kernel) == 2
                                   and p.input_shape[1] // p.groups <= STRIDED_AVX2_CHANNELS)


def taps_at_a_time(p: ConvParams) -> bool:
    """Whether the loaded build runs the rows of ``p``'s stride-1 forward a few taps at a time
    (:func:`.dense_plan.taps_rows`, the AVX2 build, for a row of all the kernel's taps: at most 384 input channels per
    group, and the row's weights past 32 KiB), each tap's weights read from L1 by a chunk's blocks: there big weights
    cost the stride-1 forward little (issue 25, Zen 3, two threads, ms, loops / columns: 8x256x4x4 -> 256 3x3 1.11 / 1.34,
    2x256x14x14 -> 256 3.06 / 3.73, 2x128x2x7x7 -> 256 3x3x3 2.16 / 2.51; block by block, 512 channels, 2x512x7x7 ->
    512 13.8 / 6.6)."""
    return available() and taps_rows(math.prod(p.kernel), p.input_shape[1] // p.groups)


def serves_fprop(p: ConvParams) -> bool:
    """Whether the cost model may pick these loops for ``p``'s forward: at stride 1 where :func:`serves` the dual
    call; at larger strides where :func:`computes_fprop`, the loops loaded from a build of STRIDED_ISAS (the AVX2
    build's for 2-D kernels of at most STRIDED_AVX2_CHANNELS input channels per group), a kernel of
    more than one tap (a strided 1x1 is a copy of x's positions and a product: 8x64x16x16 -> 128 0.23 ms here against
    the columns' 0.16), rows of STRIDED_MIN_ROW outputs or more (or of exactly STRIDED_SHORT_ROW at strides of at most
    2 in calls of STRIDED_SHORT_ROW_MACS multiply-adds or more: the cost model weighs them where the kind of CPU's
    rates have their Q0, ``cost.Rates.strided_q0``), and STRIDED_MIN_CHANNELS input channels per group or more."""
    if not computes_fprop(p):
        return False
    if any(s != 1 for s in p.stride):
        row = p.output_shape[-1]
        macs = math.prod(p.output_shape) * (p.input_shape[1] // p.groups) * math.prod(p.kernel)
        return (available() and _strided_build(p) and math.prod(p.kernel) > 1
                and (row >= STRIDED_MIN_ROW or (row == STRIDED_SHORT_ROW and max(p.stride) <= 2
                                                 and macs >= STRIDED_SHORT_ROW_MACS))
                and p.input_shape[1] // p.groups >= STRIDED_MIN_CHANNELS)
    return serves(dual(p))


def fprop(x, w, bias, p: ConvParams, workers: int, budget: int | None, lease):
    """y = conv(x, w) + bias for :func:`computes_fprop` calls: at stride 1 the input gradient of :func:`dual` with x
    as its dy (each output element one fixed order of the dx loops, whatever the workers), then the bias added in
    float32; at larger strides :func:`.dense_strided.fprop`. ``budget``: the working-set bytes of the dual's backward
    (as for :func:`backward`; None at larger strides). None where w holds an inf or a NaN (the loops would multiply
    the grid's zeros by it: fast.fprop then takes the columns path), known from its copy at stride 1."""
    g, nd = p.groups, len(p.kernel)
    if any(s != 1 for s in p.stride):
        if not all_finite(w):
            return None
        wdx = tap_major_any(w, g, True, workers, True)   # the dual's weights (g, K, Cg, Cog) in the loops' layout
        return dense_strided.fprop(x, wdx, bias, p, workers, lease)
    results = backward(x, None, None, dual(p), True, False, False, workers, budget, lease, w_dual=w)
    if results is None:                                  # w holds an inf or a NaN
        return None
    y = results[0]
    if bias is not None:
        y += np.asarray(bias, np.float32).reshape((1, -1) + (1,) * nd)
    return y
