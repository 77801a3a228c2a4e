"""The C sources' comments that cite a Python name ("small.py's _s1_plan", "(small.py, _s1_plan)") cite one that
exists: a name removed from Python must not live on as the C code's stated reason."""

from __future__ import annotations

import re
from pathlib import Path

import xconv_numpy

PACKAGE = Path(xconv_numpy.__file__).parent
CITATION = re.compile(r"\b(\w+)\.py(?:'s|,) (\w+)")


def citations():
    for source in sorted((PACKAGE / "csrc").glob("*.[ch]")):
        for n, line in enumerate(source.read_text().splitlines(), 1):
            for module, name in CITATION.findall(line):
                yield f"{source.name}:{n}", module, name


def test_c_comments_cite_python_names_that_exist():
    found = list(citations())
    assert any(f"{m}.py" != "setup.py" for _, m, _ in found), "no citation found: the pattern no longer matches the sources' style"
    stale = []
    for where, module, name in found:
        files = list(PACKAGE.rglob(f"{module}.py"))
        if not files:       # not one of the package's modules (setup.py, in a sentence about the build)
            continue
        if not any(re.search(rf"\b{re.escape(name)}\b", p.read_text()) for p in files):
            stale.append(f"{where}: {module}.py's {name}")
    assert not stale, stale
