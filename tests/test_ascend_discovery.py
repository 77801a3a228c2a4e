"""Finding and loading CANN the way current installs lay it out, on the emulator, each in its own process.

- per-repository operator libraries (``libopapi_nn.so``, ...) are used, and the deprecated
  ``libopapi.so`` beside them is never loaded (not mixed);
- ``libacl_rt.so`` serves when ``libascendcl.so`` is absent;
- ``availability()`` / ``version()`` name what was found, what is missing and ``ASCEND_OPP_PATH``;
- nothing is resolved through the current directory, empty ``LD_LIBRARY_PATH`` entries included:
  a trap library in the working directory, named like a dependency of an operator library, is
  never loaded, although the dynamic linker alone would take it first.

A process loads CANN once, so each layout runs in a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core_helpers import fake_cann_build
from xconv_ascend import discovery

BUILD = fake_cann_build()
CC = os.environ.get("CC", "gcc")

PROBE = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from xconv_ascend.driver import Driver
    from xconv_ascend.backend import AscendBackend
    drv = Driver()
    ok, reason = drv.availability()
    out = {"ok": ok, "reason": reason}
    if ok:
        b = AscendBackend(driver=drv)
        out["version"] = b.version()
        import xconv
        x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
        out["sum"] = float(xconv.conv_fprop(x, w, backend=b).sum())
        drv.release_thread()
    with open("/proc/self/maps") as f:
        out["maps"] = sorted({line.split()[-1] for line in f if line.rstrip().endswith(".so")})
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if shutil.which(CC) is None:
        pytest.skip("no C compiler")
    return BUILD.build(tmp_path_factory.mktemp("fake_cann"))


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "XCONV_ASCEND_LIB_DIR", "XCONV_BACKEND",
                        "ASCEND_OPP_PATH", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


def _probe(env, cwd) -> dict:
    import json  # noqa: PLC0415
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _compile(path: Path, source: str, *flags: str) -> None:
    src = path.with_suffix(".c")
    src.write_text(source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(path), str(src), *flags], check=True, capture_output=True)


TRAP = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void trap(void) {
    FILE *f = fopen(getenv("TRAP_MARKER"), "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
int fcdep_value(void) { return 1; }
"""


def test_split_operator_libraries_and_acl_rt_runtime(emulator, tmp_path):
    """libopapi_*.so win over libopapi.so (a trap here: never loaded); libacl_rt.so is the runtime."""
    home = tmp_path / "cann"
    lib64 = home / "lib64"
    lib64.mkdir(parents=True)
    (lib64 / "libacl_rt.so").symlink_to(emulator / "libascendcl.so")
    (lib64 / "libnnopbase.so").symlink_to(emulator / "libnnopbase.so")
    (lib64 / "libopapi_nn.so").symlink_to(emulator / "libopapi.so")
    _compile(lib64 / "libopapi.so", TRAP)                         # the deprecated monolith: must stay unloaded
    (home / "opp").mkdir()
    marker = tmp_path / "marker"
    out = _probe(_clean_env(ASCEND_HOME_PATH=str(home), ASCEND_OPP_PATH=str(home / "opp"),
                            TRAP_MARKER=str(marker)), cwd=tmp_path)
    assert out["ok"], out["reason"]
    assert out["sum"] == 4 * 9.0
    assert "found libacl_rt.so, libnnopbase.so, libopapi_nn.so" in out["version"]
    assert f"ASCEND_OPP_PATH={home / 'opp'}" in out["version"]
    assert not marker.exists()
    assert str(lib64 / "libopapi.so") not in out["maps"]


def test_opp_path_reported_when_unset(emulator, tmp_path):
    out = _probe(_clean_env(XCONV_ASCEND_LIB_DIR=str(emulator)), cwd=tmp_path)
    assert out["ok"], out["reason"]
    assert "found libascendcl.so, libnnopbase.so, libopapi.so; ASCEND_OPP_PATH unset" in out["version"]


def test_empty_ld_library_path_entry_never_resolves_a_dependency_in_the_working_directory(emulator, tmp_path):
    """An operator library needs libfcdep.so, installed in an absolute LD_LIBRARY_PATH directory that comes
    after an empty entry; the working directory holds a trap libfcdep.so. The linker alone would load
    the trap (the empty entry is the current directory, searched first); xconv loads the real one."""
    lib = tmp_path / "lib"
    dep = tmp_path / "dep"
    work = tmp_path / "work"
    for d in (lib, dep, work):
        d.mkdir()
    for name in ("libascendcl.so", "libnnopbase.so"):
        (lib / name).symlink_to(emulator / name)
    (lib / "libopapi_nn.so").symlink_to(emulator / "libopapi.so")
    _compile(dep / "libfcdep.so", "int fcdep_value(void) { return 2; }\n", "-Wl,-soname,libfcdep.so")
    _compile(work / "libfcdep.so", TRAP, "-Wl,-soname,libfcdep.so")
    _compile(lib / "libopapi_extra.so", "int fcdep_value(void);\nint extra(void) { return fcdep_value(); }\n",
             f"-L{dep}", "-lfcdep", "-Wl,-soname,libopapi_extra.so")
    assert discovery.needed(str(lib / "libopapi_extra.so"))[0] == "libfcdep.so"
    marker = tmp_path / "marker"
    env = _clean_env(XCONV_ASCEND_LIB_DIR=str(lib), LD_LIBRARY_PATH=f":{dep}:", TRAP_MARKER=str(marker))
    out = _probe(env, cwd=work)
    assert out["ok"], out["reason"]
    assert not marker.exists(), "a library was resolved through the current directory"
    assert str(dep / "libfcdep.so") in out["maps"] and str(work / "libfcdep.so") not in out["maps"]
    # the dependency nowhere but in the working directory: refused, naming it and the entry
    (dep / "libfcdep.so").unlink()
    out = _probe(env, cwd=work)
    assert not out["ok"] and not marker.exists()
    assert "libfcdep.so (needed by libopapi_extra.so)" in out["reason"] and "''" in out["reason"]


def test_linker_alone_would_take_the_trap(emulator, tmp_path):
    """The hazard is real: dlopen of the same library by the linker alone loads the working directory's trap."""
    dep, work = tmp_path / "dep", tmp_path / "work"
    dep.mkdir()
    work.mkdir()
    _compile(dep / "libfcdep.so", "int fcdep_value(void) { return 2; }\n", "-Wl,-soname,libfcdep.so")
    _compile(work / "libfcdep.so", TRAP, "-Wl,-soname,libfcdep.so")
    _compile(tmp_path / "libuser.so", "int fcdep_value(void);\nint user(void) { return fcdep_value(); }\n",
             f"-L{dep}", "-lfcdep")
    marker = tmp_path / "marker"
    code = f"import ctypes; ctypes.CDLL({str(tmp_path / 'libuser.so')!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=work, timeout=60,
                   env=_clean_env(LD_LIBRARY_PATH=f":{dep}", TRAP_MARKER=str(marker)))
    assert marker.exists()


def test_cwd_entries_and_elf_reader():
    assert discovery.cwd_entries({"LD_LIBRARY_PATH": "/a::b:/c:"}) == ["", "b", ""]
    assert discovery.cwd_entries({}) == [] and discovery.cwd_entries({"LD_LIBRARY_PATH": "/a"}) == []
    assert discovery.needed(sys.executable) is not None
    assert discovery.needed(__file__) is None
