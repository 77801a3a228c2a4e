"""xconv's workers on torch's OpenMP threads, when torch is in the process.

Inside a torch model the NumPy backend shares the process with PyTorch's OpenMP pool (libgomp). By
default libgomp's threads spin for a while after each parallel region, so a second pool of Python
threads (:mod:`.workers`) starts its chunks on cores those spinning threads hold; with
``OMP_WAIT_POLICY=PASSIVE`` they sleep instead and torch pays the wake-up on its next call. When the
process has loaded torch's own libgomp (``torch/lib/libgomp*.so*``), :func:`parallel` runs a call's
workers as one OpenMP parallel region on that library (``GOMP_parallel``): the threads that would
spin are the ones that take xconv's chunks, and no core is contended. The chunks, their order and
the work each does are those of the Python threads, so results are the same bits either way.

Off (Python threads instead) without torch's libgomp; in any forked child of a process that had imported
xconv (:mod:`xconv.forking`: libgomp's pool does not survive a fork and libgomp has no fork handler, so a
child entering a region on its parent's pool would wait forever; the child's workers are Python threads);
on a thread already inside an OpenMP region (nested regions are not used); and when
``XCONV_NUMPY_OPENMP=0``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from xconv import forking, settings

_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_lock = threading.Lock()
_state: dict = {"pid": None, "lib": None, "address": None, "in_parallel": None}
_kept = threading.local()
_ensure = ctypes.pythonapi.PyGILState_Ensure
_ensure.restype = ctypes.c_int


def _keep_thread_state() -> None:
    """Keep this OpenMP thread's Python thread state between regions. A ctypes callback on a thread Python did not
    start makes a thread state and deletes it when it returns: 15-20 us of each region (measured: an empty region
    30 us, 10 us with the state kept). One more ``PyGILState_Ensure``, never released, keeps it; the thread is
    torch's and lives as long as its pool (none survives a fork: see the module docstring)."""
    if not getattr(_kept, "done", False):
        _ensure()
        _kept.done = True


def _torch_libgomp_path() -> str | None:
    """The path of torch's libgomp if this process has mapped it, else None (nothing is loaded here)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                name = os.path.basename(path)
                if name.startswith("libgomp") and ".so" in name and f"{os.sep}torch{os.sep}" in path:
                    return path
    except OSError:
        pass
    return None


def _library():
    """torch's libgomp as a ctypes library, or None; looked up once per process, once torch is imported. Every call
    reads ``XCONV_NUMPY_OPENMP`` anew (alone: :func:`xconv.settings.one`) and the pid (a forked child's differs)."""
    if _looked_up_here():                                # the usual call
        return _state["lib"]
    if not settings.current().numpy_openmp or "torch" not in sys.modules or forking.forked():
        return None
    pid = os.getpid()
    if _state["pid"] == pid:
        return _state["lib"]
    with _lock:
        if _state["pid"] is None:
            lib = _load()
            _state.update(pid=pid, lib=lib,       # GOMP_parallel's address kept with it (one library per process)
                          address=None if lib is None else ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value,
                          in_parallel=None if lib is None else ctypes.cast(lib.omp_in_parallel, ctypes.c_void_p).value)
        elif _state["pid"] != pid:
            return None                                 # a forked child: libgomp's pool did not survive the fork
        return _state["lib"]


def _looked_up_here() -> bool:
    """:func:`_library`'s usual case, its lookup made in this process (not a forked child), the team switched on:
    ``_state["lib"]`` is the answer. Reads ``XCONV_NUMPY_OPENMP`` alone (:func:`xconv.settings.one`)."""
    return _state["pid"] == os.getpid() and not forking._forked and settings.one("numpy_openmp")


def _load():
    path = _torch_libgomp_path()
    if path is None or not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        lib = ctypes.CDLL(path)                         # already mapped: the same library torch uses
        lib.GOMP_parallel.argtypes = [_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        lib.GOMP_parallel.restype = None
        lib.omp_in_parallel.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def gomp_parallel_address() -> int | None:
    """The address of torch's ``GOMP_parallel`` when :func:`parallel` would run here (for C code that starts its own
    regions: :mod:`.jobs`), else None."""
    lib = _library()
    if lib is None or lib.omp_in_parallel():
        return None
    return _state["address"]


def team_functions() -> tuple:
    """(GOMP_parallel's address, omp_in_parallel's) of torch's libgomp for C code that checks whether it may start a
    region itself (csrc/template_run.c), or (None, None) where :func:`parallel` would never run on the team."""
    lib = _state["lib"] if _looked_up_here() else _library()
    if lib is None:
        return None, None
    return _state["address"], _state["in_parallel"]


def available() -> bool:
    """Whether :func:`parallel` would run on torch's OpenMP threads from this thread."""
    lib = _state["lib"] if _looked_up_here() else _library()
    return lib is not None and not lib.omp_in_parallel()


def parallel(body, threads: int) -> bool:
    """``body()`` on each of ``threads`` OpenMP threads of torch's pool (the calling thread among them), returning
    when all have returned; the first exception any raised is raised here. False, without running anything, when
    the team is not available (see the module docstring): the caller uses its Python threads instead."""
    lib = _library()
    if lib is None or lib.omp_in_parallel():
        return False
    errors = []

    def run(_):
        try:
            _keep_thread_state()
            body()
        except BaseException as e:      # an exception must not cross the C frames of libgomp
            errors.append(e)

    callback = _BODY(run)                               # held until GOMP_parallel returns
    lib.GOMP_parallel(callback, None, threads, 0)
    if errors:
        raise errors[0]
    return True
