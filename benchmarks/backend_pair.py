"""Two xconv backends held against each other on the same machine: the conformance corpus and the layer suite.

    python benchmarks/backend_pair.py --a cudnn --b torch-cuda          # on a GPU: two routes to cuDNN
    python benchmarks/backend_pair.py --a numpy --b torch-cpu --cases tiny --cases kernel

1. Agreement: every selected corpus case on both backends, each result within its bound of the
   float64 reference and the two within bound_a + bound_b of each other (the kit's comparison of
   bundles, on bundles built in memory).
2. Speed: full-mask float32 backward of each layer-suite case (``benchmarks/suite.json``) at the
   given batch on both backends, each on its own arrays (CuPy for cudnn, CUDA tensors for
   torch-cuda, NumPy elsewhere), interleaved, median of ``--reps`` after warm-up, synchronized.

``benchmarks/gpu_check.py`` runs both for cudnn against torch-cuda when both are available.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "conformance", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import numpy as np  # noqa: E402

import xconv  # noqa: E402


def agreement(a: str, b: str, patterns=None, budget_s: float = 600.0):
    """The kit's Comparison of backends ``a`` and ``b`` over the selected cases (within ``budget_s``)."""
    from xconv_conformance.bundle import Bundle, build
    from xconv_conformance.cases import corpus_hash, load_corpus, select
    from xconv_conformance.compare import compare_bundles
    from xconv_conformance.runner import Watch, inputs_of, run_case

    cases = select(load_corpus(), patterns)
    start = time.perf_counter()
    done = []
    outcomes = {a: [], b: []}
    watches = {a: Watch(), b: Watch()}
    for case in cases:
        if time.perf_counter() - start > budget_s:
            break
        for name in (a, b):
            outcomes[name].append(watches[name].after(run_case(case, name, keep_outputs=True)))
        done.append(case)
    bundles = []
    for name in (a, b):
        info = xconv.get_backend(name).info()
        manifest = {"backend": {"name": name, "version": info.version}, "device": ", ".join(info.devices) or "?",
                    "xconv_version": xconv.__version__, "platform": {}, "created": "",
                    "corpus": {"hash": corpus_hash(done), "case_ids": [c.id for c in done]}}
        manifest, arrays = build(manifest, [(c, o, inputs_of(c).digest()) for c, o in zip(done, outcomes[name])])
        bundles.append(Bundle(manifest, arrays, f"<{name}>"))
    return compare_bundles(bundles, corpus=done), len(done), len(cases)


def _arrays_for(name: str, shapes, seed: int):
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if name == "cudnn":
        import cupy as cp
        return [cp.asarray(h) for h in host], cp.cuda.runtime.deviceSynchronize
    if name.startswith("torch-") and name != "torch-cpu":
        import torch
        device = name.split("-", 1)[1]
        module = getattr(torch, device)
        return [torch.from_numpy(h).to(device) for h in host], module.synchronize
    return host, lambda: None


def speed(a: str, b: str, suite: list[dict], batch: int, reps: int, warmup: int) -> list[dict]:
    """Median ms per full-mask backward of each suite case on ``a`` and ``b`` (interleaved)."""
    rows = []
    for case in suite:
        x_shape = [batch, *case["input"][1:]]
        w_shape = list(case["weight"])
        conv = dict(stride=tuple(case.get("stride", 1)), padding=tuple(case.get("padding", 0)),
                    dilation=tuple(case.get("dilation", 1)), groups=case.get("groups", 1))
        y_shape = list(xconv.output_shape(tuple(x_shape), tuple(w_shape), **conv))
        calls = {}
        for name in (a, b):
            (dy, x, w), sync = _arrays_for(name, (y_shape, x_shape, w_shape), 0)
            calls[name] = (lambda dy=dy, x=x, w=w, name=name: xconv.convolution_backward(dy, x, w, backend=name,
                                                                                         **conv), sync)
        times = {a: [], b: []}
        for i in range(warmup + reps):
            for name in ((a, b) if i % 2 == 0 else (b, a)):
                call, sync = calls[name]
                sync()
                t = time.perf_counter()
                call()
                sync()
                if i >= warmup:
                    times[name].append((time.perf_counter() - t) * 1e3)
        ma, mb = statistics.median(times[a]), statistics.median(times[b])
        rows.append({"case": case["name"], a: ma, b: mb, "ratio": mb / ma})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default="cudnn")
    ap.add_argument("--b", default="torch-cuda")
    ap.add_argument("--cases", action="append", default=None, help="corpus case patterns (default: all)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for the agreement phase")
    ap.add_argument("--suite", default=str(ROOT / "benchmarks" / "suite.json"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--suite-cases", nargs="*", default=None, help="layer-suite case names (default all)")
    args = ap.parse_args(argv)
    for name in (args.a, args.b):
        ok, reason = xconv.get_backend(name).availability()
        if not ok:
            print(f"{name} is unavailable: {reason}")
            return 2
    cmp, ran, total = agreement(args.a, args.b, args.cases, args.budget)
    print(f"agreement of {args.a} [A] and {args.b} [B]: {ran} of {total} cases run")
    from xconv_conformance.compare import format_comparison
    print(format_comparison(cmp))
    if not args.no_speed:
        suite = json.loads(Path(args.suite).read_text())["cases"]
        if args.suite_cases:
            suite = [c for c in suite if c["name"] in args.suite_cases]
        print(f"\nfull-mask float32 backward, batch {args.batch}, median ms of {args.reps}")
        print(f"{'case':28} {args.a:>12} {args.b:>12} {'b/a':>7}")
        for r in speed(args.a, args.b, suite, args.batch, args.reps, args.warmup):
            print(f"{r['case']:28} {r[args.a]:12.3f} {r[args.b]:12.3f} {r['ratio']:7.3f}")
    return 1 if cmp.disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
