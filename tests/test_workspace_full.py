"""workspace_limit (and $XCONV_WORKSPACE_LIMIT) on numpy, and padding="full" everywhere a padding string goes."""

import tracemalloc

import numpy as np
import pytest
import torch

import xconv
from xconv import workspace
from xconv_numpy import fast, paths

MiB = 1 << 20


def test_limit_keeps_peak_and_results():
    """(8, 64, 56, 56) 3x3 backward at 4 MiB: traced scratch <= the limit, memory peak within the outputs plus
    twice the limit; grad_input and grad_bias bitwise, grad_weight (summed in blocks the limit sizes) within
    float32 tolerance of the unlimited call."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    w = (0.1 * rng.standard_normal((64, 64, 3, 3))).astype(np.float32)
    dy = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    with xconv.trace() as t:
        free = xconv.convolution_backward(dy, x, w, padding=1)
    fast.release_memory()
    tracemalloc.start()
    try:
        with xconv.trace() as t4:
            limited = xconv.convolution_backward(dy, x, w, padding=1, workspace_limit=4 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    outputs = sum(a.nbytes for a in limited)
    assert t4.records[0].workspace_bytes <= 4 * MiB < t.records[0].workspace_bytes
    assert peak <= outputs + 2 * 4 * MiB, (peak, outputs)
    assert np.array_equal(limited[0], free[0]) and np.array_equal(limited[2], free[2])
    np.testing.assert_allclose(limited[1], free[1], rtol=1e-5, atol=1e-5 * float(np.abs(free[1]).max()))
    again = xconv.convolution_backward(dy, x, w, padding=1, workspace_limit=4 * MiB)
    assert all(np.array_equal(a, b) for a, b in zip(again, limited))          # bitwise run to run under it


@pytest.mark.parametrize("strategy", ["a", "b"])
def test_blas_paths_within_limit(strategy):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 40, 40)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((4, 8, 40, 40)).astype(np.float32)
    ref = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64), padding=1,
                                     backend="numpy-exact")
    for limit in (MiB // 4, 2 * MiB):
        with xconv.trace() as t, paths.force(f"grid-{strategy}"):
            got = xconv.convolution_backward(dy, x, w, padding=1, workspace_limit=limit)
            y = xconv.conv_fprop(x, w, padding=1, workspace_limit=limit)
        assert all(r.workspace_bytes <= limit for r in t.records), [r.workspace_bytes for r in t.records]
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
        np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=1), rtol=1e-5, atol=1e-4)


def test_depthwise_under_a_limit_takes_the_counted_path():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16, 30, 30)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((4, 16, 30, 30)).astype(np.float32)
    with xconv.trace() as t:
        free = xconv.convolution_backward(dy, x, w, padding=1, groups=16)
        got = xconv.convolution_backward(dy, x, w, padding=1, groups=16, workspace_limit=MiB // 2)
    assert t.records[1].path.startswith("grid-") and t.records[1].workspace_bytes <= MiB // 2
    for a, b in zip(got, free):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))


def test_limit_too_small_refused_by_name():
    x = np.zeros((2, 64, 30, 30), np.float32)
    w = np.zeros((64, 64, 3, 3), np.float32)
    for backend in ("numpy", "numpy-exact"):
        with pytest.raises(xconv.UnsupportedError, match=r"workspace_limit=1000\b"):
            xconv.conv_fprop(x, w, padding=1, workspace_limit=1000, backend=backend)


def test_env_default_and_bad_values(monkeypatch):
    x = np.zeros((2, 64, 30, 30), np.float32)
    w = np.zeros((64, 64, 3, 3), np.float32)
    monkeypatch.setenv(workspace.ENV, "1k")
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit=1024"):
        xconv.conv_fprop(x, w, padding=1, backend="numpy-exact")
    xconv.conv_fprop(x, w, padding=1, backend="numpy-exact", workspace_limit=64 * MiB)     # the argument wins
    monkeypatch.setenv(workspace.ENV, "lots")
    with pytest.raises(xconv.ConfigError, match=workspace.ENV):
        xconv.conv_fprop(x, w)
    monkeypatch.delenv(workspace.ENV)
    for bad in (-1, 1.5, "4MiB", True):
        with pytest.raises(xconv.ShapeError, match="workspace_limit"):
            xconv.conv_fprop(x, w, workspace_limit=bad)
    assert [workspace.parse_bytes(t) for t in ("4MiB", "512k", "1G", "7", "none")] == [4 * MiB, 512 << 10, 1 << 30,
                                                                                        7, None]


@pytest.mark.parametrize("k, d, transposed", [((3, 5), (1, 2), False), ((4, 1), (2, 1), False), ((3, 3), (1, 1), True)])
def test_full_padding(k, d, transposed):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 9, 11))
    w = rng.standard_normal((4, 3) + k if transposed else (3, 4) + k)
    pads = tuple(dd * (kk - 1) for kk, dd in zip(k, d))
    shape = xconv.output_shape(x.shape, w.shape, padding="full", dilation=d, transposed=transposed)
    assert shape == xconv.output_shape(x.shape, w.shape, padding=pads, dilation=d, transposed=transposed)
    if not transposed:
        assert shape[2:] == tuple(s + dd * (kk - 1) for s, kk, dd in zip(x.shape[2:], k, d))   # full correlation
    y = xconv.conv_fprop(x, w, padding="full", dilation=d, transposed=transposed)
    conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    want = conv(torch.from_numpy(x), torch.from_numpy(w), padding=pads, dilation=d).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    dy = rng.standard_normal(shape)
    got = xconv.convolution_backward(dy, x, w, padding="full", dilation=d, transposed=transposed)
    same = xconv.convolution_backward(dy, x, w, padding=pads, dilation=d, transposed=transposed)
    assert all(np.array_equal(a, b) for a, b in zip(got, same))


def test_full_padding_torch_module():
    from xconv.torch import XConv1d, XConv2d

    m = XConv2d(3, 5, (3, 2), padding="full", dilation=(1, 2))
    ref = torch.nn.Conv2d(3, 5, (3, 2), padding=(2, 2), dilation=(1, 2))
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 6, 7, dtype=torch.float32)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)
    assert XConv1d(2, 2, 4, padding="full")(torch.randn(1, 2, 5)).shape == (1, 2, 8)
