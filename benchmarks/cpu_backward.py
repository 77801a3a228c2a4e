"""Benchmark: full-mask float32 convolution backward, xconv's NumPy backend vs PyTorch CPU and JAX CPU.

Run from the repository root (see benchmarks/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/cpu_backward.py

For each case of the layer suite it checks xconv's result against torch's, then times both
(median after warm-up, same thread count) in two modes: interleaved repetitions in one process
(the way ``xconv.torch`` runs inside a model) and each library alone in its own process (no torch
loaded in xconv's). It prints the CPU model, the instruction set of xconv's compiled loops and
the BLAS kernel, then per case the times, GFLOP/s, the ratio torch/xconv and xconv's peak extra
memory (tracemalloc), the geometric mean of the ratios and numpy's float32 matrix-product rate.

JAX is the third peer where it is installed (``pip install -e backends/xconv_jax``): a jitted
``jax.vjp`` of ``jax.lax.conv_general_dilated`` (precision HIGHEST, grad_bias by a sum), compiled
before timing, on arrays already on the CPU device, waited for with ``block_until_ready``. XLA's
CPU runtime sizes its own thread pool (all cores); ``--threads`` does not reach it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

# PyTorch's OpenMP threads (libgomp) spin after each parallel region by default; in one process
# on 2 cores that spinning steals the cores from whatever runs next (measured: xconv's 1x1 case
# 4.1 ms after a torch call with PASSIVE, 8.0 ms without; torch's own time unchanged). Must be
# set before torch loads libgomp; an explicit setting is respected, and OMP_WAIT_POLICY=default runs
# with libgomp's own default (spin a while after each region, then sleep: what a user's process has).
_USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
if _USER_OMP_WAIT_POLICY == "default":
    del os.environ["OMP_WAIT_POLICY"]
else:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "backends"))
sys.path.insert(0, str(ROOT))

import xconv  # noqa: E402

SHARED_SUITE = ROOT.parent / "shared" / "bench" / "suite.json"
#: Cases whose xconv rate is compared with numpy's matrix-product rate.
GEMM_SHAPED = ("resnet_conv1x1_28", "resnet_conv3x3_28_s2")
LOCAL_SUITE = ROOT / "benchmarks" / "suite.json"


def load_suite() -> tuple[list[dict], Path]:
    """The shared suite when present (warning if the local copy differs), else the local copy."""
    local = json.loads(LOCAL_SUITE.read_text()) if LOCAL_SUITE.exists() else None
    if SHARED_SUITE.exists():
        shared = json.loads(SHARED_SUITE.read_text())
        if local is not None and local != shared:
            warnings.warn(f"{LOCAL_SUITE} differs from {SHARED_SUITE}; using the shared one "
                          "(copy it over to keep them in step)", stacklevel=2)
        return shared["cases"], SHARED_SUITE
    if local is None:
        raise SystemExit(f"no suite: neither {SHARED_SUITE} nor {LOCAL_SUITE} exists")
    return local["cases"], LOCAL_SUITE


def compiled_loops_info() -> str:
    """Which compiled loops the NumPy backend uses here, and which instruction-set build, or why none."""
    from xconv_numpy import status

    return status.describe()


def cpu_model() -> str:
    """The CPU's model name, family and model numbers (which tell CPU generations apart where the name does not:
    AMD family 25 is Zen 3/4, 26 Zen 5; Intel family 6 model 143 Sapphire Rapids) and its vector extensions (from
    /proc/cpuinfo where there is one)."""
    import platform
    name, flags, ids = platform.processor() or platform.machine(), set(), {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith(("cpu family", "model\t")):
                    ids.setdefault(line.split(":", 1)[0].strip(), line.split(":", 1)[1].strip())
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    family = f"family {ids['cpu family']} model {ids.get('model', '?')}; " if "cpu family" in ids else ""
    return f"{name} ({family}{os.cpu_count()} logical CPUs; {' '.join(isa) or 'no AVX2'})"


def flops(case: dict, out_spatial) -> float:
    """2 x 2 x N x C_out x prod(out) x C_in/groups x prod(kernel): dgrad + wgrad."""
    n = case["input"][0]
    c_out = case["weight"][0]
    return 4.0 * n * c_out * math.prod(out_spatial) * math.prod(case["weight"][1:])


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed: BLAS kernel unknown"
    rows = [f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture')} threads={i.get('num_threads')}"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(rows) or "no BLAS found by threadpoolctl"


def limit_blas_threads(n: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=n, user_api="blas")


def matmul_rate(size: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of numpy float32 (size x size) @ (size x size), median of reps."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2.0 * size**3 / statistics.median(times) / 1e9


def peak_extra(fn) -> tuple[int, int]:
    """(peak bytes allocated during fn() beyond the arrays it returns, bytes it returns), by tracemalloc.

    The NumPy fast path keeps its scratch buffers between calls (see docs/numpy-backend.md);
    they are freed first, so that the measured call allocates, and tracemalloc sees, all of its
    scratch memory.
    """
    try:
        from xconv_numpy.fast import release_memory
        release_memory()
    except ImportError:
        pass
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    kept = sum(r.nbytes for r in result if r is not None)
    return peak - base - kept, kept


def check(ours, theirs, name: str, what: str) -> float:
    """Normwise relative error of ours vs torch; exit if it is not float32-rounding sized.

    (No BLAS here: a multithreaded OpenBLAS call leaves its threads spinning for a while, which
    would slow whatever is timed next on a 2-core machine.)
    """
    ref = theirs.detach().numpy().astype(np.float64)
    diff = ours.astype(np.float64) - ref
    err = float(np.sqrt(np.sum(diff * diff)) / max(np.sqrt(np.sum(ref * ref)), 1e-30))
    if not err < 1e-4:
        raise SystemExit(f"{name}: xconv {what} differs from torch: relative error {err:.3g}")
    return err


DEGENERATE = [  # (name, input, weight, conv kwargs): long reductions over few channels
    ("c1_1d_long", [4, 1, 200000], [1, 1, 9], dict(padding=[4])),
    ("c1_2d", [16, 1, 256, 256], [1, 1, 3, 3], dict(padding=[1, 1])),
    ("c1_1x1_huge_batch", [4096, 1, 16, 16], [1, 1, 1, 1], dict()),
    ("depthwise_1d", [8, 64, 4096], [64, 1, 7], dict(padding=[3], groups=64)),
]


def _hash_fast_path(cases) -> dict:
    """sha256 of the fast path's (dx, dw, db) per case, fixed inputs (run in a subprocess)."""
    import hashlib
    out = {}
    for name, xs, ws, kw in cases:
        rng = np.random.default_rng(11)
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw), dtype=np.float32)
        h = hashlib.sha256()
        for r in xconv.convolution_backward(dy, x, w, backend="numpy", **kw):
            h.update(r.tobytes())
        out[name] = h.hexdigest()[:16]
    return out


def determinism(threads=(1, 2, 4)) -> int:
    """Run the fast path with OPENBLAS_NUM_THREADS = each of ``threads`` in subprocesses; compare bitwise."""
    import subprocess
    suite, _ = load_suite()
    cases = [(c["name"], c["input"], c["weight"],
              dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"]))
             for c in suite] + DEGENERATE
    script = ("import json, sys; sys.path[:0] = {paths!r}; import cpu_backward as b; "
              "print(json.dumps(b._hash_fast_path({cases!r})))")
    paths = [str(ROOT / "benchmarks"), str(ROOT / "backends"), str(ROOT)]
    results = {}
    for t in threads:
        for rep in range(2):
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t))
            proc = subprocess.run([sys.executable, "-c", script.format(paths=paths, cases=cases)], env=env,
                                  capture_output=True, text=True, check=True)
            results[(t, rep)] = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = list(results)
    print(f"fast path, bitwise, across processes {keys}:")
    same_all = True
    for name, *_ in cases:
        hashes = {k: results[k][name] for k in keys}
        same = len(set(hashes.values())) == 1
        same_all &= same
        print(f"  {name:24s} {'identical' if same else 'DIFFERENT: ' + str(hashes)}")
    print("all identical" if same_all else "some differ")
    return 0 if same_all else 1


def case_data(case: dict):
    """(x, w, dy, conv kwargs, output shape) of a case: the same data in every process (seeded by its name)."""
    import zlib
    rng = np.random.default_rng(zlib.crc32(case["name"].encode()))
    x = rng.standard_normal(case["input"], dtype=np.float32)
    w = rng.standard_normal(case["weight"], dtype=np.float32) / math.sqrt(math.prod(case["weight"][1:]))
    conv = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"], groups=case["groups"])
    out_shape = xconv.output_shape(x.shape, w.shape, **conv)
    dy = rng.standard_normal(out_shape, dtype=np.float32)
    return x, w, dy, conv, out_shape


def jax_module():
    """jax, or None when it is not installed."""
    try:
        import jax
    except ImportError:
        return None
    return jax


def jax_runner(case: dict, x, w, dy, jax):
    """JAX's full-mask backward: a jitted vjp of lax.conv_general_dilated (compiled here, before any timing)."""
    nd = len(case["stride"])
    dims = tuple(range(nd + 2))
    numbers = jax.lax.ConvDimensionNumbers(dims, dims, dims)
    pads = [(p, p) for p in case["padding"]]

    def forward(a, b):
        return jax.lax.conv_general_dilated(a, b, case["stride"], pads, rhs_dilation=case["dilation"],
                                            dimension_numbers=numbers, feature_group_count=case["groups"],
                                            precision=jax.lax.Precision.HIGHEST)

    @jax.jit
    def backward(g, a, b):
        _, pullback = jax.vjp(forward, a, b)
        da, db = pullback(g)
        return da, db, g.sum(axis=(0,) + tuple(range(2, nd + 2)))

    cpu = jax.devices("cpu")[0]
    jx, jw, jdy = (jax.device_put(a, cpu) for a in (x, w, dy))
    backward.lower(jdy, jx, jw).compile()
    return lambda: jax.block_until_ready(backward(jdy, jx, jw))


def runners(case: dict, x, w, dy, conv, torch=None, jax=None) -> dict:
    """name -> a callable running the full-mask backward (torch's only when ``torch`` is given, JAX's only when
    ``jax`` is)."""
    out = {"xconv": lambda: xconv.convolution_backward(dy, x, w, bias_sizes=[w.shape[0]],
                                                       output_mask=(True, True, True), backend="numpy", **conv)}
    if torch is not None:
        tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)
        nd = len(case["stride"])

        def run_torch():
            with torch.no_grad():
                return torch.ops.aten.convolution_backward(
                    tdy, tx, tw, [w.shape[0]], case["stride"], case["padding"], case["dilation"], False,
                    [0] * nd, case["groups"], [True, True, True])
        out["torch"] = run_torch
    if jax is not None:
        out["jax"] = jax_runner(case, x, w, dy, jax)
    return out


def median_times(fns: dict, reps: int, pause: float = 0.0) -> dict:
    """name -> median seconds of ``reps`` timed calls after one warm-up round; the callables alternate (their
    order reversed every round)."""
    times = {k: [] for k in fns}
    items = list(fns.items())
    for rep in range(reps + 1):
        for name, fn in (items if rep % 2 == 0 else items[::-1]):
            if pause:
                time.sleep(pause)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def solo(lib: str, cases: list, threads: int, reps: int, pause: float) -> None:
    """Child of the own-process mode: time ``lib`` alone on every case, print {name: seconds} as JSON."""
    torch = jax = None
    if lib == "torch":
        import torch
        torch.set_num_threads(threads)
    elif lib == "jax":
        jax = jax_module()
    else:
        limit_blas_threads(threads)
    out = {}
    for case in cases:
        x, w, dy, conv, _ = case_data(case)
        fn = runners(case, x, w, dy, conv, torch, jax)[lib]
        out[case["name"]] = median_times({lib: fn}, reps, pause)[lib]
    print(json.dumps(out))


def own_process_times(cases: list, threads: int, reps: int, pause: float) -> dict:
    """lib -> {case name: seconds}, each library timed alone in a fresh process of its own, one process per case
    and library, the two alternating in order from case to case (so that a change of machine load falls on both);
    torch's process with the OpenMP wait policy the user set, or its default."""
    import subprocess
    env = dict(os.environ)
    if _USER_OMP_WAIT_POLICY in (None, "default"):
        env.pop("OMP_WAIT_POLICY", None)
    libs = ("xconv", "torch") + (("jax",) if jax_module() is not None else ())
    out = {lib: {} for lib in libs}
    for i, case in enumerate(cases):
        for lib in (libs if i % 2 == 0 else libs[::-1]):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--solo", lib, "--threads", str(threads),
                   "--reps", str(reps), "--pause", str(pause), "--cases", case["name"]]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"the {lib} process failed:\n{proc.stderr}")
            out[lib].update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def gmean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per case (median; >= 5)")
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: torch's default)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds of idle before each timed call (default 0: idling slows both libraries' "
                         "next call)")
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--mode", choices=("both", "interleaved", "own-process"), default="both",
                    help="interleaved in one process, each library in its own process, or both (default)")
    ap.add_argument("--solo", choices=("xconv", "torch", "jax"), help=argparse.SUPPRESS)
    ap.add_argument("--determinism", action="store_true",
                    help="instead of timing: compare the fast path's results bitwise across processes run with "
                         "OPENBLAS_NUM_THREADS=1, 2 and 4 (suite shapes and degenerate ones)")
    args = ap.parse_args(argv)
    if args.determinism:
        return determinism()
    reps = max(5, args.reps)
    cases, suite_path = load_suite()
    if args.cases:
        cases = [c for c in cases if c["name"] in args.cases]
    if args.solo:
        solo(args.solo, cases, args.threads or os.cpu_count(), reps, args.pause)
        return 0

    import torch

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    limiter = limit_blas_threads(threads)

    print(f"suite: {suite_path}")
    print(f"CPU: {cpu_model()}")
    jax = jax_module()
    print(f"numpy {np.__version__}, torch {torch.__version__}, xconv {xconv.__version__}, {compiled_loops_info()}")
    print(f"jax: {jax.__version__} on {jax.devices('cpu')[0].device_kind} (jitted jax.vjp; XLA's own thread pool)"
          if jax is not None else "jax: not installed (pip install -e backends/xconv_jax): no JAX column")
    print(f"threads: torch {torch.get_num_threads()}, BLAS: {blas_info()}"
          + ("" if limiter is not None else " (threadpoolctl missing: BLAS threads not pinned)"))
    print("env: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}"
                              for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                        "OMP_NUM_THREADS", "OMP_WAIT_POLICY")))
    print()
    own = own_process_times(cases, threads, reps, args.pause) if args.mode != "interleaved" else None
    if args.mode == "own-process":
        header = f"{'case':24s} {'xconv ms':>9s} {'torch ms':>9s} {'torch/xc':>8s}" + (
            f" {'jax ms':>9s} {'jax/xc':>8s}" if "jax" in own else "")
        print("each library in its own process\n" + header + "\n" + "-" * len(header))
        ratios, jax_ratios = [], []
        for case in cases:
            t_x, t_t = own["xconv"][case["name"]], own["torch"][case["name"]]
            ratios.append(t_t / t_x)
            line = f"{case['name']:24s} {t_x * 1e3:9.2f} {t_t * 1e3:9.2f} {t_t / t_x:8.2f}"
            if "jax" in own:
                t_j = own["jax"][case["name"]]
                jax_ratios.append(t_j / t_x)
                line += f" {t_j * 1e3:9.2f} {t_j / t_x:8.2f}"
            print(line)
        print("-" * len(header))
        print(f"geometric mean torch/xconv: {gmean(ratios):.3f}   min: {min(ratios):.3f}")
        if jax_ratios:
            print(f"geometric mean jax/xconv: {gmean(jax_ratios):.3f}   min: {min(jax_ratios):.3f}")
        return 0
    header = (f"{'case':24s} {'xconv ms':>9s} {'torch ms':>9s} {'torch/xc':>8s} {'xc GF/s':>8s} {'pt GF/s':>8s} "
              f"{'xc extra MiB':>12s} {'/ io':>5s}" + (f" {'jax ms':>9s} {'jax/xc':>7s}" if jax else "")
              + (f" {'own: xc ms':>10s} {'pt ms':>7s} {'torch/xc':>8s}" if own else "")
              + (f" {'jax ms':>7s} {'jax/xc':>7s}" if own and "jax" in own else ""))
    print("interleaved in one process" + ("; then each library in its own process" if own else ""))
    print(header)
    print("-" * len(header))
    ratios, own_ratios, rates, jax_ratios, own_jax_ratios = [], [], [], [], []
    for case in cases:
        name = case["name"]
        x, w, dy, conv, out_shape = case_data(case)
        fns = runners(case, x, w, dy, conv, torch, jax)
        ours, theirs = fns["xconv"](), fns["torch"]()
        for a, b, what in zip(ours, theirs, ("grad_input", "grad_weight", "grad_bias")):
            check(a, b, name, what)
        if jax is not None:
            for a, b, what in zip(ours, fns["jax"](), ("grad_input", "grad_weight", "grad_bias")):
                check(a, torch.from_numpy(np.array(b)), name, what + " (jax)")
        del ours, theirs
        extra, _ = peak_extra(fns["xconv"])
        io_bytes = sum(a.nbytes for a in (dy, x, w)) + x.nbytes + w.nbytes + 4 * w.shape[0]
        t = median_times(fns, reps, args.pause)
        t_x, t_t = t["xconv"], t["torch"]
        f = flops(case, out_shape[2:])
        ratios.append(t_t / t_x)
        rates.append(f / t_x / 1e9)
        line = (f"{name:24s} {t_x * 1e3:9.2f} {t_t * 1e3:9.2f} {t_t / t_x:8.2f} {f / t_x / 1e9:8.1f} "
                f"{f / t_t / 1e9:8.1f} {extra / 2**20:12.1f} {extra / io_bytes:5.2f}")
        if jax is not None:
            jax_ratios.append(t["jax"] / t_x)
            line += f" {t['jax'] * 1e3:9.2f} {t['jax'] / t_x:7.2f}"
        if own:
            o_x, o_t = own["xconv"][name], own["torch"][name]
            own_ratios.append(o_t / o_x)
            line += f" {o_x * 1e3:10.2f} {o_t * 1e3:7.2f} {o_t / o_x:8.2f}"
            if "jax" in own:
                own_jax_ratios.append(own["jax"][name] / o_x)
                line += f" {own['jax'][name] * 1e3:7.2f} {own['jax'][name] / o_x:7.2f}"
        print(line, flush=True)
    print("-" * len(header))
    print(f"geometric mean torch/xconv, interleaved: {gmean(ratios):.3f}   min: {min(ratios):.3f}")
    if own:
        print(f"geometric mean torch/xconv, own processes: {gmean(own_ratios):.3f}   min: {min(own_ratios):.3f}")
    if jax_ratios:
        print(f"geometric mean jax/xconv, interleaved: {gmean(jax_ratios):.3f}   min: {min(jax_ratios):.3f}")
    if own_jax_ratios:
        print(f"geometric mean jax/xconv, own processes: {gmean(own_jax_ratios):.3f}   min: {min(own_jax_ratios):.3f}")
    # measured last: OpenBLAS's threads keep spinning for a while after a threaded product
    rate = matmul_rate()
    print(f"numpy float32 matmul rate (2048^3, {threads} threads): {rate:.1f} GFLOP/s; 70% = {0.7 * rate:.1f}")
    for case, r in zip(cases, rates):
        if case["name"] in GEMM_SHAPED:
            print(f"  {case['name']}: xconv {r:.1f} GFLOP/s = {100 * r / rate:.0f}% of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
