"""Errors of the torch modules and convert(): the argument the user got wrong, in torch's words, when called."""

from __future__ import annotations

import pytest

import xconv
from core_helpers import TORCH_MISSING, SpyBackend, registered

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402

import xconv.torch as xt  # noqa: E402


def _torch_message(module, x) -> str:
    with pytest.raises(RuntimeError) as info:
        module(x)
    return str(info.value)


@pytest.mark.parametrize("make, shape", [
    (lambda cls: cls(4, 6, 3), (2, 3, 8, 8)),                          # channels, batched
    (lambda cls: cls(4, 6, 3), (3, 8, 8)),                             # channels, unbatched
    (lambda cls: cls(4, 6, 3, groups=2), (2, 6, 8, 8)),                # groups
    (lambda cls: cls(4, 6, 3, padding_mode="reflect", padding=1), (2, 3, 8, 8)),
    (lambda cls: cls(4, 6, 3), (8, 8)),                                # rank
    (lambda cls: cls(4, 6, 3), (1, 2, 4, 8, 8)),
])
def test_module_shape_errors_blame_the_input_in_torch_words(make, shape):
    torch.manual_seed(0)
    theirs = make(nn.Conv2d)
    ours = xt.convert(make(nn.Conv2d), backend="numpy")
    x = torch.randn(shape)
    with pytest.raises(xconv.ShapeError) as info:
        ours(x)
    assert info.value.argument == "input"
    if getattr(theirs, "padding_mode", "zeros") == "zeros":
        assert str(info.value) == f"input: {_torch_message(theirs, x)}"
    else:   # torch pads first and names the padded size; xconv names the tensor the user passed
        assert str(info.value).endswith("expected input[2, 3, 8, 8] to have 4 channels, but got 3 channels instead")
        assert "[2, 3, 10, 10] to have 4 channels" in _torch_message(theirs, x)


@pytest.mark.parametrize("cls, tcls, shape", [
    (xt.XConvTranspose2d, nn.ConvTranspose2d, (2, 3, 5, 5)),
    (xt.XConvTranspose1d, nn.ConvTranspose1d, (3, 5)),
    (xt.XConv3d, nn.Conv3d, (1, 3, 4, 4, 4)),
    (xt.XConv1d, nn.Conv1d, (2, 3, 7)),
])
def test_every_module_kind_blames_the_input(cls, tcls, shape):
    x = torch.randn(shape)
    with pytest.raises(xconv.ShapeError) as info:
        cls(4, 6, 3)(x)
    assert info.value.argument == "input" and (info.value.expected, info.value.given) == (4, 3)
    assert str(info.value) == f"input: {_torch_message(tcls(4, 6, 3), x)}"


def test_convert_refuses_an_unknown_backend_when_called_and_swaps_nothing():
    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(xconv.UnknownBackendError, match="'numpi'"):
        xt.convert(model, backend="numpi")
    assert type(model[0]) is nn.Conv2d
    with pytest.raises(xconv.UnknownBackendError):
        xt.XConv2d(1, 2, 3, backend="numpi")
    with pytest.raises(xconv.ShapeError, match="backend: must be a backend name"):
        xt.convert(model, backend=3)
    with pytest.raises(xconv.ShapeError, match="math"):
        xt.convert(model, math="fast")
    with pytest.raises(xconv.ShapeError, match="deterministic"):
        xt.convert(model, deterministic="yes")
    assert type(model[0]) is nn.Conv2d


def test_convert_checks_availability_and_the_model_device():
    class Unavailable(SpyBackend):
        def availability(self):
            return False, "no such accelerator here"

    class CudaOnly(SpyBackend):
        array_families = ("cupy",)

    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    with registered(Unavailable("offline")), registered(CudaOnly("cuda-only")):
        with pytest.raises(xconv.BackendUnavailableError, match="no such accelerator here"):
            xt.convert(model, backend="offline")
        with pytest.raises(xconv.BackendUnavailableError, match="no such accelerator here"):
            xt.XConv2d(1, 2, 3, backend="offline")
        # takes CuPy arrays only: a CPU model's tensors cross as NumPy arrays, which it does not take
        with pytest.raises(xconv.ShapeError, match="'cuda-only' does not take numpy arrays"):
            xt.convert(model, backend="cuda-only")
        assert type(model[0]) is nn.Conv2d
        # a backend object is checked the same way
        with pytest.raises(xconv.BackendUnavailableError):
            xt.convert(model, backend=Unavailable("object"))
    converted = xt.convert(model, backend="numpy")
    assert type(converted[0]) is xt.XConv2d
