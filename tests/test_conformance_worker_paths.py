"""Conformance workers never import code from the directory the kit is run in."""

import os
import subprocess
import sys
import textwrap

from xconv_conformance import isolation
from xconv_conformance.cases import load_corpus

PLANTED = textwrap.dedent("""
    import os, pathlib
    pathlib.Path(os.environ["XCONV_TEST_MARKER_DIR"], "ran-" + __name__ + "-" + str(os.getpid())).touch()
    raise SystemExit("planted module executed")
""")


def _plant(cwd):
    (cwd / "xconv_conformance").mkdir()
    (cwd / "xconv_conformance" / "__init__.py").write_text(PLANTED)
    (cwd / "xconv_conformance" / "worker.py").write_text(PLANTED)
    (cwd / "numpy.py").write_text(PLANTED)


def test_worker_command_is_isolated_from_the_current_directory():
    cmd = isolation.worker_command("3", "4")
    assert cmd[0] == sys.executable and cmd[-2:] == ["3", "4"]
    assert "-P" in cmd or "del sys.path[0]" in cmd[2]
    env = {"PYTHONPATH": os.pathsep.join(["", "rel", "/abs"])}
    entries = isolation.worker_pythonpath(env).split(os.pathsep)
    assert "" not in entries and all(os.path.isabs(e) for e in entries)
    assert entries[0] == isolation._kit_path() and os.path.abspath("rel") in entries and "/abs" in entries


def test_planted_modules_in_the_working_directory_never_run(tmp_path):
    cwd = tmp_path / "work"
    cwd.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    _plant(cwd)
    # the parent is started from a script in another folder (sys.path[0] is that folder, as for the
    # installed `xconv` script), so only the workers could pick the planted files up
    launcher = tmp_path / "bin" / "xconv_launcher.py"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom xconv.cli import main\nsys.exit(main())\n")
    env = dict(os.environ, XCONV_TEST_MARKER_DIR=str(markers))
    proc = subprocess.run([sys.executable, str(launcher), "conformance", "check", "--backend", "numpy",
                           "--cases", "kernel/k1-s1-p0", "--no-progress"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert list(markers.iterdir()) == [], proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planted module executed" not in proc.stdout + proc.stderr


def test_a_worker_started_in_a_planted_directory_serves_cases(tmp_path, monkeypatch):
    """One worker, started directly (no parent CLI), in a folder holding the planted files."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    _plant(cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XCONV_TEST_MARKER_DIR", str(markers))
    case = next(c for c in load_corpus() if c.id == "kernel/k1-s1-p0")
    with isolation.CaseRunner("numpy", isolate=True) as runner:
        out = runner.run(case)
    assert list(markers.iterdir()) == []
    assert out.status == "passed", out.message
