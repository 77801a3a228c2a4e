"""The ``xconv`` command line: ``xconv backends``, ``xconv run``, ``xconv conformance``."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
import time

import numpy as np

from . import api, registry, tracing
from .dtypes import DTYPES
from .errors import XconvError
from .params import MATH_MODES, output_shape
from .workspace import parse_bytes


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.replace("x", ",").split(",") if v.strip()]


def _padding(text: str):
    """"1", "1,2", "1:2,0:1" (pre:post pairs) or "valid" / "same" / "same_lower" / "full"."""
    if text.strip().isalpha() or "_" in text:
        return text.strip()
    parts = [p for p in text.split(",") if p.strip()]
    if any(":" in p for p in parts):
        return [tuple(int(v) for v in p.split(":")) for p in parts]
    values = [int(p) for p in parts]
    return values[0] if len(values) == 1 else values


def _determinism(text: str):
    if text in ("batch_invariant", "run_to_run", "true", "1"):
        return text if text == "batch_invariant" else True
    raise argparse.ArgumentTypeError(f"--deterministic takes nothing or batch_invariant, not {text!r}")


def _mask(text: str) -> tuple[bool, bool, bool]:
    bits = text.replace(",", "")
    if len(bits) != 3 or set(bits) - {"0", "1"}:
        raise argparse.ArgumentTypeError(f"--mask takes three 0/1 digits such as 110, not {text!r}")
    return tuple(b == "1" for b in bits)


def _checksum(a) -> str:
    if a is None:
        return "None (masked)"
    data = np.ascontiguousarray(a)
    digest = hashlib.sha256(data.tobytes()).hexdigest()[:16]
    f64 = data.astype(np.float64)
    return f"shape={tuple(data.shape)} dtype={data.dtype} sum={f64.sum():.6e} abs_sum={np.abs(f64).sum():.6e} sha256={digest}"


def cmd_backends(args) -> int:
    rows = [("name", "available", "version", "devices", "reason")]
    for r in registry.list_backends():
        rows.append((r.name, "yes" if r.available else "no", r.version, ",".join(r.devices), r.reason))
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row[:4], widths)) + "  " + str(row[4]))
    return 0


def cmd_run(args) -> int:
    rng = np.random.default_rng(args.seed)
    dtype = DTYPES[args.dtype]
    conv = dict(stride=args.stride if len(args.stride) > 1 else args.stride[0],
                padding=args.padding,
                dilation=args.dilation if len(args.dilation) > 1 else args.dilation[0],
                groups=args.groups, transposed=args.transposed,
                output_padding=args.output_padding if len(args.output_padding) > 1 else args.output_padding[0])
    x = rng.standard_normal(args.input).astype(dtype)
    w = rng.standard_normal(args.weight).astype(dtype)
    out_shape = output_shape(args.input, args.weight, **conv)
    dy = rng.standard_normal(out_shape).astype(dtype)
    common = dict(conv, math=args.math, deterministic=args.deterministic, backend=args.backend,
                  workspace_limit=args.workspace_limit)
    if args.op == "fprop":
        call = lambda: (api.conv_fprop(x, w, **common),)  # noqa: E731
        names = ("output",)
    else:
        call = lambda: api.convolution_backward(dy, x, w, output_mask=args.mask, **common)  # noqa: E731
        names = ("grad_input", "grad_weight", "grad_bias")
    backend = registry.select_backend(args.backend, "numpy")
    with tracing.trace() as first:
        results = call()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(f"backend: {backend.name} ({backend.info().version})")
    print(f"op: {args.op}  input={tuple(args.input)} weight={tuple(args.weight)} output={out_shape} dtype={args.dtype}")
    print(f"parameters: {conv}, math={args.math}, deterministic={args.deterministic}")
    for name, r in zip(names, results):
        print(f"{name}: {_checksum(r)}")
    print(f"record: {first.records[-1].summary()}")
    if times:
        print(f"time: median {1e3 * float(np.median(times)):.3f} ms over {len(times)} runs (min {1e3 * min(times):.3f} ms)")
    return 0


def cmd_conformance(argv: list[str]) -> int:
    try:
        kit = importlib.import_module("xconv_conformance.cli")
    except ImportError as exc:
        print(f"xconv: the conformance kit is not installed ({exc})", file=sys.stderr)
        return 2
    return kit.main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xconv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list registered backends, availability, reason and version")
    run = sub.add_parser("run", help="run fprop or backward on random data; print shapes, checksums, time")
    run.add_argument("--op", choices=("backward", "fprop"), default="backward")
    run.add_argument("--input", type=_ints, default=[4, 32, 28, 28], help="N,C,*spatial (default 4,32,28,28)")
    run.add_argument("--weight", type=_ints, default=[64, 32, 3, 3], help="weight shape (default 64,32,3,3)")
    run.add_argument("--stride", type=_ints, default=[1])
    run.add_argument("--padding", type=_padding, default=1,
                     help="int, per-dim ints (1,2), pre:post pairs (1:2,0:1), valid, same, same_lower, full")
    run.add_argument("--dilation", type=_ints, default=[1])
    run.add_argument("--groups", type=int, default=1)
    run.add_argument("--transposed", action="store_true")
    run.add_argument("--output-padding", type=_ints, default=[0])
    run.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    run.add_argument("--mask", type=_mask, default=(True, True, True), help="three 0/1 digits (default 111)")
    run.add_argument("--math", choices=MATH_MODES, default="keep_dtype")
    run.add_argument("--deterministic", nargs="?", const=True, default=False, type=_determinism,
                     help="run-to-run determinism; --deterministic batch_invariant adds batch invariance")
    run.add_argument("--workspace-limit", type=lambda t: parse_bytes(t, "--workspace-limit"), default=None,
                     help="most scratch bytes (4194304, 4MiB, 512k); default $XCONV_WORKSPACE_LIMIT, else none")
    run.add_argument("--backend", default=None, help="backend name (default: $XCONV_BACKEND, else by array family)")
    run.add_argument("--repeat", type=int, default=5, help="timed repetitions after one warm-up call")
    run.add_argument("--seed", type=int, default=0)
    sub.add_parser("conformance", help="the conformance kit (xconv conformance --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["conformance"]:
        return cmd_conformance(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return {"backends": cmd_backends, "run": cmd_run}[args.command](args)
    except XconvError as exc:
        print(f"xconv: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
