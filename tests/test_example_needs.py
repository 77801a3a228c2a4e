"""examples/train_digits.py says what to install when PyTorch or scikit-learn is missing (no raw ModuleNotFoundError)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


@pytest.mark.parametrize("hidden, named", [("sklearn", "scikit-learn"), ("torch", "torch")])
def test_the_digits_example_says_what_to_install(tmp_path, hidden, named):
    """Run as a script with one package unimportable: one message naming what to install, exit 2, no traceback."""
    code = (f"import sys, runpy; sys.modules[{hidden!r}] = None; sys.argv = ['train_digits.py', '--quick']; "
            f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert 'pip install -e ".[torch]" scikit-learn' in proc.stderr and f"missing here: {named}" in proc.stderr
