"""Finding the CANN library directory and binding the declared functions (no device work).

:func:`locate` picks the directory from ``lib_dir`` or the environment (``$XCONV_ASCEND_LIB_DIR``,
else ``$ASCEND_HOME_PATH/lib64``, else ``$ASCEND_TOOLKIT_HOME/lib64``; the first variable that is
set decides; a relative path is refused). :func:`bind` loads the libraries that
:mod:`.discovery` finds there, by absolute path in the order runtime, nnopbase, operators, and
declares every function's ``argtypes``/``restype`` from :mod:`.abi`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os

from . import discovery
from .abi import SIGNATURES

LIB_DIR_VARS = ("XCONV_ASCEND_LIB_DIR", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")


class LoadError(Exception):
    """The libraries cannot be used here; ``str()`` is the availability reason."""


class Functions:
    """Attribute access to the declared functions."""


def environ_value(environ, name):
    """``environ[name]``, None when unset or empty."""
    value = environ.get(name)
    return value if value else None


def locate(lib_dir: str | None, environ) -> tuple[str, str]:
    """(directory, where it came from). LoadError with the reason when there is none."""
    if lib_dir is not None:
        path, source = lib_dir, "lib_dir argument"
    else:
        path = source = None
        for var in LIB_DIR_VARS:
            value = environ_value(environ, var)
            if value is not None:
                source = f"${var}"
                path = value if var == "XCONV_ASCEND_LIB_DIR" else os.path.join(value, "lib64")
                if not os.path.isabs(value):
                    raise LoadError(f"{var}={value!r} is not an absolute path (CANN libraries are never "
                                    "loaded from a relative path or the current directory)")
                break
        if path is None:
            raise LoadError("ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and XCONV_ASCEND_LIB_DIR are unset "
                            "(source CANN's set_env.sh, or set XCONV_ASCEND_LIB_DIR to the absolute path of "
                            "the directory holding libascendcl.so)")
    if not os.path.isabs(path):
        raise LoadError(f"library directory {path!r} ({source}) is not an absolute path")
    if not os.path.isdir(path):
        raise LoadError(f"library directory {path} ({source}) does not exist")
    return path, source


#: The symbol xconv's CANN emulator (tests/fake_cann) exports and real CANN lacks: ``const char *(void)``,
#: what the emulator is in words.
EMULATOR_MARKER = "xconv_cann_emulator"


@dataclasses.dataclass
class Bound:
    """The loaded libraries of one directory and their declared functions. ``emulation``: "" on real
    CANN, else what the emulator says it is (its :data:`EMULATOR_MARKER`)."""

    libs: dict[str, ctypes.CDLL]
    fn: Functions
    lib_dir: str
    source: str
    emulation: str = ""


def emulation(handles) -> str:
    """What the emulator among ``handles`` (loaded libraries) says it is, or "" when none exports the marker."""
    for lib in handles:
        try:
            marker = getattr(lib, EMULATOR_MARKER)
        except AttributeError:
            continue
        marker.restype, marker.argtypes = ctypes.c_char_p, []
        text = marker()
        return (text.decode(errors="replace").strip() if text else "") or "an emulator of CANN"
    return ""


def bind(path: str, source: str, inv: discovery.Inventory, environ) -> Bound:
    """Load ``inv``'s libraries (found in ``path``) and declare every function (LoadError with the reason)."""
    if inv.missing:
        raise LoadError(f"not found in {path} ({source}): {', '.join(inv.missing)}; {inv.describe()}")
    where = f" ({source})"
    files = {"ascendcl": inv.runtime, "nnopbase": inv.nnopbase}
    libs, fn, opened = {}, Functions(), {}
    try:
        for name, file in files.items():
            libs[name] = discovery.load_closure(file, path, environ, opened, where)
        ops = [(file, discovery.load_closure(file, path, environ, opened, where)) for file in inv.op_libraries]
    except discovery.DiscoveryError as exc:
        raise LoadError(str(exc)) from None
    for name in ("ascendcl", "nnopbase"):
        for symbol, (restype, argtypes) in SIGNATURES[name].items():
            try:
                f = getattr(libs[name], symbol)
            except AttributeError:
                raise LoadError(f"symbol {symbol} missing from {files[name]}{where}") from None
            f.restype, f.argtypes = restype, argtypes
            setattr(fn, symbol, f)
    for symbol, (restype, argtypes) in SIGNATURES["opapi"].items():
        f = None
        for file, lib in ops:
            try:
                f = getattr(lib, symbol)
            except AttributeError:
                continue
            libs.setdefault("opapi", lib)
            break
        if f is None:
            raise LoadError(f"symbol {symbol} missing from {', '.join(file for file, _ in ops)}{where}")
        f.restype, f.argtypes = restype, argtypes
        setattr(fn, symbol, f)
    return Bound(libs, fn, path, source, emulation([*libs.values(), *(lib for _, lib in ops)]))
