"""Availability, handles, streams and memory for the cuDNN backend.

Nothing here imports CuPy or cuDNN at module import: :func:`availability` imports them lazily,
once, and reports the first thing missing, precisely:

1. CuPy not installed (or failing to import, or older than 13);
2. no CUDA device (CuPy sees none, or the driver refuses);
3. cuDNN runtime not found (no ``libcudnn.so.9``: neither from the ``nvidia-cudnn-cu12``/``-cu13``
   wheel nor on the loader path), or older than 9.0;
4. cuDNN frontend not installed (``nvidia-cudnn-frontend``, ``import cudnn``), failing to import,
   or older than 1.8.

:class:`CupyRuntime` is what the backend runs on: per-thread, per-device cuDNN handles bound to
CuPy's current stream, output and workspace allocations from CuPy's memory pool, and the CuPy
fallbacks (bias add, bias reduction). It never synchronizes the device; only autotuning (once
per plan key) waits for its timing events.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import importlib
import importlib.util
import os
import sys
import sysconfig
import threading

MIN_CUPY = (13, 0)
MIN_CUDNN = 90000           # cuDNN 9.0.0, as cudnnGetVersion() reports it
MIN_FRONTEND = (1, 8)


def install_hint() -> str:
    """How to install the CUDA extras from where xconv is installed (no ``xconv`` distribution is published)."""
    from xconv.install import hint

    return hint("cuda12", "cuda13")


@dataclasses.dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""
    cupy_version: str = ""
    cudnn_version: int = 0
    frontend_version: str = ""
    devices: tuple[str, ...] = ()
    library: str = ""
    emulation: str = ""         # "" when CuPy, cuDNN and its frontend are the installed ones; else what is not

    @property
    def version_string(self) -> str:
        parts = []
        if self.cudnn_version:
            parts.append(f"cuDNN {format_cudnn_version(self.cudnn_version)}")
        if self.frontend_version:
            parts.append(f"frontend {self.frontend_version}")
        if self.cupy_version:
            parts.append(f"CuPy {self.cupy_version}")
        return ", ".join(parts)


def format_cudnn_version(v: int) -> str:
    """cudnnGetVersion()'s integer (major*10000 + minor*100 + patch for cuDNN 9) as text."""
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def parse_version(text: str) -> tuple[int, ...]:
    out = []
    for part in str(text).split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Probes (module-level so tests can replace them)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _import(module: str):
    return importlib.import_module(module)


def _device_names(cupy) -> tuple[str, ...]:
    count = cupy.cuda.runtime.getDeviceCount()
    names = []
    for i in range(count):
        try:
            name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # a name is only for display
            name = "CUDA device"
        names.append(f"cuda:{i} ({name})")
    return tuple(names)


def _distribution_file(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``path`` is a file of an installed distribution whose name starts with one of ``prefixes``."""
    import importlib.metadata

    real = os.path.realpath(path)
    for dist in importlib.metadata.distributions():
        if not (dist.metadata["Name"] or "").lower().startswith(prefixes):
            continue
        if any(os.path.realpath(str(dist.locate_file(f))) == real for f in dist.files or ()):
            return True
    return False


def stand_ins(cupy, fe, library: str) -> str:
    """"" when CuPy, the cuDNN frontend and an absolute cuDNN library path are files of their installed
    distributions; else which are not (stand-ins a user or test put first: a fake the backend runs on)."""
    found = []
    for module, prefixes, what in ((cupy, ("cupy",), "CuPy"), (fe, ("nvidia-cudnn-frontend",), "cuDNN frontend")):
        path = getattr(module, "__file__", None)
        if not path or not _distribution_file(path, prefixes):
            found.append(f"the {what} module {path or repr(module)} is not from its installed distribution")
    if os.path.isabs(library) and "site-packages" in library and not _distribution_file(library, ("nvidia-cudnn",)):
        found.append(f"the cuDNN library {library} is not from an nvidia-cudnn wheel")
    return "; ".join(found)


def _cudnn_library_candidates() -> list[str]:
    """Where the cuDNN 9 runtime may be: the pip wheels' nvidia/*/lib folders, then the loader path."""
    if sys.platform.startswith("win"):
        patterns = ["nvidia/cudnn/bin/cudnn64_9.dll", "nvidia/*/bin/cudnn64_9.dll"]
        names = ["cudnn64_9.dll"]
    else:
        patterns = ["nvidia/cudnn/lib/libcudnn.so.9*", "nvidia/*/lib/libcudnn.so.9*"]
        names = ["libcudnn.so.9", "libcudnn.so"]
    roots = []
    for root in [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *sys.path]:
        if root and os.path.isdir(root) and root not in roots:
            roots.append(root)
    found = []
    for root in roots:
        for pattern in patterns:
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                if path not in found:
                    found.append(path)
    return found + names


def _load_cudnn_runtime() -> tuple[str, int] | None:
    """(library, cudnnGetVersion()) of the first cuDNN runtime that loads, or None.

    Loading it globally first also lets the frontend's own ``dlopen("libcudnn.so.9")`` find it.
    """
    for candidate in _cudnn_library_candidates():
        try:
            lib = ctypes.CDLL(candidate, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        except OSError:
            continue
        try:
            get_version = lib.cudnnGetVersion
            get_version.restype = ctypes.c_size_t
            return candidate, int(get_version())
        except AttributeError:
            continue
    return None


def probe() -> Availability:
    """Check, in order, everything the backend needs; the first failure is the reason."""
    if not _installed("cupy"):
        return Availability(False, f"CuPy is not installed ({install_hint()})")
    try:
        cupy = _import("cupy")
    except Exception as exc:
        return Availability(False, f"CuPy failed to import: {type(exc).__name__}: {exc}")
    cupy_version = str(getattr(cupy, "__version__", ""))
    if parse_version(cupy_version) < MIN_CUPY:
        return Availability(False, f"CuPy {cupy_version} is too old (need >= {'.'.join(map(str, MIN_CUPY))})",
                            cupy_version=cupy_version)
    try:
        devices = _device_names(cupy)
    except Exception as exc:
        return Availability(False, f"no CUDA device: {type(exc).__name__}: {exc}", cupy_version=cupy_version)
    if not devices:
        return Availability(False, "no CUDA device (CuPy sees 0 devices)", cupy_version=cupy_version)
    runtime = _load_cudnn_runtime()
    if runtime is None:
        return Availability(False, "cuDNN runtime not found (no libcudnn.so.9 from the nvidia-cudnn-cu12/-cu13 "
                                   f"wheel or the loader path; {install_hint()})",
                            cupy_version=cupy_version, devices=devices)
    library, cudnn_version = runtime
    if cudnn_version < MIN_CUDNN:
        return Availability(False, f"cuDNN runtime {format_cudnn_version(cudnn_version)} at {library} is too old "
                                   f"(need >= {format_cudnn_version(MIN_CUDNN)})",
                            cupy_version=cupy_version, cudnn_version=cudnn_version, devices=devices, library=library)
    if not _installed("cudnn"):
        return Availability(False, "cuDNN frontend not installed (it provides 'import cudnn'; "
                                   f"{install_hint()})",
                            cupy_version=cupy_version, cudnn_version=cudnn_version, devices=devices, library=library)
    try:
        fe = _import("cudnn")
    except Exception as exc:
        return Availability(False, f"cuDNN frontend failed to import: {type(exc).__name__}: {exc}",
                            cupy_version=cupy_version, cudnn_version=cudnn_version, devices=devices, library=library)
    fe_version = str(getattr(fe, "__version__", ""))
    if parse_version(fe_version) < MIN_FRONTEND:
        return Availability(False, f"cuDNN frontend {fe_version or '(unknown version)'} is too old "
                                   f"(need >= {'.'.join(map(str, MIN_FRONTEND))})",
                            cupy_version=cupy_version, cudnn_version=cudnn_version, frontend_version=fe_version,
                            devices=devices, library=library)
    missing = [name for name in ("pygraph", "data_type", "heur_mode", "numerical_note", "build_plan_policy",
                                 "reduction_mode", "create_handle", "set_stream", "cudnnGraphNotSupportedError")
               if not hasattr(fe, name)]
    if missing:
        return Availability(False, f"cuDNN frontend {fe_version} lacks {', '.join(missing)}",
                            cupy_version=cupy_version, cudnn_version=cudnn_version, frontend_version=fe_version,
                            devices=devices, library=library)
    return Availability(True, "", cupy_version=cupy_version, cudnn_version=cudnn_version,
                        frontend_version=fe_version, devices=devices, library=library,
                        emulation=stand_ins(cupy, fe, library))


_lock = threading.Lock()
_cached: Availability | None = None


def availability() -> Availability:
    """The probe's result, computed once per process (:func:`reset` forgets it)."""
    global _cached
    with _lock:
        if _cached is None:
            try:
                _cached = probe()
            except Exception as exc:  # availability never raises
                _cached = Availability(False, f"availability probe failed: {type(exc).__name__}: {exc}")
        return _cached


def reset() -> None:
    global _cached
    with _lock:
        _cached = None


# ---------------------------------------------------------------------------------------------
# The runtime the backend executes on


class CupyRuntime:
    """CuPy arrays, CuPy's memory pool and current stream, and cuDNN handles (one per thread and device)."""

    def __init__(self):
        import cupy  # noqa: PLC0415  (lazy by design)

        self.cp = cupy
        self.fe = _import("cudnn")
        self._local = threading.local()
        self._null = contextlib.nullcontext()

    # arrays -----------------------------------------------------------------------------------
    @staticmethod
    def device_of(a) -> int:
        return a.device.id

    @staticmethod
    def ptr(a) -> int:
        return a.data.ptr

    @staticmethod
    def is_c_contiguous(a) -> bool:
        return a.flags.c_contiguous

    @staticmethod
    def element_strides(a) -> tuple[int, ...]:
        size = a.itemsize
        return tuple(s // size for s in a.strides)

    def contiguous(self, a):
        return self.cp.ascontiguousarray(a)

    def copy(self, a):
        """A fresh C-contiguous copy (fresh pool allocations are 512-byte aligned)."""
        return a.copy(order="C")

    def empty(self, shape, like):
        return self.cp.empty(shape, dtype=like.dtype)

    def on_device(self, device: int):
        if self.cp.cuda.runtime.getDevice() == device:
            return self._null
        return self.cp.cuda.Device(device)

    def workspace(self, nbytes: int):
        """(keep-alive buffer, pointer) of ``nbytes`` from the pool; stream-ordered reuse needs no sync."""
        if nbytes <= 0:
            return None, 0
        buf = self.cp.empty((nbytes,), dtype=self.cp.uint8)
        return buf, buf.data.ptr

    # cuDNN handles and streams ------------------------------------------------------------------
    def handle(self, device: int):
        """This thread's handle for ``device``, bound to CuPy's current stream (set only on change)."""
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        slot = handles.get(device)
        if slot is None:
            slot = handles[device] = [self.fe.create_handle(), None]
        stream = self.cp.cuda.get_current_stream().ptr
        if slot[1] != stream:
            self.fe.set_stream(handle=slot[0], stream=stream)
            slot[1] = stream
        return slot[0]

    # CuPy fallbacks (same stream) ---------------------------------------------------------------
    # CuPy has no bfloat16 dtype: bfloat16 data arrives as its 16-bit patterns (xconv.interop), so
    # the fallbacks widen those bits to float32 and round back to nearest-even themselves.

    def _is_bits(self, a) -> bool:
        return a.dtype.kind in "iu"

    def _widen(self, a, acc):
        if self._is_bits(a):
            return (a.view(self.cp.uint16).astype(self.cp.uint32) << 16).view(self.cp.float32).astype(acc)
        return a.astype(acc)

    def _narrow(self, f, like):
        if not self._is_bits(like):
            return f.astype(like.dtype)
        u = self.cp.ascontiguousarray(f.astype(self.cp.float32)).view(self.cp.uint32)
        rounded = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
        nan = self.cp.isnan(f)
        rounded = self.cp.where(nan, (u >> 16) | 0x40, rounded)
        return rounded.astype(self.cp.uint16).view(like.dtype)

    def add_bias(self, y, bias):
        shape = (1, -1) + (1,) * (y.ndim - 2)
        if not (self._is_bits(y) or self._is_bits(bias)):
            y += bias.reshape(shape)
            return y
        total = self._widen(y, self.cp.float32) + self._widen(bias, self.cp.float32).reshape(shape)
        return self.cp.ascontiguousarray(self._narrow(total, y))

    def sum_bias(self, dy, dtype: str):
        acc = self.cp.float64 if dtype == "float64" else self.cp.float32
        axes = (0,) + tuple(range(2, dy.ndim))
        total = self._widen(dy, acc).sum(axis=axes) if self._is_bits(dy) else dy.sum(axis=axes, dtype=acc)
        return self.cp.ascontiguousarray(self._narrow(total, dy))

    # autotune timing ------------------------------------------------------------------------------
    def time_calls(self, run, warmup: int, repeats: int) -> list[float]:
        """Milliseconds of each of ``repeats`` calls of ``run()`` on the current stream (CUDA events)."""
        for _ in range(warmup):
            run()
        stream = self.cp.cuda.get_current_stream()
        times = []
        for _ in range(repeats):
            start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
            start.record(stream)
            run()
            stop.record(stream)
            stop.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(start, stop))
        return times
