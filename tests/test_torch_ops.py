"""xconv's PyTorch operators: the functional API carries gradients, compile/export see one op, autocast, layout."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest


import xconv
from core_helpers import TORCH_MISSING, SpyBackend

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xconv.torch as xt  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rand(*shape, grad=True, seed=[0]):
    seed[0] += 1
    g = torch.Generator().manual_seed(seed[0])
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


# (input shape, weight shape, keywords): 1-D, 2-D, 3-D, transposed, groups
CASES = {
    "1d-groups-stride-asym": ((2, 4, 7), (6, 2, 3), dict(groups=2, stride=2, padding=[(1, 2)])),
    "2d-dilated-same": ((1, 3, 5, 6), (4, 3, 2, 3), dict(dilation=(1, 2), padding="same")),
    "2d-transposed-groups": ((1, 4, 3, 3), (4, 3, 3, 2), dict(transposed=True, groups=2, stride=2, padding=1,
                                                               output_padding=(1, 0))),
    "3d": ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), dict(padding=1, stride=(1, 2, 1))),
    "3d-transposed": ((1, 2, 2, 3, 2), (2, 1, 2, 1, 2), dict(transposed=True, stride=2)),
}


@pytest.mark.parametrize("case", CASES)
def test_functional_api_gradcheck_float64(case):
    xs, ws, kw = CASES[case]
    x, w = _rand(*xs), _rand(*ws)
    ys = xconv.output_shape(xs, ws, **kw)
    dy = _rand(*ys)
    assert torch.autograd.gradcheck(lambda a, b: xconv.conv_fprop(a, b, **kw), (x, w))
    assert torch.autograd.gradcheck(lambda d, b: xconv.conv_dgrad(d, b, xs, **kw), (dy, w))
    assert torch.autograd.gradcheck(lambda a, d: xconv.conv_wgrad(a, d, ws, **kw), (x, dy))


def test_convolution_backward_and_double_backward_gradcheck():
    xs, ws, kw = CASES["1d-groups-stride-asym"]
    x, w, b = _rand(*xs), _rand(*ws), _rand(ws[0])
    dy = _rand(*xconv.output_shape(xs, ws, **{k: v for k, v in kw.items()}))
    assert torch.autograd.gradcheck(lambda d, a, c: xconv.convolution_backward(d, a, c, **kw), (dy, x, w))
    # a masked output is None and is not a function of anything
    assert torch.autograd.gradcheck(
        lambda d, a, c: xconv.convolution_backward(d, a, c, output_mask=(False, True, True), **kw)[1:], (dy, x, w))
    assert torch.autograd.gradgradcheck(lambda a, c, bb: xconv.conv_fprop(a, c, bias=bb, **kw), (x, w, b))
    m = xt.XConvTranspose1d(2, 2, 2, stride=2, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(m, (_rand(1, 2, 3),))


def test_functional_gradients_match_torch_and_never_detach():
    x, w, b = _rand(2, 4, 6, 6), _rand(6, 2, 3, 3), _rand(6)
    y = xconv.conv_fprop(x, w, bias=b, groups=2, padding=1)
    assert y.requires_grad and y.grad_fn is not None
    g = _rand(*y.shape, grad=False)
    got = torch.autograd.grad(y, (x, w, b), g)
    want = torch.autograd.grad(F.conv2d(x, w, b, groups=2, padding=1), (x, w, b), g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    # only the tensors that need grad make it differentiable; no grad mode gives a plain result
    assert xconv.conv_fprop(x.detach(), w.detach(), groups=2).grad_fn is None
    with torch.no_grad():
        assert not xconv.conv_fprop(x, w, groups=2).requires_grad
    dx, dw, db = xconv.convolution_backward(g, x, w, groups=2, padding=1, output_mask=(True, False, True))
    assert dw is None and dx.requires_grad and db.requires_grad


def test_functional_route_errors_name_the_argument():
    x, w = _rand(2, 4, 6, 6), _rand(6, 2, 3, 3)
    with pytest.raises(xconv.ShapeError, match="groups: must divide"):
        xconv.conv_fprop(x, w, groups=3)
    with pytest.raises(xconv.ShapeError, match="bias"):
        xconv.conv_fprop(x, w, groups=2, bias=_rand(5))
    with pytest.raises(xconv.ShapeError, match="weight: dtype differs"):
        xconv.conv_fprop(x, w.float(), groups=2)
    with pytest.raises(xconv.UnknownBackendError, match="registered"):
        xconv.conv_fprop(x, w, groups=2, backend="no-such-backend")


@pytest.fixture(scope="module")
def digits_model():
    spec = importlib.util.spec_from_file_location("train_digits_for_ops", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.DigitsNet()


def test_compile_fullgraph_on_the_converted_digits_model(digits_model):
    eager = xt.convert(copy.deepcopy(digits_model), backend="numpy")
    compiled_model = xt.convert(copy.deepcopy(digits_model), backend="numpy")
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    x = torch.rand(8, 1, 8, 8)
    outs = [m(x) for m in (eager, compiled)]
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for m, out in zip((eager, compiled_model), outs):
        (out[0].square().sum() + out[1].sum()).backward()
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)


def test_compile_with_a_backend_object():
    spy = SpyBackend("objspy")
    m = xt.XConv2d(2, 4, 3, backend=spy, dtype=torch.float64)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    compiled(x).sum().backward()
    assert [c[0] for c in spy.calls] == ["fprop", "dgrad", "wgrad", "bgrad"]
    torch.testing.assert_close(x.grad, torch.autograd.grad(m(x).sum(), x)[0], rtol=0, atol=0)


def test_the_functional_api_compiles_with_fullgraph():
    f = torch.compile(lambda a, b: xconv.conv_fprop(a, b, padding=[(1, 0)], groups=2, stride=2), fullgraph=True,
                      backend="aot_eager")
    x, w = _rand(1, 4, 7), _rand(6, 2, 3)
    y = f(x, w)
    torch.testing.assert_close(y, F.conv1d(F.pad(x, (1, 0)), w, groups=2, stride=2), rtol=1e-12, atol=1e-12)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (want,) = torch.autograd.grad(F.conv1d(F.pad(x, (1, 0)), w, groups=2, stride=2).sum(), x)
    torch.testing.assert_close(gx, want, rtol=1e-12, atol=1e-12)


def test_export_holds_one_xconv_op_per_convolution(digits_model):
    model = xt.convert(copy.deepcopy(digits_model), backend="numpy").eval()
    x = torch.rand(4, 1, 8, 8)
    ep = torch.export.export(model, (x,))
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function" and "xconv" in str(n.target)]
    assert ops == [torch.ops.xconv.fprop.default] * 3
    assert not any("convolution" in str(n.target) for n in ep.graph.nodes)
    for a, b in zip(ep.module()(x), model(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_autocast_computes_like_torch_conv():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(8, 4, 2, stride=2))
    converted = xt.convert(copy.deepcopy(model), backend="numpy")
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = model(x), converted(x)
        # float64 operands are not cast, as torch's autocast leaves them alone
        x64, w64 = x.double(), model[0].weight.double()
        assert xconv.conv_fprop(x64, w64, padding=1).dtype == F.conv2d(x64, w64, padding=1).dtype == torch.float64
    assert got.dtype == want.dtype == torch.bfloat16
    # the truth: float64 convolutions of the bfloat16-rounded operands, rounded to bfloat16 at each layer
    bf = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    h = F.conv2d(bf(x), bf(model[0].weight), bf(model[0].bias), padding=1)
    h = bf(h).relu()
    exact = F.conv_transpose2d(h, bf(model[2].weight), bf(model[2].bias), stride=2)
    scale = exact.abs().max().item()
    for out in (want, got):
        torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=2**-7 * scale)
    # gradients flow to the float32 parameters in float32, as torch's do
    got.float().sum().backward()
    assert converted[0].weight.grad.dtype == torch.float32


def test_channels_last_in_channels_last_out_like_torch():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, groups=1), nn.ConvTranspose2d(8, 4, 2, stride=2))
    converted = xt.convert(copy.deepcopy(model), backend="numpy")
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [m(xi) for m, xi in zip((model, converted), xs)]
    assert outs[1].stride() == outs[0].stride()
    assert outs[1].is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for out in outs:
        out.sum().backward()
    assert xs[1].grad.stride() == xs[0].grad.stride()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-5)
    # a contiguous input stays contiguous; 3-D channels-last follows suggest_memory_format
    assert converted(x.contiguous()).is_contiguous()
    x3 = torch.randn(1, 2, 3, 4, 5).to(memory_format=torch.channels_last_3d)
    w3 = torch.randn(3, 2, 2, 2, 2)
    y3 = xconv.conv_fprop(x3.requires_grad_(), w3)
    assert y3.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(y3, F.conv3d(x3, w3), rtol=1e-5, atol=1e-5)


def test_ops_are_registered_with_their_schemas():
    schema = str(torch.ops.xconv.backward.default._schema)
    assert "bool[] output_mask" in schema and "-> (Tensor, Tensor, Tensor)" in schema
    for name in ("fprop", "dgrad", "wgrad"):
        assert hasattr(torch.ops.xconv, name)
