"""Columns and a few large matrix products, split over the workers: the path for real models' mid-sized layers.

x's im2col columns ``(g, C/g * K, N * Q)`` are built by the C copies of the small-call path (csrc/small_cols.c),
by ranges of channels on the workers (float32: one C job list with the products, :mod:`.jobs`), then

- forward: ``y = W @ cols``;
- weight gradient: ``dW = dy @ cols^T`` (each element's sum over ``N * Q`` is one BLAS dot order);
- input gradient: ``dcols = W^T @ dy``, then the C col2im adds each tap's columns in order (by channel ranges);

each product split into blocks of its result's rows or columns (never its inner dimension).

Blocks are fixed by the call's shapes alone (:func:`blocks`), each block is one single-threaded BLAS call
(BLAS is pinned to one thread, :mod:`.blas`) run on any worker, so the bits of every output depend on the
shapes and values only, never on the worker count, the mask or which thread ran a block. Where the small
path's one product runs on one core, this one keeps both cores busy on layers of a few to a few hundred
MFLOP: the deep stages of a ResNet (small spatial size, wide channels), 3-channel stems, strided
shortcuts. Calls whose columns would outgrow the bytes of their operands run in chunks, fixed by the shapes: the
forward in chunks of samples; the backward in chunks of x's channels (one group: every dW element still one
product's sum over all samples, :func:`channel_chunks`), else of samples (dW's partial sums added in chunk order).
Where the products of a forward sample are wide (:func:`_direct`) they write y's samples themselves. The columns are
the definition's windows of x_pad (its padding zeros are terms there too) and dx adds back only the columns' terms that
land inside x, so a NaN or an infinity in any input gives the definition's NaNs and infs: calls with non-finite inputs
run here too (``nonfinite="keeps"``: no pass over dy, x and w first; ResNet-18's 512x512x3x3 weights are 9.4 MB a
pass). The scratch (columns, dy
channel-major, the forward's channel-major result) comes from the fast path's arena (:class:`_Buffers`: kept between
calls, so a repeated call pays no page faults; 4x512x3199 -> 512 k3 s2 forward: about 400 faults a call before) but
is not counted against a workspace limit as it is taken: under a limit the path runs only where its bound fits
(``bounds.colgemm``).
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES, accumulation_dtype

from . import cost, jobs, native, small, small_c
from .aligned import empty_result
from .grid.scratch import Lease
from .plans import per_params
from .workers import run

#: Multiply-adds per block: big enough that a block's BLAS call runs near its peak rate (each block packs
#: its operands again), small enough that a call of a few MFLOP still has a block per core (2^20, was 2^22 before
#: the blocks ran as C jobs: a 1x1 8x80x3x3 -> 480 forward's job list 76 -> 58 us on two threads; the large calls
#: of issue 25's models within noise either way).
BLOCK_MACS = 1 << 20
#: Most blocks per product: the cores the cost model assumes (cost.CORES; a machine with more cores runs a product on
#: at most that many: the blocks, so the bits, are the configuration's, not the machine's). Each block packs its
#: operands again; on this 2-core Zen 4, 2 blocks against 4, alternating, 2 threads: forward 8x256x4x4 3x3 1.29 vs
#: 1.37 ms, 8x128x8x8 3x3 s2 0.70 vs 0.82, 2x256x14x14 3.2 vs 3.7-3.9; backward 1.36-1.41 vs 1.58-1.63 (s2), 2.4-2.5
#: vs 2.5-2.6.
MAX_BLOCKS = cost.CORES
#: Columns (or rows) per block are a multiple of this (whole BLAS micro-tiles).
ALIGN = 16
#: Output positions per sample from which a float32 forward's products always write y itself (:func:`_direct`).
DIRECT_Q = 512


def blocks(total: int, macs_per_unit: int) -> list[tuple[int, int]]:
    """[a, b) ranges splitting ``total`` units (columns or rows) into blocks by the work they hold alone."""
    want = max(1, min(MAX_BLOCKS, (total * macs_per_unit) // BLOCK_MACS, total // ALIGN))
    if want == 1:
        return [(0, total)]
    step = -(-total // want)
    step = -(-step // ALIGN) * ALIGN
    return [(a, min(a + step, total)) for a in range(0, total, step)]


def _block_views(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list:
    """(a block, b block, out block) of out[i] = a[i] @ b[i] for each group i: blocks of out's columns (when out has
    more columns than rows: each block packs its slice of b and all of a again) or rows (each block packs all of b
    again). The inner dimension is never split: every element is one BLAS dot order, whatever the blocks."""
    g, m, k = a.shape
    n = b.shape[2]
    if m <= n:
        parts = [(i, lo, hi) for i in range(g) for lo, hi in blocks(n, m * k)]
        return [(a[i], b[i][:, lo:hi], out[i][:, lo:hi]) for i, lo, hi in parts]
    parts = [(i, lo, hi) for i in range(g) for lo, hi in blocks(m, n * k)]
    return [(a[i][lo:hi], b[i], out[i][lo:hi]) for i, lo, hi in parts]


def _split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, workers: int) -> None:
    """out[i] = a[i] @ b[i] for each group i by the blocks of :func:`_block_views`, each one ``numpy.matmul``, or
    (float32, NumPy's ILP64 OpenBLAS found) the very ``cblas_sgemm`` call numpy.matmul makes for it, run as a C job
    list (:mod:`.jobs`: no Python between the blocks): the same bits either way."""
    views = _block_views(a, b, out)
    if jobs.sgemm(views, workers):
        return

    def task(_, __, j):
        x, y, o = views[j]
        np.matmul(x, y, out=o)
    run([(j,) for j in range(len(views))], task, lambda: None, workers)


def _direct(p: ConvParams) -> bool:
    """Whether the forward's products write y's samples themselves (blocks within one sample, y's rows their output
    rows; no channel-major result, no pass moving it into y): float32 as C jobs, where a sample's product has at
    least DIRECT_Q columns (output positions) or at least as many as its inner dimension (input channels per group x
    taps), so that packing the weights again per sample costs less than the pass it saves, and where every block is
    one sgemm takes (no dimension of 1: the route never falls back). Two threads, the Intel machine of issue 25, ms,
    alternating in one process: 2x64x56x56 -> 128 1x1 s2 1.20 -> 0.65, 2x128x28x28 -> 256 1x1 s2 1.09 -> 0.75,
    4x512x3199 -> 512 k3 s2 63 -> 57, 4x512x1599 34.8 -> 31.7; with fewer, per-sample blocks ran slower (2x512x7x7 ->
    512 3x3 3.90 -> 4.44, 8x256x4x4 3x3 1.49 -> 2.20, 2x128x28x28 -> 256 3x3 s2 2.08 -> 2.21) or alike (2x256x14x14 ->
    256 3x3 4.20 -> 4.09). The bits are those of numpy.matmul on these blocks, a function of the configuration and the
    build like every path's, but not always the channel-major route's: OpenBLAS picks its kernel, and handles a
    block's last columns, by the block's shape (2x64x10x10 -> 16 1x1: 106 of 3200 elements differ in their last bit;
    the ResNet-18 shortcuts and speech_1d's layers do not)."""
    Q, inner, m = math.prod(p.output_shape[2:]), p.weight_shape[1] * math.prod(p.kernel), p.weight_shape[0] // p.groups
    if not (p.dtype == "float32" and Q >= ALIGN and (Q >= DIRECT_Q or Q >= inner) and min(m, inner) > 1):
        return False
    parts = blocks(Q, m * inner) if m <= Q else blocks(m, Q * inner)      # one sample's blocks (_block_views)
    return all(hi - lo > 1 for lo, hi in parts) and runs_as_jobs(p)


def runs_as_jobs(p: ConvParams) -> bool:
    """Whether ``p``'s products run as C jobs (float32 compute, NumPy's ILP64 sgemm found): see :func:`_split_matmul`."""
    return p.dtype != "float64" and jobs.sgemm_available()


def _sub(p: ConvParams, n0: int, n1: int) -> ConvParams:
    """``p`` for samples [n0, n1)."""
    return p.replace(input_shape=(n1 - n0,) + tuple(p.input_shape[1:]),
                     output_shape=(n1 - n0,) + tuple(p.output_shape[1:]))


@per_params
def _forward_chunks(p: ConvParams) -> tuple:
    """(the forward's sample chunks, its scratch bytes): a function of the configuration, kept with its plans."""
    chunks = tuple(sample_chunks(p, False, False, True))
    return chunks, max(cols_bytes(_sub(p, n0, n1), False, False, True) for n0, n1 in chunks)


@per_params
def _backward_chunks(p: ConvParams) -> tuple:
    """(the backward's chunks, "samples" or "channels", {(need_dx, need_dw): scratch bytes}), kept with the
    configuration's plans: one chunk of all samples where it fits, else chunks of x's channels where they fit
    (:func:`channel_chunks`), else chunks of samples. Whatever the mask: dW's chunking (so its bits) must not change."""
    chunks = tuple(sample_chunks(p, True, True))
    if len(chunks) != 1:
        by_channel = tuple(channel_chunks(p))
        if by_channel:
            width = max(c1 - c0 for c0, c1 in by_channel)
            return by_channel, "channels", {(gx, gw): _channel_scratch(p, width, gx or gw)
                                            for gx in (False, True) for gw in (False, True)}
    return chunks, "samples", {(gx, gw): max(cols_bytes(_sub(p, n0, n1), gx, gw) for n0, n1 in chunks)
                               for gx in (False, True) for gw in (False, True)}


class _Buffers:
    """One call's scratch by role ("cols": x's or dx's columns, one at a time; "dy": dy channel-major; "y": the
    forward's channel-major result), leased from the arena (kept between calls: a repeated call pays no page
    faults) at the size of the first request and reused by every later one of its role (a call's chunks are equal
    but for a smaller last one), given back when the call ends."""

    def __init__(self, lease: Lease):
        self.lease, self.bufs = lease, {}

    def get(self, role: str, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        buf = self.bufs.get(role)
        if buf is None or buf.nbytes < n:
            buf = self.bufs[role] = self.lease.empty((n,), np.uint8)
        return buf[:n].view(dtype).reshape(shape)

    def empty(self, role: str):
        """``empty(shape, dtype)`` for ``role``."""
        return lambda shape, dtype: self.get(role, shape, dtype)

    def drop(self, role: str) -> None:
        """Let ``role``'s buffer go now (taken for jobs that then did not serve: the fallback takes its own)."""
        buf = self.bufs.pop(role, None)
        if buf is not None:
            self.lease.release(buf)


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias (inputs finite), chunk by chunk of samples (:func:`sample_chunks`)."""
    chunks, scratch = _forward_chunks(p)
    tracing.note(workspace_bytes=scratch)
    with Lease() as lease:
        bufs = _Buffers(lease)
        if len(chunks) <= 1:
            return _fprop(x, w, bias, p, workers, bufs)
        y = empty_result(p.output_shape, DTYPES[p.dtype])
        for n0, n1 in chunks:                      # each chunk's result moved straight into its samples of y
            _fprop(x[n0:n1], w, bias, _sub(p, n0, n1), workers, bufs, y[n0:n1])
        return y


def _fprop(x, w, bias, p: ConvParams, workers: int, bufs: _Buffers, out=None):
    """y of one chunk (all of ``p``'s samples), made in ``out`` (a C-contiguous array of y's shape and dtype) when
    given, else in a new array; returns it. Where :func:`_direct`, the products write y's samples themselves."""
    f, cdt = small.plan(p), accumulation_dtype(p.dtype)
    wm = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K)
    if _direct(p):
        y = empty_result(p.output_shape, cdt) if out is None else out
        if _columns_then_products(x, p, f, cdt, lambda cols: sample_views(wm, cols, y, f), workers, bufs):
            return finish_forward(y, bias, p, f, True)
        out = y                                    # (not reached where _direct holds: its blocks are all sgemm's)
    y = bufs.get("y", (f.g, f.Cog, f.N * f.Q), cdt)
    if not _columns_then_products(x, p, f, cdt, lambda cols: _block_views(wm, cols, y), workers, bufs):
        _split_matmul(wm, small_c.im2col(x, p, f, cdt), y, workers)          # cols: (g, Cg*K, N*Q)
    return finish_forward(y, bias, p, f, False, out)


def sample_views(wm, cols, y, f) -> list:
    """The direct forward's blocks (:func:`_direct`): per sample, :func:`_block_views` of its columns of ``cols``
    (g, Cg*K, N*Q) into its rows of ``y`` (N, C_out, *spatial)."""
    ys = y.reshape(f.N, f.g, f.Cog, f.Q)
    return [v for n in range(f.N) for v in _block_views(wm, cols[:, :, n * f.Q:(n + 1) * f.Q], ys[n])]


def finish_forward(y, bias, p: ConvParams, f, direct: bool, out=None):
    """The forward's result from its products' output ``y`` (y itself where ``direct``, else its channel-major
    (g, Cog, N*Q) result, in the compute dtype): bias added, then, channel-major, moved into ``out`` (a new array
    where None) in the call's dtype."""
    if direct:
        if bias is not None:
            y.reshape(f.N, f.g, f.Cog, f.Q)[...] += np.asarray(bias, y.dtype).reshape(1, f.g, f.Cog, 1)
        return y
    if bias is not None:
        y += np.asarray(bias, y.dtype).reshape(f.g, f.Cog, 1)
    return small.from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype], out)


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, workers: int):
    """(dx, dw), None where not needed (inputs finite): all samples at once where their columns fit, else chunk by
    chunk of x's channels (:func:`channel_chunks`: every dW element still one product's sum over all samples), else
    chunk by chunk of samples (:func:`sample_chunks`; dW's partial sums added in chunk order)."""
    chunks, by, scratch = _backward_chunks(p)
    tracing.note(workspace_bytes=scratch[(need_dx, need_dw)])
    out_dt = DTYPES[p.dtype]
    with Lease() as lease:
        bufs = _Buffers(lease)
        if by == "channels":
            dx, dw = _backward_by_channels(dy, x, w, p, need_dx, need_dw, workers, chunks, bufs)
            return (None if dx is None else dx.astype(out_dt, copy=False),
                    None if dw is None else dw.astype(out_dt, copy=False))
        if len(chunks) <= 1:
            dx, dw = _backward(dy, x, w, p, need_dx, need_dw, workers, bufs)
            return (None if dx is None else dx.astype(out_dt, copy=False),
                    None if dw is None else dw.astype(out_dt, copy=False))
        dx = empty_result(p.input_shape, out_dt) if need_dx else None
        into = need_dx and out_dt == accumulation_dtype(p.dtype)   # each chunk's dx made in its samples of dx
        dw = None
        for n0, n1 in chunks:
            dxq, dwq = _backward(dy[n0:n1], None if x is None else x[n0:n1], w, _sub(p, n0, n1), need_dx, need_dw,
                                 workers, bufs, dx[n0:n1] if into else None)
            if need_dx and not into:
                dx[n0:n1] = dxq
            if need_dw:
                if dw is None:
                    dw = dwq
                else:
                    dw += dwq
        return dx, (None if dw is None else dw.astype(out_dt, copy=False))


def _backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, workers: int, bufs: _Buffers, dx_out=None):
    """(dx, dw) in the compute dtype; dx made in ``dx_out`` (C-contiguous, dx's shape, the compute dtype) when
    given. x's columns and dx's share one buffer (one of the two at a time)."""
    f, cdt = small.plan(p), accumulation_dtype(p.dtype)
    dyc = small.dy_channel_major(dy, f, cdt, bufs.empty("dy"))            # (g, Cog, N*Q)
    dx = dw = None
    if need_dw:
        dwm = np.empty((f.g, f.Cog, f.Cg * f.K), cdt)
        if not _columns_then_products(x, p, f, cdt, lambda cols: _block_views(dyc, cols.transpose(0, 2, 1), dwm),
                                      workers, bufs):
            _split_matmul(dyc, small_c.im2col(x, p, f, cdt).transpose(0, 2, 1), dwm, workers)    # (g, N*Q, Cg*K)
        dw = dwm.reshape(p.weight_shape)
    if need_dx:
        wt = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K).transpose(0, 2, 1)   # (g, Cg*K, Cog)
        dcols = bufs.get("cols", (f.g, f.Cg * f.K, f.N * f.Q), cdt)
        dx = _products_then_col2im(wt, dyc, dcols, p, f, cdt, workers, dx_out)
        if dx is None:
            _split_matmul(wt, dyc, dcols, workers)
            dx = small_c.col2im(dcols, p, f, cdt, dx_out)
    return dx, dw


def channel_chunks(p: ConvParams) -> list[tuple[int, int]]:
    """[c0, c1) ranges of x's channels (one group only) whose columns over all samples, with dy's channel-major copy,
    stay within the call's bytes (both gradients, as :func:`sample_chunks` counts them, with no dW partial to keep:
    each chunk's dW columns are final); equal chunks fixed by the configuration. Empty for several groups or where one
    channel's columns do not fit. The backward's dW is then ``dy @ cols^T`` by column blocks of whole sums over
    N * Q (no partial sums: at 2x256x14x14 3x3, two sample chunks' K = 196 products and partial sum ran dx + dW in
    6.1-6.3 ms, all samples in 3.7-4.2)."""
    f = small.plan(p)
    if f.g != 1:
        return []
    it = np.dtype(accumulation_dtype(p.dtype)).itemsize
    NQ = f.N * f.Q
    budget = _io_bytes(p, True, True, False) - it * f.Co * NQ
    width = min(f.C, budget // (it * f.K * NQ))
    if width < 1:
        return []
    width = -(-f.C // -(-f.C // width))            # equal chunks
    return [(c, min(c + width, f.C)) for c in range(0, f.C, width)]


def _channel_scratch(p: ConvParams, width: int, cols: bool) -> int:
    """Scratch bytes of the channel-chunked backward: one chunk's columns (x's or dx's, one at a time) and dy
    channel-major."""
    f = small.plan(p)
    it = np.dtype(accumulation_dtype(p.dtype)).itemsize
    return it * (width * f.K * f.N * f.Q * int(cols) + f.Co * f.N * f.Q)


def _backward_by_channels(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, workers: int, chunks,
                          bufs: _Buffers):
    """(dx, dw) in the compute dtype, chunk by chunk of x's channels [c0, c1) (one group): the chunk's columns
    ``cols`` (its rows c0 * K .. c1 * K of all samples' im2col), ``dW[:, c0 K:c1 K] = dy @ cols^T``, then the same
    buffer's ``dcols = W^T[c0 K:c1 K] @ dy`` added back into dx's channels c0..c1 (col2im). As C job lists per chunk
    where :func:`runs_as_jobs` (:func:`_chunk_jobs`), else the same loops and ``numpy.matmul`` blocks: the same
    bits."""
    f, cdt = small.plan(p), accumulation_dtype(p.dtype)
    K, NQ = f.K, f.N * f.Q
    dyc = small.dy_channel_major(dy, f, cdt, bufs.empty("dy"))[0]       # (Co, N*Q)
    buf = bufs.get("cols", (max(c1 - c0 for c0, c1 in chunks) * K * NQ,), cdt)
    dwm = np.empty((f.Co, f.C * K), cdt) if need_dw else None
    wt = np.ascontiguousarray(w, cdt).reshape(f.Co, f.C * K).T if need_dx else None     # (C*K, Co)
    dx = empty_result(p.input_shape, cdt) if need_dx else None
    xr, geo = small_c.im2col_input(x, p, cdt) if need_dw else (None, None)
    cgeo = small_c.col2im_geometry(p) if need_dx else None
    plane = math.prod(p.input_shape[2:])
    for c0, c1 in chunks:
        cols = buf[:(c1 - c0) * K * NQ].reshape((c1 - c0) * K, NQ)
        dw_views = [(dyc, cols.T, dwm[:, c0 * K:c1 * K])] if need_dw else []
        dx_views = [(wt[c0 * K:c1 * K], dyc, cols)] if need_dx else []
        # x's and dx's channels c0.. seen from the chunk: their first channel at c0, the loops' range from 0
        x0 = None if xr is None else native.address(xr) + c0 * xr.strides[1]
        dx0 = None if dx is None else native.address(dx) + c0 * plane * dx.itemsize
        if not _chunk_jobs(x0, geo, dx0, cgeo, cols, c1 - c0, dw_views, dx_views, p, workers):
            if need_dw:
                small_c.im2col_channels(x0, cols, geo, c1 - c0, cdt)
                _split_matmul(*(v[None] for v in dw_views[0]), workers)
            if need_dx:
                _split_matmul(*(v[None] for v in dx_views[0]), workers)
                small_c.col2im_channels(cols, dx0, cgeo, c1 - c0, cdt)
    return dx, (None if dwm is None else dwm.reshape(p.weight_shape))


def _chunk_jobs(x0, geo, dx0, cgeo, cols, width: int, dw_views, dx_views, p: ConvParams, workers: int) -> bool:
    """One channel chunk of :func:`_backward_by_channels` as C job lists (float32 where :func:`runs_as_jobs`): dW's
    (im2col by channel ranges, then its product blocks), then dx's (its product blocks into the same buffer, then
    col2im by channel ranges); False, nothing run, where the jobs do not serve. Two lists, not one whose dx products
    wait for dW's: a thread that waits spins, and where the threads outnumber the free cores (a CPU quota, a busy
    machine) one spun while the other had the products (2x256x14x14 3x3, two threads on one core: 11.2-12.0 ms as
    one list, 5.8-6.0 as two; measured by the review of issue 25)."""
    if not runs_as_jobs(p):
        return False
    dw_calls = jobs.sgemm_calls(_block_views(*(v[None] for v in dw_views[0]))) if dw_views else []
    dx_calls = jobs.sgemm_calls(_block_views(*(v[None] for v in dx_views[0]))) if dx_views else []
    if dw_calls is None or dx_calls is None:
        return False
    ranges = _channel_ranges(width, workers)
    if dw_calls:
        run = jobs.Jobs()
        run.split("im2col", (x0, native.address(cols), native.address(geo)), 3, ranges, signal=0)
        run.rows("sgemm", dw_calls, wait=(0, len(ranges)))
        run.run(min(workers, len(dw_calls)))
    if dx_calls:
        run = jobs.Jobs()
        run.rows("sgemm", dx_calls, signal=1)
        run.split("col2im", (native.address(cols), dx0, cgeo.ctypes.data), 3, ranges, wait=(1, len(dx_calls)))
        run.run(min(workers, len(dx_calls)))
    return True


def _channel_ranges(C: int, workers: int) -> list:
    """Channel ranges of the column copies run as jobs: two per worker (one on a single worker)."""
    return jobs.ranges(C, 2 * workers) if workers > 1 else [(0, C)]


def _columns_then_products(x, p: ConvParams, f, cdt, views, workers: int, bufs: _Buffers) -> bool:
    """x's columns (``bufs``' "cols"), then the products' blocks ``views(cols)`` (of :func:`_block_views`), as one C
    job list (float32 where :func:`runs_as_jobs`): the column copies by channel ranges, the blocks once they are done
    (numpy.matmul's calls: the bits of the NumPy route); False, nothing run and the columns let go, where the
    jobs do not serve."""
    if not runs_as_jobs(p):                        # float32 compute (cdt), sgemm jobs there
        return False
    cols = bufs.get("cols", (f.C * f.K, f.N * f.Q), cdt)
    calls = jobs.sgemm_calls(views(cols.reshape(f.g, f.Cg * f.K, f.N * f.Q)))
    if calls is None:
        del cols
        bufs.drop("cols")                          # freed: the fallback builds its own columns
        return False
    parts, threads, _kept = column_jobs(x, p, f, cdt, cols, calls, workers)
    if _one_tap(p):                                # the columns are x's channel-major copy: rows moved whole
        small.channel_major_into(x, cols.reshape(f.C, f.N, f.Q))
    jobs.Jobs.concatenated([q for q in parts if q is not None]).run(threads)
    return True


def column_jobs(x, p: ConvParams, f, cdt, cols, calls, workers: int) -> tuple:
    """The job lists of :func:`_columns_then_products`: ([x's column copies by channel ranges (None for a one-tap
    call: its caller copies the rows), the products' ``calls`` once those are done], the threads to run them on, what
    the jobs read that must stay alive: x as the copies read it and its geometry)."""
    threads = min(workers, len(calls))             # a thread more than the blocks would only share the copies
    products = jobs.Jobs()
    if _one_tap(p):
        products.rows("sgemm", calls)
        return [None, products], threads, ()
    xr, geo = small_c.im2col_input(x, p, cdt)
    ranges = _channel_ranges(f.C, threads)
    copies = jobs.Jobs()
    copies.split("im2col", (native.address(xr), native.address(cols), native.address(geo)), 3, ranges, signal=0)
    products.rows("sgemm", calls, wait=(0, len(ranges)))
    return [copies, products], threads, (xr, geo)


def _one_tap(p: ConvParams) -> bool:
    """A 1x1 kernel at stride 1 without padding: x's columns (C, N * Q) are x with its first two axes swapped (the
    same elements the im2col loop writes: 8x480x3x3 -> 80 forward, columns 58 -> 8 us)."""
    return math.prod(p.kernel) == 1 and all(s == 1 for s in p.stride) and all(a == b == 0 for a, b in p.padding)


def _products_then_col2im(wt, dyc, dcols, p: ConvParams, f, cdt, workers: int, dx=None):
    """dx: the products ``dcols = wt @ dyc`` (blocks of :func:`_block_views`), then col2im by channel ranges once they
    are done, as one C job list (float32 where :func:`runs_as_jobs`; the bits of the NumPy route); None, nothing
    run, where the jobs do not serve."""
    if not runs_as_jobs(p):                        # float32 compute (cdt), sgemm jobs there
        return None
    if dx is None:
        dx = empty_result(p.input_shape, cdt)
    made = dx_jobs(wt, dyc, dcols, dx, p, f, workers)
    if made is None:
        return None
    parts, threads, _geo = made
    jobs.Jobs.concatenated(parts).run(threads)
    return dx


def dx_jobs(wt, dyc, dcols, dx, p: ConvParams, f, workers: int):
    """The job lists of :func:`_products_then_col2im` into ``dx`` ([the products' blocks, then col2im by channel
    ranges once they are done], run as one list), the threads to run them on and the col2im geometry they read (keep
    it alive while they run); None where sgemm would not take a block."""
    calls = jobs.sgemm_calls(_block_views(wt, dyc, dcols))
    if calls is None:
        return None
    threads = min(workers, len(calls))
    geo = small_c.col2im_geometry(p)
    ranges = _channel_ranges(f.C, threads)
    products, adds = jobs.Jobs(), jobs.Jobs()
    products.rows("sgemm", calls, signal=1)
    adds.split("col2im", (native.address(dcols), native.address(dx), geo.ctypes.data), 3, ranges,
               wait=(1, len(calls)))
    return [products, adds], threads, geo


def cols_bytes(p: ConvParams, need_dx: bool, need_dw: bool, fprop_call: bool = False) -> int:
    """Scratch bytes of a call in one chunk: the columns (x's, or dx's: one at a time), and dy channel-major or the
    forward's channel-major result (none where :func:`_direct`)."""
    f = small.plan(p)
    it = np.dtype(accumulation_dtype(p.dtype)).itemsize
    cols = f.C * f.K * f.N * f.Q
    if fprop_call:
        return it * (cols + (0 if _direct(p) else f.Co * f.N * f.Q))
    return it * (cols * int(need_dx or need_dw) + f.Co * f.N * f.Q)


def _io_bytes(p: ConvParams, need_dx: bool, need_dw: bool, fprop_call: bool) -> int:
    it = np.dtype(DTYPES[p.dtype]).itemsize
    x, w, y = (math.prod(s) for s in (p.input_shape, p.weight_shape, p.output_shape))
    return it * (x + w + y if fprop_call else x + w + y + x * need_dx + w * need_dw)


def sample_chunks(p: ConvParams, need_dx: bool, need_dw: bool, fprop_call: bool = False) -> list[tuple[int, int]]:
    """[n0, n1) chunks of samples whose scratch stays within the backend's memory contract (at most the bytes of
    the call's inputs and outputs); fixed by the configuration alone. Empty when one sample does not fit."""
    N = p.input_shape[0]
    it = np.dtype(accumulation_dtype(p.dtype)).itemsize
    budget = _io_bytes(p, need_dx, need_dw, fprop_call) - it * math.prod(p.weight_shape) * need_dw   # dW partial
    one = cols_bytes(_sub(p, 0, 1), need_dx, need_dw, fprop_call)
    size = min(N, budget // max(one, 1))
    if size < 1:
        return []
    size = -(-N // -(-N // size))                  # equal chunks
    return [(a, min(a + size, N)) for a in range(0, N, size)]


def fits(p: ConvParams, need_dx: bool, need_dw: bool, fprop_call: bool = False) -> bool:
    """Whether this path serves the call within the memory contract (see :func:`sample_chunks`); a backward call
    is chunked as if both gradients were asked for."""
    return p.input_shape[0] > 0 and bool(sample_chunks(p, *((False, False) if fprop_call else (True, True)),
                                                       fprop_call))
