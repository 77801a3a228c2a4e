"""Scratch memory of the grid paths: the arena kept between calls, a call's lease, grid buffers, and the
deterministic slots that sum weight-gradient partials of concurrent chunks."""

from __future__ import annotations

import math
import threading

import numpy as np

from xconv import tracing
from xconv.workspace import check_request

from ..blas import MAX_WORKERS
from ..native import address
from ..workers import run
from .geometry import Geom, blocks

#: Scratch memory kept between calls for reuse (see ``release_memory``).
ARENA_BYTES = 64 << 20


class Arena:
    """Scratch memory kept between calls, so that repeated calls do not pay the kernel's page faults.

    A call leases buffers (``lease.empty``) and gives them all back when it ends; up to
    ``ARENA_BYTES`` of them are kept for later calls, the least recently returned freed first.
    Buffers come in size classes (4 KiB at least, then eight per power of two: at most 1/8 wasted),
    one free list per class, so taking and giving do not scan the buffers kept (a call leasing
    thousands of tiny buffers costs no later call a scan). Each starts on a 64-byte boundary (a view of
    a block 64 bytes longer, aligned once when made: a lease does not look up addresses, which inside a
    model, caches cold, cost a few µs a buffer). :func:`release_memory` frees them all.
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
        step = 1 << ((nbytes - 1).bit_length() - 4)    # nbytes - 1 in [2^(b-1), 2^b): steps of 2^(b-4)
        return -(-nbytes // step) * step

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes <= self.MIN_CLASS:                   # size_class(nbytes), in line (every lease's hot path)
            c = self.MIN_CLASS
        else:
            step = 1 << ((nbytes - 1).bit_length() - 4)
            c = -(-nbytes // step) * step
        with self.lock:
            bufs = self.free.get(c)
            if bufs:
                _, buf = bufs.pop()               # the most recently returned: warmest in cache
                self.total -= buf.nbytes
                return buf
        return _aligned(c)

    def views(self, shapes, dtype: np.dtype) -> tuple[list, list]:
        """(the buffers taken, an aligned uninitialized ``dtype`` array of each of ``shapes`` on them; None for None):
        a whole lease in one call, for a lane's hot path (:class:`Lease` costs it a few calls more a buffer: inside a
        model, caches cold, a few µs each). The caller gives the buffers back (:meth:`give`) when done, even on an
        error; nothing is counted against a limit or reported to a trace (a lane's runner runs neither)."""
        bufs, out = [], []
        for shape in shapes:
            if shape is None:
                out.append(None)
                continue
            n = math.prod(shape) * dtype.itemsize
            buf = self.take(n)
            bufs.append(buf)
            out.append(buf[:n].view(dtype).reshape(shape))
        return bufs, out

    def give(self, bufs) -> None:
        with self.lock:
            for buf in bufs:                           # (a buffer's bytes are its size class: see take)
                self.free.setdefault(buf.nbytes, []).append((self.seq, buf))
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


ARENA = Arena()


def _aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized bytes starting on a 64-byte boundary (a view of a block 64 bytes longer)."""
    raw = np.empty(nbytes + 64, np.uint8)
    a = -address(raw) % 64
    return raw[a:a + nbytes]


def release_memory() -> None:
    """Free the scratch memory the fast path keeps between calls (at most ``ARENA_BYTES``)."""
    ARENA.clear()


class Lease:
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
        if self.limit is not None:                       # a refused request is not counted (workers.run goes on
            check_request("numpy", sum(self.sizes) + n + 64, self.limit, "scratch (its smallest chunking)")
        self.sizes.append(n + 64)                        # with the workspaces it has)
        buf = ARENA.take(n)                              # (aligned: see Arena)
        self.bufs.append(buf)
        return buf[:n].view(dtype).reshape(shape)

    def release(self, a: np.ndarray) -> None:
        """Let the buffer behind ``a`` (an array :meth:`empty` made) go now, not kept for reuse: freed once the
        caller drops ``a`` (its bytes stay counted: they were taken)."""
        for i, buf in enumerate(self.bufs):
            if buf.base is a.base:
                del self.bufs[i]
                return

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        ARENA.give(self.bufs)
        self.bufs = []
        if tracing._open:                                # tracing.active()
            tracing.workspace(sum(self.sizes))


class GridBuf:
    """A reusable grid buffer for lines [e0, e1) of one tensor.

    Zeroed in full on first use; afterwards a fill zeroes only the lines that hold no data
    (outside the batch or outside the valid range of the first grid dim). Within a line the
    positions that hold no data are the same for every line and are never written, so they
    stay zero.
    """

    def __init__(self, geo: Geom, G: int, C: int, lines: int, dtype, lease: Lease):
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
        for gv, tv in blocks(geo, grid, tensor, e0, e1, valid):
            gv[...] = tv
        return grid


def scatter(geo: Geom, grid, tensor, e0: int, e1: int, valid):
    """Copy the valid positions of grid lines [e0, e1) into ``tensor`` (N, G, C, *spatial), casting."""
    for gv, tv in blocks(geo, grid, tensor, e0, e1, valid):
        tv[...] = gv


class Slots:
    """Deterministic accumulation of per-chunk weight-gradient partials computed concurrently.

    Chunk i adds into slot i % S, and a slot takes its chunks strictly in increasing order (a
    chunk waits for its predecessor in the slot); the slots are summed in order at the end. S
    depends only on the shapes, so the rounding does not depend on the number of threads. The
    first chunk of a slot writes its GEMM straight into the slot; later ones go through the
    worker's scratch and one addition.
    """

    def __init__(self, n_slots: int, shapes, dtype, lease: Lease):
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


def slot_order_sum(parts, n_slots: int):
    """The sum of ``parts`` (chunk partials, in chunk order) as :class:`Slots` adds them, on one thread: chunk i into
    slot i % n_slots in chunk order, then the slots in order (for callers that have every chunk's partial at once:
    the same bits as the concurrent slots)."""
    accs = [None] * n_slots
    for i, part in enumerate(parts):
        if accs[i % n_slots] is None:
            accs[i % n_slots] = part
        else:
            accs[i % n_slots] += part
    total = accs[0]
    for more in accs[1:]:
        if more is not None:
            total += more
    return total


def n_slots(io_bytes: int, w_bytes: int) -> int:
    """Accumulator slots: up to MAX_WORKERS while their memory stays within a quarter of the call's bytes."""
    return max(1, min(MAX_WORKERS, io_bytes // max(4 * w_bytes, 1)))



def run_guarded(chunks, task, workspace, workers, slots):
    """workers.run with the slots released when a chunk fails. (Workspaces are made before any chunk runs, on the
    calling thread, so a workspace that cannot be leased leaves no chunk waiting: workers.run goes on with fewer
    workers, or raises before any work when the first cannot be leased.)"""
    run(chunks, task, workspace, workers, slots.fail if slots is not None else None)
