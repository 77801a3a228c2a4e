"""Benchmark: whole-model training steps, PyTorch CPU vs the same model converted to xconv's NumPy backend.

Run from the repository root (see benchmarks/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/models.py
    python benchmarks/models.py --threads 1 --models resnet18_64 unet_64
    python benchmarks/models.py --breakdown resnet18_64

The model families people train on small CPUs, defined here by hand (no torchvision): ResNet-18
(64x64 batch 8; 224x224 batch 2), MobileNetV2 width 0.5 (96x96 batch 8), a 3-level U-Net with
ConvTranspose2d 2x2 stride-2 up-sampling (64x64 batch 4), a wav2vec-2.0-shaped 1-D feature encoder
(kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2, 1 s at 16 kHz, batch 4), a 3-D conv net (8x56x56
clips, batch 2) and the digits CNN of examples/train_digits.py (batch 64).

Per model: the torch model and ``xconv.torch.convert(copy, backend="numpy")`` (same weights), one
training step each (zero grads, forward, loss, backward; no optimizer step), the two alternating in
one process, in the user's default environment (this script sets no ``OMP_WAIT_POLICY``), with
torch's default threads or ``--threads N`` (``torch.set_num_threads(N)`` and the BLAS libraries
limited to N threads, as cpu_backward.py does); the median of at least ``--reps`` steps and at least
0.5 s of them per library, after at least 0.2 s of warm-up. Then the same for an evaluation-mode
forward (``model.eval()``, ``torch.no_grad()``). ``--mode own-process`` times each model and library
in fresh processes of their own (``--procs``, 3 by default, alternating which library goes first; the
median of their medians; no torch model run in xconv's process; torch is still imported, as the
converted model is a torch module).

``--breakdown MODEL`` times one xconv training step layer by layer: every xconv call of the step
(forward, and backward with its output mask), with the path the NumPy backend ran (``xconv.trace()``),
its time inside the step, its GFLOP/s and that rate as a share of numpy's measured float32 matrix
product rate, and the same call replayed in isolation on xconv and on torch (``aten.convolution`` /
``aten.convolution_backward`` with the same mask).

Timings on a shared 2-core machine are noisy: repeat runs and compare medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xconv  # noqa: E402
import xconv.torch  # noqa: E402

_USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
from cpu_backward import blas_info, compiled_loops_info, cpu_model, limit_blas_threads  # noqa: E402
if _USER_OMP_WAIT_POLICY is None:       # cpu_backward sets PASSIVE on import; a user's process has no setting
    os.environ.pop("OMP_WAIT_POLICY", None)


# ---------------------------------------------------------------------------------------------
# Models


def _bn_relu(c, dims=2):
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]
    return [bn(c), nn.ReLU(inplace=True)]


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), *_bn_relu(64), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def _divisible(v, d=8):
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(inplace=True), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, width=0.5, classes=10):
        super().__init__()
        cin = _divisible(32 * width)
        layers = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(inplace=True)]
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                           (6, 160, 3, 2), (6, 320, 1, 1)):
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = 1280
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def _double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), *_bn_relu(cout),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), *_bn_relu(cout))


class UNet(nn.Module):
    """Three resolution levels (64, 32, 16 at 64x64 input), ConvTranspose2d 2x2 stride-2 up-sampling."""

    def __init__(self, cin=3, classes=2, base=32):
        super().__init__()
        self.enc1, self.enc2 = _double_conv(cin, base), _double_conv(base, 2 * base)
        self.mid = _double_conv(2 * base, 4 * base)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = _double_conv(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = _double_conv(2 * base, base)
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


class SpeechEncoder(nn.Module):
    """wav2vec 2.0's convolutional feature encoder: 7 conv1d layers of 512 channels, GroupNorm after the first."""

    def __init__(self, channels=512):
        super().__init__()
        layers, cin = [], 1
        for i, (k, s) in enumerate(((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))):
            layers.append(nn.Conv1d(cin, channels, k, s, bias=False))
            if i == 0:
                layers.append(nn.GroupNorm(channels, channels))
            layers.append(nn.GELU())
            cin = channels
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


class Conv3DNet(nn.Module):
    """A small C3D-like clip classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(3, 32, 3, padding=1, bias=False), *_bn_relu(32, 3), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(32, 64, 3, padding=1, bias=False), *_bn_relu(64, 3), nn.MaxPool3d(2),
            nn.Conv3d(64, 128, 3, padding=1, bias=False), *_bn_relu(128, 3),
            nn.Conv3d(128, 128, 3, padding=1, bias=False), *_bn_relu(128, 3), nn.MaxPool3d(2),
            nn.Conv3d(128, 256, 3, padding=1, bias=False), *_bn_relu(256, 3))
        self.fc = nn.Linear(256, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3, 4)))


def _digits():
    sys.path.insert(0, str(ROOT / "examples"))
    from train_digits import DigitsNet, loss_fn
    return DigitsNet(), loss_fn


def _classify(classes=10):
    def loss(out, x, y):
        return F.cross_entropy(out, y)
    return loss


#: name -> (builder returning (model, loss(out, x, y)), input shape, target maker)
MODELS = {
    "resnet18_64": (lambda: (ResNet18(), _classify()), (8, 3, 64, 64), "class"),
    "resnet18_224": (lambda: (ResNet18(), _classify()), (2, 3, 224, 224), "class"),
    "mobilenetv2_96": (lambda: (MobileNetV2(0.5), _classify()), (8, 3, 96, 96), "class"),
    "unet_64": (lambda: (UNet(), lambda out, x, y: F.cross_entropy(out, y)), (4, 3, 64, 64), "mask"),
    "speech_1d": (lambda: (SpeechEncoder(), lambda out, x, y: out.square().mean()), (4, 1, 16000), None),
    "conv3d_56": (lambda: (Conv3DNet(), _classify()), (2, 3, 8, 56, 56), "class"),
    "digits": (lambda: (lambda m: (m[0], lambda out, x, y: m[1](*out, x, y)))(_digits()), (64, 1, 8, 8),
               "class"),
}


def build(name: str, seed: int = 0):
    """(torch model, converted copy, loss, x, y) for model ``name``, fixed weights and data."""
    make, shape, target = MODELS[name]
    torch.manual_seed(seed)
    model, loss = make()
    conv = xconv.torch.convert(copy.deepcopy(model), backend="numpy")
    x = torch.randn(shape)
    if target == "class":
        y = torch.randint(0, 10, (shape[0],))
    elif target == "mask":
        y = torch.randint(0, 2, (shape[0],) + tuple(shape[2:]))
    else:
        y = None
    return model, conv, loss, x, y


def step_fn(model, loss, x, y):
    def step():
        model.zero_grad(set_to_none=True)
        loss(model(x), x, y).backward()
    return step


def eval_fn(model, x):
    def fwd():
        with torch.no_grad():
            model(x)
    return fwd


# ---------------------------------------------------------------------------------------------
# Timing


#: The clock: wall time (what users see), or with ``--clock cpu`` the process's CPU time (all its threads),
#: which on an oversubscribed machine measures the work done rather than the time slices received; it is
#: meaningful with ``--threads 1`` (with more threads it counts OpenMP's spin-waiting too).
CLOCK = time.perf_counter


#: Each library's timed steps of a model span at least this many seconds, and its warm-up at least WARMUP_SECONDS:
#: ``--reps`` is a floor. A digits step (2-3 ms) timed 5 times gave ratios from 0.73 to 1.82 between runs.
MIN_SECONDS = 0.5
WARMUP_SECONDS = 0.2


def _count(seconds_each: float, reps: int, span: float) -> int:
    """Steps of ``seconds_each`` needed to fill ``span`` seconds, at least ``reps``."""
    return max(reps, math.ceil(span / max(seconds_each, 1e-6)))


def timed_pair(fa, fb, reps: int, warmup: int = 2, span: float = MIN_SECONDS) -> tuple[float, float]:
    """Medians of fa and fb, alternating (order swapped each repetition), after warm-up; at least ``reps`` each and
    enough that the faster one's fill ``span`` seconds (the warm-up, at least ``warmup`` each, ``span`` x
    WARMUP_SECONDS / MIN_SECONDS)."""
    ta, tb = [], []

    def run(n):
        for rep in range(n):
            for f, out in (((fa, ta), (fb, tb)) if rep % 2 == 0 else ((fb, tb), (fa, ta))):
                t = CLOCK()
                f()
                out.append(CLOCK() - t)
    warmup = max(1, warmup)
    run(warmup)
    run(_count(min(ta[-1], tb[-1]), warmup, span * WARMUP_SECONDS / MIN_SECONDS) - warmup)
    done = len(ta)
    run(_count(min(statistics.median(ta), statistics.median(tb)), reps, span))
    return statistics.median(ta[done:]), statistics.median(tb[done:])


def timed(f, reps: int, warmup: int = 2) -> float:
    """Median of f after warm-up, as :func:`timed_pair` counts them."""
    ts = []

    def run(n):
        for _ in range(n):
            t = CLOCK()
            f()
            ts.append(CLOCK() - t)
    warmup = max(1, warmup)
    run(warmup)
    run(_count(ts[-1], warmup, WARMUP_SECONDS) - warmup)
    done = len(ts)
    run(_count(statistics.median(ts), reps, MIN_SECONDS))
    return statistics.median(ts[done:])


def set_threads(n):
    if n:
        torch.set_num_threads(n)
        return limit_blas_threads(n)
    return None


def interleaved(names, reps: int, kind: str) -> dict:
    out = {}
    for name in names:
        model, conv, loss, x, y = build(name)
        if kind == "train":
            fa, fb = step_fn(model, loss, x, y), step_fn(conv, loss, x, y)
        else:
            model.eval(), conv.eval()
            fa, fb = eval_fn(model, x), eval_fn(conv, x)
        out[name] = timed_pair(fa, fb, reps)
    return out


def own_process(names, reps: int, kind: str, threads, procs: int = 3) -> dict:
    """Per model, ``procs`` fresh processes per library (torch first, then xconv first, alternating), each timing its
    median step; the median over the processes. A single process's figure moved by 0.7-1.2x between runs here."""
    out = {}
    for name in names:
        times = {"torch": [], "xconv": []}
        for i in range(procs):
            for lib in (("torch", "xconv") if i % 2 == 0 else ("xconv", "torch")):
                cmd = [sys.executable, __file__, "--worker", name, lib, kind, "--reps", str(reps),
                       "--clock", "cpu" if CLOCK is time.process_time else "wall"]
                if threads:
                    cmd += ["--threads", str(threads)]
                res = subprocess.run(cmd, capture_output=True, text=True, check=True)
                times[lib].append(json.loads(res.stdout.strip().splitlines()[-1])["seconds"])
        out[name] = (statistics.median(times["torch"]), statistics.median(times["xconv"]))
    return out


def worker(name: str, lib: str, kind: str, reps: int) -> None:
    model, conv, loss, x, y = build(name)
    m = model if lib == "torch" else conv
    del model, conv
    if kind == "eval":
        m.eval()
    f = step_fn(m, loss, x, y) if kind == "train" else eval_fn(m, x)
    print(json.dumps({"seconds": timed(f, reps)}))


def table(title: str, results: dict) -> list:
    print(f"\n{title}")
    print(f"{'model':<16}{'torch ms':>10}{'xconv ms':>10}{'torch/xc':>10}")
    ratios = []
    for name, (tt, tx) in results.items():
        ratios.append(tt / tx)
        print(f"{name:<16}{tt * 1e3:>10.1f}{tx * 1e3:>10.1f}{tt / tx:>10.2f}")
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{'geomean':<16}{'':>20}{geo:>10.2f}   min {min(ratios):.2f}")
    return ratios


# ---------------------------------------------------------------------------------------------
# Per-layer breakdown


def _flops(op, shapes, kw, mask) -> float:
    """Multiply-adds x 2 of the call (the direct-convolution count; per output of a backward call)."""
    x, w, y = shapes["input"], shapes["weight"], shapes["output"]
    if kw.get("transposed"):            # the forward of a transposed conv is the dgrad of a direct one
        x, y = y, x                     # (w[0] is then that direct conv's output channels: y's, x's input)
    macs = x[0] * w[0] * math.prod(y[2:]) * math.prod(w[1:])
    if op == "fprop":
        return 2.0 * macs
    return 2.0 * macs * (int(mask[0]) + int(mask[1]))


def breakdown(name: str, reps: int) -> None:
    """Time each xconv call of one training step of ``name`` and replay it alone on xconv and on torch."""
    model, conv, loss, x, y = build(name)
    calls = []
    orig_f, orig_b = xconv.conv_fprop, xconv.convolution_backward

    def rec(op, orig):
        def call(*args, **kw):
            with xconv.trace() as t:
                start = CLOCK()
                r = orig(*args, **kw)
                sec = CLOCK() - start
            mask = kw.get("output_mask", (True, True, True)) if op == "backward" else None
            calls.append(dict(op=op, args=list(args),   # copied after the step: a copy here slowed the next calls
                              kw=dict(kw), mask=mask, sec=sec, path=t.records[-1].path if t.records else "?",
                              shapes=t.records[-1].shapes if t.records else {}))
            return r
        return call

    step = step_fn(conv, loss, x, y)
    step()
    step()
    xconv.conv_fprop, xconv.convolution_backward = rec("fprop", orig_f), rec("backward", orig_b)
    try:
        with xconv.trace():   # an open trace sends every call through the public calls (xconv/lanes.py steps aside)
            step()
    finally:
        xconv.conv_fprop, xconv.convolution_backward = orig_f, orig_b
    for c in calls:       # (ResNet-18's 512x512x3x3 backward: 9-14 ms in the step with copies inside, 3.0-3.6 without)
        c["args"] = [np.array(a, copy=True) if a is not None else None for a in c["args"]]
    rate = _sgemm_rate()
    print(f"\nper-layer breakdown of one xconv training step of {name} (numpy sgemm {rate:.0f} GFLOP/s)")
    print(f"{'op':<9}{'mask':<6}{'input':<20}{'weight':<20}{'cfg':<14}{'in-step ms':>11}{'alone ms':>9}"
          f"{'torch ms':>9}{'pt/xc':>7}{'GF/s':>7}{'%sgemm':>7}  path")
    total_x = total_t = 0.0
    for c in calls:
        kw = c["kw"]
        shapes = {"input": list(c["args"][1].shape if c["op"] == "backward" else c["args"][0].shape),
                  "weight": list(c["args"][2].shape if c["op"] == "backward" else c["args"][1].shape)}
        shapes["output"] = list(c["args"][0].shape) if c["op"] == "backward" else list(
            xconv.output_shape(shapes["input"], shapes["weight"], **{k: kw[k] for k in (
                "stride", "padding", "dilation", "groups", "transposed", "output_padding") if k in kw}))
        fl = _flops(c["op"], shapes, kw, c["mask"])
        tx, tt = _replay(c, reps)
        total_x += tx
        total_t += tt
        mask = "".join("T" if b else "F" for b in c["mask"]) if c["mask"] else ""
        cfg = _cfg(kw, shapes["weight"])
        print(f"{c['op']:<9}{mask:<6}{'x'.join(map(str, shapes['input'])):<20}"
              f"{'x'.join(map(str, shapes['weight'])):<20}{cfg:<14}{c['sec'] * 1e3:>11.2f}{tx * 1e3:>9.2f}"
              f"{tt * 1e3:>9.2f}{tt / tx:>7.2f}{fl / tx / 1e9:>7.1f}{100 * fl / tx / 1e9 / rate:>6.0f}%  {c['path']}")
    print(f"{'sum of calls alone':<89}{total_x * 1e3:>9.1f}{total_t * 1e3:>9.1f}{total_t / total_x:>7.2f}")


def _sgemm_rate(size: int = 1024, reps: int = 5) -> float:
    """GFLOP/s of numpy's float32 (size x size) products on the benchmark's clock (best of reps)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    best = math.inf
    for _ in range(reps):
        t = CLOCK()
        a @ b
        best = min(best, CLOCK() - t)
    return 2.0 * size**3 / best / 1e9


def _cfg(kw, wshape) -> str:
    s = kw.get("stride", 1)
    s = s if isinstance(s, int) else (s[0] if len(set(s)) == 1 else s)
    g = kw.get("groups", 1)
    parts = [f"s{s}"] if s != 1 else []
    if g != 1:
        parts.append(f"g{g}")
    if kw.get("transposed"):
        parts.append("T")
    return ",".join(parts) or "-"


def _torch_conv_kwargs(kw, nd):
    def seq(v, default):
        v = kw.get(v, default)
        return [v] * nd if isinstance(v, int) else list(v)
    pad = kw.get("padding", 0)
    if isinstance(pad, int):
        pad = [pad] * nd
    pad = [p if isinstance(p, int) else p[0] for p in pad]     # symmetric in these models
    return dict(stride=seq("stride", 1), padding=pad, dilation=seq("dilation", 1),
                transposed=bool(kw.get("transposed", False)), output_padding=seq("output_padding", 0),
                groups=kw.get("groups", 1))


def _replay(c, reps):
    """(xconv seconds, torch seconds) of the recorded call alone, alternating."""
    kw, args = c["kw"], c["args"]
    aten = torch.ops.aten
    if c["op"] == "fprop":
        xx, ww = args[0], args[1]
        bias = kw.get("bias")
        tk = _torch_conv_kwargs(kw, xx.ndim - 2)
        tx_, tw_ = torch.from_numpy(xx), torch.from_numpy(ww)
        tb_ = None if bias is None else torch.from_numpy(np.asarray(bias))

        def fx():
            xconv.conv_fprop(xx, ww, **kw)

        def ft():
            with torch.no_grad():
                aten.convolution(tx_, tw_, tb_, tk["stride"], tk["padding"], tk["dilation"], tk["transposed"],
                                 tk["output_padding"], tk["groups"])
    else:
        dy, xx, ww = args[0], args[1], args[2]
        tk = _torch_conv_kwargs(kw, xx.ndim - 2)
        tdy, tx_, tw_ = torch.from_numpy(dy), torch.from_numpy(xx), torch.from_numpy(ww)
        mask = list(c["mask"])
        bias_sizes = [tdy.shape[1]] if mask[2] else None

        def fx():
            xconv.convolution_backward(dy, xx, ww, **kw)

        def ft():
            aten.convolution_backward(tdy, tx_, tw_, bias_sizes, tk["stride"], tk["padding"], tk["dilation"],
                                      tk["transposed"], tk["output_padding"], tk["groups"], mask)
    return timed_pair(fx, ft, reps, warmup=2, span=0.05)


# ---------------------------------------------------------------------------------------------


def header(threads) -> None:
    print(f"CPU: {cpu_model()}")
    print(f"xconv from {Path(xconv.__file__).resolve().parent.parent} (this checkout's, put first on sys.path)")
    print(f"xconv compiled loops: {compiled_loops_info()}")
    print(f"BLAS: {blas_info()}")
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                          "XCONV_NUMPY_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                          "MKL_ENABLE_INSTRUCTIONS")}
    print("environment: " + (", ".join(f"{k}={v}" for k, v in env.items() if v is not None) or "default"))
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} "
          f"({'set by --threads' if threads else 'default'}); "
          f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}")


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a count of at least 1, got {n}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--reps", type=_positive, default=5,
                    help="timed repetitions per model (median), at least; more where they fill under "
                         f"{MIN_SECONDS} s; default 5")
    ap.add_argument("--procs", type=_positive, default=3,
                    help="--mode own-process: processes per model and library (median of their medians); default 3")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) and BLAS limited to N")
    ap.add_argument("--mode", choices=("interleaved", "own-process", "both"), default="interleaved")
    ap.add_argument("--no-eval", action="store_true", help="skip the evaluation-mode forward table")
    ap.add_argument("--no-train", action="store_true", help="skip the training-step table")
    ap.add_argument("--breakdown", choices=list(MODELS), help="per-layer breakdown of this model (only)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time (default), or the process's CPU time (use with --threads 1 on a busy machine)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "LIB", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    limits = set_threads(args.threads)  # noqa: F841  (kept alive: threadpoolctl restores on collection)
    if args.worker:
        worker(*args.worker, args.reps)
        return 0
    header(args.threads)
    print(f"clock: {args.clock}")
    if args.breakdown:
        breakdown(args.breakdown, args.reps)
        return 0
    results = {}
    kinds = [k for k, off in (("train", args.no_train), ("eval", args.no_eval)) if not off]
    for kind in kinds:
        what = "training step (forward, loss, backward)" if kind == "train" else "evaluation-mode forward"
        if args.mode in ("interleaved", "both"):
            r = interleaved(args.models, args.reps, kind)
            table(f"{what}, interleaved in one process (median of >= {args.reps} steps, >= {MIN_SECONDS} s each)", r)
            results[f"{kind}/interleaved"] = r
        if args.mode in ("own-process", "both"):
            r = own_process(args.models, args.reps, kind, args.threads, args.procs)
            table(f"{what}, each model and library in its own processes (median over {args.procs} processes of "
                  f"medians of >= {args.reps} steps)", r)
            results[f"{kind}/own-process"] = r
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
