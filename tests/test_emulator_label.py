"""Results from an emulator never pass for silicon: the CANN emulator identifies itself (a marker symbol real
CANN lacks), and `xconv backends`, the bundle manifest, `compare` and the HTML report say "emulated" in words.
The cuDNN backend says the same of an injected runtime or of stand-in modules."""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import zipfile

import pytest

from core_helpers import fake_cann_build
from xconv_ascend import loader

BUILD = fake_cann_build()


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return BUILD.build(tmp_path_factory.mktemp("fake_cann_label"))


def _xconv(*args, env):
    return subprocess.run([sys.executable, "-m", "xconv", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_the_emulator_exports_its_marker_and_the_loader_reads_it(lib_dir):
    lib = ctypes.CDLL(str(lib_dir / "libascendcl.so"))
    text = loader.emulation([lib])
    assert "emulator" in text and "not Ascend hardware" in text
    libc = ctypes.CDLL(ctypes.util.find_library("c"))          # a library without the marker: real
    assert loader.emulation([libc]) == ""


def test_emulated_results_are_labelled_end_to_end(lib_dir, tmp_path):
    env = dict(os.environ, XCONV_ASCEND_LIB_DIR=str(lib_dir))
    env.pop("XCONV_BACKEND", None)
    listing = _xconv("backends", env=env)
    assert listing.returncode == 0, listing.stderr
    row = next(li for li in listing.stdout.splitlines() if li.startswith("ascend "))
    assert row.split()[1:3] == ["yes", "(emulated)"] and "(Ascend910B2, on the CANN emulator)" in row, row
    assert "emulated by: xconv CANN emulator" in _xconv("backends", "-v", env=env).stdout

    bundle, report = tmp_path / "ascend.xcr", tmp_path / "run.html"
    run = _xconv("conformance", "run", "--backend", "ascend", "--cases", "tiny/2d-f32", "--cases", "tiny/1d-f16",
                 "--out", str(bundle), "--report", str(report), "--no-progress", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "note: EMULATED, not the vendor's hardware: xconv CANN emulator" in run.stdout
    with zipfile.ZipFile(bundle) as zf:
        backend = json.loads(zf.read("manifest.json"))["backend"]
    assert backend["emulated"] is True and "CANN emulator" in backend["emulation"]
    assert "on the CANN emulator" in backend["devices"][0]
    assert "Emulated results: ascend ran on xconv CANN emulator" in report.read_text()

    cmp_report = tmp_path / "compare.html"
    compared = _xconv("conformance", "compare", str(bundle), "--report", str(cmp_report), env=env)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "EMULATED, not the vendor's hardware: xconv CANN emulator" in compared.stdout
    assert compared.stdout.strip().splitlines()[-2].endswith("([A] emulated, not vendor hardware)")
    assert "Emulated results: [A] ascend ran on xconv CANN emulator" in cmp_report.read_text()


def test_the_cudnn_backend_says_what_it_runs_on_when_it_is_not_the_installed_stack(monkeypatch, capsys):
    """A stand-in CuPy (here a module of no installed distribution, as a fake on sys.path would be) with the real
    cuDNN frontend: available, and labelled emulated naming the stand-in; an injected runtime is labelled too."""
    import types

    from xconv import cli
    from xconv_cudnn import driver
    from xconv_cudnn.backend import CudnnBackend

    fe = pytest.importorskip("cudnn")                       # the real frontend (nvidia-cudnn-frontend)
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.__version__ = "14.0.0"
    fake_cupy.__file__ = "/tmp/not-installed/cupy/__init__.py"
    monkeypatch.setattr(driver, "_installed", lambda name: True)
    monkeypatch.setattr(driver, "_import", lambda name: fake_cupy if name == "cupy" else fe)
    monkeypatch.setattr(driver, "_device_names", lambda cp: ("cuda:0 (NVIDIA H200)",))
    monkeypatch.setattr(driver, "_load_cudnn_runtime", lambda: ("libcudnn.so.9", 91000))
    driver.reset()
    try:
        status = driver.probe()
        assert status.available, status.reason
        assert "CuPy module /tmp/not-installed/cupy/__init__.py is not from its installed distribution" \
            in status.emulation
        assert "frontend" not in status.emulation                # the real frontend is from its wheel
        assert "CuPy module" in CudnnBackend().emulation()
        assert cli.main(["backends"]) == 0
        row = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("cudnn "))
        assert row.split()[1:3] == ["yes", "(emulated)"], row
    finally:
        driver.reset()
    injected = CudnnBackend(runtime=object())
    assert "an injected runtime (object), not CuPy and cuDNN on a GPU" == injected.emulation()
