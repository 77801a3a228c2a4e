"""Command lines that cannot succeed fail before the work: exit 2, one line naming the option, no traceback."""

import os
import subprocess
import sys

import pytest

ONE_CASE = ["--cases", "kernel/k1-s1-p0", "--no-progress"]


def _xconv(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "xconv", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("args, path", [
    (["run", "--backend", "numpy", "--out", "/nonexistent/dir/a.xcr"], "/nonexistent/dir/a.xcr"),
    (["run", "--backend", "numpy", "--out", "{tmp}"], "{tmp}"),
    (["run", "--backend", "numpy", "--out", "{tmp}/a.xcr", "--report", "/nonexistent/r.html"], "/nonexistent/r.html"),
    (["check", "--backend", "numpy", "--report", "/nonexistent/r.html"], "/nonexistent/r.html"),
    (["check", "--backend", "numpy", "--report", "{tmp}"], "{tmp}"),
    (["compare", "{tmp}/missing.xcr", "--report", "/nonexistent/r.html"], "/nonexistent/r.html"),
])
def test_output_paths_are_checked_before_any_case(tmp_path, args, path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    path = path.replace("{tmp}", str(tmp_path))
    extra = ONE_CASE if args[0] != "compare" else []
    proc = _xconv("conformance", *args, *extra)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and path in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""                      # no summary: no case ran
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".xcr-")]


@pytest.mark.parametrize("shape, named", [("2x4x99999999999999999999x8", "input"),
                                          ("4096x4096x4096x4096", "--input 4096x4096x4096x4096")])
def test_xconv_run_refuses_impossible_sizes_by_name(shape, named):
    proc = _xconv("run", "--input", shape, "--repeat", "0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "ArrayMemoryError" not in proc.stderr and "ValueError" not in proc.stderr


@pytest.mark.parametrize("spelling", ["4MB", "4MiB", "4M", "4194304", "4mb"])
def test_workspace_limit_takes_the_usual_byte_spellings(spelling):
    proc = _xconv("run", "--input", "1x2x6x6", "--workspace-limit", spelling, "--repeat", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_bad_byte_count_is_one_line_naming_the_option():
    proc = _xconv("run", "--input", "1x2x6x6", "--workspace-limit", "4XB", "--repeat", "0")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("xconv run: error: argument --workspace-limit: is not a byte count"), last
    assert "<lambda>" not in proc.stderr and "4XB" in last
