"""Benchmark: xconv's NumPy backward with each output mask against the full mask, on the layer suite.

Run from the repository root (see benchmarks/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/masks.py
    python benchmarks/masks.py --threads 1

A call that asks for fewer outputs must not take longer than the full call (issue 25: "masks no slower than full").
Per case of the suite (float32, the data of ``cpu_backward.py``): the median time of ``xconv.convolution_backward`` with
the full mask and with each partial one (dx, dw, db, dx+dw, dx+db, dw+db), the calls alternating, and the largest
ratio partial/full. Prints the CPU model, xconv's compiled loops and the BLAS kernel, as the other benchmarks do.
Timings on a shared machine are noisy: repeat runs and compare medians.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_backward as cb  # noqa: E402  (its path set-up puts this checkout's xconv first; OMP_WAIT_POLICY as there)

import xconv  # noqa: E402

MASKS = {"full": (True, True, True), "dx": (True, False, False), "dw": (False, True, False),
         "db": (False, False, True), "dx+dw": (True, True, False), "dx+db": (True, False, True),
         "dw+db": (False, True, True)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (xconv's workers); default: as set")
    args = ap.parse_args(argv)
    limit = cb.limit_blas_threads(args.threads) if args.threads else None
    cases, path = cb.load_suite()
    print(f"CPU: {cb.cpu_model()}")
    print(f"xconv compiled loops: {cb.compiled_loops_info()}")
    print(f"BLAS: {cb.blas_info()}")
    print(f"suite: {path}")
    print(f"{'case':<24}" + "".join(f"{m:>9}" for m in MASKS) + f"{'max part/full':>15}")
    worst = 0.0
    for case in cases:
        x, w, dy, conv, _ = cb.case_data(case)
        fns = {m: (lambda mk=mk: xconv.convolution_backward(dy, x, w, output_mask=mk, backend="numpy", **conv))
               for m, mk in MASKS.items()}
        times = cb.median_times(fns, args.reps)
        ratio = max(times[m] / times["full"] for m in MASKS if m != "full")
        worst = max(worst, ratio)
        print(f"{case['name']:<24}" + "".join(f"{times[m] * 1e3:>9.2f}" for m in MASKS) + f"{ratio:>15.2f}")
    print(f"largest partial/full ratio (ms above; 1.00 or less: no mask slower than full): {worst:.2f}")
    if limit is not None:
        limit.restore_original_limits()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
