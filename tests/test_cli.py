"""The xconv command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xconv


# the console script installed next to this interpreter (a bare "xconv" could be another installation's)
SCRIPT = Path(sys.executable).with_name("xconv")


def run(*args, module=False):
    if not module and not SCRIPT.exists():
        pytest.skip(f"no xconv console script next to {sys.executable}")
    cmd = [sys.executable, "-m", "xconv", *args] if module else [str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_backends_table():
    out = run("backends")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "available", "devices,"]
    assert any(line.startswith("numpy ") and " yes " in line for line in lines)
    assert max(map(len, lines)) <= 100, out.stdout              # within 100 columns; -v has every field
    verbose = run("backends", "-v").stdout
    assert "numpy: available" in verbose and "  version: xconv " in verbose


def test_run_backward_prints_shapes_checksums_and_time():
    out = run("run", "--input", "2,4,9", "--weight", "6,2,3", "--groups", "2", "--padding", "1:2", "--stride", "2",
              "--mask", "101", "--dtype", "float64", "--repeat", "2", module=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "grad_input: shape=(2, 4, 9) dtype=float64" in text
    assert "grad_weight: None (masked)" in text
    assert "grad_bias: shape=(6,)" in text
    assert "time: median" in text
    # the checksum is of the real result: recompute it here
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9))
    w = rng.standard_normal((6, 2, 3))
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, stride=2, padding=[(1, 2)], groups=2))
    dx, _, db = xconv.convolution_backward(dy, x, w, stride=2, padding=[(1, 2)], groups=2,
                                           output_mask=(True, False, True))
    assert f"sum={dx.sum():.6e}" in text and f"sum={db.sum():.6e}" in text


def test_run_fprop_transposed():
    out = run("run", "--op", "fprop", "--input", "1,4,5,5", "--weight", "4,3,3,3", "--transposed", "--stride", "2",
              "--output-padding", "1", "--padding", "1", "--repeat", "0")
    assert out.returncode == 0, out.stderr
    assert "output: shape=(1, 3, 10, 10)" in out.stdout


def test_run_explain_names_each_output_s_path_and_rule():
    """--explain: per path, the outputs it computed and the rule of the NumPy backend's table that chose it."""
    out = run("run", "--input", "2,3,9,9", "--weight", "5,3,3,3", "--mask", "011", "--backend", "numpy",
              "--repeat", "0", "--explain", module=True)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("explain: ")]
    bias = "explain: backward path: bias-sum: float64 row sums in sample order [grad_bias: always]"
    assert lines == ["explain: backward path: small-c: small-call C grid loops [grad_weight: cost model: small-c "
                     "cheapest (cost.py)]", bias], lines


def test_run_reports_invalid_arguments_as_usage_errors():
    out = run("run", "--groups", "3")
    assert out.returncode == 2
    assert "ShapeError: groups: must divide input's channel count" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("run", "--backend", "nope")
    assert out.returncode == 2
    assert "no backend named 'nope' is registered (registered: " in out.stderr and "numpy" in out.stderr


def test_backends_lists_every_settings_problem_and_blames_no_plugin():
    import os
    env = dict(os.environ, XCONV_NUMPY_ISA="bogus", XCONV_WORKSPACE_LIMIT="lots")
    if not SCRIPT.exists():
        pytest.skip(f"no xconv console script next to {sys.executable}")
    out = subprocess.run([str(SCRIPT), "backends"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr                       # the listing is the diagnosis (docs: cmd_backends)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("settings problems (2):")
    block = "\n".join(lines[:lines.index("")])
    assert "XCONV_WORKSPACE_LIMIT: is not a byte count" in block and "given 'lots'" in block
    assert "XCONV_NUMPY_ISA: is not a build" in block and "given 'bogus'" in block
    table = lines[lines.index("") + 1:]
    assert table[0].split()[:3] == ["name", "available", "devices,"]
    assert not any("XCONV_WORKSPACE_LIMIT" in l or "XCONV_NUMPY_ISA" in l or "raised" in l for l in table), out.stdout
    assert max(map(len, lines)) <= 100, out.stdout
    verbose = subprocess.run([str(SCRIPT), "backends", "-v"], capture_output=True, text=True, timeout=120,
                             env=env).stdout
    numpy_rows = verbose[verbose.index("\nnumpy: available"):verbose.index("\nnumpy-exact:")]
    assert "compiled loops: not known while XCONV_NUMPY_ISA is bad" in numpy_rows     # its own variable only
    assert "WORKSPACE" not in numpy_rows
