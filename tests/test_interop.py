"""DLPack interop: PyTorch CPU tensors in, PyTorch tensors out, no copies on the way in."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, TORCH_MISSING, registered

torch = pytest.importorskip("torch", reason=TORCH_MISSING)


def test_torch_tensors_in_torch_tensors_out_matching_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 9, 9, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, b, stride=2, padding=1, groups=2)
    dy = torch.randn_like(y)
    y.backward(dy)
    got = xconv.conv_fprop(x, w, bias=b, stride=2, padding=1, groups=2)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    torch.testing.assert_close(got, y.detach(), rtol=0, atol=1e-12)
    dx, dw, db = xconv.convolution_backward(dy, x, w, stride=2, padding=1, groups=2)
    for mine, theirs in ((dx, x.grad), (dw, w.grad), (db, b.grad)):
        assert isinstance(mine, torch.Tensor)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    dx2 = xconv.conv_dgrad(dy, w, tuple(x.shape), stride=2, padding=1, groups=2)
    dw2 = xconv.conv_wgrad(x, dy, tuple(w.shape), stride=2, padding=1, groups=2)
    torch.testing.assert_close(dx2, x.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(dw2, w.grad, rtol=0, atol=1e-12)


def test_cpu_tensor_picks_numpy_and_is_not_copied():
    spy = SpyBackend("torchspy")
    spy.priority = 100  # preferred for numpy arrays while registered
    with registered(spy):
        x = torch.randn(1, 2, 6, 5).transpose(2, 3)  # non-contiguous
        w = torch.randn(3, 2, 3, 3)
        xconv.conv_fprop(x, w)
        (_, _, (seen_x, seen_w)), = spy.calls
        assert isinstance(seen_x, np.ndarray)
        assert seen_x.__array_interface__["data"][0] == x.data_ptr()  # a view of the tensor's memory
        assert seen_x.strides == tuple(s * 4 for s in x.stride())
        assert seen_w.__array_interface__["data"][0] == w.data_ptr()


def test_bfloat16_tensors_round_trip():
    x = torch.randn(1, 4, 7, dtype=torch.bfloat16)
    w = torch.randn(2, 4, 3, dtype=torch.bfloat16)
    y = xconv.conv_fprop(x, w, padding=1)
    assert y.dtype == torch.bfloat16
    want = torch.nn.functional.conv1d(x.double(), w.double(), padding=1)
    assert (y.double() - want).abs().max() <= 2.0**-8 * want.abs().max() + 1e-6


def test_mixed_families_rejected():
    with pytest.raises(xconv.ShapeError, match="weight: array family differs from input's"):
        xconv.conv_fprop(torch.zeros(1, 1, 3), np.zeros((1, 1, 1)))


def test_masked_entries_stay_none():
    x, w = torch.randn(1, 2, 5), torch.randn(3, 2, 3)
    dx, dw, db = xconv.convolution_backward(torch.randn(1, 3, 3), x, w, output_mask=(False, True, False))
    assert dx is None and db is None and isinstance(dw, torch.Tensor)
