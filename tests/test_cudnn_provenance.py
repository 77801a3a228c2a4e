"""The cuDNN backend's trace records, determinism levels and workspace budget, on the recording fake frontend."""

import numpy as np
import pytest

import xconv
from test_cudnn_translation import fake_backend
from xconv import UnsupportedError
from xconv_cudnn import cache as cache_mod


def _data(rng, xs=(2, 3, 8, 8), ws=(4, 3, 3, 3)):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(xconv.output_shape(xs, ws, padding=1)).astype(np.float32)
    return x, w, dy


def test_record_engine_cache_workspace():
    backend, fe = fake_backend()
    x, w, dy = _data(np.random.default_rng(0))
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, padding=1, backend=backend, deterministic=True)
        xconv.conv_fprop(x, w, padding=1, backend=backend, deterministic=True)
        xconv.conv_fprop(x[:, :, 0], w[:, :, 0], padding=1, backend=backend, math="allow_tf32")
    first, second, one_d = t.records
    assert first.plan_cache == "miss" and second.plan_cache == "hit"
    assert first.path.startswith("cuDNN fprop graph: heuristics' first supported plan")
    assert "NONDETERMINISTIC" in first.path and first.deterministic == "run_to_run"
    assert first.workspace_bytes == 256 == fe.graphs[0].get_workspace_size()
    assert one_d.legalized == [xconv.legalize.LIFT_1D] and one_d.math == "allow_tf32"
    assert one_d.deterministic == "none"


def test_autotuned_plan_named(monkeypatch):
    monkeypatch.setenv(cache_mod.BENCHMARK_ENV, "1")
    backend, fe = fake_backend(engines=[(), (), ()], plan_times=(3.0, 1.0, 2.0))
    x, w, dy = _data(np.random.default_rng(1))
    with xconv.trace() as t:
        xconv.conv_dgrad(dy, w, x.shape, padding=1, backend=backend)
    (r,) = t.records
    assert "autotuned plan 1 eng1_k2=2" in r.path and r.workspace_bytes == 256   # plan 1: 128 * 2 bytes


def test_workspace_limit_deselects_engines_and_refuses():
    backend, fe = fake_backend(engines=[(), (), ()])
    fe.workspaces = [4096, 1024, 512]
    x, w, dy = _data(np.random.default_rng(2))
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, padding=1, backend=backend, workspace_limit=2000)
    assert ("deselect_workspace_greater_than", 2000) in fe.graphs[-1].calls
    assert t.records[0].workspace_bytes == 1024 <= 2000
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=1), rtol=1e-5, atol=1e-5)
    executed = len(fe.executions)
    with pytest.raises(UnsupportedError, match="workspace_limit=100 bytes"):
        xconv.conv_fprop(x, w, padding=1, backend=backend, workspace_limit=100)
    assert len(fe.executions) == executed                               # refused before any execution


def test_batch_invariant_refused_before_device_work():
    backend, fe = fake_backend()
    x, w, dy = _data(np.random.default_rng(3))
    with pytest.raises(UnsupportedError, match="batch-invariant"):
        xconv.convolution_backward(dy, x, w, padding=1, backend=backend, deterministic="batch_invariant")
    assert fe.graphs == [] and fe.executions == []


def test_full_padding_reaches_cudnn_as_explicit_padding():
    backend, fe = fake_backend()
    x, w, _ = _data(np.random.default_rng(4))
    y = xconv.conv_fprop(x, w, padding="full", backend=backend)
    node = next(n for n in fe.graphs[-1].nodes if n[0] == "conv_fprop")
    assert list(node[2]["pre_padding"]) == [2, 2] == list(node[2]["post_padding"])
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=2), rtol=1e-5, atol=1e-5)
