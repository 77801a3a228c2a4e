"""Install hints name what works from where xconv is installed; never an unpublished 'xconv' distribution."""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

import xconv
from xconv import install

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_hint_from_a_checkout_names_the_checkout_and_the_extra():
    assert install.checkout() == str(ROOT)
    assert install.hint("cuda12", "cuda13") == (f'pip install -e "{ROOT}[cuda12]" or '
                                                f'pip install -e "{ROOT}[cuda13]"')


def test_hint_from_a_wheel_names_the_extras_packages(monkeypatch):
    monkeypatch.setattr(install, "checkout", lambda: None)
    for extra in ("cuda12", "cuda13", "torch"):
        hint = install.hint(extra)
        assert hint.startswith("pip install ")
        given = [_normal(r) for r in re.findall(r'"([^"]+)"', hint)]
        assert given == [_normal(r) for r in EXTRAS[extra]]


def _normal(requirement: str) -> tuple:
    """(name, sorted specifiers): installed metadata may order a requirement's specifiers differently."""
    name, specs = re.match(r"([A-Za-z0-9_.\-\[\]]+)\s*(.*)", requirement).groups()
    return name.lower(), sorted(s.strip() for s in specs.split(",") if s.strip())


def test_no_hint_anywhere_installs_an_unpublished_xconv_distribution():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    pattern = re.compile(r"""pip install\s+(-U\s+)?['"]?xconv\b(?![-_/])""")
    offenders = []
    for name in files:
        if name == "docs/install.md":  # it says, in so many words, that this command fails
            continue
        text = (ROOT / name).read_text(errors="replace")
        offenders += [f"{name}: {m.group(0)}" for m in pattern.finditer(text)]
    assert offenders == []


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_unavailable_backend_is_returned_and_refuses_its_first_call_with_the_reason():
    backend = xconv.get_backend("cudnn")  # no complaint: its info says why it cannot run
    info = backend.info()
    assert not info.available and install.hint("cuda12") in info.reason
    x = np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(xconv.BackendUnavailableError) as raised:
        xconv.conv_fprop(x, x, backend="cudnn")
    assert raised.value.reason == info.reason


def test_backends_table_shows_the_hint(capsys):
    from xconv import cli

    rows = {r.name: r for r in xconv.list_backends()}
    if rows["cudnn"].available:
        pytest.skip("cudnn is available here")
    assert cli.main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, li in enumerate(lines) if li.startswith("cudnn "))
    entry = [lines[start]] + [li for li in itertools.takewhile(lambda li: li.startswith(" "), lines[start + 1:])]
    assert install.hint("cuda12", "cuda13") in " ".join(" ".join(entry).split())   # the reason wraps within 100 columns
