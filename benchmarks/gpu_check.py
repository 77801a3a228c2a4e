"""GPU check of the cuDNN backend: conformance, speed against PyTorch's cuDNN, host overhead.

Run from the repository root on a machine with an NVIDIA GPU, CuPy, cuDNN 9, the cuDNN frontend
and (for the comparison) PyTorch with CUDA already installed; it installs nothing::

    python benchmarks/gpu_check.py [--benchmark] [--quick] [--conformance-budget S] [--cases NAME ...]

1. Correctness: the conformance corpus (``xconv_conformance``) on ``cudnn``, within a time budget;
   without the kit, ``tests/test_cudnn_gpu.py`` (cross-checks against the NumPy oracle).
2. Speed: every case of the layer suite (``../shared/bench/suite.json``, else
   ``benchmarks/suite.json``) at batch 32, full-mask float32 backward, xconv-cudnn against
   ``torch.ops.aten.convolution_backward`` (PyTorch's own cuDNN) in the same process on the same
   memory, CUDA events, median of >= 20 after warm-up, in float32 keep_dtype (torch
   ``allow_tf32=False``) and in TF32 (xconv ``math="allow_tf32"``, torch ``allow_tf32=True``).
   ``--benchmark`` autotunes both (``XCONV_CUDNN_BENCHMARK=1``, ``torch.backends.cudnn.benchmark``).
3. Host overhead: host time per call of a cached tiny convolution (backend primitive, public API,
   and the bare frontend ``execute`` for reference).
4. Where the ``torch-cuda`` backend (``backends/xconv_torch``) is available too: ``cudnn`` and
   ``torch-cuda`` held against each other on the same GPU (``benchmarks/backend_pair.py``): the
   corpus cases within ``--conformance-budget``, pairwise within bound_a + bound_b, and the layer
   suite's full backward time through both xconv backends.

Progress goes to stderr; one summary table goes to stdout. Targets (H200): every conformance case
within its bound; geometric mean of torch_time / xconv_time >= 0.95; host overhead of a cached
backend call < 20 us. Exit status 0 when all measured targets are met, 1 otherwise, 2 when the
backend is unavailable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "conformance", ROOT / "backends", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import numpy as np  # noqa: E402

import xconv  # noqa: E402
from xconv.params import make_params  # noqa: E402

SUITES = [ROOT.parent / "shared" / "bench" / "suite.json", ROOT / "shared" / "bench" / "suite.json",
          ROOT / "benchmarks" / "suite.json"]
TARGET_RATIO = 0.95
TARGET_HOST_US = 20.0


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def load_suite(explicit: str | None):
    paths = [Path(explicit)] if explicit else SUITES
    for path in paths:
        if path.exists():
            return json.loads(path.read_text())["cases"], path
    raise SystemExit(f"no layer suite found (looked at {', '.join(map(str, paths))})")


# ---------------------------------------------------------------------------------------------
# 1. Correctness


def run_conformance(budget_s: float) -> dict:
    try:
        import xconv_conformance as kit
    except ImportError as exc:
        log(f"conformance kit not importable ({exc}); running tests/test_cudnn_gpu.py instead")
        return run_gpu_tests(budget_s)
    cases = kit.load_corpus()
    log(f"conformance: {len(cases)} cases on cudnn (budget {budget_s:.0f} s)")
    counts = {"passed": 0, "failed": 0, "refused": 0, "unavailable": 0}
    failures, refusals, worst = [], [], 0.0
    start = time.perf_counter()
    ran = 0
    for case in cases:
        if time.perf_counter() - start > budget_s:
            break
        outcome = kit.run_case(case, "cudnn")
        ran += 1
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
        if outcome.ratio is not None and outcome.status != "refused":
            worst = max(worst, float(outcome.ratio))
        if outcome.status == "failed":
            failures.append(f"{case.id}: {outcome.message.strip().splitlines()[0] if outcome.message else ''}")
        elif outcome.status == "refused":
            refusals.append(f"{case.id}: {outcome.message.strip().splitlines()[0] if outcome.message else ''}")
        elif outcome.status == "unavailable":
            failures.append(f"{case.id}: unavailable: {outcome.message}")
            break
    seconds = time.perf_counter() - start
    for line in failures[:10]:
        log(f"  FAILED {line}")
    for line in refusals[:10]:
        log(f"  refused {line}")
    return dict(kind="conformance corpus", total=len(cases), ran=ran, counts=counts, worst_ratio=worst,
                seconds=seconds, ok=counts["failed"] == 0 and counts.get("unavailable", 0) == 0 and ran == len(cases),
                failures=failures, refusals=refusals)


def run_gpu_tests(budget_s: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_cudnn_gpu.py"), "-q", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(budget_s, 60))
        text = out.stdout.strip().splitlines()
        last = text[-1] if text else out.stderr.strip()[-200:]
        ok = out.returncode == 0
    except subprocess.TimeoutExpired:
        last, ok = f"timed out after {budget_s:.0f} s", False
    log(f"  {last}")
    return dict(kind="tests/test_cudnn_gpu.py", summary=last, ok=ok, seconds=time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# 2. Speed against PyTorch


def median_ms_cupy(cp, fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def median_ms_torch(torch, fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def normwise(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_suite(cp, torch, cases, batch: int, warmup: int, reps: int, autotune: bool) -> list[dict]:
    rows = []
    if torch is not None:
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.benchmark = autotune
        torch.backends.cudnn.deterministic = False
    for math_mode in ("keep_dtype", "allow_tf32"):
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = math_mode == "allow_tf32"
        for case in cases:
            name = case["name"]
            in_shape = [batch] + list(case["input"][1:])
            w_shape = list(case["weight"])
            nd = len(in_shape) - 2
            conv = dict(stride=list(case["stride"]), padding=list(case["padding"]), dilation=list(case["dilation"]),
                        groups=int(case["groups"]))
            out_shape = xconv.output_shape(in_shape, w_shape, **conv)
            c_out = out_shape[1]
            row = dict(case=name, math=math_mode)
            try:
                rng = np.random.default_rng(0)
                make = lambda shape: cp.asarray(rng.standard_normal(shape, dtype=np.float32))  # noqa: E731
                x, w, dy = make(in_shape), make(w_shape), make(out_shape)

                def xconv_call():
                    return xconv.convolution_backward(dy, x, w, bias_sizes=[c_out], math=math_mode, backend="cudnn",
                                                      **conv)

                got = xconv_call()
                row["xconv_ms"] = median_ms_cupy(cp, xconv_call, warmup, reps)
                if torch is not None:
                    tx, tw, tdy = (torch.from_dlpack(a) for a in (x, w, dy))   # same memory

                    def torch_call():
                        return torch.ops.aten.convolution_backward(
                            tdy, tx, tw, [c_out], conv["stride"], conv["padding"], conv["dilation"], False,
                            [0] * nd, conv["groups"], [True, True, True])

                    want = torch_call()
                    row["torch_ms"] = median_ms_torch(torch, torch_call, warmup, reps)
                    row["ratio"] = row["torch_ms"] / row["xconv_ms"]
                    row["rel_diff"] = max(normwise(cp.asnumpy(g), r.detach().cpu().numpy()) for g, r in zip(got, want))
                log(f"  {name:24s} {math_mode:10s} xconv {row['xconv_ms']:8.3f} ms"
                    + (f"  torch {row['torch_ms']:8.3f} ms  ratio {row['ratio']:.3f}  diff {row['rel_diff']:.1e}"
                       if "ratio" in row else ""))
            except Exception as exc:  # one failing case must not hide the rest
                row["error"] = f"{type(exc).__name__}: {exc}"
                log(f"  {name:24s} {math_mode:10s} ERROR {row['error']}")
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# 3. Host overhead


def host_us(cp, fn, calls: int, batch: int = 200) -> float:
    """Host seconds per call of ``fn`` (synchronizing between batches, outside the timed part)."""
    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    total = 0.0
    done = 0
    while done < calls:
        n = min(batch, calls - done)
        start = time.perf_counter()
        for _ in range(n):
            fn()
        total += time.perf_counter() - start
        cp.cuda.Device().synchronize()
        done += n
    return total / calls * 1e6


def run_overhead(cp, calls: int) -> dict:
    backend = xconv.get_backend("cudnn")
    p = make_params((1, 4, 8, 8), (4, 4, 3, 3), padding=1)
    x = cp.ones(p.input_shape, cp.float32)
    w = cp.ones(p.weight_shape, cp.float32)
    dy = cp.ones(p.output_shape, cp.float32)
    out = {}
    out["backend.dgrad (cached plan)"] = host_us(cp, lambda: backend.dgrad(dy, w, p), calls)
    out["backend.fprop (cached plan)"] = host_us(cp, lambda: backend.fprop(x, w, None, p), calls)
    out["xconv.conv_dgrad (public API)"] = host_us(
        cp, lambda: xconv.conv_dgrad(dy, w, p.input_shape, padding=1, backend="cudnn"), calls)
    out["xconv.convolution_backward mask 111 (public API)"] = host_us(
        cp, lambda: xconv.convolution_backward(dy, x, w, padding=1, backend="cudnn"), calls)
    # The floor: the frontend's own execute with a prepared variant pack.
    key = backend.plan_key_for("dgrad", p, (dy, w))
    entry = backend.cache.get(key)
    if entry is not None and entry.kind == "plan":
        rt = backend.runtime()
        dx = cp.empty(p.input_shape, cp.float32)
        pack = {entry.inputs[0][0]: dy.data.ptr, entry.inputs[1][0]: w.data.ptr, entry.outputs[0][0]: dx.data.ptr}
        ws = cp.empty((max(entry.workspace, 1),), cp.uint8)
        handle = rt.handle(dy.device.id)
        out["cudnn frontend graph.execute alone"] = host_us(
            cp, lambda: entry.graph.execute(pack, ws.data.ptr, handle=handle), calls)
    return out


# ---------------------------------------------------------------------------------------------
# Report


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_torch_cuda_pair(suite_cases, args) -> list:
    """[(table row, ok)] of cudnn against torch-cuda (benchmarks/backend_pair.py); [] without torch-cuda."""
    try:
        available, reason = xconv.get_backend("torch-cuda").availability()
    except xconv.BackendUnavailableError as exc:
        available, reason = False, exc.reason
    if not available:
        log(f"[4/4] cudnn vs torch-cuda: skipped ({reason})")
        return []
    log("[4/4] cudnn vs torch-cuda on the same GPU")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import backend_pair

    cmp, ran, total = backend_pair.agreement("cudnn", "torch-cuda", None, args.conformance_budget)
    bad = len(cmp.disagreements)
    rows = [((f"cudnn vs torch-cuda: {ran}/{total} corpus cases", f"{bad} disagreement(s)", "", "",
              "0 disagreements", "PASS" if bad == 0 else "FAIL"), bad == 0)]
    for r in backend_pair.speed("cudnn", "torch-cuda", suite_cases, args.batch, args.reps, args.warmup):
        rows.append(((f"{r['case']} [xconv cudnn vs xconv torch-cuda]", f"{r['cudnn']:.3f} ms",
                      f"{r['torch-cuda']:.3f} ms", f"{r['ratio']:.3f}", "", ""), True))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=None, help="layer suite JSON (default ../shared/bench/suite.json)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=25, help="timed repetitions per measurement (>= 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cases", nargs="*", default=None, help="suite case names (default all)")
    ap.add_argument("--benchmark", action="store_true", help="autotune both (XCONV_CUDNN_BENCHMARK, cudnn.benchmark)")
    ap.add_argument("--conformance-budget", type=float, default=150.0, help="seconds for the correctness phase")
    ap.add_argument("--no-conformance", action="store_true")
    ap.add_argument("--host-calls", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="fewer cases and repetitions (smoke run)")
    args = ap.parse_args(argv)
    args.reps = max(args.reps, 20)
    if args.benchmark:
        os.environ["XCONV_CUDNN_BENCHMARK"] = "1"
    wall = time.perf_counter()

    backend = xconv.get_backend("cudnn")
    available, reason = backend.availability()
    if not available:
        print(f"cuDNN backend unavailable: {reason}")
        return 2
    import cupy as cp

    try:
        import torch

        if not torch.cuda.is_available():
            log("torch has no CUDA here: no comparison")
            torch = None
    except ImportError:
        log("torch not installed: no comparison")
        torch = None
    props = cp.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    header = [f"GPU: {gpu}", f"xconv-cudnn: {backend.version()}",
              f"torch: {torch.__version__} (cuDNN {torch.backends.cudnn.version()})" if torch is not None else "torch: -",
              f"autotune: {'on' if args.benchmark else 'off (heuristics)'}; batch {args.batch}; "
              f"median of {args.reps} after {args.warmup} warm-up"]
    log("\n".join(header))

    results = {}
    if not args.no_conformance:
        log("[1/3] correctness")
        try:
            results["correctness"] = run_conformance(args.conformance_budget / (3 if args.quick else 1))
        except Exception as exc:
            results["correctness"] = dict(kind="conformance", ok=False, error=f"{type(exc).__name__}: {exc}")
            log(traceback.format_exc())

    log("[2/3] layer suite against PyTorch cuDNN")
    cases, suite_path = load_suite(args.suite)
    if args.cases:
        cases = [c for c in cases if c["name"] in args.cases]
    if args.quick:
        cases = cases[:3]
    suite_rows = run_suite(cp, torch, cases, args.batch, args.warmup, args.reps, args.benchmark)

    log("[3/3] host overhead")
    overhead = run_overhead(cp, 1000 if args.quick else args.host_calls)
    pair = run_torch_cuda_pair(cases, args)

    # ---- the summary table ------------------------------------------------------------------
    rows = [("check", "xconv", "torch", "torch/xconv", "target", "result")]
    all_ok = True
    corr = results.get("correctness")
    if corr is not None:
        if "counts" in corr:
            c = corr["counts"]
            value = (f"{c['passed']} passed, {c['failed']} failed, {c['refused']} refused of {corr['ran']}/"
                     f"{corr['total']} run (worst error/bound {corr['worst_ratio']:.2f})")
        else:
            value = corr.get("summary") or corr.get("error", "")
        rows.append((f"correctness: {corr.get('kind')}", value, "", "", "all within bound",
                     "PASS" if corr.get("ok") else "FAIL"))
        all_ok &= bool(corr.get("ok"))
    for mode in ("keep_dtype", "allow_tf32"):
        mode_rows = [r for r in suite_rows if r["math"] == mode]
        for r in mode_rows:
            if "error" in r:
                rows.append((f"{r['case']} [{mode}]", "ERROR", "", "", "", r["error"][:60]))
                all_ok = False
                continue
            rows.append((f"{r['case']} [{mode}]", f"{r['xconv_ms']:.3f} ms",
                         f"{r['torch_ms']:.3f} ms" if "torch_ms" in r else "-",
                         f"{r['ratio']:.3f}" if "ratio" in r else "-", "",
                         f"diff {r['rel_diff']:.1e}" if "rel_diff" in r else ""))
        ratios = [r.get("ratio") for r in mode_rows if "ratio" in r]
        if ratios:
            g = geomean(ratios)
            ok = g >= TARGET_RATIO and len(ratios) == len(mode_rows)
            all_ok &= ok
            rows.append((f"geomean torch/xconv [{mode}]", "", "", f"{g:.3f}", f">= {TARGET_RATIO}",
                         "PASS" if ok else "FAIL"))
    all_ratios = [r["ratio"] for r in suite_rows if "ratio" in r]
    if all_ratios:
        rows.append(("geomean torch/xconv [both modes]", "", "", f"{geomean(all_ratios):.3f}", f">= {TARGET_RATIO}",
                     "PASS" if geomean(all_ratios) >= TARGET_RATIO else "FAIL"))
    else:
        rows.append(("geomean torch/xconv", "", "", "-", f">= {TARGET_RATIO}", "NOT MEASURED (no torch CUDA)"))
        all_ok = False
    for label, us in overhead.items():
        target = f"< {TARGET_HOST_US:.0f} us" if label.startswith("backend.dgrad") else ""
        result = ("PASS" if us < TARGET_HOST_US else "FAIL") if target else ""
        if target:
            all_ok &= us < TARGET_HOST_US
        rows.append((f"host/call: {label}", f"{us:.1f} us", "", "", target, result))
    for row, ok in pair:
        rows.append(row)
        all_ok &= ok
    print("\n".join(header))
    print(f"suite: {suite_path}")
    print(table(rows))
    print(f"overall: {'all targets met' if all_ok else 'targets NOT met'} "
          f"({time.perf_counter() - wall:.0f} s)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
