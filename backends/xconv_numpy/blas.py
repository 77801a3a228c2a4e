"""BLAS thread control: one BLAS thread during xconv's NumPy calls, whichever thread makes them.

A threaded BLAS partitions some matrix products differently with different thread counts, and OpenBLAS
picks other kernels (its "direct" small-GEMM kernel only single-threaded), so the bits of a product depend
on the thread count. The NumPy backend's calls therefore run every BLAS product single-threaded and run
their independent chunks on their own workers (:mod:`.workers`) instead.

How, per library found loaded (``/proc/self/maps`` through threadpoolctl, else directly; NumPy's own when it
can be told apart, since xconv calls no other):

- OpenBLAS built with pthreads (numpy's and scipy's wheels): its thread count is one process-wide value.
  It is set to 1 by the library's own setter, called by ctypes, while any xconv call runs (reference
  counted: concurrent calls share the pin; the saved count comes back when the last one ends). Not
  through threadpoolctl, whose OpenBLAS setter silently ignores every call from a thread other than the
  first one that used it (so a pin from a worker thread did nothing: issue 24). This build's
  ``openblas_set_num_threads_local`` sets the same process-wide value (it is thread-local only in OpenMP
  builds), so it is no better. While the pin holds, BLAS calls that other threads of the process make
  run single-threaded too.
- OpenBLAS built with OpenMP: the count a call uses is the calling thread's OpenMP setting, which a
  process-wide setter does not reach from xconv's workers; such a library is reported as *uncontrolled*.
- Sequential OpenBLAS: nothing to do.
- Other BLAS libraries (MKL, BLIS, FlexiBLAS) through threadpoolctl's setters.

:func:`control` says which held (``xconv backends`` and the trace show it). A fork resets the pin in
the child (``os.register_at_fork``): the child restores the saved counts and starts with no pin held.
"""

from __future__ import annotations

import ctypes
import os
import threading

#: Most chunks running at once (Python threads, each calling single-threaded BLAS); each chunk
#: gets budget / 2 bytes, whatever the number of threads actually used.
MAX_WORKERS = 4
_CPUS = os.cpu_count() or 1
_AFFIXES = (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", ""))


class _Lib:
    """One BLAS library: its thread-count getter and setter, whether it is NumPy's, and how it threads."""

    def __init__(self, name, get, set_, is_numpy, threading_layer, sgemm64=None):
        self.name, self.get, self.set, self.is_numpy, self.threading = name, get, set_, is_numpy, threading_layer
        self.sgemm64 = sgemm64          # the address of its ILP64 cblas_sgemm, when it has one

    def count(self) -> int:
        try:
            return max(1, int(self.get()))
        except Exception:      # a library that cannot say: treat as one thread
            return 1


def _openblas(path: str, is_numpy: bool) -> _Lib | None:
    """OpenBLAS at ``path`` by ctypes (already mapped: the same library NumPy uses), or None."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for prefix, suffix in _AFFIXES:
        get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
        set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
        if get is None or set_ is None:
            continue
        get.restype, get.argtypes = ctypes.c_int, []
        set_.restype, set_.argtypes = None, [ctypes.c_int]
        parallel = getattr(lib, f"{prefix}_get_parallel{suffix}", None)
        layer = "pthreads"
        if parallel is not None:
            parallel.restype, parallel.argtypes = ctypes.c_int, []
            layer = {0: "sequential", 1: "pthreads", 2: "openmp"}.get(int(parallel()), "pthreads")
        sgemm = getattr(lib, f"{'scipy_' if prefix.startswith('scipy') else ''}cblas_sgemm64_", None) \
            if suffix == "64_" else None
        return _Lib(f"OpenBLAS ({os.path.basename(path)})", get, (lambda n, f=set_: f(int(n))), is_numpy, layer,
                    None if sgemm is None else ctypes.cast(sgemm, ctypes.c_void_p).value)
    return None


def _find() -> list:
    libs = []
    try:
        from threadpoolctl import ThreadpoolController
        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:      # threadpoolctl missing or unable to inspect: look for OpenBLAS directly
        controllers = None
    if controllers is not None:
        for lc in controllers:
            path = str(getattr(lc, "filepath", ""))
            is_numpy = "numpy" in path
            if getattr(lc, "internal_api", "") == "openblas":
                lib = _openblas(path, is_numpy)
            else:
                lib = _Lib(f"{lc.internal_api} ({os.path.basename(path)})", lc.get_num_threads, lc.set_num_threads,
                           is_numpy, str(getattr(lc, "threading_layer", "")))
            if lib is not None:
                libs.append(lib)
        return _numpys(libs)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        paths = set()
    for path in sorted(paths):
        lib = _openblas(path, "numpy" in path)
        if lib is not None:
            libs.append(lib)
    return _numpys(libs)


def _numpys(libs: list) -> list:
    """NumPy's own BLAS libraries when they can be told apart (xconv calls no other: torch's bundled OpenBLAS,
    loaded or not in this process, is left alone), else all."""
    return [lib for lib in libs if lib.is_numpy] or libs


#: Threading layers whose count xconv leaves alone (sequential; OpenMP builds keep a count per thread).
_UNPINNED = ("sequential", "openmp")


class _Blas:
    """The pin: BLAS at one thread while any xconv call runs (reference counted across threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.libs = None          # [_Lib] once looked up
        self.saved = []
        self.workers = 1

    def __enter__(self) -> int:
        """Set BLAS to one thread; return the number of workers to use (NumPy's BLAS thread count). Runs around
        every call that may reach BLAS: one library (the usual case) takes a short path (about 2 us against 6)."""
        with self.lock:
            if self.depth == 0:
                libs = self.libs
                if libs is None:
                    libs = self.libs = _find()
                if len(libs) == 1:
                    lib = libs[0]
                    n = lib.count()
                    self.saved = [n]
                    if n != 1 and lib.threading not in _UNPINNED:
                        lib.set(1)
                    self.workers = min(n, MAX_WORKERS, _CPUS)
                else:
                    self.saved = [lib.count() for lib in libs]
                    for lib, n in zip(libs, self.saved):
                        if n != 1 and lib.threading not in _UNPINNED:
                            lib.set(1)
                    self.workers = self._workers(self.saved)
            self.depth += 1
            return self.workers

    def __exit__(self, *exc):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                libs, saved = self.libs, self.saved
                if len(libs) == 1 and len(saved) == 1:     # _restore's one library, in line (every pinned call)
                    if saved[0] != 1 and libs[0].threading not in _UNPINNED:
                        libs[0].set(saved[0])
                else:
                    self._restore()

    def _restore(self):
        for lib, n in zip(self.libs or (), self.saved):
            if n != 1 and lib.threading not in _UNPINNED:
                lib.set(n)

    def _workers(self, counts) -> int:
        """Workers for BLAS thread ``counts`` (one per library): NumPy's own count, at most MAX_WORKERS and the CPUs."""
        mine = [n for lib, n in zip(self.libs, counts) if lib.is_numpy]
        return min(max(mine or counts or [1]), MAX_WORKERS, _CPUS)

    def worker_count(self) -> int:
        """The number of workers ``with`` would give, without setting BLAS to one thread (for calls that run no
        BLAS: the compiled loops)."""
        with self.lock:
            libs = self.libs
            if libs is None:
                libs = self.libs = _find()
            if self.depth:
                return self.workers
            if len(libs) == 1:                           # the usual case, as __enter__'s short path
                return min(libs[0].count(), MAX_WORKERS, _CPUS)
            return self._workers([lib.count() for lib in libs])

    def control(self) -> str:
        with self.lock:
            if self.libs is None:
                self.libs = _find()
            if not self.libs:
                return "no BLAS library found (NumPy's own loops)"
            out = []
            for lib in self.libs:
                how = {"sequential": "sequential", "openmp": "uncontrolled (an OpenMP build: per-thread counts)"}
                out.append(f"{lib.name}: {how.get(lib.threading, 'pinned to 1 thread per call')}")
            return "; ".join(out)

    def found(self) -> list:
        """The BLAS libraries found (looked up once, on first use)."""
        libs = self.libs
        if libs is None:
            with self.lock:
                if self.libs is None:
                    self.libs = _find()
                libs = self.libs
        return libs

    def pinned(self) -> bool:
        """Whether every BLAS library found runs one thread inside xconv's calls: pinned, sequential, or an OpenMP
        build whose thread count (this thread's OpenMP setting, e.g. ``OMP_NUM_THREADS=1``) is one."""
        for lib in self.found():                                 # (a loop, not all(): this runs on every call)
            if lib.threading == "openmp" and lib.count() != 1:
                return False
        return True

    # fork: the lock is taken around os.fork so that the child never inherits it held mid-update
    def _before_fork(self):
        self.lock.acquire()

    def _after_fork_parent(self):
        self.lock.release()

    def _after_fork_child(self):
        self.lock = threading.Lock()
        if self.depth:                   # a call of another parent thread held the pin: not the child's
            self._restore()
            self.depth = 0


_BLAS = _Blas()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_BLAS._before_fork, after_in_parent=_BLAS._after_fork_parent,
                        after_in_child=_BLAS._after_fork_child)


def single_threaded_blas() -> _Blas:
    """Context manager: BLAS runs one thread inside it; ``with`` gives the number of Python workers to use."""
    return _BLAS


def blas_workers() -> int:
    """The number of Python workers a call gets (NumPy's BLAS thread count, at most MAX_WORKERS and the CPU count),
    BLAS left as it is: for paths that call no BLAS."""
    return _BLAS.worker_count()


def sgemm64_address() -> int | None:
    """The address of NumPy's own ILP64 ``cblas_sgemm`` (the function numpy.matmul calls for float32 matrices: the
    scipy-openblas64 of NumPy's wheels), for compiled code that runs the same products; None when NumPy's BLAS is
    another library or was not found."""
    found = [lib.sgemm64 for lib in _BLAS.found() if lib.is_numpy and lib.sgemm64]
    return found[0] if len(found) == 1 else None


def control() -> str:
    """How each BLAS library found is held to one thread in xconv's calls (for ``xconv backends``)."""
    return _BLAS.control()


def pinned() -> bool:
    """Whether BLAS runs single-threaded inside xconv's calls whichever thread makes them."""
    return _BLAS.pinned()
