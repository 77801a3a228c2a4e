"""Issue 13's pathological shapes: xconv's NumPy backend vs PyTorch CPU in time and peak memory.

Each case runs each side in its own fresh process (time of the second call, and the growth of the
process's peak resident memory over its state after imports and a warm-up on a tiny case), then
both sides alternating in one process (median of 3). Prints the CPU model, ISA flags and BLAS
kernel first. Run from the repository root:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/pathological.py

The issue's bar: within 10x torch's time and memory. Nothing here is asserted; tests never time.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # torch's spinning OpenMP threads would slow what follows

CASES = {
    # name: (what it is, xconv call, torch call) built by make(name) below
    "wgrad_padding1999_stride1e4": "conv_wgrad of a 1x1 input into a 2000x2000 kernel, padding 1999, stride 10^4",
    "depthwise_stride1e4": "depthwise backward, 8x8 input, 3x3 kernel, stride 10^4",
    "patch_embed_k64": "fprop + backward, (8,3,256,256) -> 96 channels, kernel = stride = 64",
    "patch_embed_k128": "fprop + backward, (8,3,256,256) -> 96 channels, kernel = stride = 128",
    "small_conv_after_patch_embed": "3x3 backward (8,16,32,32) after a k=64 patch embedding in the process",
}


def make(name):
    """(xconv_fn, torch_fn) for one case."""
    import torch

    import xconv

    f = np.float32
    aten = torch.ops.aten.convolution_backward
    if name == "wgrad_padding1999_stride1e4":
        x, dy = np.ones((1, 2, 1, 1), f), np.ones((1, 1, 1, 1), f)
        tx, tdy, tw = torch.ones(1, 2, 1, 1), torch.ones(1, 1, 1, 1), torch.empty(1, 2, 2000, 2000)
        return (lambda: xconv.conv_wgrad(x, dy, (1, 2, 2000, 2000), padding=1999, stride=10**4),
                lambda: aten(tdy, tx, tw, None, [10**4] * 2, [1999] * 2, [1, 1], False, [0, 0], 1,
                             [False, True, False]))
    if name == "depthwise_stride1e4":
        dy, x, w = np.ones((1, 1, 1, 1), f), np.ones((1, 1, 8, 8), f), np.ones((1, 1, 3, 3), f)
        t = [torch.tensor(a) for a in (dy, x, w)]
        return (lambda: xconv.convolution_backward(dy, x, w, stride=10**4),
                lambda: aten(*t, [1], [10**4] * 2, [0, 0], [1, 1], False, [0, 0], 1, [True, True, True]))
    if name.startswith("patch_embed"):
        k = int(name.rsplit("k", 1)[1])
        rng = np.random.default_rng(0)
        x = rng.standard_normal((8, 3, 256, 256)).astype(f)
        w = rng.standard_normal((96, 3, k, k)).astype(f)
        dy = rng.standard_normal((8, 96, 256 // k, 256 // k)).astype(f)
        tx, tw, tdy = torch.tensor(x), torch.tensor(w), torch.tensor(dy)

        def ours():
            xconv.conv_fprop(x, w, stride=k)
            xconv.convolution_backward(dy, x, w, stride=k)

        def theirs():
            torch.nn.functional.conv2d(tx, tw, stride=k)
            aten(tdy, tx, tw, [96], [k, k], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
        return ours, theirs
    if name == "small_conv_after_patch_embed":
        before_ours, before_theirs = make("patch_embed_k64")
        before_ours()
        before_theirs()
        rng = np.random.default_rng(1)
        x = rng.standard_normal((8, 16, 32, 32)).astype(f)
        w = rng.standard_normal((16, 16, 3, 3)).astype(f)
        dy = rng.standard_normal((8, 16, 32, 32)).astype(f)
        t = [torch.tensor(a) for a in (dy, x, w)]
        return (lambda: xconv.convolution_backward(dy, x, w, padding=1),
                lambda: aten(*t, [16], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]))
    raise KeyError(name)


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(name: str, side: str) -> None:
    """One side of one case in this (fresh) process: prints JSON {seconds, peak_bytes}."""
    import torch  # noqa: F401  (both sides import both libraries: the same baseline)

    import xconv
    xconv.conv_fprop(np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32))
    base = _rss()
    ours, theirs = make(name)
    fn = ours if side == "xconv" else theirs
    fn()
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "peak_bytes": max(0, _rss() - base)}))


def header() -> str:
    model, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = " ".join(x for x in line.split(":", 1)[1].split() if x.startswith(("avx", "fma", "sse4")))
                    break
    except OSError:
        pass
    blas = "unknown"
    try:
        from threadpoolctl import threadpool_info
        blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except Exception:
        pass
    return f"CPU: {model}\nISA: {flags}\nBLAS: {blas}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2])
        return 0
    print(header())
    print(f"{'case':32} {'xconv s':>9} {'torch s':>9} {'time x':>7} {'xconv MiB':>10} {'torch MiB':>10} "
          f"{'mem x':>6} {'same-process x':>15}")
    for name in CASES:
        res = {}
        for side in ("xconv", "torch"):
            out = subprocess.run([sys.executable, __file__, "--child", name, side], capture_output=True, text=True,
                                 timeout=600)
            res[side] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            if res[side] is None:
                print(f"{name}: {side} failed: {out.stderr.strip().splitlines()[-1:]}")
        ours, theirs = make(name)
        ours(), theirs()
        ratios = []
        for _ in range(3):
            t = time.perf_counter()
            ours()
            a = time.perf_counter() - t
            t = time.perf_counter()
            theirs()
            ratios.append(a / max(time.perf_counter() - t, 1e-9))
        if res["xconv"] and res["torch"]:
            xs, ts = res["xconv"]["seconds"], res["torch"]["seconds"]
            xm, tm = res["xconv"]["peak_bytes"] / 2**20, res["torch"]["peak_bytes"] / 2**20
            print(f"{name:32} {xs:9.4f} {ts:9.4f} {xs / max(ts, 1e-9):7.2f} {xm:10.1f} {tm:10.1f} "
                  f"{xm / max(tm, 1.0):6.2f} {statistics.median(ratios):15.2f}")
    print("time x, mem x: xconv / torch (fresh processes; memory over the post-import baseline, at least 1 MiB "
          "for torch); same-process x: median xconv/torch time ratio, alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main())
