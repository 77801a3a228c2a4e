"""``xconv conformance fuzz``: it finds and shrinks a planted bug the corpus misses, replays what it
found, and finds nothing on the real backends within CI's bounded run.

The planted backend is ``planted`` (tests/plugins/xconv_planted): the NumPy backend with grad_weight's
first element 3% too large on grouped convolutions with an even kernel size, a family no corpus case
holds (checked below). It is exposed to the subprocesses through a ``.dist-info`` generated from its
own pyproject.toml, as tests/test_isolation.py exposes xconv_crashy: nothing in xconv names it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_site import plugin_env

from xconv_conformance.cases import case_from_spec, load_corpus

REPO = Path(__file__).resolve().parent.parent
PLANTED = REPO / "tests" / "plugins" / "xconv_planted"
FUZZ_SECONDS = "20"                 # CI's bounded run per backend


def in_family(case) -> bool:
    return case.groups > 1 and any(k % 2 == 0 for k in case.kernel)


@pytest.fixture(scope="module")
def planted_env(tmp_path_factory):
    env = plugin_env(PLANTED, tmp_path_factory.mktemp("planted-site"))
    env.pop("XCONV_PLANTED_BUG", None)
    return env


def _xconv(env, *args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "xconv", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_corpus_holds_no_case_of_the_planted_family():
    assert not [c.id for c in load_corpus() if c.kind == "valid" and in_family(c)]


def test_the_planted_bug_passes_the_corpus_cases_nearest_to_it(planted_env, tmp_path):
    """Grouped, depthwise and even-kernel cases of the corpus all pass: the bound cannot see the bug there."""
    rc, out, err = _xconv(planted_env, "conformance", "run", "--backend", "planted", "--out", str(tmp_path / "p.xcr"),
                          "--no-progress", "--no-isolate", "--cases", "group", "--cases", "depthwise",
                          "--cases", "padding/")
    assert rc == 0, out + err
    row = next(line.split() for line in out.splitlines() if line.startswith("planted "))
    assert int(row[1]) > 20 and row[2] == "0", out


def test_fuzz_finds_and_shrinks_the_planted_bug_and_run_replays_it(planted_env, tmp_path):
    found = tmp_path / "found.jsonl"
    rc, out, err = _xconv(planted_env, "conformance", "fuzz", "--backend", "planted", "--seconds", "60", "--seed", "0",
                          "--out", str(found))
    assert rc == 1, out + err
    lines = out.strip().splitlines()
    assert len(lines) == 1 and found.read_text() == out.strip() + "\n", out
    spec = json.loads(lines[0])
    case = case_from_spec(spec)                                  # the `cases --json` format, round-tripped
    assert case.spec() == spec
    assert in_family(case)                                       # it is the planted family ...
    assert (case.groups, case.c_in, case.c_out, case.n) == (2, 2, 2, 1)      # ... shrunk to its smallest
    assert max(case.kernel) == 2 and max(case.stride) == 1 and max(case.dilation) == 1
    assert case.nd <= 2 and max(case.spatial) <= 2 and case.dtype == "float32"
    assert "found a failing case, shrunk to " + case.id in err and "grad_weight" in err
    # replay: the finding is a regression case for any backend
    rc, out, err = _xconv(planted_env, "conformance", "run", "--backend", "planted", "--cases-from", str(found),
                          "--out", str(tmp_path / "replay.xcr"), "--no-progress")
    assert rc == 1 and f"FAILED {case.id} on planted: grad_weight" in out, out + err
    rc, out, err = _xconv(planted_env, "conformance", "run", "--backend", "numpy", "--cases-from", str(found),
                          "--out", str(tmp_path / "numpy.xcr"), "--no-progress")
    assert rc == 0, out + err


def test_exact_mode_sees_one_unit_in_the_last_place(planted_env, tmp_path):
    """The ``ulp`` bug (one grad_weight element one unit off, on every call) is inside the error bound of
    float32 and float64 results: the corpus's tolerance cases pass it, its exact cases do not (in every
    dtype), and fuzz --exact finds it."""
    env = dict(planted_env, XCONV_PLANTED_BUG="ulp")
    rc, out, err = _xconv(env, "conformance", "check", "--backend", "planted", "--cases", "dtype/2d-f32",
                          "--cases", "dtype/2d-f64", "--cases", "kernel/", "--no-progress", "--no-isolate")
    assert rc == 0, out + err
    rc, out, err = _xconv(env, "conformance", "check", "--backend", "planted", "--exact", "--no-progress",
                          "--no-isolate", "-v")
    assert rc == 1 and "exact mode:" in out, out + err
    row = next(line.split() for line in out.splitlines() if line.startswith("planted "))
    exact = [c for c in load_corpus() if c.fill == "exact"]
    assert row[2] == str(sum(c.mask[1] for c in exact)) and row[1] == str(sum(not c.mask[1] for c in exact)), out
    # compare holds exact bundles to the exact values and to each other, bit for bit
    for name in ("planted", "numpy"):
        _xconv(env, "conformance", "run", "--backend", name, "--exact", "--cases", "f32", "--out",
               str(tmp_path / f"{name}.xcr"), "--no-progress", "--no-isolate")
    rc, out, err = _xconv(env, "conformance", "compare", str(tmp_path / "planted.xcr"), str(tmp_path / "numpy.xcr"))
    assert rc == 1 and "grad_weight: exact mode:" in out and "differ on grad_weight in exact mode" in out, out + err
    rc, out, err = _xconv(env, "conformance", "fuzz", "--backend", "planted", "--exact", "--seconds", "30")
    assert rc == 1 and json.loads(out.splitlines()[0])["fill"] == "exact", out + err


@pytest.mark.parametrize("backend", ["numpy", "torch-cpu", "jax-cpu"])
def test_fuzz_finds_nothing_on_the_real_backends(backend, planted_env):
    import xconv
    rows = {r.name: r for r in xconv.list_backends()}
    if backend not in rows or not rows[backend].available:
        pytest.skip(f"{backend} is not installed here (pip install -e backends/xconv_torch -e backends/xconv_jax)")
    rc, out, err = _xconv(planted_env, "conformance", "fuzz", "--backend", backend, "--seconds", FUZZ_SECONDS,
                          "--seed", "1")
    assert rc == 0 and out == "", out + err
    assert "none failed" in err
    examples = int(err.split(" cases in ")[0].rsplit(" ", 1)[1])
    assert examples >= 5, err                                  # it ran cases (how many depends on the load)
