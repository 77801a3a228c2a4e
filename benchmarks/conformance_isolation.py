"""What running the backend in worker processes costs a conformance run.

    python benchmarks/conformance_isolation.py [--backend numpy] [--repeat 5] [--cases PATTERN ...]

Runs ``xconv conformance run --backend NAME`` with and without ``--no-isolate``, alternating, each
in a fresh process (both modes pay the same imports and first-call costs), and prints per mode
the median wall time of the whole command and of the run itself (the "time" column of its summary:
the cases, the oracle, and the fresh-process determinism check), the CPU time of the command and
all its processes (the steadier figure on a loaded machine), and the overhead of isolation.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(backend: str, isolate: bool, cases: list[str]) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "xconv", "conformance", "run", "--backend", backend, "--out",
               os.path.join(tmp, "b.xcr"), "--no-progress"] + (["--no-isolate"] if not isolate else [])
        for pattern in cases:
            cmd += ["--cases", pattern]
        start, cpu = time.perf_counter(), _children_cpu()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    row = next(line for line in proc.stdout.splitlines() if line.startswith(backend + " "))
    return wall, float(row.split()[-1].rstrip("s")), cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cases", action="append", default=[])
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
          file=sys.stderr)
    results = {True: [], False: []}
    load0 = f"{os.getloadavg()[0]:.2f}"
    one_run(args.backend, True, args.cases)          # warm the file caches and any on-disk compilation caches
    for i in range(args.repeat):
        for isolate in ((True, False) if i % 2 == 0 else (False, True)):
            results[isolate].append(one_run(args.backend, isolate, args.cases))
            wall, run, cpu = results[isolate][-1]
            print(f"  {'isolated   ' if isolate else 'in-process '} wall {wall:6.2f} s, run {run:6.2f} s, "
                  f"cpu {cpu:6.2f} s", file=sys.stderr)
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in results.items()}
    print(f"backend {args.backend}, {args.repeat} runs per mode (medians); load average before/after: "
          f"{load0} / {os.getloadavg()[0]:.2f}")
    print(f"{'mode':12} {'command wall':>13} {'run':>8} {'CPU':>8}")
    for isolate, label in ((False, "in-process"), (True, "isolated")):
        print(f"{label:12} {med[isolate][0]:12.2f}s {med[isolate][1]:7.2f}s {med[isolate][2]:7.2f}s")
    over = [med[True][i] / med[False][i] - 1 for i in range(3)]
    print(f"isolation overhead: {over[0]:+.0%} of the command's wall time, {over[1]:+.0%} of the run's time, "
          f"{over[2]:+.0%} of the CPU time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
