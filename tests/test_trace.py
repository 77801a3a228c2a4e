"""xconv.trace(): each record field checked against what really ran (spied on the code paths themselves)."""

import threading

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, count_calls
from xconv import legalize, tracing
from xconv_numpy import columns, dense, depthwise, paths, small_c
from xconv_numpy.grid import pointwise, pointwise_planned, strategy_a, strategy_b


@pytest.fixture(autouse=True)
def grid_paths(request):
    """These small shapes would take the small-call path; the tests below name the grid paths they spy on
    (except test_small_call_path_reported: nested force blocks combine, so it runs without this one)."""
    if request.node.name == "test_small_call_path_reported":
        yield
        return
    with paths.force(off=["small-paths"]):
        yield


def _conv(rng, xs, ws, dtype=np.float32, **kw):
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(dtype)
    return x, w, dy


def test_no_trace_no_record():
    assert not tracing.active() and tracing.current() is None
    x, w, _ = _conv(np.random.default_rng(0), (1, 2, 5, 5), (3, 2, 3, 3))
    xconv.conv_fprop(x, w)
    with xconv.trace() as t:
        pass
    assert t.records == []


def test_pointwise_backward_reports_pointwise(monkeypatch):
    ran = count_calls(monkeypatch, pointwise_planned, "backward")      # float32, C-contiguous: its job table
    chunked = count_calls(monkeypatch, pointwise, "backward")
    x, w, dy = _conv(np.random.default_rng(0), (2, 8, 6, 6), (4, 8, 1, 1))
    with xconv.trace() as t:
        xconv.convolution_backward(dy, x, w, math="allow_tf32")
    (r,) = t.records
    assert len(ran) == 1 and len(chunked) == 0
    assert (r.op, r.backend, r.path) == ("backward", "numpy", "pointwise: pointwise per-sample GEMM [grad_input, "
                                                          "grad_weight: 1x1 kernel, stride 1, no padding] + bias-sum: "
                                                          "float64 row sums in sample order [grad_bias: always]")
    assert r.math == "keep_dtype"                          # effective: numpy never uses TF32
    assert r.deterministic == "run_to_run" and r.plan_cache is None and r.legalized == [] and r.error is None
    assert r.workspace_bytes > 0 and r.seconds > 0
    assert r.shapes == dict(input=[2, 8, 6, 6], weight=[4, 8, 1, 1], output=[2, 4, 6, 6])


@pytest.mark.parametrize("strategy, module", [("a", strategy_a), ("b", strategy_b)])
def test_blas_strategy_reported(monkeypatch, strategy, module):
    ran = count_calls(monkeypatch, module, "backward")
    x, w, dy = _conv(np.random.default_rng(1), (2, 3, 9, 9), (5, 3, 3, 3), padding=1)
    with xconv.trace() as t, paths.force(f"grid-{strategy}"):
        xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False))
    assert len(ran) == 1
    assert t.records[0].path == (f"grid-{strategy}: blas-grid strategy {strategy.upper()} "
                                 f"({'dy' if strategy == 'a' else 'x'}-columns) [grad_input, grad_weight: forced]")


def test_compiled_and_depthwise_paths(monkeypatch):
    rng = np.random.default_rng(2)
    c_runs = count_calls(monkeypatch, dense, "backward")
    d_runs = count_calls(monkeypatch, depthwise, "backward")
    x, w, dy = _conv(rng, (2, 32, 8, 8), (32, 32, 3, 3), padding=1)
    xd, wd, dyd = _conv(rng, (2, 6, 8, 8), (6, 1, 3, 3), padding=1, groups=6)
    with xconv.trace() as t, paths.without_cost_model():      # the rules below the cost model's
        xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False))
        xconv.convolution_backward(dyd, xd, wd, padding=1, groups=6, output_mask=(True, True, False))
        xconv.conv_fprop(x, w, padding=1)
    ran = [r.path for r in t.records]
    assert dense.serves(xconv.params.make_params(x.shape, w.shape, padding=1)) == bool(c_runs)
    assert ran[0].startswith("dense: C direct loops [grad_input, grad_weight: dense C loops serve" if c_runs
                             else "grid-")
    assert ran[1].startswith("depthwise: depthwise C loops [grad_input, grad_weight: one input channel per group"
                             if d_runs else "grid-")
    assert len(c_runs) <= 1 and len(d_runs) <= 1
    assert ran[2] == "grid-forward: blas-grid x-columns [output: otherwise]"


def test_column_fallback_reported(monkeypatch):
    """A backward with an infinity in dy runs on the im2col columns (the grid would turn it into NaNs)."""
    ran = count_calls(monkeypatch, columns, "backward")
    x, w, dy = _conv(np.random.default_rng(8), (2, 3, 7, 7), (4, 3, 3, 3), padding=1)
    dy[0, 0, 0, 0] = np.inf
    with xconv.trace() as t:
        xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False))
    assert len(ran) == 1
    assert t.records[0].path == "columns: im2col columns (fallback) [grad_input, grad_weight: non-finite detour]"
    assert t.records[0].workspace_bytes > 0


def test_exact_and_batch_invariant():
    x, w, dy = _conv(np.random.default_rng(3), (3, 2, 6, 6), (4, 2, 3, 3), dtype=np.float64)
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, backend="numpy-exact")
        xconv.conv_dgrad(dy, w, x.shape, deterministic="batch_invariant")
    exact, inv = t.records
    assert exact.path == "reference im2col (float64)"
    # float64: one chunk of columns (4 output lines of 4 positions x C_in*K = 18) plus x and the result
    assert exact.workspace_bytes == 8 * (4 * 4 * 18 + 3 * 2 * 36 + 3 * 4 * 16)
    assert inv.deterministic == "batch_invariant" and inv.path.startswith("per-sample (batch_invariant)")


def test_one_d_lifted_where_not_native():
    spy = SpyBackend("spy2d", xconv.Capabilities(spatial_dims=frozenset({2, 3})))
    x, w, dy = _conv(np.random.default_rng(4), (2, 3, 10), (4, 3, 3), dtype=np.float64)
    with xconv.trace() as t:
        xconv.convolution_backward(dy, x, w, backend=spy)
        xconv.convolution_backward(dy, x, w)                        # numpy runs 1-D natively
    assert [len(p.input_shape) for _, p, _ in spy.calls] == [4, 4, 4]
    assert t.records[0].legalized == [legalize.LIFT_1D] and t.records[0].backend == "spy2d"
    assert t.records[1].legalized == []


def test_padding_transposed_and_strided_rewrites():
    spy = SpyBackend("spy-narrow", xconv.Capabilities(asymmetric_padding=frozenset(), strided=False))
    rng = np.random.default_rng(5)
    x, w, _ = _conv(rng, (2, 3, 7, 7), (4, 3, 3, 3), dtype=np.float64)
    xt = np.asfortranarray(x)
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, padding=[(0, 1), (1, 1)], backend=spy)
        xconv.conv_fprop(xt, w, padding=1, backend=spy)
        xconv.conv_fprop(x, w, padding=1, backend=spy)
        xconv.conv_fprop(x, w.transpose(1, 0, 2, 3).copy(), transposed=True)       # numpy lacks transposed
    assert t.records[0].legalized == [legalize.EXPLICIT_PADDING]
    assert t.records[1].legalized == [legalize.STRIDED_COPIED]
    assert t.records[2].legalized == []
    assert t.records[3].legalized == [legalize.TRANSPOSED]


def test_empty_batch_not_run():
    with xconv.trace() as t:
        xconv.conv_fprop(np.zeros((0, 3, 5, 5)), np.zeros((2, 3, 3, 3)))
    assert t.records[0].legalized == [legalize.EMPTY] and t.records[0].path is None


def test_nested_threads_and_errors():
    x, w, _ = _conv(np.random.default_rng(6), (1, 2, 5, 5), (3, 2, 3, 3))
    with xconv.trace() as outer:
        xconv.conv_fprop(x, w)
        with xconv.trace() as inner:
            th = threading.Thread(target=xconv.conv_fprop, args=(x, w))
            th.start()
            th.join()
            with pytest.raises(xconv.UnsupportedError):
                xconv.conv_fprop(x, w, backend="numpy-exact", workspace_limit=10)
        xconv.conv_fprop(x, w)
    assert len(inner.records) == 2 and len(outer.records) == 4
    assert inner.records[0] is outer.records[1]
    assert inner.records[1].error.startswith("UnsupportedError") and "workspace_limit=10" in inner.records[1].error
    assert not tracing.active()


def test_record_json_ready():
    import json

    x, w, _ = _conv(np.random.default_rng(7), (1, 2, 5, 5), (3, 2, 3, 3))
    with xconv.trace() as t:
        xconv.conv_fprop(x, w)
    d = json.loads(json.dumps(t.records[0].as_dict()))
    assert d["op"] == "fprop" and d["path"] == "grid-forward: blas-grid x-columns [output: otherwise]"
    assert "seconds=" in t.records[0].summary()


def test_torch_module_calls_recorded_with_their_time():
    import time

    import torch

    from xconv.torch import XConv2d

    m = XConv2d(3, 4, 3, padding="full", deterministic="batch_invariant")
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    start = time.perf_counter()
    with xconv.trace() as t:
        m(x).sum().backward()
    elapsed = time.perf_counter() - start
    assert [r.op for r in t.records] == ["fprop", "backward"]
    assert all(r.deterministic == "batch_invariant" and r.shapes["output"] == [2, 4, 7, 7] for r in t.records)
    assert 0 < sum(r.seconds for r in t.records) <= elapsed
    assert "deterministic='batch_invariant'" in repr(m)


def test_torch_functional_route_keeps_level_and_limit():
    """Torch tensors run as xconv's torch operators: the determinism level and workspace limit reach the backend."""
    import torch

    x = torch.randn(2, 16, 12, 12, requires_grad=True)
    w = torch.randn(16, 16, 3, 3)
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, padding=1, deterministic="batch_invariant", workspace_limit=1 << 20).sum().backward()
    assert [r.deterministic for r in t.records] == ["batch_invariant", "batch_invariant"]
    assert all(0 < r.workspace_bytes <= 1 << 20 for r in t.records)
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit=1000"):
        xconv.conv_fprop(x, w, padding=1, workspace_limit=1000)


def test_small_call_path_reported(monkeypatch):
    ran = count_calls(monkeypatch, small_c, "grid_backward")
    x, w, dy = _conv(np.random.default_rng(9), (1, 4, 8, 8), (4, 4, 3, 3), padding=1)
    with xconv.trace() as t, paths.without_cost_model():      # nothing forced: the size rules choose
        xconv.convolution_backward(dy, x, w, padding=1)
        xconv.conv_fprop(x, w, padding=1)
    assert len(ran) == 1
    assert [r.path for r in t.records] == [
        "small-c: small-call C grid loops [grad_input, grad_weight: small, stride 1, C loops built (small.serves)]"
        " + bias-sum: float64 row sums in sample order [grad_bias: always]",
        "small-c: small-call C grid loops [output: small, stride 1, C loops built (small.serves)]"]
