"""The fast NumPy convolution: large BLAS matrix products on chunked, channel-major "grid" buffers.

:mod:`.reference` defines the math; this module computes the same sums, accumulating in float32
(float64 for float64 inputs), laid out for BLAS. ``docs/numpy-backend.md`` describes the design;
in short:

- Polyphase grid. Per dim, the zero-padded input (length ``Sp = S + pre + post``) is split into
  ``stride`` phases, phase ``r`` holding ``x_pad[m*s + r]``, ``m < L = ceil(Sp / s)``. Tap ``j``
  reads ``x_pad[i*s + j*d] = phase_{r_j}[i + q_j]``, ``(q_j, r_j) = divmod(j*d, s)``: every tap is
  a stride-1 shift of one phase. Phases, dy and y live on one grid ``(N, L_1, ..., L_nd)``,
  flattened and channel-major, ``(groups, C/groups, positions)``, where a tap is a constant
  offset, so the shifted operand of all of a phase's taps is one strided view. Grid positions
  outside the real tensors hold zeros ("garbage" rows read the next row; never copied out).
- Strategy A ("dy-columns", the usual one): per phase, the taps' shifted dy slices gathered for
  the phase's valid input positions (im2col of dy, one strided copy), then
  ``dx_p = W_p^T @ cols_p`` and ``dW_p = cols_p @ x_p^T``. For 2-D kernels with enough channels
  the first-dim taps are line-shifted views of inner-tap columns.
- Strategy B ("x-columns", few input channels, e.g. a 3-channel stem): im2col of the x phases,
  ``dW = dy @ cols^T``, ``y = W @ cols`` (fprop), ``dx`` by ``Z = W^T @ dy`` and col2im adds.
- Pointwise (1x1, stride 1, no padding): per-sample products on the native layout.
- Small calls (:mod:`.small`, at most ``small.MAX_ELEMENTS`` elements of columns): one gather (or, at
  stride 1, one strided copy of a zero-padded grid) and one matrix product per gradient on the
  calling thread, from index tables planned once per configuration; after the compiled loops.
- Columns (:mod:`.columns`): geometries the grid serves badly, and backward calls whose inputs hold
  a NaN or infinity, run on the reference's chunked im2col in the compute dtype instead.
- Chunks of grid lines (whole samples, or line ranges of one sample with halos) sized to a
  working-set budget proportional to the call's bytes, run on a few Python threads with BLAS
  single-threaded; weight-gradient partials summed in a fixed order; scratch from an arena.

Everything is a fixed sequence of NumPy operations on shapes that depend only on the
convolution's parameters, so results are bitwise reproducible run to run, process to process
and (with BLAS thread control available) across BLAS thread counts.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES, accumulation_dtype
from xconv.workspace import check_request

from . import colgemm, columns, compiled, cost, direct, grid_blocks, small
from .budget import check_im2col
from .blas import MAX_WORKERS, blas_workers, single_threaded_blas
from .workers import cap_workers as _cap_workers, even_ranges, executor as _executor, run as _run

#: The working-set budget of one call never exceeds this many bytes (bigger chunks stop paying once
#: they leave the cache).
MAX_CHUNK_BYTES = 32 << 20
#: ... and may use at least this many bytes even for tiny calls (below it chunking only adds overhead).
MIN_CHUNK_BYTES = 1 << 20
#: ... and is otherwise this fraction of the bytes of the call's inputs plus outputs.
BUDGET_FRACTION = 1.0
#: Force the backward strategy: "a" (dy-columns), "b" (x-columns) or None (chosen by cost).
STRATEGY = None
#: Force (True/False) or leave to a cost rule (None) the implicit first-dim taps of strategy "a".
IMPLICIT_OUTER = None
#: The bias gradient sums dy in blocks of whole samples of about this many bytes, in parallel.
BGRAD_BLOCK_BYTES = 2 << 20
#: Strategy "a" gathers only valid positions within each grid line (True) or whole lines (False:
#: faster copies; the padding columns cost GEMM work instead); None: by channel count.
COMPACT_INNER = None
#: Scratch memory kept between calls for reuse (see ``release_memory``).
ARENA_BYTES = 64 << 20
#: The batch is cut into at least this many chunks when it has that many lines, to share the work.
MIN_CHUNKS = 2


def compute_dtype(p: ConvParams) -> np.dtype:
    """float64 for float64 inputs, else float32 (float16 and bfloat16 are computed in float32)."""
    return accumulation_dtype(p.dtype)


# ---------------------------------------------------------------------------------------------
# Geometry


class _Geom:
    """The grid, phases and taps of one direct convolution."""

    def __init__(self, p: ConvParams):
        self.p = p
        self.nd = nd = p.nd
        self.N, self.C_in = p.input_shape[:2]
        self.C_out = p.output_shape[1]
        self.g = g = p.groups
        self.Cg, self.Cog = self.C_in // g, self.C_out // g
        self.S, self.O, self.k = tuple(p.input_shape[2:]), tuple(p.output_shape[2:]), tuple(p.kernel)
        self.K = math.prod(self.k)
        s, d = p.stride, p.dilation
        pre = [a for a, _ in p.padding]
        Sp = [n + a + b for n, (a, b) in zip(self.S, p.padding)]
        self.L = L = tuple(-(-n // st) for n, st in zip(Sp, s))
        self.L1 = L[0]
        self.line = math.prod(L[1:])                       # grid positions per line (first grid dim)
        self.gstride = tuple(math.prod(L[i + 1:]) for i in range(nd))
        # per dim: residues used by some tap, in increasing order; taps as (j, q, r)
        per_dim = [[(j,) + divmod(j * d[i], s[i]) for j in range(self.k[i])] for i in range(nd)]
        residues = [sorted({r for _, _, r in taps}) for taps in per_dim]
        self.full_cover = all(len(res) == st for res, st in zip(residues, s))
        kstride = [math.prod(self.k[i + 1:]) for i in range(nd)]
        self.phases = []                                    # list of (r tuple, [(kflat, off), ...])
        self.tapgrid = []                                   # per phase: per dim (q0, dq, count)
        by_residue = []                                     # per dim: residue -> its taps, in j order
        for taps in per_dim:
            groups = {}
            for t in taps:
                groups.setdefault(t[2], []).append(t)
            by_residue.append(groups)
        for r in itertools.product(*residues):
            lists = [by_residue[i][r[i]] for i in range(nd)]
            taps = []
            for combo in itertools.product(*lists):
                kflat = sum(t[0] * kstride[i] for i, t in enumerate(combo))
                off = sum(t[1] * self.gstride[i] for i, t in enumerate(combo))
                taps.append((kflat, off))
            self.phases.append((r, taps))
            # a phase's taps along a dim are j = j0, j0 + s', ... so their q form an arithmetic progression
            spec = []
            for lst in lists:
                dq = lst[1][1] - lst[0][1] if len(lst) > 1 else 0
                assert all(b[1] - a[1] == dq for a, b in zip(lst, lst[1:]))
                spec.append((lst[0][1], dq, len(lst)))
            self.tapgrid.append(tuple(spec))
        self.qmax1 = max(j * d[0] // s[0] for j in range(self.k[0]))
        max_off = max(off for _, taps in self.phases for _, off in taps)
        self.halo = -(-max_off // self.line) if self.line else 0   # halo lines covering every tap offset
        # valid grid ranges: (lo, hi, start, step) per dim; grid index m <-> tensor index start + (m-lo)*step
        self.x_valid = {}
        for r, _ in self.phases:
            rng = []
            for i in range(nd):
                lo = max(0, -((r[i] - pre[i]) // s[i]))
                hi = (self.S[i] - 1 + pre[i] - r[i]) // s[i] + 1
                rng.append((lo, max(lo, hi), lo * s[i] + r[i] - pre[i], s[i]))
            self.x_valid[r] = tuple(rng)
        self.y_valid = tuple((0, o, 0, 1) for o in self.O)
        # 1x1 kernel, stride 1, no padding: output positions are input positions, no grid needed
        self.pointwise = self.K == 1 and all(st == 1 for st in s) and all(a == b == 0 for a, b in p.padding)
        self.P = math.prod(self.S)

    def pieces(self, e0: int, e1: int):
        """Grid lines [e0, e1) (line e = n*L1 + m) inside the batch, as at most three blocks.

        Each block is (n0, n1, m0, m1, i0): lines [m0, m1) of samples n0..n1-1 (several samples
        only when m0 == 0 and m1 == L1), at line offset i0 from e0.
        """
        L1 = self.L1
        lo, hi = max(e0, 0), min(e1, self.N * L1)
        out = []
        e = lo
        while e < hi:
            n, m = divmod(e, L1)
            if m == 0 and hi - e >= L1:
                nb = (hi - e) // L1
                out.append((n, n + nb, 0, L1, e - e0))
                e += nb * L1
            else:
                m1 = min(L1, m + hi - e)
                out.append((n, n + 1, m, m1, e - e0))
                e += m1 - m
        return out


def _blocks(geo: _Geom, grid: np.ndarray, tensor: np.ndarray, e0: int, e1: int, valid):
    """Pairs (grid view, tensor view) of the valid positions of grid lines [e0, e1).

    ``grid`` is (G, C, (e1-e0)*line); ``tensor`` is (N, G, C, *spatial). The tensor view is
    transposed to the grid view's axis order (G, C, n, m, *rest).
    """
    G, C = grid.shape[:2]
    rest = geo.L[1:]
    out = []
    for n0, n1, m0, m1, i0 in geo.pieces(e0, e1):
        lo, hi, start, step = valid[0]
        a, b = max(m0, lo), min(m1, hi)
        if a >= b or any(v[1] <= v[0] for v in valid[1:]):
            continue
        nb, nl = n1 - n0, m1 - m0
        gv = grid[:, :, i0 * geo.line:(i0 + nb * nl) * geo.line].reshape((G, C, nb, nl) + rest)
        gv = gv[(slice(None),) * 3 + (slice(a - m0, b - m0),) + tuple(slice(v[0], v[1]) for v in valid[1:])]
        first = start + (a - lo) * step
        tsl = (slice(n0, n1), slice(None), slice(None), slice(first, first + (b - a - 1) * step + 1, step))
        tsl += tuple(slice(v[2], v[2] + (v[1] - v[0] - 1) * v[3] + 1, v[3]) for v in valid[1:])
        tv = tensor[tsl]
        out.append((gv, tv.transpose((1, 2, 0) + tuple(range(3, tv.ndim)))))
    return out


class _Arena:
    """Scratch memory kept between calls, so that repeated calls do not pay the kernel's page faults.

    A call leases buffers (``lease.empty``) and gives them all back when it ends; up to
    ``ARENA_BYTES`` of them are kept for later calls, the least recently returned freed first.
    Buffers come in size classes (4 KiB at least, then eight per power of two: at most 1/8 wasted),
    one free list per class, so taking and giving do not scan the buffers kept (a call leasing
    thousands of tiny buffers costs no later call a scan). :func:`release_memory` frees them all.
    """

    MIN_CLASS = 4096

    def __init__(self):
        self.lock = threading.Lock()
        self.free: dict[int, list] = {}           # size class -> [(sequence, buffer)], oldest first
        self.total = 0
        self.seq = 0

    @classmethod
    def size_class(cls, nbytes: int) -> int:
        """The bytes of the buffer serving a request of ``nbytes``."""
        if nbytes <= cls.MIN_CLASS:
            return cls.MIN_CLASS
        step = 1 << ((nbytes - 1).bit_length() - 3)
        return -(-nbytes // step) * step

    def take(self, nbytes: int) -> np.ndarray:
        c = self.size_class(nbytes)
        with self.lock:
            bufs = self.free.get(c)
            if bufs:
                _, buf = bufs.pop()               # the most recently returned: warmest in cache
                self.total -= buf.nbytes
                return buf
        return np.empty(c, np.uint8)

    def give(self, bufs) -> None:
        with self.lock:
            for buf in bufs:
                self.free.setdefault(self.size_class(buf.nbytes), []).append((self.seq, buf))
                self.seq += 1
                self.total += buf.nbytes
            while self.total > ARENA_BYTES:       # evict the least recently returned (few classes to look at)
                c = min((c for c, lst in self.free.items() if lst), key=lambda c: self.free[c][0][0])
                _, buf = self.free[c].pop(0)
                self.total -= buf.nbytes

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.total = 0


_ARENA = _Arena()


def release_memory() -> None:
    """Free the scratch memory the fast path keeps between calls (at most ``ARENA_BYTES``)."""
    _ARENA.clear()


class _Lease:
    """The scratch buffers of one call, handed back to the arena when the call ends; their total is the
    call's workspace (reported to the trace record, and kept within ``limit`` bytes or UnsupportedError)."""

    def __init__(self, limit: int | None = None):
        self.bufs = []
        self.limit = limit
        self.sizes = []                             # bytes of each buffer taken (list.append: thread-safe)

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized array starting on a 64-byte boundary (a cache line: vector loads never split)."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        self.sizes.append(n + 64)
        if self.limit is not None:
            check_request("numpy", sum(self.sizes), self.limit, "scratch (its smallest chunking)")
        raw = _ARENA.take(n + 64)
        self.bufs.append(raw)
        a = -raw.ctypes.data % 64
        return raw[a:a + n].view(dtype).reshape(shape)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _ARENA.give(self.bufs)
        self.bufs = []
        if tracing.active():
            tracing.workspace(sum(self.sizes))


class _GridBuf:
    """A reusable grid buffer for lines [e0, e1) of one tensor.

    Zeroed in full on first use; afterwards a fill zeroes only the lines that hold no data
    (outside the batch or outside the valid range of the first grid dim). Within a line the
    positions that hold no data are the same for every line and are never written, so they
    stay zero.
    """

    def __init__(self, geo: _Geom, G: int, C: int, lines: int, dtype, lease: _Lease):
        self.geo = geo
        self.buf = lease.empty((G, C, lines * geo.line), dtype)
        self.fresh = True

    def fill(self, tensor, e0: int, e1: int, valid):
        geo = self.geo
        line = geo.line
        n = e1 - e0
        grid = self.buf[:, :, :n * line]
        if self.fresh or any(v[1] <= v[0] for v in valid[1:]):
            self.buf.fill(0)
            self.fresh = False
        else:
            before = min(max(-e0, 0), n)
            after = min(max(e1 - max(e0, geo.N * geo.L1), 0), n)
            if before:
                grid[:, :, :before * line] = 0
            if after:
                grid[:, :, (n - after) * line:] = 0
            lo, hi = valid[0][:2]
            G, C = grid.shape[:2]
            for n0, n1, m0, m1, i0 in geo.pieces(e0, e1):
                nb, nl = n1 - n0, m1 - m0
                a, b = min(max(lo - m0, 0), nl), min(max(hi - m0, 0), nl)
                if a > 0 or b < nl:
                    v = grid[:, :, i0 * line:(i0 + nb * nl) * line].reshape(G, C, nb, nl, line)
                    if a > 0:
                        v[:, :, :, :a] = 0
                    if b < nl:
                        v[:, :, :, max(a, b):] = 0
        for gv, tv in _blocks(geo, grid, tensor, e0, e1, valid):
            gv[...] = tv
        return grid


def _scatter(geo: _Geom, grid, tensor, e0: int, e1: int, valid):
    """Copy the valid positions of grid lines [e0, e1) into ``tensor`` (N, G, C, *spatial), casting."""
    for gv, tv in _blocks(geo, grid, tensor, e0, e1, valid):
        tv[...] = gv


class _Slots:
    """Deterministic accumulation of per-chunk weight-gradient partials computed concurrently.

    Chunk i adds into slot i % S, and a slot takes its chunks strictly in increasing order (a
    chunk waits for its predecessor in the slot); the slots are summed in order at the end. S
    depends only on the shapes, so the rounding does not depend on the number of threads. The
    first chunk of a slot writes its GEMM straight into the slot; later ones go through the
    worker's scratch and one addition.
    """

    def __init__(self, n_slots: int, shapes, dtype, lease: _Lease):
        self.S = n_slots
        self.lease = lease
        self.shapes, self.dtype = shapes, dtype
        self.accs = [None] * n_slots
        self.next = list(range(n_slots))
        self.conds = [threading.Condition() for _ in range(n_slots)]
        self.failed = False

    def scratch(self):
        return [self.lease.empty(shape, self.dtype) for shape in self.shapes]

    def target(self, i: int, scratch):
        """Where chunk i computes its partials: its slot's accumulators when it is the slot's first chunk."""
        if i < self.S:
            self.accs[i] = self.scratch()
            return self.accs[i]
        return scratch

    def commit(self, i: int, parts) -> None:
        s = i % self.S
        cond = self.conds[s]
        with cond:
            if i >= self.S:
                cond.wait_for(lambda: self.next[s] == i or self.failed)
                if self.failed:
                    raise RuntimeError("an earlier chunk failed")
                for a, b in zip(self.accs[s], parts):
                    a += b
            self.next[s] = i + self.S
            cond.notify_all()

    def fail(self) -> None:
        self.failed = True
        for cond in self.conds:
            with cond:
                cond.notify_all()

    def total(self):
        acc = self.accs[0]
        for more in self.accs[1:]:
            if more is not None:
                for a, b in zip(acc, more):
                    a += b
        return acc


def _n_slots(io_bytes: int, w_bytes: int) -> int:
    """Accumulator slots: up to MAX_WORKERS while their memory stays within a quarter of the call's bytes."""
    return max(1, min(MAX_WORKERS, io_bytes // max(4 * w_bytes, 1)))


# ---------------------------------------------------------------------------------------------
# Chunk planning


def _budget(nbytes: int, p: ConvParams | None = None) -> int:
    """Working-set budget of one call: all chunks in flight together stay within it. Under ``p.workspace_limit``
    it is the limit less a reserve for the weight-sized scratch (layouts, accumulator slots: at most
    3 + 2 * MAX_WORKERS weights in the compute dtype)."""
    budget = int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, BUDGET_FRACTION * nbytes)))
    if p is not None and p.workspace_limit is not None:
        reserve = (3 + 2 * MAX_WORKERS) * math.prod(p.weight_shape) * compute_dtype(p).itemsize
        budget = max(1, min(budget, p.workspace_limit - reserve))
    return budget


def _split(total: int, most: int):
    """[start, stop) ranges covering range(total), each at most ``most`` long, sizes differing by at
    most one, and an even number of them where possible (two workers finish together)."""
    n = max(1, -(-total // max(most, 1)))
    if n % 2 and n < total:
        n += 1
    return even_ranges(total, n)


def _chunks(geo: _Geom, line_bytes: int, halo_lines: int, budget: int):
    """(chunks, max lines, aligned): line ranges [e0, e1) covering the batch.

    Each chunk's buffers take at most budget / 2 bytes (two chunks in flight fit the budget; four,
    the most, twice the budget), and there are at least MIN_CHUNKS chunks when the batch has enough
    lines, so that the workers share the work. Whole samples per chunk when one sample fits
    (``aligned``), else equal line ranges of one sample. Depends only on the shapes.
    """
    L1, N = geo.L1, geo.N
    line_bytes = max(line_bytes, 1)
    cap = max(1, budget // 2)
    if (L1 + halo_lines) * line_bytes <= cap:
        nb = max(1, min(N, (cap - halo_lines * line_bytes) // (L1 * line_bytes), -(-N // MIN_CHUNKS)))
        parts = _split(N, nb)
        return [(a * L1, b * L1) for a, b in parts], max(b - a for a, b in parts) * L1, True
    nl = max(1, min(cap // line_bytes - halo_lines, -(-N * L1 // MIN_CHUNKS)))
    parts = _split(L1, nl)
    return ([(n * L1 + a, n * L1 + b) for n in range(N) for a, b in parts], max(b - a for a, b in parts),
            False)


# ---------------------------------------------------------------------------------------------
# Layout helpers



def _x4(t, G, C):
    """An (N, G*C, *spatial) tensor viewed as (N, G, C, *spatial)."""
    return t.reshape((t.shape[0], G, C) + t.shape[2:])


def _weight_layout(w, geo: _Geom, cdt, axes: str, lease: _Lease) -> np.ndarray:
    """The weight as a C-contiguous scratch array with axes ``axes``, a permutation of "gock".

    g: group, o: output channel in the group, c: input channel in the group, k: tap, taps in
    phase order. Copied in blocks of output channels so that the strided reads stay in cache
    (a plain transposing copy of a large weight runs at a fraction of memory speed).
    """
    order = _tap_order(geo)
    src = w.reshape(geo.g, geo.Cog, geo.Cg, geo.K)            # axes g, o, c, k
    perm = tuple("gock".index(a) for a in axes)
    shape = tuple(src.shape[i] for i in perm)
    permute_taps = order != list(range(geo.K))
    out = lease.empty(shape, cdt)
    tmp = lease.empty(shape, cdt) if permute_taps else out
    block = 32                                          # 32 source rows of C_in/g*K stay in cache
    o_axis = axes.index("o")
    for o in range(0, geo.Cog, block):
        sel = [slice(None)] * 4
        sel[o_axis] = slice(o, o + block)
        tmp[tuple(sel)] = src[:, o:o + block].transpose(perm)
    if permute_taps:                                    # then reorder taps: contiguous rows move
        np.take(tmp, order, axis=axes.index("k"), out=out)
    return out


def _tap_order(geo: _Geom):
    return [kf for _, taps in geo.phases for kf, _ in taps]


@functools.lru_cache(maxsize=32)
def _geom(p: ConvParams) -> _Geom:
    """p's _Geom, cached (read only: nothing writes a _Geom after __init__)."""
    return _Geom(p)


def _io_bytes(geo: _Geom, itemsize: int, need_dx: bool, need_dw: bool, fprop: bool = False) -> int:
    xs = geo.N * geo.C_in * math.prod(geo.S)
    ys = geo.N * geo.C_out * math.prod(geo.O)
    ws = geo.C_out * geo.Cg * geo.K
    if fprop:
        return itemsize * (xs + ws + ys)
    return itemsize * (ys + (xs if need_dw else 0) + ws * (1 + need_dw) + (xs if need_dx else 0))


def _new_output(shape, p: ConvParams, zero: bool):
    dt = DTYPES[p.dtype]
    return np.zeros(shape, dt) if zero else np.empty(shape, dt)


def _finish_dw(geo: _Geom, p: ConvParams, parts):
    """Assemble (kflat indices, array (g, Cog, Cg, J)) parts into (C_out, C_in/g, *k) of the output dtype."""
    dw = np.empty(p.weight_shape, DTYPES[p.dtype])
    view = dw.reshape(geo.g, geo.Cog, geo.Cg, geo.K)
    for kidx, arr in parts:
        if list(kidx) == list(range(geo.K)):
            view[...] = arr
        else:
            view[..., kidx] = arr
    return dw


def _tap_view(geo: _Geom, ip: int, grid: np.ndarray, base: int, sign: int, rows: int, spec=None) -> np.ndarray:
    """All of phase ip's tap slices of ``grid`` (G, C, positions) as one strided view (G, J, C, rows).

    Tap i reads grid[:, :, base + sign*off_i : ... + rows]; the offsets are sums of arithmetic
    progressions along each dim, so the taps form a regular (n_1, ..., n_nd) array of slices.
    ``spec`` overrides the phase's per-dim (q0, dq, count).
    """
    G, C = grid.shape[:2]
    spec = geo.tapgrid[ip] if spec is None else spec
    it = grid.itemsize
    start = base + sign * sum(q0 * gs for (q0, _, _), gs in zip(spec, geo.gstride))
    shape = (G,) + tuple(n for _, _, n in spec) + (C, rows)
    strides = ((grid.strides[0],) + tuple(sign * dq * gs * it for (_, dq, _), gs in zip(spec, geo.gstride))
               + (grid.strides[1], grid.strides[2]))
    view = np.lib.stride_tricks.as_strided(grid[:, :, start:], shape=shape, strides=strides, writeable=False)
    return view


def _x_columns(geo: _Geom, xgs, cols, rows):
    """Fill cols (g, K*Cg, rows) with each tap's shifted slice of its x phase grid (taps in phase order)."""
    Cg = geo.Cg
    jj = 0
    for ip, ((r, taps), xg) in enumerate(zip(geo.phases, xgs)):
        J = len(taps)
        view = _tap_view(geo, ip, xg, 0, 1, rows)
        cols[:, jj * Cg:(jj + J) * Cg].reshape(view.shape)[...] = view
        jj += J


# ---------------------------------------------------------------------------------------------
# Primitives


def _strategy_a(geo: _Geom, need_dx: bool, need_dw: bool) -> bool:
    """Whether the dy-columns strategy (A) is cheaper than the x-columns one (B)."""
    if STRATEGY is not None:
        return STRATEGY == "a"
    if need_dw and not need_dx:
        return geo.Cog <= geo.Cg
    return geo.Cog <= 2 * geo.Cg          # B also pays a col2im of K*Cg per position


#: colgemm's forward serves calls of at most this many output positions (N x spatial): past it the copy back to
#: (N, C, spatial) costs more than the model counts (a 1x1 at 8x28x28, 256 -> 128: 10-16 ms against the grid's 6).
COLGEMM_FORWARD_COLUMNS = 4096


def modelled(p: ConvParams, output: str):
    """The path the cost model picks for ``output`` ("y", "dx", "dw") of ``p``: "small" (the small path's older
    rules), a path the model knows, or None (the older rules decide)."""
    if small.ENABLED is not None or compiled.ENABLED is not None or STRATEGY is not None:
        return None                                    # a path forced (tests, benchmarks): the older rules
    return _modelled(p, output, small.compiled_available(), compiled.available())   # ($XCONV_NUMPY_C in the key)


@functools.lru_cache(maxsize=1024)
def _modelled(p: ConvParams, output: str, compiled_small: bool, compiled_dense: bool):
    if (p.workspace_limit is not None or p.transposed or direct.serves(p) or not compiled_small
            or columns.serves(p)):
        return None
    served = small.serves(p, output == "dx")                        # the small path by its own size rule
    same = np.dtype(DTYPES[p.dtype]) == compute_dtype(p)       # no wider copies: its grids stay within the contract
    cands = ["small"] if served or (same and small.grid_compiled(p)) else []   # its stride-1 loops at any size
    if colgemm.fits(p, output == "dx", output == "dw", output == "y") and (
            output != "y" or (len(colgemm.sample_chunks(p, False, False, True)) == 1
                              and p.input_shape[0] * math.prod(p.output_shape[2:]) <= COLGEMM_FORWARD_COLUMNS)):
        cands.append("colgemm")
    if output == "y":
        if all(s == 1 for s in p.stride) and not served:   # the small path's loops past its size, in sample blocks
            cands.append("grid")
        if not served:
            cands.append("blas-grid")                      # the older rules' forward past the small path
    else:
        if compiled.serves(p):
            cands.append("direct")
        if math.prod(p.kernel) == 1 and set(p.stride) == {1} and all(a == b == 0 for a, b in p.padding):
            cands.append("pointwise")
    pick = cost.cheapest(p, output, cands) if cands else None
    return None if pick == "blas-grid" else pick


def _columns_backward(dy, x, w, p, need_dx, need_dw, need_db):
    check_im2col("numpy", p, [op for op, bit in (("dgrad", need_dx), ("wgrad", need_dw)) if bit],
                 compute_dtype(p).itemsize, "im2col columns (fallback)")
    dx, dw = columns.backward(dy, x, w, p, need_dx, need_dw)
    return dx, dw, (bgrad(dy, p) if need_db else None)


def _backward_modelled(dy, x, w, p, need_dx, need_dw, need_db):
    """(dx, dw, db) when the cost model picks a path for every requested gradient (each on its own, so the mask
    changes no output's path), else None. db: summed in double by the small path's C call when that call is the
    weight gradient's pick (as the small path always did), else by :func:`bgrad`: either way a function of the
    configuration, not of the mask."""
    picks = {o: modelled(p, o) for o, bit in (("dx", need_dx), ("dw", need_dw)) if bit}
    if None in picks.values():
        return None
    check = [path for path in ("colgemm", "small") if path in picks.values()
             and not (path == "small" and small.grid_compiled(p))]           # those multiply padding zeros
    if check and columns.has_nonfinite(p, dy, x if picks.get("dw") in check else None,
                                       w if picks.get("dx") in check else None):
        return _columns_backward(dy, x, w, p, need_dx, need_dw, need_db)
    db_in_c = need_db and small.grid_compiled(p) and modelled(p, "dw") == "small"
    out = {}
    with single_threaded_blas() as workers, _Lease(p.workspace_limit) as lease:
        for path in dict.fromkeys(picks.values()):
            want_dx, want_dw = picks.get("dx") == path, picks.get("dw") == path
            tracing.note(f"cost model: {path} for {'dx' if want_dx else ''}{'+' if want_dx and want_dw else ''}"
                         f"{'dw' if want_dw else ''}")
            if path == "small":
                if small.grid_compiled(p):                          # checks for NaN/Inf itself
                    with_db = db_in_c and "db" not in out
                    r = small.compiled_backward(dy, x, w, p, want_dx, want_dw, with_db)
                    if r is None:                                   # NaN/Inf: the exact-zero path
                        return _columns_backward(dy, x, w, p, need_dx, need_dw, need_db)
                    if with_db:
                        out["db"] = r[2]
                else:
                    r = small.backward(dy, x, w, p, want_dx, want_dw)
            elif path == "colgemm":
                r = colgemm.backward(dy, x, w, p, want_dx, want_dw, workers)
            elif path == "direct":
                geo = _geom(p)
                budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, True, True), p)   # not the mask's
                r = compiled.backward(dy, x, w, p, want_dx, want_dw, False, workers, budget, lease)[:2]
            else:
                r = _backward_pointwise(_geom(p), dy, x if want_dw else None, w, want_dx, want_dw, False, workers,
                                        lease)[:2]
            if want_dx:
                out["dx"] = r[0]
            if want_dw:
                out["dw"] = r[1]
    if need_db and "db" not in out:
        if db_in_c:
            r = small.compiled_backward(dy, x, w, p, False, False, True)
            if r is None:
                return _columns_backward(dy, x, w, p, need_dx, need_dw, need_db)
            out["db"] = r[2]
        else:
            out["db"] = bgrad(dy, p)
    return out.get("dx"), out.get("dw"), out.get("db")


def backward(dy, x, w, p: ConvParams, mask):
    """(dx, dw, db) of a direct convolution, None where the mask bit is False."""
    need_dx, need_dw, need_db = mask
    dx = dw = None
    if need_db and not (need_dx or need_dw) and modelled(p, "dw") == "small" and small.grid_compiled(p):
        r = small.compiled_backward(dy, x, w, p, False, False, True)     # db as the full mask computes it
        if r is not None:
            return None, None, r[2]
    if need_dx or need_dw:
        results = _backward_modelled(dy, x, w, p, need_dx, need_dw, need_db)
        if results is not None:
            return results
        # the depthwise loops' scratch is not leased: under a workspace limit the counted paths run
        depthwise = direct.serves(p) and p.workspace_limit is None and not small.before_depthwise(p, need_dx)
        compiled_loops = depthwise or compiled.serves(p)      # they keep NaN/Inf where the reference does
        on_grid = not columns.serves(p)
        if (on_grid and not compiled_loops and p.workspace_limit is None and small.serves(p, need_dx)
                and small.grid_compiled(p)):             # one C call, which checks for NaN/Inf itself; no BLAS
            results = small.compiled_backward(dy, x, w, p, need_dx, need_dw, need_db)
            if results is not None:
                tracing.note("small-call columns")
                if need_db:
                    tracing.note("bias sum")
                return results
            on_grid = False                                   # NaN/Inf: the exact-zero path, as below
        if not on_grid or (not compiled_loops and columns.has_nonfinite(p, dy, x if need_dw else None,
                                                                         w if need_dx else None)):
            check_im2col("numpy", p, [op for op, bit in (("dgrad", need_dx), ("wgrad", need_dw)) if bit],
                         compute_dtype(p).itemsize, "im2col columns (fallback)")
            dx, dw = columns.backward(dy, x, w, p, need_dx, need_dw)
            return dx, dw, (bgrad(dy, p) if need_db else None)
        if depthwise:
            tracing.note("depthwise C loops")                   # no BLAS: not pinned
            return direct.backward(dy, x, w, p, need_dx, need_dw, need_db, blas_workers())
        if not compiled_loops and p.workspace_limit is None and small.serves(p, need_dx):  # compiled loops first;
            tracing.note("small-call columns")          # its scratch is not leased: not under a workspace limit
            with single_threaded_blas():
                dx, dw = small.backward(dy, x, w, p, need_dx, need_dw)
            return dx, dw, (bgrad(dy, p) if need_db else None)
        geo = _geom(p)
        with single_threaded_blas() as workers, _Lease(p.workspace_limit) as lease:
            if compiled.serves(p):                       # db from its copy of dy
                tracing.note("C direct loops")
                budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, need_dx, need_dw), p)
                return compiled.backward(dy, x, w, p, need_dx, need_dw, need_db, workers, budget, lease)
            if geo.pointwise:                           # db from the samples it reads
                tracing.note("pointwise per-sample GEMM")
                return _backward_pointwise(geo, dy, x if need_dw else None, w, need_dx, need_dw, need_db, workers,
                                           lease)
            run = _backward_a if _strategy_a(geo, need_dx, need_dw) else _backward_b
            tracing.note("blas-grid strategy A (dy-columns)" if run is _backward_a
                         else "blas-grid strategy B (x-columns)")
            dx, dw = run(geo, dy, x if need_dw else None, w, need_dx, need_dw, workers, lease)
    return dx, dw, (bgrad(dy, p) if need_db else None)


def dgrad(dy, w, p: ConvParams):
    return backward(dy, None, w, p, (True, False, False))[0]


def wgrad(x, dy, p: ConvParams):
    return backward(dy, x, None, p, (False, True, False))[1]


def bgrad(dy, p: ConvParams):
    """dy summed over N and the spatial dims: per block of samples (blocks fixed by the shape alone),
    blocks summed on the workers, partial sums added in block order."""
    tracing.note("bias sum")
    cdt = compute_dtype(p)
    axes = (0,) + tuple(range(2, dy.ndim))
    N = dy.shape[0]
    per_sample = max(1, dy.size // max(N, 1) * dy.itemsize)
    nb = max(1, BGRAD_BLOCK_BYTES // per_sample)
    blocks = [(n, min(n + nb, N)) for n in range(0, N, nb)]
    if len(blocks) <= 1:
        db = np.sum(dy, axis=axes, dtype=cdt)
    else:
        def part(b):
            return np.sum(dy[b[0]:b[1]], axis=axes, dtype=cdt)
        with single_threaded_blas() as workers:
            parts = list(_executor(workers).map(part, blocks)) if workers > 1 else [part(b) for b in blocks]
        db = parts[0]
        for more in parts[1:]:
            db += more
    return np.ascontiguousarray(db.astype(DTYPES[p.dtype], copy=False))


def _implicit_outer(geo: _Geom, ip: int, single_sample: bool) -> bool:
    """Whether phase ip's first-dim taps should be line-shifted views of inner-tap columns.

    That copies 1/n_1 of the columns, at the price of n_1 smaller GEMMs and, for the input
    gradient, n_1 - 1 additions of a (C_in/g, rows) block. Needs chunks inside one sample (the
    shifted views must be plain matrices). Measured on the suite: 5-7% faster for 2-D kernels
    with C_in/g >= 8, slower for the 3x3x3 one (whose GEMMs get too small) and for depthwise.
    """
    if geo.nd == 1 or geo.tapgrid[ip][0][2] == 1 or not single_sample:
        return False
    if IMPLICIT_OUTER is not None:
        return bool(IMPLICIT_OUTER)
    return geo.nd == 2 and geo.Cg >= 8


def _chunks_compact(geo: _Geom, lo1: int, hi1: int, dy_line_bytes: int, unit_bytes: int, budget: int,
                    single_sample: bool):
    """Chunks (n0, nb, a, b): samples n0..n0+nb-1, grid lines [a, b) of the first dim, within [lo1, hi1).

    Whole samples per chunk when one fits half the budget (and ``single_sample`` is False), else
    line ranges of one sample; at least MIN_CHUNKS chunks when there is enough work. Also returns
    the most dy-grid lines and compact lines a chunk has. Depends only on the shapes.
    """
    N, L1, h = geo.N, geo.L1, geo.halo
    S1 = hi1 - lo1
    cap = max(1, budget // 2)
    sample = S1 * unit_bytes + L1 * dy_line_bytes
    if not single_sample and sample + h * dy_line_bytes <= cap:
        nb = max(1, min(N, (cap - h * dy_line_bytes) // max(sample, 1), -(-N // MIN_CHUNKS)))
        parts = _split(N, nb)
        nb = max(b - a for a, b in parts)
        return [(a, b - a, lo1, hi1) for a, b in parts], nb * L1 + h, nb * S1
    per_line = unit_bytes + dy_line_bytes
    nl = max(1, min(cap // max(per_line, 1) - h, -(-N * S1 // MIN_CHUNKS)))
    parts = _split(S1, nl)
    nl = max(b - a for a, b in parts)
    return [(n, 1, lo1 + a, lo1 + b) for n in range(N) for a, b in parts], nl + h, nl


def _backward_a(geo: _Geom, dy, x, w, need_dx: bool, need_dw: bool, workers: int, lease: _Lease):
    """dy-columns on the valid input positions only.

    Per chunk and phase p: cols_p = the taps' shifted slices of the dy grid, gathered for the
    positions u of x's phase p only (garbage and padding positions are skipped), then
    dx_p = W_p^T @ cols_p (scattered into dx) and dW_p = cols_p @ x_p^T.
    """
    p = geo.p
    cdt = compute_dtype(p)
    it = cdt.itemsize
    g, Cg, Cog, line, h, nd, L1 = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.nd, geo.L1
    gs = geo.gstride
    live = [ip for ip, (r, _) in enumerate(geo.phases) if all(v[1] > v[0] for v in geo.x_valid[r])]
    if not live:
        return (_new_output(p.input_shape, p, zero=True) if need_dx else None,
                np.zeros(p.weight_shape, DTYPES[p.dtype]) if need_dw else None)
    valid = {ip: geo.x_valid[geo.phases[ip][0]] for ip in live}
    dead = [ip for ip in range(len(geo.phases)) if ip not in valid]
    # positions per line: the valid ones only (compact), or whole grid lines (flat: long contiguous
    # copies, GEMM work on the few padding columns, whose x is zero and whose dx is dropped)
    # (measured: compact is faster for C_in/g >= 64, where the GEMMs dominate; flat for the thin
    # channel counts, where copies do)
    flat = nd > 1 and not (COMPACT_INNER if COMPACT_INNER is not None else Cg >= 64)
    # flat 3-D: the grid rows of the second dim that hold no input are skipped too (whole rows)
    trim = {ip: (valid[ip][1][:2] if flat and nd >= 3 else (0, geo.L[1] if nd > 1 else 1)) for ip in live}
    tail = math.prod(geo.L[2:])
    rest_n = {ip: (trim[ip][1] - trim[ip][0]) * tail if flat else math.prod(v[1] - v[0] for v in valid[ip][1:])
              for ip in live}
    lo1 = min(valid[ip][0][0] for ip in live)
    hi1 = max(valid[ip][0][1] for ip in live)
    per_sample_positions = max(rest_n[ip] * (valid[ip][0][1] - valid[ip][0][0]) for ip in live)
    single = (nd == 2 and Cg >= 8 and per_sample_positions >= 2048) if IMPLICIT_OUTER is None else bool(IMPLICIT_OUTER)
    implicit = {ip: _implicit_outer(geo, ip, single) for ip in live}
    J = {ip: len(geo.phases[ip][1]) for ip in live}
    n1 = {ip: geo.tapgrid[ip][0][2] for ip in live}
    ext = {ip: ((n1[ip] - 1) * geo.tapgrid[ip][0][1] if implicit[ip] else 0) for ip in live}
    col_rows = {ip: (J[ip] // n1[ip] if implicit[ip] else J[ip]) * Cog for ip in live}
    unit_bytes = it * g * max(rest_n[ip] * (col_rows[ip] + (Cg * (1 + implicit[ip]) if need_dx else 0)
                                            + (Cg if need_dw else 0)) for ip in live)
    io = _io_bytes(geo, DTYPES[p.dtype].itemsize, need_dx, need_dw)
    budget = _budget(io, p)
    chunks, dy_lines, c_lines = _chunks_compact(geo, lo1, hi1, it * g * Cog * line, unit_bytes, budget, single)
    workers = _cap_workers(workers, budget, dy_lines * it * g * Cog * line + c_lines * unit_bytes)
    U = max(rest_n[ip] * (c_lines + ext[ip]) for ip in live)
    cols_len = max(col_rows[ip] * rest_n[ip] * (c_lines + ext[ip]) for ip in live)
    dy4 = _x4(dy, g, Cog)
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover or len(live) < len(geo.phases))
        dx4 = _x4(dx, g, Cg)
        wt = _weight_layout(w, geo, cdt, "gcko", lease)                   # taps in phase order
        wts, k0 = {}, 0
        for ip, (_, taps) in enumerate(geo.phases):                         # views (g, Cg, J*Cog)
            wts[ip] = wt[:, :, k0:k0 + len(taps)].reshape(g, Cg, -1)
            k0 += len(taps)
    if need_dw:
        x4 = _x4(x, g, Cg)
        slots = _Slots(_n_slots(io, it * g * geo.K * Cog * Cg),
                       [(g, len(taps) * Cog, Cg) for _, taps in geo.phases], cdt, lease)

    def workspace():
        return dict(dy=_GridBuf(geo, g, Cog, dy_lines, cdt, lease), cols=lease.empty((g, cols_len), cdt),
                    dx=lease.empty((g, Cg, U), cdt) if need_dx else None,
                    dx2=lease.empty((g, Cg, U), cdt) if need_dx and any(implicit.values()) else None,
                    x={ip: lease.empty((g, Cg, U), cdt) for ip in live} if need_dw else None,
                    fresh=set(live),                        # flat x blocks still to zero (padding columns)
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def tensor_block(t4, ip, n0, nb, ca, c1):
        """The phase-ip positions of samples n0.., first-dim grid lines [ca, ca+c1) of tensor t4 (N, G, C, *S)."""
        sl = [slice(n0, n0 + nb), slice(None), slice(None)]
        for d, (lo, hi, start, step) in enumerate(valid[ip]):
            first, cnt = (start + (ca - lo) * step, c1) if d == 0 else (start, hi - lo)
            sl.append(slice(first, first + (cnt - 1) * step + 1, step))
        return t4[tuple(sl)].transpose((1, 2, 0) + tuple(range(3, 3 + nd)))      # (G, C, nb, c1, ...)

    def task(ws, i, n0, nb, a, b):
        E0 = n0 * L1 + a - h
        dyg = ws["dy"].fill(dy4, E0, (n0 + nb - 1) * L1 + b, geo.y_valid)
        parts = slots.target(i, ws["dw"]) if need_dw else None
        for ip in dead if need_dw else ():     # phases whose taps read no input: zero, not leftover scratch
            parts[ip].fill(0)
        for ip in live:
            r, taps = geo.phases[ip]
            v = valid[ip]
            ca, cb = max(a, v[0][0]), min(b, v[0][1])
            c1 = cb - ca
            if c1 <= 0:
                if need_dw:
                    parts[ip].fill(0)
                continue
            rows = nb * c1 * rest_n[ip]
            spec = geo.tapgrid[ip]
            if flat:
                t0, t1 = trim[ip]
                inner_off = t0 * gs[1]
                pos_shape, pos_strides = (nb, c1 + ext[ip], rest_n[ip]), (L1 * line, line, 1)
                inner = ((slice(None),) * 4 + (slice(None) if nd >= 3 else slice(*v[1][:2]),)
                         + tuple(slice(lo, hi) for lo, hi, _, _ in v[2:]))
                grid_shape = (t1 - t0,) + geo.L[2:]
            else:
                rest_shape = tuple(hi - lo for lo, hi, _, _ in v[1:])
                inner_off = sum(lo * gstr for (lo, _, _, _), gstr in zip(v[1:], gs[1:]))
                pos_shape = (nb, c1 + ext[ip]) + rest_shape
                pos_strides = (L1 * line, line) + gs[1:]
                inner, grid_shape = (Ellipsis,), rest_shape
            base = (n0 * L1 + ca - E0) * line + inner_off
            if implicit[ip]:
                q0, dq, cnt = spec[0]
                base -= (q0 + (cnt - 1) * dq) * line                         # virtual line 0
                tspec = spec[1:]
                tgs = gs[1:]
            else:
                tspec, tgs = spec, gs
            start = base - sum(q * gstr for (q, _, _), gstr in zip(tspec, tgs))
            tap_shape = tuple(c for _, _, c in tspec)
            tap_strides = tuple(-dqq * gstr for (_, dqq, _), gstr in zip(tspec, tgs))
            view = np.lib.stride_tricks.as_strided(                         # start >= 0: h covers every tap
                dyg[:, :, start:], shape=(g,) + tap_shape + (Cog,) + pos_shape,
                strides=(dyg.strides[0],) + tuple(st * it for st in tap_strides) + (dyg.strides[1],)
                + tuple(st * it for st in pos_strides), writeable=False)
            full = nb * (c1 + ext[ip]) * rest_n[ip]
            cols = ws["cols"][:, :col_rows[ip] * full].reshape(g, col_rows[ip], full)
            cols.reshape(view.shape)[...] = view
            if implicit[ip]:
                q0, dq, cnt = spec[0]
                blocks = [cols[:, :, (cnt - 1 - k) * dq * rest_n[ip]:(cnt - 1 - k) * dq * rest_n[ip] + rows]
                          for k in range(cnt)]
            else:
                blocks = [cols]
            kb = col_rows[ip]
            if need_dx:
                dxc = ws["dx"][:, :, :rows]
                for k, blk in enumerate(blocks):
                    wk = wts[ip][:, :, k * kb:(k + 1) * kb]
                    if k == 0:
                        np.matmul(wk, blk, out=dxc)
                    else:
                        tmp = ws["dx2"][:, :, :rows]
                        np.matmul(wk, blk, out=tmp)
                        dxc += tmp
                tensor_block(dx4, ip, n0, nb, ca, c1)[...] = dxc.reshape((g, Cg, nb, c1) + grid_shape)[inner]
            if need_dw:
                if flat and ip in ws["fresh"]:
                    ws["x"][ip].fill(0)
                    ws["fresh"].discard(ip)
                xc = ws["x"][ip][:, :, :rows]
                xc.reshape((g, Cg, nb, c1) + grid_shape)[inner] = tensor_block(x4, ip, n0, nb, ca, c1)
                xt = xc.transpose(0, 2, 1)
                for k, blk in enumerate(blocks):
                    np.matmul(blk, xt, out=parts[ip][:, k * kb:(k + 1) * kb])
        if need_dw:
            slots.commit(i, parts)

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        accs = slots.total()
        dw = _finish_dw(geo, p, [([kf for kf, _ in taps],
                                  accs[ip].reshape(g, len(taps), Cog, Cg).transpose(0, 2, 3, 1) if ip in valid
                                  else np.zeros((g, Cog, Cg, len(taps)), cdt))   # taps that read no input
                                 for ip, (r, taps) in enumerate(geo.phases)])
    return (dx if need_dx else None), dw


def _blasable(a: np.ndarray, cdt) -> bool:
    """Whether matmul can hand ``a`` (..., rows, cols) to BLAS as is: compute dtype, unit inner stride."""
    return (a.dtype == cdt and a.strides[-1] == cdt.itemsize and a.strides[-2] >= a.shape[-1] * cdt.itemsize
            and all(st >= 0 for st in a.strides))


def _samples(t: np.ndarray, n0: int, n1: int, G: int, C: int, P: int, cdt, scratch: np.ndarray):
    """t[n0:n1] as (n, G, C, P) in the compute dtype: a view when BLAS can take it, else copied into scratch."""
    part = t[n0:n1]
    view = None
    try:
        view = part.view()
        view.shape = (n1 - n0, G, C, P)                    # raises where no view exists
    except AttributeError:
        view = None
    if view is not None and _blasable(view, cdt):
        return view
    out = scratch[:(n1 - n0) * G * C * P].reshape(n1 - n0, G, C, P)
    out.reshape(part.shape)[...] = part
    return out


def _backward_pointwise(geo: _Geom, dy, x, w, need_dx: bool, need_dw: bool, need_db: bool, workers: int,
                        lease: _Lease):
    """(dx, dw, db) of a 1x1 kernel, stride 1, no padding: per-sample matrix products on the (N, C, positions)
    layout as is; db from the same samples of dy while they are in cache (per sample, then samples in order)."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    it = cdt.itemsize
    out_dt = DTYPES[p.dtype]
    copy_dy = not _blasable(dy.reshape(N, g, Cog, P), cdt) if dy.flags.c_contiguous else True
    copy_x = need_dw and (not _blasable(x.reshape(N, g, Cg, P), cdt) if x.flags.c_contiguous else True)
    sample_bytes = it * g * P * (Cog * copy_dy + Cg * copy_x + Cg * (need_dx and out_dt != cdt)) \
        + (it * g * Cog * Cg if need_dw else 0)
    io = _io_bytes(geo, out_dt.itemsize, need_dx, need_dw)
    budget = _budget(io, p)
    cap = max(1, budget // 2)
    nb = max(1, min(N, cap // max(sample_bytes, 1), -(-N // MIN_CHUNKS)))
    chunks = _split(N, nb)
    nb = max(b - a for a, b in chunks)
    workers = _cap_workers(workers, budget, nb * sample_bytes)
    if need_dx:
        dx = np.empty(p.input_shape, out_dt)
        wt = lease.empty((g, Cg, Cog), cdt)
        wt[...] = w.reshape(g, Cog, Cg).transpose(0, 2, 1)
    if need_dw:
        slots = _Slots(_n_slots(io, it * g * Cog * Cg), [(g, Cg, Cog)], cdt, lease)
    db_parts = lease.empty((N, g * Cog), cdt) if need_db else None

    def workspace():
        return dict(dy=lease.empty((nb * g * Cog * P,), cdt) if copy_dy else None,
                    x=lease.empty((nb * g * Cg * P,), cdt) if copy_x else None,
                    dx=lease.empty((nb, g, Cg, P), cdt) if need_dx and out_dt != cdt else None,
                    dws=lease.empty((nb, g, Cg, Cog), cdt) if need_dw else None,
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def task(ws, i, n0, n1):
        m = n1 - n0
        dyc = _samples(dy, n0, n1, g, Cog, P, cdt, ws["dy"])
        if need_db:
            db_parts[n0:n1] = dyc.sum(axis=3).reshape(m, g * Cog)
        if need_dx:
            if ws["dx"] is None:
                np.matmul(wt, dyc, out=dx[n0:n1].reshape(m, g, Cg, P))
            else:
                out = ws["dx"][:m]
                np.matmul(wt, dyc, out=out)
                dx[n0:n1].reshape(m, g, Cg, P)[...] = out
        if need_dw:
            xc = _samples(x, n0, n1, g, Cg, P, cdt, ws["x"])
            per = ws["dws"][:m]                                        # dW^T per sample: x @ dy^T
            np.matmul(xc, dyc.transpose(0, 1, 3, 2), out=per)          # (packs faster than dy @ x^T)
            parts = slots.target(i, ws["dw"])
            np.sum(per, axis=0, out=parts[0])
            slots.commit(i, parts)

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        dw = np.empty(p.weight_shape, out_dt)
        dw.reshape(g, Cog, Cg)[...] = slots.total()[0].transpose(0, 2, 1)
    db = np.ascontiguousarray(db_parts.sum(axis=0).astype(out_dt, copy=False)) if need_db else None
    return (dx if need_dx else None), dw, db


def _run_guarded(chunks, task, workspace, workers, slots):
    _run(chunks, task, workspace, workers, slots.fail if slots is not None else None)


def _backward_b(geo: _Geom, dy, x, w, need_dx: bool, need_dw: bool, workers: int, lease: _Lease):
    """x-columns: cols = shifted x-phase slices; dW = dy @ cols^T; dx by Z = W^T @ dy and col2im."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    line_bytes = cdt.itemsize * line * g * (Cog + K * Cg * (need_dx + need_dw) + nph * Cg * (need_dx + need_dw))
    io = _io_bytes(geo, DTYPES[p.dtype].itemsize, need_dx, need_dw)
    budget = _budget(io, p)
    chunks, lines, aligned = _chunks(geo, line_bytes, 2 * h, budget)
    workers = _cap_workers(workers, budget, (lines + 2 * h) * line_bytes)
    hf = 0 if aligned else h           # dy lines before the chunk whose col2im reaches into it
    order = _tap_order(geo)
    dy4 = _x4(dy, g, Cog)
    if need_dw:
        x4 = _x4(x, g, Cg)
        slots = _Slots(_n_slots(io, cdt.itemsize * g * K * Cog * Cg), [(g, Cog, K * Cg)], cdt, lease)
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover)
        dx4 = _x4(dx, g, Cg)
        wt = _weight_layout(w, geo, cdt, "gkco", lease).reshape(g, K * Cg, Cog)

    def workspace():
        return dict(dy=_GridBuf(geo, g, Cog, lines + hf, cdt, lease),
                    cols=lease.empty((g, K * Cg * lines * line), cdt) if need_dw else None,
                    z=lease.empty((g, K * Cg * (lines + hf) * line), cdt) if need_dx else None,
                    x=[_GridBuf(geo, g, Cg, lines + h, cdt, lease) for _ in geo.phases] if need_dw else None,
                    dx=[lease.empty((g, Cg, (hf + lines + h) * line), cdt) for _ in geo.phases] if need_dx else None,
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def task(ws, i, e0, e1):
        rows = (e1 - e0) * line
        ext = rows + hf * line
        dyg = ws["dy"].fill(dy4, e0 - hf, e1, geo.y_valid)
        if need_dw:
            xgs = [b.fill(x4, e0, e1 + h, geo.x_valid[r]) for b, (r, _) in zip(ws["x"], geo.phases)]
            cols = ws["cols"][:, :K * Cg * rows].reshape(g, K * Cg, rows)
            _x_columns(geo, xgs, cols, rows)
            parts = slots.target(i, ws["dw"])
            np.matmul(dyg[:, :, hf * line:], cols.transpose(0, 2, 1), out=parts[0])   # (g, Cog, K*Cg)
            slots.commit(i, parts)
        if need_dx:
            z = ws["z"][:, :K * Cg * ext].reshape(g, K * Cg, ext)
            np.matmul(wt, dyg, out=z)
            jj = 0
            for (r, taps), buf in zip(geo.phases, ws["dx"]):
                dxg = buf[:, :, :ext + h * line]
                dxg.fill(0)
                for _, off in taps:
                    dxg[:, :, off:off + ext] += z[:, jj * Cg:(jj + 1) * Cg]
                    jj += 1
                _scatter(geo, dxg[:, :, hf * line:], dx4, e0, e1, geo.x_valid[r])

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        dw = _finish_dw(geo, p, [(order, slots.total()[0].reshape(g, Cog, K, Cg).transpose(0, 1, 3, 2))])
    return (dx if need_dx else None), dw


def fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias, by x-columns (im2col of the x phases) and one GEMM per chunk."""
    if columns.serves(p):
        check_im2col("numpy", p, ["fprop"], compute_dtype(p).itemsize, "im2col columns (fallback)")
        return columns.fprop(x, w, bias, p)
    if direct.serves(p) and p.workspace_limit is None and not small.before_depthwise(p):  # scratch not leased
        tracing.note("depthwise C loops")                       # no BLAS: not pinned
        return direct.fprop(x, w, bias, p, blas_workers())
    pick = modelled(p, "y")
    if pick == "colgemm":
        tracing.note("cost model: colgemm for y")
        with single_threaded_blas() as workers:
            return colgemm.fprop(x, w, bias, p, workers)
    if pick == "grid":
        tracing.note("cost model: grid loops for y")
        return grid_blocks.fprop(x, w, bias, p, blas_workers())
    if p.workspace_limit is None and small.serves(p):       # its scratch is not leased: not under a limit
        tracing.note("small-call columns")
        if small.grid_compiled(p):                          # one C call, no BLAS
            return small.fprop(x, w, bias, p)
        with single_threaded_blas():
            return small.fprop(x, w, bias, p)
    geo = _geom(p)
    cdt = compute_dtype(p)
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    line_bytes = cdt.itemsize * line * g * (Cog + K * Cg + nph * Cg)
    budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, False, False, fprop=True), p)
    chunks, lines, _ = _chunks(geo, line_bytes, h, budget)
    R = lines * line
    lease = _Lease(p.workspace_limit)
    tracing.note("blas-grid x-columns")
    chunk_bytes = (lines + h) * line_bytes
    wm = _weight_layout(w, geo, cdt, "gokc", lease).reshape(g, Cog, K * Cg)
    b = None if bias is None else bias.astype(cdt).reshape(g, Cog, 1)
    x4 = _x4(x, g, Cg)
    y = np.empty(p.output_shape, DTYPES[p.dtype])
    y4 = _x4(y, g, Cog)

    def workspace():
        return dict(x=[_GridBuf(geo, g, Cg, lines + h, cdt, lease) for _ in geo.phases],
                    cols=lease.empty((g, K * Cg * R), cdt), y=lease.empty((g, Cog, R), cdt))

    def task(ws, i, e0, e1):
        rows = (e1 - e0) * line
        xgs = [buf.fill(x4, e0, e1 + h, geo.x_valid[r]) for buf, (r, _) in zip(ws["x"], geo.phases)]
        cols = ws["cols"][:, :K * Cg * rows].reshape(g, K * Cg, rows)
        _x_columns(geo, xgs, cols, rows)
        yg = ws["y"][:, :, :rows]
        np.matmul(wm, cols, out=yg)
        if b is not None:
            yg += b
        _scatter(geo, yg, y4, e0, e1, geo.y_valid)

    with single_threaded_blas() as workers, lease:
        _run(chunks, task, workspace, _cap_workers(workers, budget, chunk_bytes))
    return y
