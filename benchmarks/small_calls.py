"""Benchmark: small convolutions (digits-sized layers), xconv's NumPy backend vs PyTorch CPU.

Run from the repository root (see benchmarks/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/small_calls.py

Layers of the size ``examples/train_digits.py`` trains (8x8 images, batch 1-32, 4-16 channels, a
1-D and a depthwise layer among them), each as a full-mask backward and as a forward, float32.
Per call: median time of many interleaved repetitions (after a warm-up) for xconv
(``xconv.convolution_backward`` / ``xconv.conv_fprop``) and torch (``aten.convolution_backward`` /
``F.conv*d``), and the ratio torch/xconv (> 1: xconv faster); then the geometric means. At these
sizes the times are mostly per-call overhead (Python, dispatch, threads), not arithmetic.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # see cpu_backward.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))

import xconv  # noqa: E402
from cpu_backward import blas_info, compiled_loops_info, cpu_model, limit_blas_threads  # noqa: E402

#: name, input, weight, conv kwargs
CASES = [
    ("b1_c4_3x3", (1, 4, 8, 8), (4, 4, 3, 3), dict(padding=(1, 1))),
    ("b32_c1to16_3x3", (32, 1, 8, 8), (16, 1, 3, 3), dict(padding=(1, 1))),
    ("b32_c16to32_g4", (32, 16, 8, 8), (32, 4, 3, 3), dict(padding=(1, 1), groups=4)),
    ("b8_c16_depthwise", (8, 16, 8, 8), (16, 1, 3, 3), dict(padding=(1, 1), groups=16)),
    ("b16_c8_1d_k3", (16, 8, 64), (8, 8, 3), dict(padding=(1,))),
    ("b32_c16_1x1_4x4", (32, 16, 4, 4), (16, 16, 1, 1), dict()),
    ("b16_c8to16_s2", (16, 8, 8, 8), (16, 8, 3, 3), dict(stride=(2, 2), padding=(1, 1))),
]


def _median_pair(fa, fb, reps: int) -> tuple[float, float]:
    ta, tb = [], []
    for rep in range(reps + 5):
        for f, out in (((fa, ta), (fb, tb)) if rep % 2 == 0 else ((fb, tb), (fa, ta))):
            t = time.perf_counter()
            f()
            out.append(time.perf_counter() - t)
    return statistics.median(ta[5:]), statistics.median(tb[5:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200, help="timed repetitions per call (median)")
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: torch's default)")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    limit_blas_threads(threads)
    print(f"CPU: {cpu_model()}")
    print(f"numpy {np.__version__}, torch {torch.__version__}, xconv {xconv.__version__}, {compiled_loops_info()}")
    print(f"threads: torch {torch.get_num_threads()}, BLAS: {blas_info()}")
    print()
    header = f"{'case':20s} {'bwd xc us':>10s} {'bwd pt us':>10s} {'torch/xc':>8s} {'fwd xc us':>10s} {'fwd pt us':>10s} " \
             f"{'torch/xc':>8s}"
    print(header)
    print("-" * len(header))
    ratios = {"bwd": [], "fwd": []}
    rng = np.random.default_rng(0)
    for name, xs, ws, kw in CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw), dtype=np.float32)
        tx, tw, tb, tdy = (torch.from_numpy(a) for a in (x, w, b, dy))
        nd = len(xs) - 2
        stride, padding = list(kw.get("stride", (1,) * nd)), list(kw.get("padding", (0,) * nd))
        groups = kw.get("groups", 1)
        conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]

        def xb():
            return xconv.convolution_backward(dy, x, w, bias_sizes=(ws[0],), backend="numpy", **kw)

        def tbw():
            with torch.no_grad():
                return torch.ops.aten.convolution_backward(tdy, tx, tw, [ws[0]], stride, padding, [1] * nd, False,
                                                           [0] * nd, groups, [True, True, True])

        def xf():
            return xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw)

        def tf():
            with torch.no_grad():
                return conv(tx, tw, tb, stride=stride, padding=padding, groups=groups)

        for g, t in zip(xb(), tbw()):
            np.testing.assert_allclose(g, t.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(xf(), tf().numpy(), rtol=1e-4, atol=1e-4)
        bx, bt = _median_pair(xb, tbw, args.reps)
        fx, ft = _median_pair(xf, tf, args.reps)
        ratios["bwd"].append(bt / bx)
        ratios["fwd"].append(ft / fx)
        print(f"{name:20s} {bx * 1e6:10.1f} {bt * 1e6:10.1f} {bt / bx:8.2f} {fx * 1e6:10.1f} {ft * 1e6:10.1f} "
              f"{ft / fx:8.2f}", flush=True)
    print("-" * len(header))
    for k, v in ratios.items():
        print(f"geometric mean torch/xconv, {'backward' if k == 'bwd' else 'forward'}: "
              f"{math.exp(sum(map(math.log, v)) / len(v)):.3f}   min: {min(v):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
