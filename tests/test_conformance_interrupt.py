"""Ctrl-C (SIGINT) in `check` prints the summary of what finished; in `run` it writes a partial bundle marked
interrupted. A subprocess is interrupted once a few cases have run (a slow backend leaves a file per call)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

SLOW = textwrap.dedent("""
    import os, pathlib, time
    import xconv
    from xconv_numpy import NumpyBackend

    class Slow(NumpyBackend):
        def __init__(self):
            super().__init__()
            self.name = "slow-numpy"

        def backward(self, dy, x, w, p, mask):
            calls = pathlib.Path(os.environ["XCONV_TEST_CALLS"])
            (calls / f"{time.monotonic_ns()}").touch()
            time.sleep(0.3)
            return super().backward(dy, x, w, p, mask)

    xconv.register_backend(Slow(), replace=True)
""")

def _sigint_default():
    """A child of a background job inherits SIGINT ignored (then Python installs no handler): restore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)



def _start(tmp_path, *args):
    (tmp_path / "slow_plugin_mod.py").write_text(SLOW)
    calls = tmp_path / "calls"
    calls.mkdir()
    env = dict(os.environ, XCONV_TEST_CALLS=str(calls))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "xconv", "conformance", *args, "--import", "slow_plugin_mod",
                             "--backend", "slow-numpy", "--cases", "tiny", "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    deadline = time.monotonic() + 300
    while len(list(calls.iterdir())) < 4:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the run ended or hung before 4 calls: {out}{err}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_ctrl_c_in_check_prints_the_summary_of_what_finished(tmp_path):
    code, out, err = _start(tmp_path, "check")
    assert code == 130, out + err
    row = next(li for li in out.splitlines() if li.startswith("slow-numpy "))
    passed = int(row.split()[1])
    assert 1 <= passed < 12, row
    assert "interrupted (Ctrl-C) after" in out and "of 12 case(s) on slow-numpy" in out, out
    assert "Traceback" not in err, err


def test_ctrl_c_in_run_writes_a_partial_bundle_marked_interrupted(tmp_path):
    out_path = tmp_path / "partial.xcr"
    code, out, err = _start(tmp_path, "run", "--out", str(out_path))
    assert code == 130, out + err
    assert "Traceback" not in err, err
    with zipfile.ZipFile(out_path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    done = manifest["interrupted"]["after"]
    assert manifest["interrupted"]["of"] == 12 and 1 <= done < 12
    assert len(manifest["cases"]) == done == len(manifest["corpus"]["case_ids"])
    assert f"partial: interrupted after {done} of 12 cases" in out
    cmp = subprocess.run([sys.executable, "-m", "xconv", "conformance", "compare", str(out_path)],
                         capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    assert f"PARTIAL: its run was interrupted after {done} of 12 cases" in cmp.stdout
