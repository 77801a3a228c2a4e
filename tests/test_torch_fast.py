"""xconv.torch_fast: the converted modules' eager fast path gives the operators' bits, and steps aside where the
operators' machinery is needed (double backward, fake tensors, functorch transforms)."""

from __future__ import annotations

import copy

import pytest

from core_helpers import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402

import xconv.torch as xt  # noqa: E402
from xconv import torch_fast, torch_ops  # noqa: E402

MODULES = [
    (nn.Conv2d(3, 8, 3, padding=1, groups=1), (4, 3, 7, 6)),
    (nn.Conv2d(8, 8, 3, stride=2, padding=(1, 0), groups=4, bias=False), (2, 8, 9, 9)),
    (nn.Conv1d(4, 6, 5, padding=2, dilation=1), (3, 4, 11)),
    (nn.ConvTranspose2d(8, 2, 4, stride=2, padding=1), (2, 8, 4, 4)),
    (nn.Conv3d(2, 4, 2), (1, 2, 4, 4, 3)),
]


def _run(module, x, fast: bool, monkeypatch):
    with monkeypatch.context() as mp:
        if not fast:                     # the operators: neither the module's one-step call nor the fast path
            mp.setattr(torch_fast, "eager", lambda *t: False)
            mp.setattr(torch_fast, "usable", lambda *t: False)
        ops = []
        real = torch_ops.fprop_op
        mp.setattr(torch_fast.torch_ops, "fprop_op", lambda *a: ops.append(1) or real(*a))
        module.zero_grad(set_to_none=True)
        x = x.detach().requires_grad_(True)
        y = module(x)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads = [x.grad] + [p.grad for p in module.parameters()]
        return y.detach(), grads, len(ops)


@pytest.mark.parametrize("index", range(len(MODULES)))
def test_fast_path_gives_the_operators_bits(index, monkeypatch):
    torch.manual_seed(index)
    module, shape = MODULES[index]
    xmod = xt.convert(module, backend="numpy")
    x = torch.randn(shape)
    y_fast, g_fast, ops_fast = _run(xmod, x, True, monkeypatch)
    y_op, g_op, ops_op = _run(xmod, x, False, monkeypatch)
    assert ops_fast == 0 and ops_op == 1                 # each path really ran
    assert torch.equal(y_fast, y_op)
    for a, b in zip(g_fast, g_op):
        assert torch.equal(a, b)
    ref = module(x)                                      # and both are torch's convolution, to rounding
    torch.testing.assert_close(y_fast, ref.detach(), rtol=1e-4, atol=1e-5)


def test_double_backward_through_the_fast_path():
    torch.manual_seed(0)
    module = nn.Conv2d(2, 3, 3, padding=1).double()
    xmod = xt.convert(module, backend="numpy")
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    assert torch_fast.usable(x, xmod.weight)
    torch.autograd.gradgradcheck(lambda inp, w: xmod._xconv_apply(inp, w, None, ((1, 1), (1, 1))),
                                 (x, xmod.weight))
    g_x, = torch.autograd.grad(xmod(x).pow(2).sum(), x, create_graph=True)
    g_ref, = torch.autograd.grad(module(x).pow(2).sum(), x, create_graph=True)
    torch.testing.assert_close(g_x, g_ref)
    hx, = torch.autograd.grad(g_x.sum(), x)
    href, = torch.autograd.grad(g_ref.sum(), x)
    torch.testing.assert_close(hx, href)


def test_steps_aside_for_fake_tensors_and_transforms():
    x = torch.randn(1, 2, 4, 4)
    assert torch_fast.usable(x, None)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not torch_fast.usable(torch.empty(1, 2, 4, 4))
    assert not torch_fast.usable(x.to("meta"))
    seen = []
    torch.func.vmap(lambda t: seen.append(torch_fast.usable(t)) or t)(torch.randn(3, 2))
    assert seen == [False]
    xmod = xt.convert(nn.Conv2d(2, 3, 3), backend="numpy")
    batch = torch.randn(4, 1, 2, 5, 5)
    out = torch.func.vmap(xmod)(batch)                    # vmap over the module: the operator's path
    torch.testing.assert_close(out, torch.stack([xmod(b) for b in batch]))


def test_a_modules_one_step_call_refuses_what_the_fast_path_and_autocast_need():
    """torch_fast.eager (a module's one-step call) takes exactly what usable() takes with autocast off: each of
    usable()'s exclusions and an autocast region send the module through the full chain, whose results are torch's."""
    x, w = torch.randn(1, 2, 4, 4), nn.Parameter(torch.randn(3, 2, 3, 3))
    assert torch_fast.eager(x, w, None) and torch_fast.usable(x, w, None)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not torch_fast.eager(torch.empty(1, 2, 4, 4), torch.empty(3, 2, 3, 3), None)
    assert not torch_fast.eager(x.to("meta"), w, None) and not torch_fast.eager(x, w.to("meta"), None)
    assert not torch_fast.eager(x, w, torch.randn(3).to("meta"))
    seen = []
    torch.func.vmap(lambda t: seen.append(torch_fast.eager(t, w, None)) or t)(torch.randn(3, 2))
    assert seen == [False]
    class Sub(torch.Tensor):
        pass

    assert not torch_fast.eager(x.as_subclass(Sub), w, None) and not torch_fast.usable(x.as_subclass(Sub))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not torch_fast.eager(x, w, None) and torch_fast.usable(x, w, None)
        torch.manual_seed(0)
        ref = nn.Conv2d(2, 3, 3)
        xmod = xt.convert(copy.deepcopy(ref), backend="numpy")
        got, want = xmod(x), ref(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def _spy_views(monkeypatch) -> list:
    """Each _as_numpy result of the test: True where the call took NumPy views, False where it went through DLPack."""
    seen = []
    real = torch_fast._as_numpy
    monkeypatch.setattr(torch_fast, "_as_numpy", lambda *a: seen.append(real(*a) is not None) or real(*a))
    return seen


def test_plain_cpu_tensors_cross_as_numpy_views(monkeypatch):
    """float32 tensors (a Parameter that requires grad among them) reach the NumPy backend as Tensor.numpy() views,
    forward and backward, and come back as tensors with torch's values; the results own no torch storage of ours."""
    torch.manual_seed(1)
    module = nn.Conv2d(3, 4, 3, padding=1)
    xmod = xt.convert(module)
    seen = _spy_views(monkeypatch)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = xmod(x)
    y.sum().backward()
    assert seen == [True, True]
    ref_x = x.detach().clone().requires_grad_(True)
    module(ref_x).sum().backward()
    torch.testing.assert_close(y, module(x).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xmod.weight.grad, module.weight.grad, rtol=1e-5, atol=1e-4)


def test_tensors_numpy_cannot_view_take_dlpack(monkeypatch):
    """bfloat16, a negative-bit view and a backend that takes torch tensors itself: not NumPy views; the values are
    still the convolution's (the negative bit resolved, not dropped)."""
    torch.manual_seed(2)
    module = nn.Conv2d(2, 3, 3, padding=1)
    seen = _spy_views(monkeypatch)
    x = torch.randn(1, 2, 5, 5)
    xb = xt.convert(nn.Conv2d(2, 3, 3, padding=1)).to(torch.bfloat16)
    xb.load_state_dict({k: v.to(torch.bfloat16) for k, v in module.state_dict().items()})
    torch.testing.assert_close(xb(x.to(torch.bfloat16)).float(), module(x.to(torch.bfloat16).float()).detach(),
                               rtol=2e-2, atol=2e-2)
    xmod = xt.convert(copy.deepcopy(module))
    neg = torch._neg_view(x)
    assert neg.is_neg()
    torch.testing.assert_close(xmod(neg).detach(), module(-x).detach(), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("XCONV_BACKEND", "torch-cpu")
    torch.testing.assert_close(xmod(x).detach(), module(x).detach(), rtol=1e-5, atol=1e-5)
    assert seen == [False, False, False]


@pytest.mark.parametrize("index", range(len(MODULES)))
def test_a_forward_that_records_no_graph_skips_the_function_and_gives_its_bits(index, monkeypatch):
    """Under no_grad, inference_mode, or with nothing requiring grad, the forward runs the kernel without the
    autograd Function (no graph to record): the same bits, no grad_fn; with a weight requiring grad it records one."""
    module, shape = MODULES[index]
    conv = xt.convert(copy.deepcopy(module), backend="numpy")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(index))
    applied = []
    real = torch_fast._Fprop.apply
    monkeypatch.setattr(torch_fast._Fprop, "apply", lambda *a: applied.append(1) or real(*a))     # a spy
    recorded = conv(x)
    assert recorded.grad_fn is not None and applied == [1]
    with torch.no_grad():
        plain = conv(x)
    with torch.inference_mode():
        inference = conv(x)
    for p in conv.parameters():
        p.requires_grad_(False)
    frozen = conv(x)
    assert applied == [1]
    for y in (plain, inference, frozen):
        assert y.grad_fn is None and not y.requires_grad
        assert torch.equal(y, recorded.detach())
        assert y.shape == recorded.shape and y.stride() == recorded.stride()


def test_forward_mode_ad_is_not_dropped_by_the_no_graph_forward():
    """A dual tensor (forward-mode AD) with frozen weights: the forward must not run without the Function (it would
    drop the tangent silently); the Function refuses forward AD by name, as before."""
    import torch.autograd.forward_ad as fwAD

    conv = xt.convert(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), backend="numpy")
    for p in conv.parameters():
        p.requires_grad_(False)
    x, t = torch.randn(2, 16, 8, 8), torch.randn(2, 16, 8, 8)
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="jvp"):
            conv(fwAD.make_dual(x, t))
    assert conv(x).grad_fn is None                       # after the level closes: the no-graph forward again
