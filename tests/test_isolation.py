"""The conformance kit survives a backend that crashes or hangs (xconv_conformance.isolation).

The backend is ``crashy`` (tests/plugins/xconv_crashy), an outside plugin distribution that
segfaults, aborts and hangs on chosen configurations and prints to stdout on every call. It is
exposed to the subprocesses below through a ``.dist-info`` generated from its own pyproject.toml
(its entry points), not installed: nothing in xconv names it.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from plugin_site import plugin_env

REPO = Path(__file__).resolve().parent.parent
CRASHY = REPO / "tests" / "plugins" / "xconv_crashy"
TIMEOUT = "3"          # seconds per case: the hanging cases cost this much each


@pytest.fixture(scope="module")
def crashy_env(tmp_path_factory):
    env = plugin_env(CRASHY, tmp_path_factory.mktemp("crashy-site"))
    return env


def _xconv(env, *args, cwd=REPO):
    proc = subprocess.run([sys.executable, "-m", "xconv", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_run_records_crashed_and_timed_out_cases_and_writes_the_bundle(crashy_env, tmp_path):
    out_file, report = tmp_path / "x.xcr", tmp_path / "x.html"
    rc, out = _xconv(crashy_env, "conformance", "run", "--backend", "crashy", "--out", str(out_file),
                     "--case-timeout", TIMEOUT, "-v", "--no-progress", "--cases", "tiny/", "--cases",
                     "deterministic/2d-direct", "--report", str(report))
    assert rc == 1, out
    assert out_file.exists(), out
    page = report.read_text()
    assert "<td class='crashed'>crashed</td>" in page and "<td class='timed_out'>timed out</td>" in page
    assert "crashed: SIGSEGV" in page and "<summary>stderr</summary>" in page
    # the summary counts them; -v names each with its signal, and shows the stderr it wrote
    row = next(line.split() for line in out.splitlines() if line.startswith("crashy "))
    assert row[1:6] == ["11", "0", "3", "2", "0"], out          # passed, failed, crashed, timed out, refused
    assert "CRASHED tiny/3d-f16 on crashy: crashed: SIGSEGV" in out
    assert "CRASHED tiny/3d-f64 on crashy: crashed: SIGABRT" in out
    assert f"TIMED OUT tiny/3d-bf16 on crashy: timed out: still running after {TIMEOUT} s" in out
    assert "crashy: about to segfault" in out and "Segmentation fault" in out      # faulthandler's report
    # the fresh-process determinism check: only the cases that crash or hang there fail
    assert "CRASHED deterministic/2d-direct-f16 on crashy: in the fresh process of the determinism check" in out
    assert "TIMED OUT deterministic/2d-direct-bf16 on crashy: in the fresh process" in out

    with zipfile.ZipFile(out_file) as zf:
        records = {r["id"]: r for r in json.loads(zf.read("manifest.json"))["cases"]}
    assert records["tiny/3d-f16"]["status"] == "crashed" and records["tiny/3d-f16"]["signal"] == "SIGSEGV"
    assert "crashy: about to segfault" in records["tiny/3d-f16"]["stderr"]
    assert records["tiny/3d-f64"]["signal"] == "SIGABRT"
    hung = records["tiny/3d-bf16"]
    assert hung["status"] == "timed_out" and "in _misbehave" in hung["stderr"]     # where it hung (faulthandler)
    assert records["deterministic/2d-direct-f16"]["status"] == "crashed"
    assert records["deterministic/2d-direct-bf16"]["status"] == "timed_out"
    for cid in ("deterministic/2d-direct-f32", "deterministic/2d-direct-f64", "tiny/3d-f32", "tiny/2d-f16"):
        assert records[cid]["status"] == "passed", records[cid]     # stdout noise never reached the channel

    rc, text = _xconv(crashy_env, "conformance", "compare", str(out_file))
    assert rc == 1, text
    assert "crashed" in text and "timed out" in text.replace("timed_out", "timed out")
    line = next(line for line in text.splitlines() if "tiny/3d-f16" in line)
    assert "crashed" in line and "SIGSEGV" in line


def test_pytest_front_end_fails_only_the_case_that_crashes(crashy_env):
    proc = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "conformance"), "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--xconv-backend", "crashy", "--xconv-cases", "tiny/3d-f16",
                           "--xconv-cases", "tiny/3d-f32", "--xconv-case-timeout", TIMEOUT],
                          cwd=REPO, env=crashy_env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "tiny/3d-f16 on crashy: crashed: SIGSEGV" in out and "crashy: about to segfault" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("crashy "))
    assert row[1:5] == ["1", "0", "1", "0"], out             # passed, failed, crashed, timed out


def test_in_process_runs_and_runtime_registered_backends(capsys):
    """--no-isolate runs in the kit's process; a backend registered at run time cannot be rebuilt in a
    worker, so its cases run in-process, with a note that says so."""
    import xconv
    from xconv_conformance import cli
    from xconv_numpy import NumpyBackend

    assert cli.main(["--backend", "numpy", "--cases", "tiny/1d-f32", "--no-progress", "--no-isolate"]) == 0
    backend = NumpyBackend()
    backend.name = "registered-at-run-time"
    xconv.register_backend(backend)
    try:
        assert cli.main(["--backend", backend.name, "--cases", "tiny/1d-f32", "--no-progress"]) == 0
    finally:
        xconv.unregister_backend(backend.name)
    out = capsys.readouterr().out
    assert "note: backend 'registered-at-run-time' is not registered in a fresh process" in out
    assert "not isolated" in out
