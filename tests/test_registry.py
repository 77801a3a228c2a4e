"""Plugin registration through the ``xconv.backends`` entry-point group, from a distribution outside xconv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import xconv

PLUGIN = textwrap.dedent('''
    """A third-party xconv backend: the NumPy reference, 2-D only, under another name."""
    import xconv
    from xconv_numpy import NumpyBackend


    class ThirdParty(NumpyBackend):
        capabilities = xconv.Capabilities(spatial_dims=frozenset({2}), asymmetric_padding=frozenset())
        priority = 10  # preferred for numpy arrays over the built-in backend

        def __init__(self):
            super().__init__()
            self.name = "thirdparty"
            self.priority = 10  # NumpyBackend.__init__ sets its own on the instance
            self.calls = 0

        def version(self):
            return "thirdparty 1.2.3"

        def fprop(self, x, w, bias, p):
            self.calls += 1
            assert p.nd == 2
            return super().fprop(x, w, bias, p)


    @xconv.hookimpl
    def xconv_backends():
        return [ThirdParty()]
''')

PROBE = textwrap.dedent('''
    import json, numpy as np, xconv
    rows = {r.name: [r.available, r.reason, r.version] for r in xconv.list_backends()}
    y = xconv.conv_fprop(np.ones((1, 2, 5)), np.ones((3, 2, 3)), padding=((1, 0),))  # 1-D, asymmetric
    backend = xconv.get_backend("thirdparty") if "thirdparty" in rows and rows["thirdparty"][0] else None
    print(json.dumps({"rows": rows, "y": y.tolist(), "calls": getattr(backend, "calls", None)}))
''')


def _distribution(root, name, entry_points: str, modules: dict[str, str]):
    """A minimal installed distribution (a .dist-info folder) plus its modules, under ``root``."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)


def _probe(path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_third_party_distribution_registers_a_backend(tmp_path):
    _distribution(tmp_path, "xconv_thirdparty", "[xconv.backends]\nthirdparty = thirdparty_plugin\n",
                  {"thirdparty_plugin": PLUGIN})
    result = _probe(tmp_path)
    assert result["rows"]["thirdparty"] == [True, "", "thirdparty 1.2.3"]
    assert result["rows"]["numpy"][0] is True
    assert result["calls"] == 1  # selected for numpy arrays by priority, 1-D lifted to 2-D by the core
    assert result["y"] == [[[4.0, 6.0, 6.0, 6.0]] * 3]


def test_broken_plugin_is_listed_unavailable_and_does_not_break_xconv(tmp_path):
    _distribution(tmp_path, "xconv_broken", "[xconv.backends]\nbroken = no_such_module_xyz\n", {})
    result = _probe(tmp_path)
    available, reason, _ = result["rows"]["broken"]
    assert available is False and "failed to load" in reason and "no_such_module_xyz" in reason
    assert result["y"] == [[[4.0, 6.0, 6.0, 6.0]] * 3]


def test_builtin_backends_listed():
    rows = {r.name: r for r in xconv.list_backends()}
    assert rows["numpy"].available and rows["numpy"].devices == ("cpu",) and "numpy" in rows["numpy"].version
    assert rows["numpy-exact"].available
    assert xconv.get_backend("numpy").capabilities.spatial_dims == frozenset({1, 2, 3})


def test_register_backend_rejects_duplicate_name():
    with pytest.raises(ValueError, match="already registered"):
        xconv.register_backend(xconv.get_backend("numpy"))


def test_hookspec_is_one_documented_hook():
    from xconv import hookspec
    hooks = [n for n in dir(hookspec) if n.startswith("xconv_")]
    assert hooks == ["xconv_backends"] and hookspec.xconv_backends.__doc__
