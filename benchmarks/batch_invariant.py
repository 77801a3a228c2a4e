"""Benchmark: what deterministic="batch_invariant" costs on xconv's NumPy backend (forward and grad_input).

Run from the repository root (see benchmarks/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/batch_invariant.py

For each case of the layer suite (forward and the input gradient, float32), it times xconv with
``deterministic=True`` (run to run), xconv with ``deterministic="batch_invariant"`` (per sample)
and PyTorch CPU, interleaved in one process (median after a warm-up), and prints the times and the
ratios invariant/plain (the cost of the guarantee) and torch/invariant. ``--isolated`` runs each of
the three in its own process instead (same data, same repetitions) and prints the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # see cpu_backward.py
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import xconv  # noqa: E402
from cpu_backward import blas_info, compiled_loops_info, limit_blas_threads, load_suite  # noqa: E402

VARIANTS = ("plain", "invariant", "torch")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return "unknown CPU"
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    isa = [f for f in ("avx512f", "avx2", "fma", "neon", "asimd") if f in flags]
    return f"{model} (ISA: {', '.join(isa) or 'baseline'})"


def make(case: dict):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case["input"]).astype(np.float32)
    w = rng.standard_normal(case["weight"]).astype(np.float32)
    conv = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"], groups=case["groups"])
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, **conv)).astype(np.float32)
    return x, w, dy, conv


def calls(case: dict, variant: str):
    """(forward, grad_input) callables of ``variant`` on ``case``'s data."""
    x, w, dy, conv = make(case)
    if variant == "torch":
        import torch

        nd = len(case["input"]) - 2
        fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nd]
        tx, tw, tdy = map(torch.from_numpy, (x, w, dy))
        kw = dict(stride=conv["stride"], padding=conv["padding"], dilation=conv["dilation"], groups=conv["groups"])

        def dgrad():
            return torch.ops.aten.convolution_backward(tdy, tx, tw, None, kw["stride"], kw["padding"], kw["dilation"],
                                                       False, [0] * nd, kw["groups"], [True, False, False])[0]
        return (lambda: fn(tx, tw, **kw)), dgrad
    det = True if variant == "plain" else "batch_invariant"
    return ((lambda: xconv.conv_fprop(x, w, deterministic=det, **conv)),
            (lambda: xconv.conv_dgrad(dy, w, x.shape, deterministic=det, **conv)))


def time_interleaved(fns: dict, reps: int) -> dict:
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def measure(cases, variants, reps: int) -> dict:
    """{case name: {(variant, op): ms}}, the variants interleaved."""
    out = {}
    for case in cases:
        fns = {}
        for v in variants:
            fwd, dgrad = calls(case, v)
            fns[(v, "fprop")], fns[(v, "dgrad")] = fwd, dgrad
        out[case["name"]] = {f"{v}/{op}": ms for (v, op), ms in time_interleaved(fns, reps).items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cases", nargs="*")
    ap.add_argument("--isolated", action="store_true", help="each variant in its own process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    threads = torch.get_num_threads()
    limit_blas_threads(threads)
    cases, _ = load_suite()
    if args.cases:
        cases = [c for c in cases if c["name"] in args.cases]
    if args.child:
        print(json.dumps(measure(cases, [args.child], max(5, args.reps))))
        return 0
    print(f"CPU: {cpu_model()}")
    print(f"numpy {np.__version__}, torch {torch.__version__}, xconv {xconv.__version__}; {compiled_loops_info()}")
    print(f"threads: torch {threads}; BLAS: {blas_info()}")
    print(f"mode: {'each variant in its own process' if args.isolated else 'interleaved in one process'}\n")
    if args.isolated:
        results = {}
        for v in VARIANTS:
            cmd = [sys.executable, __file__, "--child", v, "--reps", str(args.reps)]
            cmd += ["--cases", *[c["name"] for c in cases]]
            part = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            for name, row in part.items():
                results.setdefault(name, {}).update(row)
    else:
        results = measure(cases, VARIANTS, max(5, args.reps))
    print(f"{'case':24s} {'op':6s} {'plain ms':>9s} {'inv ms':>9s} {'torch ms':>9s} {'inv/plain':>9s} "
          f"{'torch/inv':>9s}")
    ratios = []
    for case in cases:
        row = results[case["name"]]
        for op in ("fprop", "dgrad"):
            plain, inv, pt = row[f"plain/{op}"], row[f"invariant/{op}"], row[f"torch/{op}"]
            ratios.append(inv / plain)
            print(f"{case['name']:24s} {op:6s} {plain:9.2f} {inv:9.2f} {pt:9.2f} {inv / plain:9.2f} {pt / inv:9.2f}")
    print(f"\ngeometric mean of inv/plain: {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
