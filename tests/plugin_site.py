"""Expose a plugin distribution folder under tests/plugins/ to a subprocess without building it: a hand-written
``.dist-info`` (METADATA and entry_points.txt from the folder's pyproject.toml) in ``site``, and an environment
whose PYTHONPATH puts ``site``, the folder and the kit first."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def plugin_env(folder: Path, site: Path) -> dict:
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    dist = site / f"{folder.name}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                     for group, eps in project["entry-points"].items())
    (dist / "entry_points.txt").write_text(points)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(folder), str(REPO / "conformance")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
