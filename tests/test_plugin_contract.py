"""The backend contract, enforced at registration (xconv.registry, xconv.backend.contract_problems).

The outside distribution is ``xconv-ducky`` (tests/plugins/xconv_ducky), exposed to subprocesses through a
``.dist-info`` generated from its own pyproject.toml, as tests/test_isolation.py exposes xconv-crashy: a
duck-typed backend without priority or info (defaults taken, and said), an impostor reusing the built-in
name ``numpy`` (refused, both distributions named) and one missing three primitives (refused by name).
Truth: the real NumPy backend's results, and which backend the trace record says ran.
"""

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

import xconv
from xconv.backend import DEFAULTS, REQUIRED, Backend, Completed, contract_problems

REPO = Path(__file__).resolve().parent.parent
DUCKY = REPO / "tests" / "plugins" / "xconv_ducky"


@pytest.fixture(scope="module")
def ducky_env(tmp_path_factory):
    project = tomllib.loads((DUCKY / "pyproject.toml").read_text())["project"]
    site = tmp_path_factory.mktemp("ducky-site")
    dist = site / f"xconv_ducky-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in project["entry-points"].items()))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(DUCKY)]        # first on the path: found before xconv
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _rows(out: str) -> dict:
    """`xconv backends` rows by name, each with its wrapped continuation lines joined (the table keeps within 100
    columns)."""
    rows, name = {}, None
    for line in out.splitlines()[1:]:
        if line.startswith(" ") and name is not None:
            rows[name] += " " + line.strip()
        else:
            name = line.split()[0]
            rows[name] = line
    return rows


def _run(env, *args):
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_xconv_backends_names_both_problems_and_exits_0(ducky_env):
    rc, out, err = _run(ducky_env, "-m", "xconv", "backends")
    assert rc == 0, err
    assert "Traceback" not in out + err and "AttributeError" not in out + err
    rows = _rows(out)
    assert rows["ducky"].split()[1] == "yes"
    assert "contract: missing priority, availability, capabilities_for, version, devices, backward, info" \
           " (defaults used)" in rows["ducky"]
    assert rows["numpy"].split()[1] == "yes" and "refused" not in rows["numpy"]
    assert rows["numpy@xconv-ducky"].split()[1] == "no"
    assert ("refused: the name 'numpy' is already claimed by plugin 'numpy' of distribution xconv; this claim is "
            "from plugin 'ducky' of distribution xconv-ducky") in rows["numpy@xconv-ducky"]
    assert "refused: missing dgrad; missing wgrad; missing bgrad (plugin 'ducky' of distribution xconv-ducky)" \
           in rows["ducky-halfway@xconv-ducky"]
    rc, out, err = _run(ducky_env, "-m", "xconv", "--version")
    assert rc == 0 and "backend ducky" in out, err


PROBE = textwrap.dedent('''
    import json, numpy as np, xconv
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 2))
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, padding=1))
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, padding=1)                                   # automatic selection
        auto = xconv.convolution_backward(dy, x, w, padding=1, bias_sizes=(4,))
        duck = xconv.convolution_backward(dy, x, w, padding=1, bias_sizes=(4,), backend="ducky")
    ref = xconv.convolution_backward(dy, x, w, padding=1, bias_sizes=(4,), backend="numpy-exact")
    ducky = xconv.get_backend("ducky")
    print(json.dumps({
        "ran_on": [r.backend for r in t.records], "numpy_type": type(xconv.get_backend("numpy")).__name__,
        "y_close": bool(np.allclose(y, xconv.conv_fprop(x, w, padding=1, backend="numpy-exact"), rtol=1e-12)),
        "auto_close": all(bool(np.allclose(a, b, rtol=1e-12)) for a, b in zip(auto, ref)),
        "duck_equal": all(bool(np.array_equal(a, b)) for a, b in zip(duck, ref)),
        "duck_calls": ducky.calls, "duck_priority": ducky.priority,
        "names": sorted(xconv.get_backend(n).name for n in ("numpy", "numpy-exact", "ducky"))}))
''')


def test_automatic_selection_still_works_and_the_duck_runs_with_defaults(ducky_env):
    rc, out, err = _run(ducky_env, "-c", PROBE)
    assert rc == 0, err
    r = json.loads(out)
    assert r["ran_on"] == ["numpy", "numpy", "ducky"] and r["numpy_type"] == "NumpyBackend"
    assert r["y_close"] and r["auto_close"] and r["duck_equal"]
    assert r["duck_calls"] == 3 and r["duck_priority"] == 0         # backward composed of dgrad, wgrad, bgrad
    assert r["names"] == ["ducky", "numpy", "numpy-exact"]


class _Duck:
    name = "in-process-duck"
    array_families = ("numpy",)
    capabilities = xconv.Capabilities()

    def fprop(self, x, w, bias, p):
        return xconv.get_backend("numpy-exact").fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        return xconv.get_backend("numpy-exact").dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        return xconv.get_backend("numpy-exact").wgrad(x, dy, p)

    def bgrad(self, dy, p):
        return xconv.get_backend("numpy-exact").bgrad(dy, p)


def test_contract_problems_by_name():
    assert contract_problems(Backend.__new__(type("Full", (Backend,), {"name": "full"}))) == []
    assert contract_problems(_Duck()) == []
    assert contract_problems(object()) == [f"missing {a}" for a in REQUIRED]
    bad = type("Bad", (_Duck,), {"name": "", "priority": "high", "array_families": "numpy", "version": "1.0"})()
    assert contract_problems(bad) == ["name must be a non-empty str, not ''",
                                      "array_families must be a tuple of str, not 'numpy'",
                                      "priority must be a number, not 'high'", "version is not callable"]
    assert set(DEFAULTS) == {"priority", "availability", "capabilities_for", "version", "devices", "backward", "info"}


def test_register_backend_same_rules_in_process():
    with pytest.raises(xconv.ShapeError, match="missing fprop; missing dgrad"):
        xconv.register_backend(type("NoPrimitives", (), {"name": "np-less", "array_families": ("numpy",),
                                                          "capabilities": xconv.Capabilities()})())
    duck = _Duck()
    xconv.register_backend(duck)
    try:
        registered = xconv.get_backend("in-process-duck")
        assert isinstance(registered, Completed) and registered.inner is duck and registered.priority == 0
        row = next(r for r in xconv.list_backends() if r.name == "in-process-duck")
        assert row.available and "contract: missing priority" in row.reason
        x, w = np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3))
        with xconv.trace() as t:
            y = xconv.conv_fprop(x, w)
        assert t.records[0].backend == "numpy"                            # priority 0 ties: the built-in stays first
        np.testing.assert_array_equal(xconv.conv_fprop(x, w, backend="in-process-duck"), y)
        dy = np.ones(y.shape)
        got = xconv.convolution_backward(dy, x, w, backend=duck, bias_sizes=(3,))   # the object itself, completed
        for a, b in zip(got, xconv.convolution_backward(dy, x, w, backend="numpy-exact", bias_sizes=(3,))):
            np.testing.assert_array_equal(a, b)
    finally:
        xconv.unregister_backend("in-process-duck")
    with pytest.raises(xconv.ShapeError, match="missing bgrad"):
        xconv.conv_fprop(np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1)),
                         backend=type("Partial", (_Duck,), {"bgrad": property(lambda self: 1 / 0)})())


def test_an_entry_point_reusing_a_built_in_name_loads_and_its_claim_is_settled(tmp_path):
    """A distribution whose entry point is also called ``numpy`` (and sorts after xconv) and whose backend is
    also called ``numpy``: both plugins load, the built-in keeps the name, the other is listed refused."""
    info = tmp_path / "zz_rival-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zz-rival\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[xconv.backends]\nnumpy = zz_rival\n")
    (tmp_path / "zz_rival.py").write_text(textwrap.dedent('''
        import xconv
        from xconv_numpy import NumpyBackend

        class Rival(NumpyBackend):
            def fprop(self, *args):
                raise RuntimeError("the rival ran")

        @xconv.hookimpl
        def xconv_backends():
            return [Rival()]
    '''))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    rc, out, err = _run(env, "-m", "xconv", "backends")
    assert rc == 0, err
    rows = _rows(out)
    assert rows["numpy"].split()[1] == "yes"
    assert "the name 'numpy' is already claimed by plugin 'numpy' of distribution xconv; this claim is from " \
           "plugin 'numpy' of distribution zz-rival" in rows["numpy@zz-rival"]
    rc, out, err = _run(env, "-c", "import numpy as np, xconv; print(xconv.conv_fprop(np.ones((1, 1, 3)), "
                                   "np.ones((1, 1, 2))).tolist())")
    assert rc == 0 and out.strip() == "[[[2.0, 2.0]]]", err
