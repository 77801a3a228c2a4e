"""Build the fake CANN libraries (libascendcl.so, libnnopbase.so, libopapi.so).

Usage:
    from build import build            # or load this file with importlib
    lib_dir = build(tmp_dir)            # -> Path containing the three .so files

    python tests/fake_cann/build.py DEST

Extra compiler flags can be given in $FAKECANN_CFLAGS (e.g. "-g -fsanitize=address";
then run python with LD_PRELOAD=$(gcc -print-file-name=libasan.so)).

libnnopbase.so and libopapi.so link against libascendcl.so (which holds the
whole emulator state) with rpath $ORIGIN, so one process always has exactly one
state.  The libraries are only rebuilt when a source in this folder is newer.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from ctypes import c_char_p, c_int, c_int32, c_int64, c_uint32, c_uint64, c_void_p
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = "fake_cann.h"

# (library, sources, extra link flags); libascendcl.so must come first.
LIBS = [
    ("libascendcl.so", ["ascendcl.c"], []),
    ("libnnopbase.so", ["nnopbase.c"], ["-lascendcl"]),
    ("libopapi.so", ["opapi.c"], ["-lascendcl", "-lm"]),
]

CFLAGS = [
    "-O2",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-Wall",
    "-Werror",
    "-fvisibility=hidden",
    "-pthread",
]

LIB_NAMES = [name for name, _, _ in LIBS]

#: ctypes (restype, argtypes) of the emulator's test-only control API in libascendcl.so (fake_cann.h).
CONTROL_SIGNATURES = {
    "fakecann_live_objects": (c_int64, []),
    "fakecann_live_count": (c_int64, [c_int]),
    "fakecann_live_device_bytes": (c_uint64, []),
    "fakecann_misuse_count": (c_int64, []),
    "fakecann_set_soc_name": (None, [c_char_p]),
    "fakecann_set_device_count": (None, [c_uint32]),
    "fakecann_set_fail_init": (None, [c_int]),
    "fakecann_set_workspace_size": (None, [c_uint64]),
    "fakecann_set_strict_outputs": (None, [c_int]),
    "fakecann_set_emulate_precision": (None, [c_int]),
    "fakecann_fail_next": (None, [c_char_p, c_int, c_int]),
    "fakecann_get_deterministic": (c_int64, [c_int32]),
    "fakecann_get_process_deterministic": (c_int64, []),
    "fakecann_process_option_writes": (c_int64, []),
    "fakecann_set_phase1_delay_us": (None, [c_uint32]),
    "fakecann_reclaimed_count": (c_int64, []),
    "fakecann_device_refcount": (c_int, [c_int32]),
    "fakecann_current_device": (c_int32, []),
    "fakecann_is_initialized": (c_int, []),
    "fakecann_call_count": (c_int, []),
    "fakecann_call_op": (c_int, [c_int]),
    "fakecann_call_deterministic": (c_int64, [c_int]),
    "fakecann_call_cube_math": (c_int, [c_int]),
    "fakecann_call_mask": (c_int, [c_int]),
    "fakecann_call_transposed": (c_int, [c_int]),
    "fakecann_call_groups": (c_int64, [c_int]),
    "fakecann_call_dtype": (c_int, [c_int]),
    "fakecann_call_stream": (c_void_p, [c_int]),
    "fakecann_prepare_count": (c_int, []),
    "fakecann_reset": (None, []),
    "fakecann_reset_runtime": (None, []),
    "xconv_cann_emulator": (c_char_p, []),     # the marker real CANN lacks (fake_cann.h)
}


def _inputs() -> list[Path]:
    return sorted(HERE.glob("*.c")) + [HERE / HEADER, Path(__file__).resolve()]


def _extra_cflags() -> list[str]:
    """Extra flags from $FAKECANN_CFLAGS (e.g. "-g -fsanitize=address")."""
    return os.environ.get("FAKECANN_CFLAGS", "").split()


def _stamp() -> str:
    return " ".join([os.environ.get("CC", "gcc"), *CFLAGS, *_extra_cflags()])


def _up_to_date(dest: Path) -> bool:
    newest_src = max(p.stat().st_mtime for p in _inputs())
    for name in LIB_NAMES:
        out = dest / name
        if not out.exists() or out.stat().st_mtime < newest_src:
            return False
    stamp = dest / ".fakecann-build.stamp"
    return stamp.exists() and stamp.read_text() == _stamp()


def _compile(dest: Path, name: str, sources: list[str], extra: list[str]) -> None:
    cc = os.environ.get("CC", "gcc")
    tmp = dest / f".{name}.{os.getpid()}.tmp"
    cmd = [
        cc,
        *CFLAGS,
        *_extra_cflags(),
        f"-I{HERE}",
        *[str(HERE / s) for s in sources],
        "-o",
        str(tmp),
        f"-Wl,-soname,{name}",
        "-Wl,--no-undefined",
        f"-L{dest}",
        *extra,
        "-Wl,-rpath,$ORIGIN",
        "-lpthread",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"building {name} failed ({proc.returncode}):\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )
    os.replace(tmp, dest / name)  # atomic: a loaded old copy keeps its inode


def loaded_dir() -> Path | None:
    """The build directory of the fake libascendcl.so already mapped into this process, if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith("/libascendcl.so"):
            lib_dir = Path(fields[5]).parent
            if (lib_dir / ".fakecann-build.stamp").exists():
                return lib_dir
    return None


def build(dest_dir: str | os.PathLike[str]) -> Path:
    """Compile the three libraries into dest_dir (if stale) and return it.

    When this process has already loaded the emulator from another build directory, that
    directory is returned instead: a second copy of libascendcl.so (another path) would be a
    second emulator state, and the libnnopbase.so/libopapi.so loaded next to it would bind to the
    first copy by soname, mixing the two (e.g. aclrtMalloc answering 107002 after aclrtSetDevice).
    """
    dest = Path(dest_dir).resolve()
    loaded = loaded_dir()
    if loaded is not None and loaded.resolve() != dest:
        return loaded
    dest.mkdir(parents=True, exist_ok=True)
    if _up_to_date(dest):
        return dest
    with open(dest / ".fakecann-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _up_to_date(dest):
                for name, sources, extra in LIBS:
                    _compile(dest, name, sources, extra)
                (dest / ".fakecann-build.stamp").write_text(_stamp())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} DEST_DIR", file=sys.stderr)
        return 2
    print(build(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
