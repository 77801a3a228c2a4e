"""The kit at scale: ``run --shard K/N`` and ``compare`` merging shard bundles (xconv_conformance.merge)."""

import subprocess
import sys
from pathlib import Path

from xconv_conformance.bundle import load_bundle
from xconv_conformance.merge import merge_shards

REPO = Path(__file__).resolve().parent.parent
SELECT = ["--cases", "tiny/", "--cases", "mask/", "--cases", "exact/f32"]


def _xconv(*args):
    proc = subprocess.run([sys.executable, "-m", "xconv", "conformance", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _run(tmp_path, name, *extra):
    path = tmp_path / f"{name}.xcr"
    rc, out = _xconv("run", "--backend", "numpy", "--out", str(path), "--no-progress", "--no-isolate", *SELECT, *extra)
    assert rc == 0, out
    return path


def test_merged_shards_equal_the_unsharded_run(tmp_path):
    whole = _run(tmp_path, "whole")
    shards = [_run(tmp_path, f"s{k}", "--shard", f"{k}/3") for k in (1, 2, 3)]
    sizes = [len(load_bundle(str(s)).manifest["cases"]) for s in shards]
    total = len(load_bundle(str(whole)).manifest["cases"])
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
    merged = merge_shards([load_bundle(str(s)) for s in reversed(shards)])
    assert not merged.gaps and len(merged.bundles) == 1
    m, w = merged.bundles[0], load_bundle(str(whole))
    assert m.manifest["corpus"]["case_ids"] == w.manifest["corpus"]["case_ids"]
    for a, b in zip(m.manifest["cases"], w.manifest["cases"]):
        assert (a["id"], a["status"], a["digests"]) == (b["id"], b["status"], b["digests"])
        for name in ("grad_input", "grad_weight", "grad_bias"):
            x, y = m.output(a, name), w.output(b, name)
            assert (x is None and y is None) or (x.tobytes() == y.tobytes())
    rc, out = _xconv("compare", *map(str, shards), str(whole))
    assert rc == 0, out
    assert f"numpy merged from shards [1, 2, 3] of 3: {total} of {total} cases" in out
    assert f"{total} case(s) compared in all 2 bundles: all agree" in out


def test_overlapping_shards_are_refused_and_gaps_reported(tmp_path):
    s1, s2 = _run(tmp_path, "s1", "--shard", "1/3"), _run(tmp_path, "s2", "--shard", "2/3")
    rc, out = _xconv("compare", str(s1), str(s2), str(s1))
    assert rc == 2 and "overlapping shards" in out and "shard 1/3" in out, out
    rc, out = _xconv("compare", str(s1), str(s2))
    assert rc == 1 and "gap: numpy lacks shard(s) 3/3" in out, out


def test_shard_argument_is_checked():
    rc, out = _xconv("run", "--backend", "numpy", "--out", "x.xcr", "--shard", "4/3")
    assert rc == 2 and "1 <= K <= N" in out


def test_pytest_xdist_runs_the_corpus_and_prints_the_kit_summary():
    pytest = __import__("pytest")
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install -e \".[test]\"")
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", "-n", "2", "-q", "-p", "no:cacheprovider",
                           "--xconv-backend", "numpy", "--xconv-cases", "tiny/", "--xconv-cases", "exact/f32-1d"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("numpy "))
    assert row[1:3] == ["13", "0"], proc.stdout[-2000:]        # the controller's summary of the workers' cases
