"""torch.func transforms (grad, vjp, jacrev, vmap over grad) through xconv's functional API and modules.

The truth is torch's own convolution under the same transform, in float64 (agreement to ~1e-12: both are
exact sums of the same products in different orders).
"""

from __future__ import annotations

import pytest

import xconv
from core_helpers import TORCH_MISSING, SpyBackend, registered

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call, grad, jacrev, vjp, vmap  # noqa: E402

import xconv.torch as xt  # noqa: E402

CLOSE = dict(rtol=1e-10, atol=1e-10)
# every operator has its own vmap rule: torch's slow per-element fallback (which warns) never runs
pytestmark = pytest.mark.filterwarnings("error:There is a performance drop:UserWarning")


def _rand(*shape, seed=[0]):
    seed[0] += 1
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed[0]), dtype=torch.float64)


# (xconv keywords, torch function, torch keywords, input shape, weight shape)
CONVS = {
    "2d-stride-groups": (dict(stride=2, padding=1, groups=2), F.conv2d, dict(stride=2, padding=1, groups=2),
                         (3, 4, 7, 6), (6, 2, 3, 3)),
    "1d-transposed": (dict(transposed=True, stride=2, padding=1, output_padding=1), F.conv_transpose1d,
                      dict(stride=2, padding=1, output_padding=1), (3, 4, 5), (4, 3, 3)),
}


def _pair(case):
    kw, tfn, tkw, xs, ws = CONVS[case]
    return (lambda x, w, b: xconv.conv_fprop(x, w, bias=b, **kw)), (lambda x, w, b: tfn(x, w, b, **tkw)), xs, ws


@pytest.mark.parametrize("case", CONVS)
def test_grad_and_vjp_through_the_functional_api(case):
    ours, theirs, xs, ws = _pair(case)
    x, w = _rand(*xs), _rand(*ws)
    b = _rand(ws[1] * CONVS[case][0].get("groups", 1) if CONVS[case][0].get("transposed") else ws[0])
    loss = lambda f: lambda x, w, b: f(x, w, b).sin().sum()  # noqa: E731
    got = grad(loss(ours), argnums=(0, 1, 2))(x, w, b)
    want = grad(loss(theirs), argnums=(0, 1, 2))(x, w, b)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **CLOSE)
    out, pull = vjp(ours, x, w, b)
    out_t, pull_t = vjp(theirs, x, w, b)
    torch.testing.assert_close(out, out_t, **CLOSE)
    cotangent = _rand(*out.shape)
    for a, e in zip(pull(cotangent), pull_t(cotangent)):
        torch.testing.assert_close(a, e, **CLOSE)


def test_jacrev_small_float64():
    ours, theirs, _, _ = _pair("2d-stride-groups")
    x, w, b = _rand(1, 2, 4, 3), _rand(4, 1, 2, 2), _rand(4)
    kw = dict(stride=2, padding=1, groups=2)
    got = jacrev(lambda x, w: xconv.conv_fprop(x, w, bias=b, **kw), argnums=(0, 1))(x, w)
    want = jacrev(lambda x, w: F.conv2d(x, w, b, **kw), argnums=(0, 1))(x, w)
    for a, e in zip(got, want):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e, **CLOSE)


def test_vmap_over_grad_gives_per_sample_gradients():
    """Per-sample weight gradients (the DP-SGD idiom) through the functional API and a converted module."""
    x, w = _rand(5, 3, 6, 6), _rand(4, 3, 3, 3)

    def per_sample(conv):
        return vmap(grad(lambda w, xi: conv(xi[None], w).square().sum()), in_dims=(None, 0))(w, x)

    got = per_sample(lambda xi, w: xconv.conv_fprop(xi, w, padding=1, stride=2))
    want = per_sample(lambda xi, w: F.conv2d(xi, w, padding=1, stride=2))
    assert got.shape == (5, 4, 3, 3, 3)
    torch.testing.assert_close(got, want, **CLOSE)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.ConvTranspose2d(4, 2, 2, stride=2)).double()
    ours = xt.convert(nn.Sequential(*[m for m in model.modules()][1:]), backend="numpy")   # shares the parameters
    params = {k: v.detach() for k, v in model.named_parameters()}

    def grads(m):
        return vmap(grad(lambda p, xi: functional_call(m, p, (xi[None],)).square().sum()), in_dims=(None, 0))(params, x)

    got, want = grads(ours), grads(model)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == (5, *params[name].shape)
        torch.testing.assert_close(got[name], want[name], **CLOSE, msg=name)


@pytest.mark.parametrize("cls, tcls, kwargs", [
    (xt.XConv2d, nn.Conv2d, dict(padding="same", dilation=2)),
    (xt.XConvTranspose3d, nn.ConvTranspose3d, dict(stride=2, groups=2)),
])
def test_grad_through_modules_and_second_order(cls, tcls, kwargs):
    torch.manual_seed(1)
    theirs = tcls(4, 4, 3, dtype=torch.float64, **kwargs)
    ours = cls(4, 4, 3, dtype=torch.float64, backend="numpy", **kwargs)
    ours.load_state_dict(theirs.state_dict())
    nd = 2 if cls is xt.XConv2d else 3
    x = _rand(2, 4, *(5,) * nd)
    params = {k: v.detach() for k, v in theirs.named_parameters()}

    def loss(m):
        return lambda p, x: functional_call(m, p, (x,)).sin().sum()

    for a, e in zip(grad(loss(ours), argnums=(0, 1))(params, x), grad(loss(theirs), argnums=(0, 1))(params, x)):
        for k in (a if isinstance(a, dict) else {"x": a}):
            torch.testing.assert_close((a[k] if isinstance(a, dict) else a), (e[k] if isinstance(e, dict) else e),
                                       **CLOSE)
    # grad of grad: the gradient ops are differentiable under the transform too
    gg = grad(lambda x: grad(loss(ours))(params, x)["weight"].square().sum())(x)
    gg_t = grad(lambda x: grad(loss(theirs))(params, x)["weight"].square().sum())(x)
    torch.testing.assert_close(gg, gg_t, **CLOSE)


def test_grad_through_the_gradient_functions():
    """conv_dgrad, conv_wgrad and convolution_backward are differentiable under torch.func.grad as well."""
    x, w, dy = _rand(2, 4, 6, 6), _rand(6, 2, 3, 3), _rand(2, 6, 6, 6)
    kw = dict(groups=2, padding=1)

    def torch_backward(dy, x, w):
        return torch.ops.aten.convolution_backward(dy, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 2,
                                                   [True, True, True])

    cases = [
        (lambda w: xconv.conv_dgrad(dy, w, x.shape, **kw).square().sum(),
         lambda w: torch_backward(dy, x, w)[0].square().sum()),
        (lambda x: xconv.conv_wgrad(x, dy, w.shape, **kw).square().sum(),
         lambda x: torch_backward(dy, x, w)[1].square().sum()),
        (lambda dy: sum(r.square().sum() for r in xconv.convolution_backward(dy, x, w, bias_sizes=[6], **kw)),
         lambda dy: sum(r.square().sum() for r in torch_backward(dy, x, w))),
    ]
    for (ours, theirs), arg in zip(cases, (w, x, dy)):
        torch.testing.assert_close(grad(ours)(arg), grad(theirs)(arg), **CLOSE)


def test_vmap_folds_an_unbatched_weight_into_one_call():
    """vmap over the input with a shared weight is one convolution of the folded batch (B*N); a batched weight
    is one call per element. Both match torch's vmap of its own convolution."""
    x, w, ws = _rand(3, 2, 4, 6, 6), _rand(5, 4, 3, 3), _rand(3, 5, 4, 3, 3)
    spy = SpyBackend("vmapspy")
    with registered(spy):
        got = vmap(lambda xi: xconv.conv_fprop(xi, w, padding=1, backend="vmapspy"))(x)
        assert [c[0] for c in spy.calls] == ["fprop"] and spy.calls[0][1].input_shape == (6, 4, 6, 6)
        torch.testing.assert_close(got, vmap(lambda xi: F.conv2d(xi, w, padding=1))(x), **CLOSE)
        spy.calls.clear()
        got = vmap(lambda xi, wi: xconv.conv_fprop(xi, wi, padding=1, backend="vmapspy"))(x, ws)
        assert [c[0] for c in spy.calls] == ["fprop"] * 3
        torch.testing.assert_close(got, vmap(lambda xi, wi: F.conv2d(xi, wi, padding=1))(x, ws), **CLOSE)
        spy.calls.clear()
        dy = _rand(3, 2, 5, 6, 6)
        got = vmap(lambda d: xconv.conv_dgrad(d, w, (2, 4, 6, 6), padding=1, backend="vmapspy"))(dy)
        assert [c[0] for c in spy.calls] == ["dgrad"]
        want = vmap(lambda d: torch.ops.aten.convolution_backward(d, x[0], w, None, [1, 1], [1, 1], [1, 1], False,
                                                                  [0, 0], 1, [True, False, False])[0])(dy)
        torch.testing.assert_close(got, want, **CLOSE)
