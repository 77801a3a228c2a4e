"""Install hints that work from where the user stands.

No distribution named ``xconv`` is published on a package index (docs/install.md), so a hint
never names that distribution. When xconv was installed from a checkout (``pip install -e
.``, recorded in the installation's ``direct_url.json``) a hint names that checkout with the
extra; otherwise it names the extra's own packages, read from the installed metadata (the
extras of ``pyproject.toml``), which pip can install from anywhere.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "xconv"

#: The CPU-only PyTorch build: PyTorch's own package index for CPU wheels.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@functools.lru_cache(maxsize=None)
def checkout() -> str | None:
    """The checkout this xconv runs from (an editable install), else the local directory it was installed
    from (``direct_url.json``), else None (installed from a wheel or an index)."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "xconv" / "__init__.py").is_file():
        return str(root)
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        except (ValueError, OSError):
            continue
        parsed = urlparse(url)
        if parsed.scheme == "file" and parsed.path and Path(unquote(parsed.path)).is_dir():
            return unquote(parsed.path)
    return None


@functools.lru_cache(maxsize=None)
def extra_requirements(extra: str) -> tuple[str, ...]:
    """The requirements the installed xconv lists for ``extra`` (without their markers)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    marker = re.compile(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""")
    return tuple(r.split(";", 1)[0].strip() for r in requires if ";" in r and marker.search(r.split(";", 1)[1]))


def hint(*extras: str) -> str:
    """A pip command (or several, joined by "or") that installs ``extras`` of xconv from where it is installed."""
    root = checkout()
    commands = []
    for extra in extras:
        if root:
            commands.append(f'pip install -e "{root}[{extra}]"')
        elif extra_requirements(extra):
            commands.append("pip install " + " ".join(f'"{r}"' for r in extra_requirements(extra)))
        else:
            commands.append(f'pip install -e ".[{extra}]" from an xconv checkout')
    return " or ".join(commands)


def torch_hint() -> str:
    """How to get PyTorch's CPU build, which the torch bridge and the cross-checks need."""
    return f"pip install torch --index-url {TORCH_CPU_INDEX} (the CPU build; docs/torch.md)"
