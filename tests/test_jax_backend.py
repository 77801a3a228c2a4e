"""The JAX backends (backends/xconv_jax, distribution xconv-jax): registration without importing jax,
JAX arrays in and out, NumPy arrays when named, float64 under a scoped x64, masked gradients never
computed, the refusals each platform states.

Their numbers are held against the float64 oracle by the conformance corpus (``pytest conformance``
runs it on jax-cpu); here the truths are the NumPy exact backend and JAX's own autodiff.
"""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import xconv

INSTALL = "pip install -e backends/xconv_jax (JAX's CPU wheel: jax==0.10.2 jaxlib==0.10.2)"
if importlib.util.find_spec("jax") is None or importlib.util.find_spec("xconv_jax") is None:
    pytest.skip(f"JAX or the xconv-jax plugin is not installed: {INSTALL}", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from xconv_jax import kernels, platforms  # noqa: E402
from xconv_jax.backend import JaxBackend  # noqa: E402


def _exact(*arrays, **kw):
    return xconv.convolution_backward(*(np.asarray(a, dtype=np.float64) for a in arrays), backend="numpy-exact", **kw)


def _rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)


def test_importing_the_plugin_imports_no_jax():
    code = ("import sys, xconv_jax.plugin as p; bs = p.xconv_backends(); "
            "print(sorted(b.name for b in bs), 'jax' in sys.modules, 'jaxlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "['jax-cpu', 'jax-gpu', 'jax-tpu'] False False", out
    # nor does listing the backends on a machine without a GPU plugin or libtpu
    code = "import sys, xconv; rows = xconv.list_backends(); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if not platforms.gpu_plugins() and importlib.util.find_spec("libtpu") is None:
        assert out.stdout.strip() == "False", out


def test_registered_through_its_entry_point_with_reasons_where_no_device():
    rows = {r.name: r for r in xconv.list_backends()}
    assert rows["jax-cpu"].available and rows["jax-cpu"].version.startswith("jax ")
    for name in ("jax-gpu", "jax-tpu"):
        assert rows[name].available or rows[name].reason, name
    if not rows["jax-tpu"].available:
        assert "tpu" in rows["jax-tpu"].reason.lower()


def test_probes_that_import_jax_give_reasons(monkeypatch):
    """Where the installed files do not settle it, jax.devices(platform) is asked (a CPU-only jaxlib here)."""
    monkeypatch.setattr(platforms, "_without_import", lambda platform: None)
    assert platforms.probe("cpu") == (True, "")
    if not jax.devices()[0].platform == "gpu":
        available, reason = platforms.probe("gpu")
        assert not available and "gpu" in reason


def test_jax_arrays_in_jax_arrays_out_without_naming_the_backend():
    x, w = jnp.asarray(_rand(2, 3, 9, 7)), jnp.asarray(_rand(4, 3, 3, 2, seed=1))
    dy = jnp.asarray(_rand(2, 4, 5, 4, seed=2))
    with xconv.trace() as t:
        got = xconv.convolution_backward(dy, x, w, stride=2, padding=((1, 2), (0, 1)))
    assert t.records[0].backend == "jax-cpu"
    assert all(isinstance(g, jax.Array) for g in got)
    want = _exact(dy, x, w, stride=2, padding=((1, 2), (0, 1)))
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-5)
    y = xconv.conv_fprop(x, w, stride=2, padding=((1, 2), (0, 1)), bias=jnp.ones(4, jnp.float32))
    assert isinstance(y, jax.Array) and y.shape == dy.shape


def test_numpy_arrays_only_when_named_and_results_are_new_writable_arrays():
    x, w = _rand(2, 3, 8), _rand(6, 1, 3, seed=1)
    x.flags.writeable = False
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, groups=3)
    assert t.records[0].backend == "numpy"                       # NumPy arrays go to NumPy unless named
    y = xconv.conv_fprop(x[:, :, ::-1], w, groups=3, backend="jax-cpu")
    assert isinstance(y, np.ndarray) and y.flags.writeable and y.flags.c_contiguous
    np.testing.assert_allclose(y, xconv.conv_fprop(x[:, :, ::-1], w, groups=3, backend="numpy-exact"),
                               rtol=1e-5, atol=1e-5)


def test_transposed_is_jax_autodiff_of_the_direct_convolution_3d():
    """A transposed convolution is the input gradient of the direct one: JAX's own vjp of
    lax.conv_general_dilated gives it independently of the backend's lhs_dilation form."""
    kw = dict(stride=(2, 1, 2), padding=1, dilation=(1, 2, 1), groups=2, transposed=True, output_padding=(1, 0, 1))
    x, w = _rand(2, 4, 3, 4, 3), _rand(4, 3, 2, 2, 3, seed=1)
    y = xconv.conv_fprop(x, w, backend="jax-cpu", **kw)
    dims = jax.lax.ConvDimensionNumbers((0, 1, 2, 3, 4), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4))
    direct = lambda z: jax.lax.conv_general_dilated(z, jnp.asarray(w), (2, 1, 2), [(1, 1)] * 3,  # noqa: E731
                                                    rhs_dilation=(1, 2, 1), dimension_numbers=dims,
                                                    feature_group_count=2, precision="highest")
    _, pullback = jax.vjp(direct, jnp.zeros(y.shape))
    np.testing.assert_allclose(y, np.asarray(pullback(jnp.asarray(x))[0]), rtol=1e-5, atol=1e-5)
    dy = _rand(*y.shape, seed=3)
    got = xconv.convolution_backward(dy, x, w, backend="jax-cpu", **kw)
    for g, e in zip(got, _exact(dy, x, w, **kw)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def _convolutions(p, mask):
    fn = kernels.backward_fn(kernels.cache_key(p), "HIGHEST", mask)
    args = [jnp.zeros(p.output_shape)] + ([jnp.zeros(p.input_shape)] if mask[1] else []) + (
        [jnp.zeros(p.weight_shape)] if mask[0] else [])
    if mask[0] and mask[1]:
        args = [args[0], jnp.zeros(p.input_shape), jnp.zeros(p.weight_shape)]
    return fn.lower(*args).compile().as_text().count("convolution(")


@pytest.mark.parametrize("transposed", [False, True])
def test_a_masked_gradient_is_never_computed(transposed):
    from xconv.params import make_params
    p = make_params((2, 4, 8, 8), (4, 4, 3, 3), dtype="float32", stride=2, padding=1, transposed=transposed,
                    output_padding=1 if transposed else 0)
    assert _convolutions(p, (True, False, False)) == 1
    assert _convolutions(p, (False, True, False)) == 1
    assert _convolutions(p, (True, True, False)) == 2
    assert _convolutions(p, (False, False, True)) == 0


def test_float64_in_a_scoped_x64_leaves_the_global_setting():
    assert not jax.config.jax_enable_x64
    x, w = _rand(1, 2, 6, dtype=np.float64), _rand(3, 2, 3, seed=1, dtype=np.float64)
    dx, dw, db = xconv.convolution_backward(np.ones((1, 3, 4)), x, w, backend="jax-cpu")
    assert dx.dtype == np.float64 and dw.dtype == np.float64
    want = _exact(np.ones((1, 3, 4)), x, w)
    np.testing.assert_allclose(dw, want[1], rtol=1e-13)          # float64 precision, not float32
    assert not jax.config.jax_enable_x64


def test_half_precision_accumulates_in_float32_and_rounds_once():
    x, w = _rand(1, 64, 32).astype(np.float16), _rand(1, 64, 32, seed=1).astype(np.float16)
    y = xconv.conv_fprop(x, w, backend="jax-cpu")                 # one output: a dot product of 2048 terms
    exact = float(np.dot(x.astype(np.float64).ravel(), w.astype(np.float64).ravel()))
    assert y.dtype == np.float16 and abs(float(y.ravel()[0]) - exact) <= abs(exact) * 2.0**-11 + 2.0**-14


def test_refusals_are_named():
    x, w = _rand(2, 3, 8), _rand(4, 3, 3, seed=1)
    with pytest.raises(xconv.UnsupportedError, match="batch-invariant"):
        xconv.conv_fprop(x, w, backend="jax-cpu", deterministic="batch_invariant")
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit"):
        xconv.conv_fprop(x, w, backend="jax-cpu", workspace_limit=1 << 20)
    assert "float64" not in xconv.get_backend("jax-tpu").capabilities.dtypes


def test_gpu_determinism_needs_the_xla_flag_at_start(monkeypatch):
    from xconv.params import make_params
    p = make_params((1, 1, 4), (1, 1, 3), deterministic=True)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    gpu = JaxBackend("gpu")
    gpu._probe = (True, "")
    gpu._deterministic_flag = platforms.deterministic_flag_set()
    with pytest.raises(xconv.UnsupportedError, match="xla_gpu_deterministic_ops"):
        gpu._precision(p)
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    gpu = JaxBackend("gpu")
    gpu._probe = (True, "")
    gpu._deterministic_flag = platforms.deterministic_flag_set()
    assert gpu._precision(p) == "HIGHEST"
    with pytest.raises(xconv.UnsupportedError, match="not been proven"):
        JaxBackend("tpu")._precision(p)
    assert JaxBackend("tpu")._precision(make_params((1, 1, 4), (1, 1, 3), math="allow_tf32")) == "HIGH"


def test_deterministic_cpu_results_repeat_bitwise():
    x, w = _rand(4, 16, 12, 12), _rand(16, 16, 3, 3, seed=1)
    dy = _rand(4, 16, 12, 12, seed=2)
    first = xconv.convolution_backward(dy, x, w, padding=1, backend="jax-cpu", deterministic=True)
    second = xconv.convolution_backward(dy, x, w, padding=1, backend="jax-cpu", deterministic=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
