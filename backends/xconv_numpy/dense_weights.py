"""The dense loops' weights in their layout (csrc/direct_conv.c; copied by csrc/grid_copy.c): the tap-major copy the dx
loops read, in rows padded to an odd number of cache lines, and the weight gradient's sums back to taps-last; each a
C job list kept as a template per shape and worker count (:class:`.jobs.Template`), or run as jobs of the dense
call's own list (:func:`.dense._run_planned`). Bits are copied: the results equal NumPy's transposes."""

from __future__ import annotations

import functools
import math

import numpy as np

from .aligned import line_aligned
from .dense_plan import frozen, padded_row
from .jobs import Jobs
from .native import address
from .workers import even_ranges

#: Tasks per worker and kind (the dense loops' dw blocks, these copies; the dx rows: ROW_TASKS_PER_WORKER) in each
#: list: more balance the workers, fewer cost less.
TASKS_PER_WORKER = 2
#: Tasks per worker of the dx loops' rows (the backward's input gradient, the forward at any stride): finer than the
#: rest, as the workers' speeds differ (a shared core: in one two-thread forward one thread's tasks ran 1.4x the
#: other's, and with two tasks each the first to finish waited 0.8 of 3.4 ms). Measured, two threads, alternating in
#: one process, ms, 2 -> 4: 2x64x56x56 -> 64 3x3 forward 2.53 -> 2.39, dx 2.60 -> 2.35; 2x128x4x14x14 -> 128 3x3x3
#: 6.22 -> 5.61, 6.26 -> 5.64; 8x128x16x16 -> 128 3.64 -> 3.28 forward; one thread unchanged. The weight gradient's
#: tasks stay at TASKS_PER_WORKER: each reads the whole call's dy and x again (2x64x56x56: 3.20 -> 3.35 at 4).
ROW_TASKS_PER_WORKER = 4


def _readable(a: np.ndarray) -> bool:
    """Whether the copy loops read ``a`` (a weight, or one sample) where it lies: float32, C-contiguous, aligned."""
    return a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned


@functools.lru_cache(maxsize=64)
def _positions(B: int, K: int, flip: bool, step: int) -> np.ndarray:
    """Where xconv_x_to_grid puts each weight read: flip, position u = b K + t goes to (K-1-t) B + b; else position t
    goes to t * step."""
    if flip:
        u = np.arange(B * K, dtype=np.int64)
        return frozen((K - 1 - u % K) * B + u // K)
    return frozen(np.arange(K, dtype=np.int64) * step)


def _copyable(w, g: int, flip: bool) -> bool:
    """Whether :func:`tap_major`'s C copy takes ``w``."""
    return _readable(w) and (w.shape[0] // g) % 16 == 0 and w.shape[1] % 16 == 0


def tap_major(w, g: int, flip: bool, workers: int, padded: bool = False):
    """``w`` (g A, B, *kernel) in the dx loops' tap-major layout by one transposing copy in C (csrc/grid_copy.c's
    xconv_x_to_grid, on up to ``workers`` threads), or None where w is not float32, C-contiguous and aligned, A and B
    multiples of 16 (the caller then copies by NumPy):

    - flip=False: ``out[gi, t, a, b] = w[gi A + a, b, t]`` (the weights of the input gradient);
    - flip=True: ``out[gi, t, b, a] = w[gi A + a, b, K - 1 - t]`` (the dual's, for the forward: :func:`dual`).

    Bits are copied, so the result equals NumPy's transposes (which took 3-7x longer: 0.25 ms for 256 x 256 x 3 x 3).
    ``padded``: a view of rows :func:`padded_row` floats apart, as the loops read the weights fastest."""
    A, B, K = w.shape[0] // g, w.shape[1], math.prod(w.shape[2:])
    if not _copyable(w, g, flip):
        return None
    rows, n = (B, A) if flip else (A, B)
    ld = padded_row(n) if padded else n
    out = line_aligned((g, K, rows, ld))[..., :n]
    _copy(("x_to_grid", w.shape, g, flip, ld), workers, _tap_major_rows, w, out, g, flip, workers)
    return out


def tap_major_any(w, g: int, flip: bool, workers: int, padded: bool = False) -> np.ndarray:
    """:func:`tap_major`, or where its C copy does not take ``w`` (another dtype or layout, channels not multiples of
    16), NumPy's transpose into the same layout, C-contiguous float32 (the same values)."""
    out = tap_major(w, g, flip, workers, padded)
    if out is not None:
        return out
    t = np.asarray(w, np.float32).reshape(g, w.shape[0] // g, w.shape[1], -1)           # (g, A, B, K)
    return np.ascontiguousarray(t[..., ::-1].transpose(0, 3, 2, 1) if flip else t.transpose(0, 3, 1, 2))


def _tap_major_rows(w, out, g: int, flip: bool, workers: int) -> list:
    """The copy jobs' rows of :func:`tap_major` (w and out at their addresses; out's rows may be padded, ld floats
    apart: :func:`padded_row`) and the positions table they read."""
    A, B, K = w.shape[0] // g, w.shape[1], math.prod(w.shape[2:])
    ld = out.strides[-2] // 4
    parts = max(1, TASKS_PER_WORKER * workers)
    if flip:                # channels a of every group (rows of B K reads), positions u = b K + t: in 16 x 16 tiles
                            # (the AVX2 build: 8 x 8)
        pos = _positions(B, K, True, 0)
        return [[address(w), B * K, 0, g * A, A, K * B * ld, address(pos), u0, u1, 0, 0, address(out), ld]
                for u0, u1 in even_ranges(B * K, parts)], pos
    pos = _positions(B, K, False, A)    # per group: channels a B + b (K reads each), positions t
    return [[address(w) + 4 * gi * A * B * K, K, 16 * c0, 16 * c1, B, ld, address(pos), 0, K, 0, 0,
             address(out) + 4 * gi * K * A * ld, ld]
            for gi in range(g) for c0, c1 in even_ranges(A * B // 16, max(1, parts // g))], pos


#: The copies' job templates, per (kind, shape[, groups, flip, row length], workers): source and destination
#: (arguments 0 and 11 of x_to_grid, 0 and 3 of taps_last) held as offsets (see jobs.Template), each with the
#: positions table its jobs read at its address (kept alive with it).
_COPIES: dict = {}
_COPY_ARGS = {"x_to_grid": (0, 11), "taps_last": (0, 3)}


def _copy(key, workers: int, rows, src, dst, *args) -> None:
    """Run the copy jobs ``rows(src, dst, *args)`` = (rows, table they read) on up to ``workers`` threads from their
    template, made on the first call of ``key`` with these workers."""
    key = key + (workers,)
    kept = _COPIES.get(key)
    if kept is None:
        jobs = Jobs()
        table, positions = rows(src, dst, *args)
        jobs.rows(key[0], table)
        if len(_COPIES) >= 256:         # above a real model's weight shapes
            _COPIES.clear()
        a, b = _COPY_ARGS[key[0]]
        kept = _COPIES[key] = (jobs.template({a: 0, b: 1}, (src, dst)), positions)
    kept[0].run((src, dst), workers)


def _taps_last(total: np.ndarray, workers: int) -> np.ndarray:
    """The weight gradient's sums (g, K, Cog, Cg), float32 C-contiguous, as (g, Cog, Cg, K): one transposing copy in
    C (csrc/grid_copy.c's xconv_taps_last) on up to ``workers`` threads (bits copied)."""
    g, K, A, B = total.shape
    out = np.empty((g, A, B, K), np.float32)
    _copy(("taps_last", total.shape), workers, _taps_last_rows, total, out, workers)
    return out


def _taps_last_rows(total, out, workers: int) -> list:
    """The copy jobs' rows of :func:`_taps_last` (and no table)."""
    g, K, A, B = total.shape
    R, parts = A * B, max(1, TASKS_PER_WORKER * workers // g)
    return [[address(total) + 4 * gi * K * R, K, R, address(out) + 4 * gi * K * R, 16 * r0, 16 * r1]
            for gi in range(g) for r0, r1 in even_ranges(R // 16, parts)], None
