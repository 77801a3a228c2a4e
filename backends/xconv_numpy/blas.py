"""BLAS thread control: one BLAS thread during xconv's NumPy calls, so results do not depend on the thread count.

A threaded BLAS (OpenBLAS, MKL) partitions some matrix products differently with different
thread counts, which changes their summation order and so their rounding. The NumPy backend's
calls set every loaded BLAS library to one thread (threadpoolctl, else OpenBLAS's own setter
found by ctypes) and run their independent chunks on Python threads instead; the pin is
reference counted, so concurrent calls share it, and the original counts come back when the
last one ends.
"""

from __future__ import annotations

import ctypes
import os
import threading

#: Most chunks running at once (Python threads, each calling single-threaded BLAS); each chunk
#: gets budget / 2 bytes, whatever the number of threads actually used.
MAX_WORKERS = 4
_CPUS = os.cpu_count() or 1


class _Blas:
    """Control of the BLAS libraries' thread counts (threadpoolctl, else OpenBLAS by ctypes), reference counted.

    While any fast-path call runs, BLAS is set to one thread and the call runs its chunks on up to
    ``MAX_WORKERS`` Python threads (NumPy releases the GIL in matmul and copies). The chunking
    does not depend on the number of workers, so results do not depend on the thread count.
    Each library's own count is restored when the last concurrent call ends.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.libs = None          # [(get, set)] per BLAS library found
        self.saved = []
        self.workers = 1

    def _find(self):
        libs = []
        try:
            from threadpoolctl import ThreadpoolController
            for lc in ThreadpoolController().select(user_api="blas").lib_controllers:
                libs.append(((lambda lc=lc: lc.num_threads), (lambda n, lc=lc: lc.set_num_threads(n)),
                             "numpy" in str(getattr(lc, "filepath", ""))))
        except Exception:  # threadpoolctl missing or unable to inspect: try OpenBLAS directly
            libs = []
        if not libs:
            try:
                with open("/proc/self/maps") as maps:
                    paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
            except OSError:
                paths = set()
            for path in sorted(paths):
                try:
                    lib = ctypes.CDLL(path)
                except OSError:
                    continue
                for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"),
                                       ("openblas", "")):
                    get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                    set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                    if get is not None and set_ is not None:
                        get.restype = ctypes.c_int
                        set_.argtypes = [ctypes.c_int]
                        libs.append((get, (lambda n, f=set_: f(int(n))), "numpy" in path))
                        break
        self.libs = libs

    def __enter__(self) -> int:
        """Set BLAS to one thread; return the number of workers to use (NumPy's BLAS thread count)."""
        with self.lock:
            if self.libs is None:
                self._find()
            if not self.libs:
                return 1
            if self.depth == 0:
                self.saved = self._counts()
                for (_, set_, _), n in zip(self.libs, self.saved):
                    if n != 1:
                        set_(1)
                self.workers = self._workers(self.saved)
            self.depth += 1
            return self.workers

    def __exit__(self, *exc):
        with self.lock:
            if not self.libs:
                return
            self.depth -= 1
            if self.depth == 0:
                for (_, set_, _), n in zip(self.libs, self.saved):
                    if n != 1:
                        set_(n)

    def _counts(self) -> list:
        return [max(1, int(get())) for get, _, _ in self.libs]

    def _workers(self, counts) -> int:
        """Workers for BLAS thread ``counts`` (one per library): NumPy's own count, at most MAX_WORKERS and the CPUs."""
        mine = [n for (_, _, is_numpy), n in zip(self.libs, counts) if is_numpy]
        return min(max(mine or counts), MAX_WORKERS, _CPUS)

    def worker_count(self) -> int:
        """The number of workers ``with`` would give, without setting BLAS to one thread (for calls that run no
        BLAS: the compiled loops)."""
        with self.lock:
            if self.libs is None:
                self._find()
            if not self.libs:
                return 1
            return self.workers if self.depth else self._workers(self._counts())


_BLAS = _Blas()


def single_threaded_blas() -> _Blas:
    """Context manager: BLAS runs one thread inside it; ``with`` gives the number of Python workers to use."""
    return _BLAS


def blas_workers() -> int:
    """The number of Python workers a call gets (NumPy's BLAS thread count, at most MAX_WORKERS and the CPU count),
    BLAS left as it is: for paths that call no BLAS."""
    return _BLAS.worker_count()
