"""Train a small CNN on scikit-learn's 8x8 digits twice, with torch.nn layers and converted to xconv, and compare.

The model has two convolutions (the second grouped), a classifier and an auxiliary
reconstruction head (a transposed convolution from the 4x4 feature map back to 8x8); the loss is
cross-entropy + 0.5 * MSE(reconstruction, image). Both runs start from the same weights (the
xconv model is a deepcopy of the torch model, converted with ``xconv.torch.convert``) and see the
same batches in the same order; they run in lockstep on the CPU.

What is compared, and against which bounds (docs/torch.md explains the choice):

* Per step, every convolution of the xconv model: its forward output, grad_input, grad_weight
  and grad_bias against PyTorch's own kernels (``aten.convolution`` / ``aten.convolution_backward``)
  on the identical operands. Each element is a sum of K products, so each library's result is
  within ``gamma(K, u) * A`` of the exact value, where ``A`` is the same sum over absolute values
  (computed by xconv on |grad_output|, |input|, |weight| in float64) and ``gamma`` the error-bound
  constant of docs/conformance.md (min of the worst-case K*u/(1-K*u) and the probabilistic
  exp(8*sqrt(K)*u)-1); their difference is within twice that. "max |d|/bound" is the largest
  |xconv - torch| / (2 * gamma(K, u) * A) seen in the epoch: <= 1 means every convolution agreed
  within its error bound.
* Per epoch, the two trajectories, trained in float32. Rounding makes independent runs drift
  apart, so the allowance is measured, not guessed: a third run, PyTorch in float64 from the same
  start on the same batches, shows how far rounding alone moves PyTorch's float32 run. The xconv
  run passes when (a) its per-step losses differ from the torch run's by at most
  ``TRAJECTORY_FACTOR`` times the torch run's own drift from float64 (both as the mean over the
  epoch's steps of the absolute per-step difference), and (b) every test image on which the two
  models predict different classes is one whose top-two torch logits are closer than
  ``2 * TRAJECTORY_FACTOR`` times that image's largest float32-vs-float64 logit drift. In words:
  xconv may not disagree with PyTorch by more than rounding makes PyTorch disagree with itself.

Needs, beyond xconv: PyTorch (``pip install -e ".[torch]"``, or the CPU build first, docs/install.md)
and scikit-learn, whose bundled digits are the data (``pip install scikit-learn``; the ``test`` extra
installs both). Without them it says so and exits 2.

Run: ``python examples/train_digits.py [--epochs N] [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import numpy as np

NEEDS = ('examples/train_digits.py needs PyTorch and scikit-learn (its bundled 8x8 digits are the data): '
         'pip install -e ".[torch]" scikit-learn  (the CPU build of torch: docs/install.md)')


def _missing() -> str:
    """Which of the example's extra packages are not installed here ("" when both are); imports nothing."""
    import importlib.util

    def installed(module):
        if module in sys.modules and sys.modules[module] is None:      # blocked
            return False
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    wanted = (("torch", "torch"), ("sklearn", "scikit-learn"))
    return ", ".join(dist for module, dist in wanted if not installed(module))


if __name__ == "__main__" and _missing():
    print(f"{NEEDS}; missing here: {_missing()}", file=sys.stderr)
    sys.exit(2)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xconv  # noqa: E402
import xconv.torch  # noqa: E402

RECON_WEIGHT = 0.5
TRAJECTORY_FACTOR = 4.0
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
TINY = {torch.float32: 2.0**-149, torch.float64: 2.0**-1074}


class DigitsNet(nn.Module):
    """conv(1->16) - ReLU - grouped conv(16->32, groups=4) - ReLU - 2x2 avg-pool, then two heads."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, groups=4), nn.ReLU(),
            nn.AvgPool2d(2))                                      # 8x8 -> 4x4
        self.classifier = nn.Linear(32 * 4 * 4, 10)
        self.decoder = nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1)  # 4x4 -> 8x8

    def forward(self, x):
        h = self.features(x)
        return self.classifier(h.flatten(1)), self.decoder(h)


def loss_fn(logits, recon, images, labels):
    return F.cross_entropy(logits, labels) + RECON_WEIGHT * F.mse_loss(recon, images)


def load_data(dtype):
    """The 1797 bundled 8x8 digits scaled to [0, 1]; a fixed 80/20 train/test split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=dtype).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    n_train = int(0.8 * len(labels))
    tr, te = order[:n_train], order[n_train:]
    return (images[tr], labels[tr]), (images[te], labels[te])


# --------------------------------------------------------------------------------------------
# The per-step check of every xconv convolution against PyTorch's kernels on the same operands

def gamma(k, u):
    """Error-bound constant of a k-term sum of products (docs/conformance.md): min(worst case, probabilistic)."""
    worst = k * u / (1 - k * u) if k * u < 1 else math.inf
    return min(worst, math.expm1(8.0 * math.sqrt(k) * u + k * u * u / (1 - u)))


class ConvProbe:
    """Records each xconv convolution's operands in a step and checks its results against PyTorch's."""

    def __init__(self, model):
        self.layers = [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
        self.records = {}
        for m in self.layers:
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise ValueError("the probe checks zero-padded layers with explicit padding only")
            m.register_forward_pre_hook(self._pre)
            m.register_forward_hook(self._post)

    def _pre(self, module, args):
        x = args[0]
        rec = self.records[module] = {"x": x.detach()}
        if x.requires_grad:  # an alias only this layer consumes, so its gradient is this layer's grad_input
            x = x.view_as(x)
            x.register_hook(lambda g: rec.__setitem__("dx", g.detach()))
        return (x,) + tuple(args[1:])

    def _post(self, module, args, y):
        rec = self.records[module]
        rec["y"] = y.detach()
        if y.requires_grad:
            y.register_hook(lambda g: rec.__setitem__("dy", g.detach()))

    def check(self) -> float:
        """max over layers and elements of |xconv - torch| / (2 * gamma(K, u) * A) for y, dx, dw, db."""
        worst = 0.0
        for m in self.layers:
            rec = self.records.pop(m)
            x, y, dy, w, b = rec["x"], rec["y"], rec["dy"], m.weight.detach(), m.bias
            u, tiny = UNIT_ROUNDOFF[x.dtype], TINY[x.dtype]
            conf = dict(stride=list(m.stride), padding=list(m.padding), dilation=list(m.dilation),
                        transposed=m.transposed, output_padding=list(m.output_padding), groups=m.groups)
            kernel = math.prod(m.kernel_size)
            n = x.shape[0]
            slide = x.shape[2:] if m.transposed else y.shape[2:]
            k = {"y": x.shape[1] // m.groups * kernel + 1, "dx": y.shape[1] // m.groups * kernel,
                 "dw": n * math.prod(slide), "db": n * math.prod(y.shape[2:])}
            mask = [rec.get("dx") is not None, m.weight.grad is not None, b is not None and b.grad is not None]
            want_y = torch.ops.aten.convolution(x, w, None if b is None else b.detach(), **conf)
            want = torch.ops.aten.convolution_backward(dy, x, w, [b.shape[0]] if b is not None else None,
                                                       output_mask=mask, **conf)
            # the sums over absolute values, in float64 (their own rounding is covered by the 1 + 4*gamma64 factor)
            a64 = dict(stride=tuple(m.stride), padding=tuple(m.padding), dilation=tuple(m.dilation),
                       transposed=m.transposed, output_padding=tuple(m.output_padding), groups=m.groups,
                       backend="numpy")
            ax, aw, ady = x.double().abs(), w.double().abs(), dy.double().abs()
            abs_y = xconv.conv_fprop(ax, aw, bias=None if b is None else b.detach().double().abs(), **a64)
            abs_grads = xconv.convolution_backward(ady, ax, aw, output_mask=mask, **a64)
            got = {"y": y, "dx": rec.get("dx"), "dw": m.weight.grad, "db": None if b is None else b.grad}
            pairs = {"y": (want_y, abs_y), "dx": (want[0], abs_grads[0]), "dw": (want[1], abs_grads[1]),
                     "db": (want[2], abs_grads[2])}
            for key, (ref, a) in pairs.items():
                if got[key] is None:
                    continue
                bound = 2 * (gamma(k[key], u) * (1 + 4 * gamma(k[key], 2.0**-53)) * a + (k[key] + 2) * tiny)
                ratio = ((got[key].double() - ref.double()).abs() / bound).max().item()
                worst = max(worst, ratio)
        return worst


# --------------------------------------------------------------------------------------------
# Training

def make_models(seed, backend):
    """The torch model, its float64 copy and its xconv conversion, all with the same initial weights."""
    torch.manual_seed(seed)
    reference = DigitsNet()
    return reference, copy.deepcopy(reference).double(), xconv.torch.convert(copy.deepcopy(reference),
                                                                             backend=backend)


def test_logits(model, images):
    with torch.no_grad():
        return model(images.to(next(model.parameters()).dtype))[0].double()


def run(epochs=5, batch_size=32, max_batches=None, lr=0.05, seed=0, backend="numpy", out=sys.stdout):
    """Train the torch, the xconv and the float64 torch model in lockstep on the same batches.

    Returns one dict per epoch; prints a table to ``out`` (None: silent).
    """
    (images, labels), (test_images, test_labels) = load_data(torch.float32)
    torch_model, f64_model, xconv_model = make_models(seed, backend)
    models = {"torch": torch_model, "f64": f64_model, "xconv": xconv_model}
    optims = {k: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for k, m in models.items()}
    probe = ConvProbe(xconv_model)
    ConvProbe(torch_model)   # the same recording hooks (unread) on the torch model: both timings carry their cost
    order_gen = torch.Generator().manual_seed(seed)
    n = len(labels)
    rows = []
    if out is not None:
        print(f"digits: {n} train / {len(test_labels)} test images, batch {batch_size}, SGD lr {lr} momentum 0.9, "
              f"float32, xconv backend {backend!r}, torch {torch.__version__} ({torch.get_num_threads()} thread"
              f"{'s' if torch.get_num_threads() != 1 else ''})",
              file=out)
        print(f"{'epoch':>5} | {'loss torch':>10} {'loss xconv':>10} | {'step |dloss|':>12} {'allowed':>8} | "
              f"{'acc torch':>9} {'acc xconv':>9} | {'max |d|/bound':>13} | {'s/epoch torch':>13} "
              f"{'s/epoch xconv':>13}", file=out)
    for epoch in range(1, epochs + 1):
        order = torch.randperm(n, generator=order_gen)
        batches = [order[i:i + batch_size] for i in range(0, n, batch_size)][:max_batches]
        loss_sum = {k: 0.0 for k in models}
        seconds = {k: 0.0 for k in models}
        diff_xconv = diff_f64 = 0.0  # sums over steps of |loss_xconv - loss_torch| and |loss_torch - loss_f64|
        worst = 0.0
        for idx in batches:
            step_loss = {}
            for key, model in models.items():
                x = images[idx].double() if key == "f64" else images[idx]
                start = time.perf_counter()
                optims[key].zero_grad(set_to_none=True)
                logits, recon = model(x)
                loss = loss_fn(logits, recon, x, labels[idx])
                loss.backward()
                if key == "xconv":  # check this step's convolutions before the optimizer changes the weights
                    seconds[key] += time.perf_counter() - start
                    worst = max(worst, probe.check())
                    start = time.perf_counter()
                optims[key].step()
                seconds[key] += time.perf_counter() - start
                step_loss[key] = loss.item()
                loss_sum[key] += step_loss[key]
            diff_xconv += abs(step_loss["xconv"] - step_loss["torch"])
            diff_f64 += abs(step_loss["torch"] - step_loss["f64"])
        steps = len(batches)
        logits = {k: test_logits(m, test_images) for k, m in models.items()}
        pred = {k: v.argmax(1) for k, v in logits.items()}
        top2 = logits["torch"].topk(2, dim=1).values
        drift = (logits["torch"] - logits["f64"]).abs().max(1).values
        ambiguous = (top2[:, 0] - top2[:, 1]) <= 2 * TRAJECTORY_FACTOR * drift
        flipped = pred["xconv"] != pred["torch"]
        row = dict(epoch=epoch, steps=steps,
                   loss_torch=loss_sum["torch"] / steps, loss_xconv=loss_sum["xconv"] / steps,
                   loss_f64=loss_sum["f64"] / steps,
                   step_loss_diff=diff_xconv / steps, step_loss_allowed=TRAJECTORY_FACTOR * diff_f64 / steps,
                   acc_torch=(pred["torch"] == test_labels).double().mean().item(),
                   acc_xconv=(pred["xconv"] == test_labels).double().mean().item(),
                   flipped=int(flipped.sum()), unexplained_flips=int((flipped & ~ambiguous).sum()),
                   max_ratio=worst, seconds_torch=seconds["torch"], seconds_xconv=seconds["xconv"])
        rows.append(row)
        if out is not None:
            print(f"{epoch:>5} | {row['loss_torch']:>10.6f} {row['loss_xconv']:>10.6f} | "
                  f"{row['step_loss_diff']:>12.1e} {row['step_loss_allowed']:>8.1e} | "
                  f"{row['acc_torch']:>9.2%} {row['acc_xconv']:>9.2%} | {worst:>13.3g} | "
                  f"{row['seconds_torch']:>13.3f} {row['seconds_xconv']:>13.3f}", file=out)
    return rows


def agree(rows) -> list[str]:
    """The disagreements (empty when the runs agree within the bounds)."""
    problems = []
    for r in rows:
        if not r["max_ratio"] <= 1.0:
            problems.append(f"epoch {r['epoch']}: a convolution differs from torch by {r['max_ratio']:.3g} x its bound")
        if not r["step_loss_diff"] <= r["step_loss_allowed"]:
            problems.append(f"epoch {r['epoch']}: per-step losses differ by {r['step_loss_diff']:.3g} on average, "
                            f"more than the allowed {r['step_loss_allowed']:.3g}")
        if r["unexplained_flips"]:
            problems.append(f"epoch {r['epoch']}: {r['unexplained_flips']} test predictions differ without being "
                            "within rounding of a tie")
    return problems


def main(argv=None, out=sys.stdout):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 epoch of 10 batches (a smoke test)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="numpy", help="xconv backend of the converted model")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: xconv's NumPy backend runs its products on one "
                             "BLAS thread, so both sides get one)")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        rows = run(epochs=1 if args.quick else args.epochs, batch_size=args.batch_size,
                   max_batches=10 if args.quick else None, lr=args.lr, seed=args.seed, backend=args.backend,
                   out=out)
    finally:
        torch.set_num_threads(threads)
    problems = agree(rows)
    if out is not None:
        mean = {k: sum(r[f"seconds_{k}"] for r in rows) / len(rows) for k in ("torch", "xconv")}
        print(f"time per epoch: torch {mean['torch']:.3f} s, xconv {mean['xconv']:.3f} s "
              f"(training steps only; the checks are not timed)", file=out)
        print("agreement: " + ("the two runs agree within the bounds" if not problems else "; ".join(problems)),
              file=out)
    return rows, problems


if __name__ == "__main__":
    sys.exit(1 if main()[1] else 0)
