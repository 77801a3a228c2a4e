"""Which CANN libraries to load from a library directory, and loading them without path searches.

What a directory holds (:func:`inventory`), as torch_npu looks for it:

- the runtime: ``libascendcl.so``, else ``libacl_rt.so`` (some installs ship only the latter);
- ``libnnopbase.so`` (aclCreateTensor and the other aclnn meta objects);
- the operators: the per-repository ``libopapi_*.so`` (current CANN: ``libopapi_nn.so``,
  ``libopapi_math.so``, ...) when any exists, else the deprecated monolithic ``libopapi.so``.
  The two are never mixed: with per-repository libraries present, ``libopapi.so`` is not loaded;
- ``$ASCEND_OPP_PATH`` (the operator package: kernels and tiling data that aclnn loads at phase 1;
  CANN's ``set_env.sh`` sets it), reported, not required.

Loading (:func:`load_closure`): every library, and every library it needs (``DT_NEEDED``, read
from its ELF dynamic section), is opened by absolute path before anything that needs it, so the
dynamic linker never searches for a CANN library: not in ``LD_LIBRARY_PATH``, whose empty or
relative entries mean the current directory. A dependency is looked for in the library
directory, then the absolute ``LD_LIBRARY_PATH`` entries, then the linker cache
(``ldconfig -p``); one found nowhere is left to the linker only when ``LD_LIBRARY_PATH`` has no
entry that resolves against the current directory, else loading stops with the reason.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import os
import struct
import subprocess

OPP_PATH_VAR = "ASCEND_OPP_PATH"
RUNTIME_NAMES = ("libascendcl.so", "libacl_rt.so")
NNOPBASE_NAME = "libnnopbase.so"
OPAPI_NAME = "libopapi.so"
OPAPI_SPLIT_GLOB = "libopapi_*.so"


class DiscoveryError(Exception):
    """A library cannot be found or loaded safely; ``str()`` is the reason."""


@dataclasses.dataclass(frozen=True)
class Inventory:
    """What one library directory holds for xconv, and what it lacks."""

    lib_dir: str
    runtime: str | None
    nnopbase: str | None
    op_libraries: tuple[str, ...]
    opp_path: str | None          # $ASCEND_OPP_PATH as set (None: unset)
    opp_path_ok: bool             # set, absolute, and an existing directory

    @property
    def missing(self) -> tuple[str, ...]:
        out = []
        if self.runtime is None:
            out.append(f"{RUNTIME_NAMES[0]} (or {RUNTIME_NAMES[1]})")
        if self.nnopbase is None:
            out.append(NNOPBASE_NAME)
        if not self.op_libraries:
            out.append(f"{OPAPI_SPLIT_GLOB} (or {OPAPI_NAME})")
        return tuple(out)

    def describe(self) -> str:
        """One line: the libraries found, and ASCEND_OPP_PATH's state."""
        found = [os.path.basename(p) for p in (self.runtime, self.nnopbase, *self.op_libraries) if p]
        return f"found {', '.join(found) or 'no CANN library'}; {self.opp_state()}"

    def opp_state(self) -> str:
        if self.opp_path is None:
            return f"{OPP_PATH_VAR} unset (aclnn needs it to find its kernels; CANN's set_env.sh sets it)"
        if not self.opp_path_ok:
            return f"{OPP_PATH_VAR}={self.opp_path!r} is not an existing absolute directory"
        return f"{OPP_PATH_VAR}={self.opp_path}"


def inventory(lib_dir: str, environ) -> Inventory:
    """The CANN libraries in ``lib_dir`` (absolute) and ``$ASCEND_OPP_PATH``, torch_npu's way."""
    def present(name):
        path = os.path.join(lib_dir, name)
        return path if os.path.isfile(path) else None

    runtime = next((p for p in map(present, RUNTIME_NAMES) if p), None)
    split = tuple(sorted(p for p in glob.glob(os.path.join(glob.escape(lib_dir), OPAPI_SPLIT_GLOB))
                         if os.path.isfile(p)))
    ops = split or tuple(p for p in (present(OPAPI_NAME),) if p)
    opp = environ.get(OPP_PATH_VAR) or None
    opp_ok = bool(opp) and os.path.isabs(opp) and os.path.isdir(opp)
    return Inventory(lib_dir, runtime, present(NNOPBASE_NAME), ops, opp, opp_ok)


# ---------------------------------------------------------------------------------------------
# LD_LIBRARY_PATH and the ELF dynamic section


def cwd_entries(environ) -> list[str]:
    """The entries of ``LD_LIBRARY_PATH`` the linker resolves against the current directory (empty, relative)."""
    value = environ.get("LD_LIBRARY_PATH")
    if value is None:
        return []
    return [entry for entry in value.split(":") if not os.path.isabs(entry)]


def absolute_entries(environ) -> list[str]:
    value = environ.get("LD_LIBRARY_PATH") or ""
    return [entry for entry in value.split(":") if os.path.isabs(entry)]


_PT_LOAD, _PT_DYNAMIC, _DT_NEEDED, _DT_STRTAB = 1, 2, 1, 5


def needed(path: str) -> list[str] | None:
    """The ``DT_NEEDED`` sonames of the 64-bit ELF file ``path``, or None when it is not one we can read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    end = "<" if data[5] == 1 else ">"
    try:
        phoff, = struct.unpack_from(end + "Q", data, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 54)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(end + "IIQQQQQQ", data,
                                                                                 phoff + i * phentsize)
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        entries, strtab = [], None
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from(end + "qQ", data, off)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                entries.append(val)
            elif tag == _DT_STRTAB:
                strtab = val
        if strtab is None:
            return [] if not entries else None
        base = next((off + strtab - vaddr for vaddr, off, size in loads if vaddr <= strtab < vaddr + size), None)
        if base is None:
            return None
        names = []
        for val in entries:
            stop = data.index(b"\0", base + val)
            names.append(data[base + val:stop].decode())
        return names
    except (struct.error, ValueError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=1)
def _linker_cache() -> dict[str, str]:
    """soname -> absolute path from ``ldconfig -p`` (the linker cache), {} when unavailable."""
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(tool):
            try:
                out = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=20).stdout
            except (OSError, subprocess.SubprocessError):
                return {}
            cache = {}
            for line in out.splitlines()[1:]:
                name, _, target = line.strip().partition(" => ")
                soname = name.split(" (")[0].strip()
                if target and os.path.isabs(target) and soname not in cache:
                    cache[soname] = target
            return cache
    return {}


def _loaded_names() -> set[str]:
    """Basenames of the shared objects mapped into this process."""
    names = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
                if path.startswith("/"):
                    names.add(os.path.basename(path))
    except OSError:
        pass
    return names


def load_closure(path: str, lib_dir: str, environ, opened: dict[str, ctypes.CDLL], where: str = "") -> ctypes.CDLL:
    """Open ``path`` (RTLD_GLOBAL) after every library it needs, each by absolute path (see the module doc).

    ``opened`` maps absolute paths already opened by this call chain to their handles; ``where``
    (e.g. " ($ASCEND_HOME_PATH)") follows the path in a load failure's reason.
    """
    if path in opened:
        return opened[path]
    unsafe = cwd_entries(environ)
    dirs = [lib_dir] + [d for d in absolute_entries(environ) if d != lib_dir]
    sonames = needed(path)
    if sonames is None and unsafe:
        raise DiscoveryError(f"cannot read the dependencies of {path}, and LD_LIBRARY_PATH has entries that "
                             f"resolve against the current directory ({_show(unsafe)}): not loading it")
    loaded = _loaded_names()
    for soname in sonames or ():
        if soname in loaded or "/" in soname:
            continue
        found = next((os.path.join(d, soname) for d in dirs if os.path.isfile(os.path.join(d, soname))), None)
        found = found or _linker_cache().get(soname)
        if found is None:
            if unsafe:
                raise DiscoveryError(f"{soname} (needed by {os.path.basename(path)}) is in none of {dirs} nor the "
                                     f"linker cache, and LD_LIBRARY_PATH has entries that resolve against the "
                                     f"current directory ({_show(unsafe)}): not loading it from there")
            continue  # the linker finds it on the system paths, or the load below says why not
        load_closure(found, lib_dir, environ, opened, where)
    try:
        handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise DiscoveryError(f"cannot load {path}{where}: {exc}") from None
    opened[path] = handle
    return handle


def _show(entries) -> str:
    return ", ".join(repr(e) for e in entries)
