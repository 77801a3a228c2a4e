"""The NumPy backend's compiled loops: one library built at install (setup.py), once per instruction set.

``_kernels_<isa>`` (isa: baseline, avx2, avx512 on x86-64; baseline elsewhere) lie in this package's
directory; :func:`load` opens the baseline build, asks it what the CPU runs (``__builtin_cpu_supports``),
and opens the best build present that the CPU runs (``XCONV_NUMPY_ISA`` may choose a lower one). Each is
opened by absolute path from the package's own directory, and only if it is a regular file (never through a
link); no compiler runs and no cache is read. When the builds are missing (installed without a C compiler),
:func:`load` raises and the backend runs its NumPy paths; likewise when a build's argument layout is not the one
:mod:`.layout` declares.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import stat
from pathlib import Path

from xconv import settings

from . import layout
from .lazy import Lazy

#: Instruction sets of the builds, lowest first.
ISAS = ("baseline", "avx2", "avx512")
_DIR = Path(__file__).resolve().parent


def library_path(isa: str) -> Path | None:
    """The build for ``isa`` in the package directory, or None; an entry that is not a regular file is refused."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _DIR / f"_kernels_{isa}{suffix}"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file (a link?); refusing to load it")
        return path
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    sigs = {
        "xconv_dx_rows": [p, i, i, p, i, i, p, i, i, i, p, i, i, i, p, p, i, i, i, i],
        "xconv_dw_rows": [p, i, i, p, i, i, i, p, i, i, p, p, i, i, i, p, i, i, i, i],
        "xconv_x_to_grid": [p, i, i, i, i, i, p, i, i, p, i, p, i, p],
        "xconv_dy_to_grid": [p, i, i, p, i, i, i, i, i, i, i, p, p],
        "xconv_taps_last": [p, i, i, p, i, i],
        "xconv_dwcv_gather": [p, i, i, i, p, i, i, p, i, p, p, p, p, p, i, i, i, p],
        "xconv_dwcv_wgrad": [p, p, i, i, i, i, i, i, i, p, p, p, p, p, p, i, i, p],
        "xconv_jobs_work": [p, i, p],
        "xconv_jobs_parallel": [p, i, p, i, p],
    }
    for suf in ("f32", "f64"):
        sigs[f"xconv_depthwise_backward_{suf}"] = [p] * 12 + [i, i]
        sigs[f"xconv_depthwise_fprop_{suf}"] = [p] * 8 + [i, i]
        sigs[f"xconv_small_im2col_{suf}"] = [p, p, p]
        sigs[f"xconv_small_col2im_{suf}"] = [p, p, p]
        sigs[f"xconv_small_im2col_range_{suf}"] = [p, p, p, i, i]
        sigs[f"xconv_small_col2im_range_{suf}"] = [p, p, p, i, i]
        sigs[f"xconv_small_s1_fprop_{suf}"] = [p] * 7             # ..., int64_t *scratch (bytes malloc'd)
        sigs[f"xconv_small_s1_backward_{suf}"] = [p] * 10
    for suf in ("f64", "f32", "f16", "bf16"):
        sigs[f"xconv_bias_sum_{suf}"] = [p, p, p, i]
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, (ctypes.c_int if name.startswith("xconv_small_s1_") else None)
    lib.xconv_build_isa.argtypes, lib.xconv_build_isa.restype = [], ctypes.c_char_p
    lib.xconv_jobs_layout.argtypes, lib.xconv_jobs_layout.restype = [ctypes.c_int], ctypes.c_int64
    lib.xconv_cpu_level.argtypes, lib.xconv_cpu_level.restype = [], ctypes.c_int
    lib.xconv_stem_scratch.argtypes, lib.xconv_stem_scratch.restype = [p], ctypes.c_int64
    lib.xconv_stem_wjobs.argtypes, lib.xconv_stem_wjobs.restype = [p, ctypes.c_int64], ctypes.c_int64
    lib.xconv_dx_units.argtypes, lib.xconv_dx_units.restype = [ctypes.c_int64] * 3, ctypes.c_int64
    lib.xconv_dx_taps_rows.argtypes, lib.xconv_dx_taps_rows.restype = [ctypes.c_int64] * 2, ctypes.c_int64
    for suf in ("f32", "f64"):
        fn = getattr(lib, f"xconv_all_finite_{suf}")
        fn.argtypes, fn.restype = [p, ctypes.c_int64], ctypes.c_int


def _declared(lib: ctypes.CDLL, path) -> None:
    """:func:`_declare`, or a RuntimeError naming the build where it lacks a function this checkout calls (a build
    left from an older checkout: an editable install updated without rebuilding)."""
    try:
        _declare(lib)
    except AttributeError as e:
        raise RuntimeError(f"the compiled loops in {path} are older than this xconv ({e}); rebuild them: "
                           "python setup.py build_ext --inplace, or reinstall") from None


def load() -> ctypes.CDLL:
    """The best build this CPU runs (see the module docstring); raises when none is installed."""
    base = library_path("baseline")
    if base is None:
        raise RuntimeError(f"the compiled loops were not built at install (no _kernels_baseline in {_DIR}); "
                           "reinstall with a C compiler present")
    lib = ctypes.CDLL(str(base))
    _declared(lib, base)
    level = int(lib.xconv_cpu_level())
    wanted = settings.current().numpy_isa                     # validated: None or one of ISAS
    if wanted in ISAS:
        level = min(level, ISAS.index(wanted))
    for isa in reversed(ISAS[1:level + 1]):
        path = library_path(isa)
        if path is not None:
            lib = ctypes.CDLL(str(path))
            _declared(lib, path)
            break
    layout.check(lib)
    return lib


def isa(lib: ctypes.CDLL) -> str:
    """The instruction set of a loaded build."""
    return lib.xconv_build_isa().decode()


_BYTE = ctypes.c_char


def address(a) -> int:
    """The address of ndarray ``a``'s first element: ``a.ctypes.data``, about 4x faster for a writable C-contiguous
    array (no ``ctypes`` helper object; a hot path's calls pass several); any other array (a strided view, read-only)
    goes straight to ``a.ctypes.data``."""
    flags = a.flags
    if flags.c_contiguous and flags.writeable:
        try:
            return ctypes.addressof(_BYTE.from_buffer(a))
        except (TypeError, ValueError):                 # empty
            pass
    return a.ctypes.data


#: The one loaded library (:func:`load`, run once on first use), shared by every compiled part.
LIBRARY = Lazy(load)


def library() -> ctypes.CDLL | None:
    """The loaded library, or None when loading failed (:func:`load_error` says why)."""
    return LIBRARY.get()


def load_error() -> str | None:
    """Why the library could not be loaded (None if it was, or was not tried)."""
    return LIBRARY.error


def part_on(switch: str) -> bool:
    """Whether a compiled part may run: its switch (a :class:`xconv.settings.Settings` field, ``numpy_c`` or
    ``numpy_direct``: ``$XCONV_NUMPY_C``, ``$XCONV_NUMPY_DIRECT``) is on and the library loaded."""
    if LIBRARY._value is None:                           # load() reads every setting: validate them all first
        return getattr(settings.current(), switch) and library() is not None
    return settings.one(switch)                          # loaded: read this switch alone (the hot paths' call)


def switch_variable(switch: str) -> str:
    """The environment variable of a switch (``numpy_c``: ``XCONV_NUMPY_C``)."""
    return "XCONV_" + switch.upper()
