"""docs/install.md's wheel commands work as written: `pip wheel` makes a platform wheel holding the three compiled
builds of the NumPy C loops, and the documented install command finds it (run as a dry run, offline)."""

import importlib.util
import os
import platform
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel_block() -> list[str]:
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("## A wheel, to install elsewhere"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_the_documented_wheel_commands_work(tmp_path):
    build, install = _wheel_block()
    assert build.startswith("pip wheel . ") and install.startswith("pip install ")
    src = tmp_path / "src"
    src.mkdir()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):               # a clean copy of the checkout
        dst = src / name
        if (ROOT / name).is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes((ROOT / name).read_bytes())
    pip = f"{sys.executable} -m pip"
    offline = " --no-build-isolation" if importlib.util.find_spec("setuptools") else ""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run(build.replace("pip ", f"{pip} ", 1) + offline + " -q", shell=True, cwd=src, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    wheels = list((src / "dist").glob("xconv-*.whl"))
    assert len(wheels) == 1 and not wheels[0].name.endswith("-none-any.whl"), wheels     # a platform wheel
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    for isa in ("baseline", "avx2", "avx512") if x86 else ("baseline",):     # setup.py's builds
        assert any(re.fullmatch(rf"xconv_numpy/_kernels_{isa}\..*\.(so|pyd)", n) for n in names), (isa, names)
    dry = subprocess.run(install.replace("pip ", f"{pip} ", 1) + " --dry-run --no-deps --no-index", shell=True,
                         cwd=src, env=env, capture_output=True, text=True, timeout=300, executable="/bin/bash")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Would install xconv-0.1.0" in dry.stdout
