"""xconv.torch: drop-in torch.nn convolution modules on xconv, the backward mask, convert()."""

from __future__ import annotations

import copy
import math
import pickle
import subprocess
import sys

import pytest

import xconv
from core_helpers import SpyBackend, TORCH_MISSING, registered

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402
from torch.func import functional_call  # noqa: E402

import xconv.torch as xt  # noqa: E402

# torch warns that it copies the input for 'same' with an even kernel; xconv pads as it does
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")

PAIRS = [(nn.Conv1d, xt.XConv1d), (nn.Conv2d, xt.XConv2d), (nn.Conv3d, xt.XConv3d),
         (nn.ConvTranspose1d, xt.XConvTranspose1d), (nn.ConvTranspose2d, xt.XConvTranspose2d),
         (nn.ConvTranspose3d, xt.XConvTranspose3d)]
NDIM = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3, nn.ConvTranspose1d: 1, nn.ConvTranspose2d: 2,
        nn.ConvTranspose3d: 3}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny ops: one intra-op thread is fastest, and immune to other processes on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ids(pair):
    return pair[1].__name__


def make_pair(torch_cls, xconv_cls, *args, dtype=torch.float64, backend="numpy", **kwargs):
    """A torch module and its xconv twin with the same weights (the twin built by the constructor)."""
    torch.manual_seed(0)
    mine = xconv_cls(*args, dtype=dtype, backend=backend, **kwargs)
    theirs = torch_cls(*args, dtype=dtype, **kwargs)
    theirs.load_state_dict(mine.state_dict())
    return theirs, mine


def run_both(theirs, mine, x, **forward_kwargs):
    """(y, dx, dw, db) of each module for the same input and a random grad_output."""
    results = []
    dy = None
    for m in (theirs, mine):
        m.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_(True)
        y = m(xi, **forward_kwargs)
        if dy is None:
            dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
        y.backward(dy)
        results.append((y.detach(), xi.grad, m.weight.grad, None if m.bias is None else m.bias.grad))
    return results


# one configuration per kind of thing each module type must get right: groups, stride, dilation,
# padding numbers, padding strings, padding modes, output_padding, output_size
DIRECT_CASES = [
    dict(groups=2, stride=2, dilation=1, padding=1),
    dict(groups=1, stride=1, dilation=2, padding=2, bias=False),
    dict(groups=2, stride=1, dilation=2, padding="same"),
    dict(groups=1, stride=2, dilation=1, padding="valid"),
    dict(groups=2, stride=2, dilation=1, padding=2, padding_mode="reflect"),
    dict(groups=1, stride=1, dilation=2, padding=1, padding_mode="circular"),
    dict(groups=2, stride=1, dilation=1, padding=1, padding_mode="replicate"),
    dict(groups=1, stride=1, dilation=1, padding="same", padding_mode="reflect"),
]
TRANSPOSED_CASES = [
    dict(groups=2, stride=2, dilation=1, padding=1, output_padding=1),
    dict(groups=1, stride=3, dilation=2, padding=2, output_padding=2, bias=False),
    dict(groups=2, stride=1, dilation=2, padding=0, output_padding=1),
    dict(groups=1, stride=2, dilation=1, padding=1, output_size="max"),
]


def shapes_for(nd, transposed):
    spatial = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}[nd] if not transposed else {1: (5,), 2: (4, 3), 3: (3, 2, 3)}[nd]
    kernel = {1: 4, 2: 3, 3: 2}[nd]
    return (2, 4) + spatial, kernel


def cases():
    for pair in PAIRS:
        transposed = pair[0].__name__.startswith("ConvTranspose")
        for i, c in enumerate(TRANSPOSED_CASES if transposed else DIRECT_CASES):
            yield pytest.param(pair, c, id=f"{pair[1].__name__}-{i}")


def build(pair, case, dtype=torch.float64):
    """(torch module, xconv module, input, forward kwargs) for one case."""
    torch_cls, xconv_cls = pair
    nd = NDIM[torch_cls]
    transposed = torch_cls.__name__.startswith("ConvTranspose")
    case = dict(case)
    want_size = case.pop("output_size", None)
    in_shape, kernel = shapes_for(nd, transposed)
    theirs, mine = make_pair(torch_cls, xconv_cls, 4, 6, kernel, dtype=dtype, **case)
    x = torch.randn(in_shape, dtype=dtype, generator=torch.Generator().manual_seed(2))
    forward_kwargs = {}
    if want_size == "max":  # the largest output torch allows: output_padding stride-1 through output_size
        s, p, d = case["stride"], case["padding"], case["dilation"]
        forward_kwargs["output_size"] = [(n - 1) * s - 2 * p + d * (kernel - 1) + 1 + s - 1 for n in in_shape[2:]]
    return theirs, mine, x, forward_kwargs


# ---------------------------------------------------------------------------------------------
# import hygiene and module identity


def test_import_xconv_does_not_import_torch():
    code = ("import sys, numpy as np, xconv; xconv.list_backends(); "
            "xconv.conv_fprop(np.ones((1, 1, 3)), np.ones((1, 1, 2))); "
            "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')], 'torch imported'; "
            "assert 'xconv.torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("pair", PAIRS, ids=ids)
def test_subclass_same_constructor_and_state_dict_both_ways(pair):
    torch_cls, xconv_cls = pair
    mine = xconv_cls(4, 6, 3, stride=2, padding=1, groups=2, bias=True, dtype=torch.float64, backend="numpy")
    assert isinstance(mine, torch_cls)
    theirs = torch_cls(4, 6, 3, stride=2, padding=1, groups=2, bias=True, dtype=torch.float64)
    assert list(mine.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    theirs.load_state_dict(mine.state_dict())  # xconv -> torch
    assert torch.equal(theirs.weight, mine.weight) and torch.equal(theirs.bias, mine.bias)
    torch.manual_seed(5)
    other = torch_cls(4, 6, 3, stride=2, padding=1, groups=2, dtype=torch.float64)
    mine.load_state_dict(other.state_dict())  # torch -> xconv, strict
    assert torch.equal(mine.weight, other.weight) and torch.equal(mine.bias, other.bias)
    # positional arguments exactly as torch's constructor takes them
    # (stride, padding, dilation | output_padding, groups, bias)
    positional = xconv_cls(4, 6, 3, 1, 0, 1 if "Transpose" not in torch_cls.__name__ else 0, 1, False)
    assert positional.bias is None and positional.weight.shape == torch_cls(4, 6, 3, bias=False).weight.shape


def test_repr_names_the_backend():
    m = xt.XConv2d(4, 8, 3, padding=1, groups=2, backend="numpy", deterministic=True, math="allow_tf32")
    assert repr(m) == ("XConv2d(4, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), groups=2, "
                       "backend='numpy', deterministic=True, math='allow_tf32')")
    assert repr(xt.XConvTranspose1d(2, 2, 3)).endswith("stride=(1,), backend=None)")
    assert "backend='spy'" in repr(xt.XConv1d(2, 2, 3, backend=SpyBackend("spy")))


def test_deepcopy_and_pickle_keep_the_xconv_settings():
    m = xt.XConv2d(2, 4, 3, backend="numpy-exact", deterministic=True)
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert type(clone) is xt.XConv2d and clone.backend == "numpy-exact" and clone.deterministic
        assert torch.equal(clone.weight, m.weight)


# ---------------------------------------------------------------------------------------------
# numerics against the torch modules


@pytest.mark.parametrize(("pair", "case"), list(cases()))
def test_forward_backward_match_torch_float64(pair, case):
    theirs, mine, x, kw = build(pair, case)
    (y0, dx0, dw0, db0), (y1, dx1, dw1, db1) = run_both(theirs, mine, x, **kw)
    assert type(y1) is torch.Tensor and y1.shape == y0.shape and y1.dtype == torch.float64
    for got, want in ((y1, y0), (dx1, dx0), (dw1, dw0), (db1, db0)):
        if want is None:
            assert got is None
            continue
        scale = want.abs().max().item() + 1.0
        assert (got - want).abs().max().item() <= 1e-13 * scale


def _abs_conv(m, x):
    """``m`` (a torch module) on |x| with |weight| and |bias|, in float64: the scale of each output's rounding error."""
    m64 = copy.deepcopy(m).double()
    with torch.no_grad():
        m64.weight.abs_()
        if m64.bias is not None:
            m64.bias.abs_()
        return m64(x.double().abs())


@pytest.mark.parametrize("pair", PAIRS, ids=ids)
def test_forward_float32_within_the_error_bound(pair):
    """|y_xconv - y_exact| <= gamma_K * (|x| conv |w| + |b|) with K the products per output, u = 2**-24."""
    torch_cls, xconv_cls = pair
    nd = NDIM[torch_cls]
    transposed = torch_cls.__name__.startswith("ConvTranspose")
    in_shape, kernel = shapes_for(nd, transposed)
    theirs, mine = make_pair(torch_cls, xconv_cls, 4, 6, kernel, dtype=torch.float32, groups=2, stride=2, padding=1)
    x = torch.randn(in_shape, generator=torch.Generator().manual_seed(3))
    y = mine(x).double()
    exact = theirs.double()(x.double())  # float64 on the same float32 values: exact to ~1e-16
    a = _abs_conv(theirs, x)
    k = 2 * kernel ** nd + 1  # C_in/groups products per kernel position, plus the bias
    u = 2.0**-24
    bound = k * u / (1 - k * u) * a + 1e-30
    assert ((y - exact).abs() / bound).max().item() <= 1.0
    assert (y - exact).abs().max().item() > 0  # it really is float32 work


def test_unbatched_input_like_torch():
    for pair in PAIRS:
        theirs, mine, x, kw = build(pair, DIRECT_CASES[0] if "Transpose" not in pair[0].__name__
                                    else TRANSPOSED_CASES[0])
        x1 = x[0]
        got, want = mine(x1), theirs(x1)
        assert got.shape == want.shape == mine(x)[0].shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    theirs, mine = make_pair(nn.Conv2d, xt.XConv2d, 4, 6, 3, padding=1, padding_mode="reflect")
    x1 = torch.randn(4, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(mine(x1), theirs(x1), rtol=1e-12, atol=1e-12)


def test_same_padding_matches_torch_for_even_kernels_and_dilation():
    # total padding dilation*(k-1) odd: torch puts the extra element at the end
    theirs, mine = make_pair(nn.Conv2d, xt.XConv2d, 3, 4, (4, 2), padding="same", dilation=(1, 3))
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(mine(x), theirs(x), rtol=1e-12, atol=1e-12)
    assert mine(x).shape[2:] == x.shape[2:]


def test_output_size_errors_and_padding_mode_rules_like_torch():
    theirs, mine = make_pair(nn.ConvTranspose2d, xt.XConvTranspose2d, 2, 2, 3, stride=2)
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    for size in ([9, 9], [10, 10], [1, 2, 10, 9]):
        torch.testing.assert_close(mine(x, output_size=size), theirs(x, output_size=size), rtol=1e-12, atol=1e-12)
    for m in (theirs, mine):
        with pytest.raises(ValueError, match="requested an output size"):
            m(x, output_size=[12, 12])
    for cls in (nn.ConvTranspose1d, xt.XConvTranspose1d):  # 1-D: the constructor refuses
        with pytest.raises(ValueError, match="Only .zeros. padding mode is supported"):
            cls(2, 2, 3, padding_mode="reflect")
    for cls in (nn.ConvTranspose2d, xt.XConvTranspose2d):  # 2-D: forward refuses
        with pytest.raises(ValueError, match="Only .zeros. padding mode is supported"):
            cls(2, 2, 3, padding_mode="reflect")(torch.randn(1, 2, 5, 5))
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        xt.XConv1d(2, 2, 3, stride=2, padding="same")


# ---------------------------------------------------------------------------------------------
# gradcheck in float64


@pytest.mark.parametrize(("pair", "case"), list(cases()))
def test_gradcheck_float64(pair, case):
    theirs, mine, x, kw = build(pair, case)
    x = x[:1].clone().requires_grad_(True)  # one sample keeps the numerical Jacobian small
    params = {"weight": mine.weight.detach().clone().requires_grad_(True)}
    if mine.bias is not None:
        params["bias"] = mine.bias.detach().clone().requires_grad_(True)
    names = list(params)

    def f(x, *p):
        return functional_call(mine, dict(zip(names, p)), (x,), kw)

    # 3-D: the full Jacobian has too many columns; fast mode checks it along random directions
    fast = NDIM[pair[0]] == 3
    assert torch.autograd.gradcheck(f, (x, *params.values()), eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=fast)


def test_gradcheck_unbatched_and_frozen_weight():
    _, mine = make_pair(nn.Conv1d, xt.XConv1d, 2, 4, 3, padding=1, groups=2, padding_mode="circular")
    x = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)
    mine.weight.requires_grad_(False)
    assert torch.autograd.gradcheck(lambda x: mine(x), (x,))


# ---------------------------------------------------------------------------------------------
# the output mask comes from needs_input_grad; backward calls xconv once


@pytest.fixture
def recorded_backward(monkeypatch):
    calls = []
    real = xconv.convolution_backward

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(xconv, "convolution_backward", spy)
    return calls


def test_frozen_weight_asks_for_grad_input_only(recorded_backward):
    spy = SpyBackend("torchspy")
    with registered(spy):
        m = xt.XConv2d(4, 6, 3, padding=1, groups=2, dtype=torch.float64, backend="torchspy")
        m.weight.requires_grad_(False)
        m.bias.requires_grad_(False)
        x = torch.randn(2, 4, 5, 5, dtype=torch.float64, requires_grad=True)
        m(x).sum().backward()
    assert len(recorded_backward) == 1
    assert recorded_backward[0]["output_mask"] == (True, False, False)
    assert m.weight.grad is None and m.bias.grad is None and x.grad is not None
    assert [c[0] for c in spy.calls] == ["fprop", "dgrad"]  # no wgrad, no bgrad work at all


def test_input_without_grad_computes_no_grad_input(recorded_backward):
    m = xt.XConvTranspose2d(4, 6, 3, stride=2, groups=2, dtype=torch.float64, backend="numpy")
    m(torch.randn(2, 4, 3, 3, dtype=torch.float64)).sum().backward()
    assert len(recorded_backward) == 1
    assert recorded_backward[0]["output_mask"] == (False, True, True)
    assert recorded_backward[0]["bias_sizes"] == [6]
    assert m.weight.grad is not None and m.bias.grad is not None


def test_no_bias_and_frozen_bias_masks(recorded_backward):
    m = xt.XConv1d(2, 3, 3, bias=False, dtype=torch.float64)
    m(torch.randn(1, 2, 6, dtype=torch.float64, requires_grad=True)).sum().backward()
    m2 = xt.XConv1d(2, 3, 3, dtype=torch.float64)
    m2.bias.requires_grad_(False)
    m2(torch.randn(1, 2, 6, dtype=torch.float64)).sum().backward()
    assert [c["output_mask"] for c in recorded_backward] == [(True, True, False), (False, True, False)]
    assert recorded_backward[0]["bias_sizes"] is None
    assert m2.bias.grad is None and m2.weight.grad is not None


def test_keywords_reach_xconv(monkeypatch):
    seen = []
    real = xconv.conv_fprop
    monkeypatch.setattr(xconv, "conv_fprop", lambda *a, **k: seen.append(k) or real(*a, **k))
    m = xt.XConv2d(2, 2, 3, stride=2, dilation=2, padding=(1, 2), backend="numpy-exact", deterministic=True,
                   math="allow_tf32")
    m(torch.randn(1, 2, 9, 9))
    (kw,) = seen
    assert kw["backend"] == "numpy-exact" and kw["deterministic"] is True and kw["math"] == "allow_tf32"
    assert kw["stride"] == (2, 2) and kw["dilation"] == (2, 2) and kw["padding"] == ((1, 1), (2, 2))


# ---------------------------------------------------------------------------------------------
# convert()


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=4, padding_mode="reflect"), nn.Tanh()),
            nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1))
        self.side = nn.ModuleList([nn.Conv1d(4, 2, 3), nn.ConvTranspose1d(2, 2, 3, stride=2, output_padding=1)])
        self.head = nn.Conv3d(1, 1, 1)

    def forward(self, x):
        h = self.body(x)  # (N, 4, 16, 16)
        s = self.side[1](self.side[0](h.flatten(2)))
        return h, s, self.head(h.unsqueeze(1))


def test_convert_swaps_every_conv_in_a_nested_model():
    torch.manual_seed(0)
    model = Nested().double().eval()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    want = reference(x)
    params_before = dict(model.named_parameters())
    out = xt.convert(model, backend="numpy")
    assert out is model
    convs = [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    assert len(convs) == 6 and all(type(m) in xt._EQUIVALENT.values() for m in convs)
    assert all(m.backend == "numpy" for m in convs)
    assert model.body[2][0].padding_mode == "reflect" and not model.training and not model.body[0].training
    # the very same Parameters: an optimizer built before convert() still trains the model
    assert all(p is params_before[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == list(reference.state_dict())
    got = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # gradients too
    sum(o.square().sum() for o in got).backward()
    sum(o.square().sum() for o in reference(x)).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_convert_keeps_hooks_device_dtype_and_leaves_subclasses_alone():
    class MyConv(nn.Conv1d):
        pass

    seen = []
    conv = nn.Conv1d(2, 2, 3, dtype=torch.float64)
    conv.register_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    model = nn.Sequential(conv, MyConv(2, 2, 1))
    xt.convert(model, deterministic=True, math="allow_tf32")
    assert type(model[0]) is xt.XConv1d and type(model[1]) is MyConv
    assert model[0].weight.dtype == torch.float64 and model[0].weight.device.type == "cpu"
    assert model[0].deterministic and model[0].math == "allow_tf32"
    model[0](torch.randn(1, 2, 5, dtype=torch.float64))
    assert seen == ["XConv1d"]
    # a bare conv comes back converted; an xconv module passes through untouched; torch's original is untouched
    bare = nn.ConvTranspose3d(1, 1, 2)
    swapped = xt.convert(bare, backend="numpy")
    assert type(swapped) is xt.XConvTranspose3d and swapped.weight is bare.weight and type(bare) is nn.ConvTranspose3d
    assert xt.convert(swapped, backend="numpy-exact") is swapped and swapped.backend == "numpy"


def test_convert_then_train_step_matches_torch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, groups=2), nn.Flatten(),
                          nn.LazyLinear(3)).double()
    x = torch.randn(4, 1, 6, 6, dtype=torch.float64)
    model(x)  # materialize the lazy layer
    twin = xt.convert(copy.deepcopy(model))
    for m in (model, twin):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert math.isclose(0, (p - q).abs().max().item(), abs_tol=1e-12)
