"""`xconv run` prints the trace record of its call."""

import subprocess
import sys


def test_run_prints_record():
    out = subprocess.run([sys.executable, "-m", "xconv", "run", "--input", "2,8,6,6", "--weight", "4,8,1,1", "--padding", "0",
                          "--deterministic", "batch_invariant", "--workspace-limit", "1MiB", "--repeat", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("record: ")]
    # 1 MiB admits the small-call path (its scratch bound fits: a limit that constrains nothing changes no path); a 1x1
    # takes its columns and one product (paths.cost_pick), not its grid loops
    assert "backward on numpy" in line and "small-cols: small-call C columns" in line
    assert "deterministic=batch_invariant" in line and "workspace_bytes=" in line


def test_bad_limit_named():
    out = subprocess.run([sys.executable, "-m", "xconv", "run", "--workspace-limit", "lots"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "--workspace-limit" in out.stderr
