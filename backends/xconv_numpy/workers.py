"""Threads of the NumPy backend: a fixed list of chunks run on a small pool of Python threads.

NumPy's matrix products and copies, and the compiled loops of :mod:`.depthwise` and :mod:`.dense`, release the
GIL, so chunks run in parallel; BLAS itself runs one thread meanwhile (:func:`run` holds the pin of
:mod:`.blas` around every parallel run, so no BLAS call inside one is threaded; C job lists, whose loops call no BLAS
and whose sgemm jobs' callers pin it, run without it). What a chunk computes never
depends on which thread runs it, so results do not depend on the number of workers. A forked child starts
with no pool (the parent's threads are not in it) and a fresh lock.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from xconv import UnsupportedError

from . import omp_team
from .blas import single_threaded_blas

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_POOLS_PID = os.getpid()


def _after_fork_in_child() -> None:
    global _POOLS_LOCK, _POOLS_PID
    _POOLS_LOCK = threading.Lock()          # another parent thread may have held it at the fork
    _POOLS.clear()
    _POOLS_PID = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def executor(workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads (recreated in a forked child)."""
    global _POOLS_PID
    with _POOLS_LOCK:
        if _POOLS_PID != os.getpid():      # a forked child has the pools but not their threads
            _POOLS.clear()
            _POOLS_PID = os.getpid()
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xconv-numpy")
        return _POOLS[workers]


def even_ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [a, b) ranges covering range(total) (fewer if total is smaller), sizes
    differing by at most one, the longer ones first."""
    parts = max(1, min(parts, total))
    q, r = divmod(total, parts)
    out, a = [], 0
    for i in range(parts):
        b = a + q + (i < r)
        out.append((a, b))
        a = b
    return out


def cap_workers(workers: int, budget: int, chunk_bytes: int) -> int:
    """Workers whose chunks in flight fit the working-set budget together (at least one)."""
    return max(1, min(workers, budget // max(chunk_bytes, 1)))


def run(chunks, task, make_workspace, workers: int, on_error=None, pin_blas: bool = True) -> None:
    """task(workspace, index, *chunk) for every chunk, on up to ``workers`` threads, started in chunk order.

    The calling thread is one of them; each thread takes the next chunk index in turn (so chunks
    start in order, and one that waits for an earlier chunk waits for a running one) and has a
    workspace of its own. The workspaces are made first, on the calling thread, one per worker: a
    workspace that a workspace_limit refuses (``UnsupportedError`` from a lease) leaves the call with
    the workers made so far (the first one's refusal is the call's), so whether a call is refused
    never depends on which threads happened to take a chunk (it did: issue 24). On an exception the
    threads stop taking chunks, ``on_error()`` runs (it must release any thread waiting for a failed
    chunk) and the first exception propagates.
    """
    n = len(chunks)
    workers = max(1, min(workers, n))
    spare = [make_workspace()]
    for _ in range(workers - 1):
        try:
            spare.append(make_workspace())
        except UnsupportedError:            # the limit admits fewer workers: the same results, fewer threads
            break
    workers = len(spare)
    order = itertools.count()
    lock = threading.Lock()
    failed = []

    def loop():
        with np.errstate(all="ignore"):    # as the backend's own thread: non-finite values are not errors
            work()

    def work():
        with lock:
            ws = spare.pop()
        while not failed:
            with lock:
                i = next(order)
            if i >= n:
                return
            try:
                task(ws, i, *chunks[i])
            except BaseException as e:
                with lock:
                    failed.append(e)
                if on_error is not None:
                    on_error()
                return

    if workers == 1:
        loop()
    else:
        with single_threaded_blas() if pin_blas else contextlib.nullcontext():   # never threaded BLAS inside
            #                                                   xconv's own parallel region (pin_blas=False: the
            #                                                   caller's tasks call no BLAS, or pinned it already)
            if not omp_team.parallel(loop, workers):    # torch's OpenMP threads when torch is here,
                helpers = [executor(workers - 1).submit(loop) for _ in range(workers - 1)]     # else Python threads
                loop()
                for f in helpers:
                    f.result()
    if failed:
        raise failed[0]
