"""xconv's torch operators on symbolic sizes: torch.compile with changing shapes, mark_dynamic, export with a Dim.

The truth for each compiled run is the same model in eager mode. Under ``backend="aot_eager"`` the graph runs
the same kernels (aten's for the rest of the model, xconv's for the convolutions), so with
``deterministic=True`` (xconv's promise that bits depend on values only) the results are equal bit for bit.
Inductor generates its own code for the rest of the model, so there the check is float32 rounding.
"""

from __future__ import annotations

import copy

import pytest

import xconv
from core_helpers import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import xconv.torch as xt  # noqa: E402

BITWISE = dict(rtol=0, atol=0)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cnn(deterministic):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2),
                          nn.ReLU(), nn.ConvTranspose2d(4, 2, 2, stride=2))
    return xt.convert(model, backend="numpy", deterministic=deterministic)


def _train_in_lockstep(backend, batches, deterministic, mark_dynamic=False):
    """Train an eager and a compiled copy of the converted CNN on the same batches; yield per step the
    (loss, output, gradients) of both and the compile counter."""
    eager = _cnn(deterministic)
    compiled_model = copy.deepcopy(eager)
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(compiled_model, backend=counter)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, compiled_model)]
    g = torch.Generator().manual_seed(1)
    for n in batches:
        x = torch.randn(n, 3, 12, 12, generator=g)
        target = torch.randn(n, 2, 12, 12, generator=g)
        steps = []
        for model, run, opt in zip((eager, compiled_model), (eager, compiled), opts):
            xi = x.clone().requires_grad_()
            if mark_dynamic and run is compiled:
                torch._dynamo.mark_dynamic(xi, 0)
            opt.zero_grad()
            out = run(xi)
            loss = F.mse_loss(out, target)
            loss.backward()
            steps.append((loss.detach(), out.detach(), xi.grad, [p.grad.clone() for p in model.parameters()]))
            opt.step()
        yield steps, counter


def test_default_compile_trains_through_a_smaller_last_batch():
    """The user's loop (a DataLoader without drop_last): batches 8, 8, 5 under torch.compile's defaults
    (Inductor); the third step recompiles with a symbolic batch and matches eager within float32 rounding."""
    for steps, counter in _train_in_lockstep("inductor", (8, 8, 5), deterministic=False):
        (loss_e, out_e, gx_e, grads_e), (loss_c, out_c, gx_c, grads_c) = steps
        torch.testing.assert_close(loss_c, loss_e)
        torch.testing.assert_close(out_c, out_e)
        torch.testing.assert_close(gx_c, gx_e)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b)
    assert counter.frame_count == 2          # static batch 8, then one graph with a symbolic batch


@pytest.mark.parametrize("mark_dynamic", [False, True], ids=["automatic", "mark_dynamic"])
def test_changing_batch_under_aot_eager_is_bitwise_eager(mark_dynamic):
    """deterministic=True: compiled forward, input and parameter gradients equal eager's bits, every step;
    with torch._dynamo.mark_dynamic on the batch, one graph serves every batch size."""
    for steps, counter in _train_in_lockstep("aot_eager", (8, 8, 5, 3), deterministic=True,
                                             mark_dynamic=mark_dynamic):
        (loss_e, out_e, gx_e, grads_e), (loss_c, out_c, gx_c, grads_c) = steps
        torch.testing.assert_close(out_c, out_e, **BITWISE)
        torch.testing.assert_close(loss_c, loss_e, **BITWISE)
        torch.testing.assert_close(gx_c, gx_e, **BITWISE)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b, **BITWISE)
    assert counter.frame_count == (1 if mark_dynamic else 2)


def _same_stride2(x, w):
    """torch's reference for xconv's padding="same" with stride 2 (ONNX SAME_UPPER: output ceil(n/2))."""
    pads = []
    for n, k in zip(reversed(x.shape[2:]), reversed(w.shape[2:])):
        total = max((-(-n // 2) - 1) * 2 + k - n, 0)
        pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), w, stride=2)


def test_dynamic_true_functional_same_padding_stride_2_changing_batch_and_spatial():
    """torch.compile(dynamic=True) of conv_fprop(padding="same", stride=2): one graph for every batch and
    spatial size (odd and even), bitwise equal to eager xconv and within rounding of torch's conv."""
    counter = CompileCounterWithBackend("aot_eager")
    kw = dict(padding="same", stride=2, deterministic=True)
    f = torch.compile(lambda x, w: xconv.conv_fprop(x, w, **kw), dynamic=True, backend=counter)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    for shape in ((2, 3, 9, 11), (3, 3, 12, 10), (5, 3, 7, 16), (4, 3, 10, 13)):
        x = torch.randn(*shape, generator=g, requires_grad=True)
        y = f(x, w)
        want = xconv.conv_fprop(x, w, **kw)
        assert y.shape == want.shape == (shape[0], 4, -(-shape[2] // 2), -(-shape[3] // 2))
        torch.testing.assert_close(y, want, **BITWISE)
        torch.testing.assert_close(y, _same_stride2(x, w), rtol=1e-5, atol=1e-5)
        dy = torch.randn(y.shape, generator=g)
        got, expected = torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(want, (x, w), dy)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, **BITWISE)
    assert counter.frame_count == 1


def test_dynamic_true_dgrad_wgrad_and_backward_with_symbolic_shapes():
    """The gradient ops' fake kernels take symbolic explicit shapes (x.shape, w.shape) too."""
    counter = CompileCounterWithBackend("aot_eager")

    def grads(dy, x, w):
        gx = xconv.conv_dgrad(dy, w, x.shape, stride=2, padding=1, deterministic=True)
        gw = xconv.conv_wgrad(x, dy, w.shape, stride=2, padding=1, deterministic=True)
        both = xconv.convolution_backward(dy, x, w, bias_sizes=[w.shape[0]], stride=2, padding=1,
                                          deterministic=True)
        return gx, gw, both

    f = torch.compile(grads, dynamic=True, backend=counter)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 2, 3, 3, generator=g)
    for n, h, wd in ((8, 9, 13), (3, 10, 6), (6, 9, 12)):   # the first: all sizes distinct (no duck sizing)
        x = torch.randn(n, 2, h, wd, generator=g)
        dy = torch.randn(xconv.output_shape(x.shape, w.shape, stride=2, padding=1), generator=g)
        (gx, gw, both), (ex, ew, eboth) = f(dy, x, w), grads(dy, x, w)
        for a, b in zip((gx, gw, *both), (ex, ew, *eboth)):
            torch.testing.assert_close(a, b, **BITWISE)
    assert counter.frame_count == 1


def test_export_with_a_dynamic_batch_dim():
    model = _cnn(deterministic=True).eval()
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (torch.randn(4, 3, 12, 12),), dynamic_shapes=({0: batch},))
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function" and "xconv" in str(n.target)]
    assert ops == [torch.ops.xconv.fprop.default] * 3
    for n in (2, 3, 7):
        x = torch.randn(n, 3, 12, 12)
        torch.testing.assert_close(ep.module()(x), model(x), **BITWISE)


def test_shape_errors_under_compile_name_the_argument():
    """Modules check their input in traced code: the ShapeError itself, in torch's words. The functional API's
    size checks run in the operator's fake kernel; torch wraps what a fake kernel raises (TorchRuntimeError),
    and its text carries the core's message: the argument, the expected and the given value."""
    module = torch.compile(xt.XConv2d(4, 6, 3), backend="aot_eager", dynamic=True)
    with pytest.raises(xconv.ShapeError, match=r"expected input\[2, 3, 8, 8\] to have 4 channels"):
        module(torch.randn(2, 3, 8, 8))
    f = torch.compile(lambda x, w: xconv.conv_fprop(x, w, groups=2), backend="aot_eager", dynamic=True)
    with pytest.raises(Exception, match=r"ShapeError\('weight: dim 1 must be C_in / groups .*expected 3, given 2"):
        f(torch.randn(2, 6, 8, 9), torch.randn(4, 2, 3, 3))
