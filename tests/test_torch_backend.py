"""The torch backends (backends/xconv_torch, distribution xconv-torch): registration, arrays in and out,
the core's legalization on torch tensors, scoped determinism and math settings.

Their numbers are held against the float64 oracle by the conformance corpus (``pytest conformance``
runs it on torch-cpu); here the truths are the NumPy exact backend and PyTorch's own autograd.
"""

import subprocess
import sys
import threading

import numpy as np
import pytest

import xconv

torch = pytest.importorskip("torch")
xconv_torch = pytest.importorskip("xconv_torch")

from xconv_torch import settings  # noqa: E402


def _exact(*arrays, **kw):
    return xconv.convolution_backward(*(np.asarray(a, dtype=np.float64) for a in arrays), backend="numpy-exact", **kw)


def test_importing_the_plugin_imports_no_torch():
    code = ("import sys, xconv_torch.plugin as p; bs = p.xconv_backends(); "
            "print(sorted(b.name for b in bs), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "['torch-cpu', 'torch-cuda', 'torch-mps', 'torch-npu', 'torch-xpu'] False", out


def test_registered_through_its_entry_point_with_reasons_where_no_device():
    rows = {r.name: r for r in xconv.list_backends()}
    assert rows["torch-cpu"].available and rows["torch-cpu"].version.startswith("torch ")
    for name in ("torch-cuda", "torch-mps", "torch-xpu", "torch-npu"):
        if not rows[name].available:
            assert rows[name].reason, name
    if not rows["torch-npu"].available:
        assert "torch_npu" in rows["torch-npu"].reason or "NPU" in rows["torch-npu"].reason


def test_probes_that_import_torch_give_reasons(monkeypatch):
    """Where the installed files do not settle availability, torch itself is asked (a CPU build here)."""
    from xconv_torch import devices
    monkeypatch.setattr(devices, "_without_import", lambda device_type: None)
    assert devices.probe("cpu") == (True, "")
    for device_type in ("cuda", "mps", "xpu", "npu"):
        available, reason = devices.probe(device_type)
        assert not available and reason, device_type
    assert "torch_npu" in devices.probe("npu")[1]


def test_refusals_are_stated_in_capabilities():
    mps, xpu, npu = (xconv.get_backend(f"torch-{t}").capabilities for t in ("mps", "xpu", "npu"))
    assert "float64" not in mps.dtypes and not mps.deterministic
    assert "float64" not in xpu.dtypes and not xpu.deterministic
    assert "float64" not in npu.dtypes
    assert xconv.get_backend("torch-cpu").capabilities.dtypes == {"float16", "bfloat16", "float32", "float64"}


def test_torch_tensors_in_torch_tensors_out_zero_copy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 9, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, stride=2, padding=1, groups=2)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(y, (x, w), dy)
    seen = []
    aten = torch.ops.aten                       # the real namespace, held before the patch replaces it
    real = aten.convolution_backward

    class Spy:
        def __getattr__(self, name):
            return getattr(aten, name)

        @staticmethod
        def convolution_backward(*args):
            seen.extend(a.data_ptr() for a in args[:3])
            return real(*args)

    from unittest import mock
    # one call before the patch: whatever torch imports lazily on a first call must not see the spy
    xconv.convolution_backward(dy, x, w, stride=2, padding=1, groups=2, backend="torch-cpu",
                               output_mask=(True, True, False))
    with mock.patch.object(torch.ops, "aten", Spy()):
        dx, dw, db = xconv.convolution_backward(dy, x, w, stride=2, padding=1, groups=2, backend="torch-cpu",
                                                output_mask=(True, True, False))
    assert seen == [dy.data_ptr(), x.data_ptr(), w.data_ptr()]          # the caller's memory, no copy
    assert isinstance(dx, torch.Tensor) and isinstance(dw, torch.Tensor) and db is None
    torch.testing.assert_close(dx, want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, want[1], rtol=1e-12, atol=1e-12)


def test_numpy_in_numpy_out_read_only_reversed_and_fortran_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    dy = np.asfortranarray(rng.standard_normal((2, 4, 7, 7)).astype(np.float32))
    x.flags.writeable = False
    w_reversed = np.ascontiguousarray(w[:, :, ::-1, ::-1])[:, :, ::-1, ::-1]      # negative strides, w's values
    got = xconv.convolution_backward(dy, x, w_reversed, padding=1, backend="torch-cpu")
    want = _exact(dy, x, w, padding=1)
    for g_, e in zip(got, want):
        assert type(g_) is np.ndarray and g_.dtype == np.float32
        np.testing.assert_allclose(g_, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("conf", [
    dict(x=(1, 2, 9), w=(3, 2, 4), padding=((2, 1),)),                                 # 1-D, asymmetric
    dict(x=(2, 4, 8, 7), w=(4, 2, 3, 3), stride=2, padding="same", groups=2),          # same, any stride
    dict(x=(1, 2, 5, 4), w=(2, 3, 3, 3), stride=2, transposed=True, output_padding=1),
    dict(x=(1, 2, 4, 4), w=(2, 3, 3, 3), stride=2, dilation=3, transposed=True, output_padding=2),  # op >= stride
    dict(x=(1, 2, 4, 5, 3), w=(4, 2, 2, 3, 1), stride=(1, 2, 1), padding="same_lower"),  # 3-D
    dict(x=(0, 2, 6, 6), w=(3, 2, 3, 3), padding=1),                                    # empty batch
])
def test_legalized_semantics_on_torch_tensors_match_the_oracle(conf):
    conf = dict(conf)
    xs, ws = conf.pop("x"), conf.pop("w")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(xs, generator=g, dtype=torch.float64)
    w = torch.randn(ws, generator=g, dtype=torch.float64)
    y = xconv.conv_fprop(x, w, backend="torch-cpu", **conf)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), xconv.conv_fprop(x.numpy(), w.numpy(), backend="numpy-exact", **conf),
                               rtol=1e-12, atol=1e-12)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    for mask in ((True, True, True), (False, True, False)):
        got = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="torch-cpu", **conf)
        want = _exact(dy.numpy(), x.numpy(), w.numpy(), output_mask=mask, **conf)
        for g_, e in zip(got, want):
            assert (g_ is None) == (e is None)
            if e is not None:
                np.testing.assert_allclose(g_.numpy(), e, rtol=1e-11, atol=1e-11)


def test_float16_on_the_cpu_is_accumulated_in_float32():
    """torch's CPU float16 kernels accumulate in float16; the backend widens them (docs/backends.md)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 6, 6)).astype(np.float16)
    w = rng.standard_normal((8, 64, 3, 3)).astype(np.float16)
    got = xconv.conv_fprop(x, w, backend="torch-cpu")
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact").astype(np.float16)
    assert got.dtype == np.float16
    assert np.max(np.abs(got.astype(np.float64) - want)) <= np.max(np.abs(want)) * 2 ** -10


def test_tensors_on_another_device_are_refused_by_name():
    """The backend refuses tensors on a device it does not run; through the public call, meta tensors are
    shape-only (xconv's torch operators propagate shapes on them, as torch's own operators do)."""
    from xconv.params import make_params

    x, w = torch.empty(1, 2, 5, 5, device="meta"), torch.empty(3, 2, 3, 3, device="meta")
    with pytest.raises(xconv.UnsupportedError, match="torch-cpu.*meta"):
        xconv.get_backend("torch-cpu").fprop(x, w, None, make_params(x.shape, w.shape, dtype="float32"))
    y = xconv.conv_fprop(x, w, backend="torch-cpu")
    assert y.device.type == "meta" and tuple(y.shape) == (1, 3, 3, 3)


def test_scoped_settings_are_restored_and_do_not_leak_between_threads():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.deterministic,
              torch.backends.mkldnn.conv.fp32_precision)
    inside_a = threading.Event()
    release_a = threading.Event()
    seen = {}

    def a():
        with settings.scoped(torch, "cpu", True, "keep_dtype"):
            seen["a"] = (torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.conv.fp32_precision)
            inside_a.set()
            release_a.wait(10)

    def b():
        with settings.scoped(torch, "cpu", False, "allow_tf32"):
            seen["b"] = (torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.conv.fp32_precision)

    ta = threading.Thread(target=a)
    ta.start()
    assert inside_a.wait(10)
    tb = threading.Thread(target=b)
    tb.start()
    tb.join(0.3)
    assert tb.is_alive()                    # b waits for a's call to end: a's settings cannot reach it
    release_a.set()
    ta.join(10)
    tb.join(10)
    assert seen["a"] == (True, "ieee")
    assert seen["b"] == (before[0], "tf32")
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.deterministic,
            torch.backends.mkldnn.conv.fp32_precision) == before


def test_deterministic_calls_repeat_bit_for_bit_and_leave_torch_settings_alone():
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((4, 8, 12, 12)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 8, 3, 3)).astype(np.float32))
    dy = torch.from_numpy(rng.standard_normal((4, 8, 12, 12)).astype(np.float32))
    first = xconv.convolution_backward(dy, x, w, padding=1, deterministic=True, backend="torch-cpu")
    second = xconv.convolution_backward(dy, x, w, padding=1, deterministic=True, backend="torch-cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.are_deterministic_algorithms_enabled()


def test_backend_pair_holds_two_backends_against_each_other():
    """benchmarks/backend_pair.py (cudnn vs torch-cuda on a GPU) on the CPU: numpy vs torch-cpu agree."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "backend_pair.py"
    spec = importlib.util.spec_from_file_location("backend_pair", path)
    pair = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pair)
    cmp, ran, total = pair.agreement("numpy", "torch-cpu", ["tiny/2d", "transposed/2d-s2-op1-g2"])
    assert ran == total == 6 and not cmp.disagreements
    assert all(v is not None and v <= 1.0 for row in cmp.rows for v in row.pairwise.values())
