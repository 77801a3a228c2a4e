"""The ``xconv`` command line: ``xconv backends``, ``xconv run``, ``xconv conformance``.

Each subcommand has its own ``--help``. Exit status: 0 on success; 1 when a backend fails at run
time; 2 on a usage error (a bad option, or arguments xconv refuses: a ShapeError, an unknown or
unavailable backend, an unsupported configuration); 130 when interrupted (Ctrl-C). A closed
output pipe (``xconv conformance cases | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import math
import os
import platform
import sys
import time

import numpy as np

from . import api, limits, registry, tracing
from .dtypes import DTYPES
from .errors import BackendError, ResourceError, XconvError
from .params import MATH_MODES, output_shape
from .units import parse_limit


def _ints(text: str) -> list[int]:
    """"4,32,28,28" or "4x32x28x28": one or more ints."""
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected ints separated by ',' or 'x' (such as 4x32x28x28), not {text!r}")
    return values


def byte_option(option: str):
    """An argparse type for a byte-count option: :func:`xconv.units.parse_limit` (4194304, 4MB, 4MiB, 4M, 1.5G;
    "none" for no limit), its ConfigError given to argparse as the option's one-line error."""
    def byte_count(text: str):
        try:
            return parse_limit(text, option)
        except XconvError as exc:       # argparse prefixes "argument OPTION: " itself
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{option}: ")) from None
    return byte_count


def _padding(text: str):
    """"1", "1,2", "1:2,0:1" (pre:post pairs) or "valid" / "same" / "same_lower" / "full"."""
    if text.strip().isalpha() or "_" in text:
        return text.strip()
    parts = [p for p in text.split(",") if p.strip()]
    try:
        if any(":" in p for p in parts):
            return [tuple(int(v) for v in p.split(":")) for p in parts]
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected an int, ints (1,2), pre:post pairs (1:2,0:1), valid, same, "
                                         f"same_lower or full, not {text!r}")
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


WIDTH = 100   # columns of `xconv backends` without -v


def emulation_of(name: str) -> str:
    """What backend ``name`` runs on when that is an emulator or fake (its optional ``emulation()``), else ""."""
    try:
        method = getattr(registry.get_backend(name), "emulation", None)
        return str(method() or "").strip() if callable(method) else ""
    except Exception:  # noqa: BLE001 - a label must not end the listing
        return ""


def cmd_backends(args) -> int:
    """A table within :data:`WIDTH` columns: name, availability, devices or the reason (wrapped); -v: every field."""
    import textwrap

    infos = registry.list_backends()
    fakes = {r.name: emulation_of(r.name) for r in infos if r.available}
    if args.verbose:
        for r in infos:
            print(f"{r.name}: {'available' if r.available else 'unavailable'}"
                  + (" (emulated)" if fakes.get(r.name) else ""))
            for field, value in (("version", r.version), ("devices", ", ".join(r.devices)),
                                 ("emulated by", fakes.get(r.name, "")),
                                 ("note" if r.available else "reason", r.reason)):
                if value:
                    print(textwrap.fill(value, WIDTH, initial_indent=f"  {field}: ",
                                        subsequent_indent=" " * (len(field) + 4)))
        return 0
    states = {r.name: ("yes (emulated)" if fakes.get(r.name) else "yes") if r.available else "no" for r in infos}
    name_w = max([len(r.name) for r in infos] + [4])
    state_w = max([len(s) for s in states.values()] + [len("available")])
    indent = " " * (name_w + state_w + 4)
    print(f"{'name'.ljust(name_w)}  {'available'.ljust(state_w)}  devices, or why not (-v: versions too)")
    for r in infos:
        if r.available:    # an available backend's reason is a note (e.g. contract defaults used)
            detail = "; ".join(filter(None, [", ".join(r.devices) or "-", r.reason]))
        else:
            detail = r.reason or "-"
        first = f"{r.name.ljust(name_w)}  {states[r.name].ljust(state_w)}  "
        print(textwrap.fill(detail, WIDTH, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False,
                            break_long_words=False))
    return 0


def default_weight(input_shape, groups: int, transposed: bool) -> list[int]:
    """The weight ``xconv run`` uses without --weight: C_out = 2*C_in, kernel 3 per spatial dim."""
    c_in, nd = input_shape[1], len(input_shape) - 2
    if transposed:  # (C_in, C_out/groups, *k)
        return [c_in, 2 * c_in // max(groups, 1), *([3] * nd)]
    return [2 * c_in, c_in // max(groups, 1), *([3] * nd)]


def check_run_memory(input_shape, weight_shape, out_shape, dtype) -> None:
    """Refuse (ResourceError naming --input) random data ``xconv run`` could not allocate: the float64 draw
    of the largest array, then x, w and grad_output in ``dtype`` and results of the same sizes."""
    sizes = [math.prod(s) for s in (input_shape, weight_shape, out_shape)]
    total = 8 * max(sizes) + 2 * np.dtype(dtype).itemsize * sum(sizes)
    limit = limits.memory_limit()
    if limit is not None and total > limit:
        dims = "x".join(map(str, input_shape))
        raise ResourceError(f"--input {dims}: the random data and results (weight {tuple(weight_shape)}, output "
                            f"{tuple(out_shape)}, {np.dtype(dtype).name})", total, limit,
                            f"choose smaller shapes, or set ${limits.ENV} to change the limit")


def cmd_run(args) -> int:
    rng = np.random.default_rng(args.seed)
    if args.weight is None:
        args.weight = default_weight(args.input, args.groups, args.transposed)
    dtype = DTYPES[args.dtype]
    conv = dict(stride=args.stride if len(args.stride) > 1 else args.stride[0],
                padding=args.padding,
                dilation=args.dilation if len(args.dilation) > 1 else args.dilation[0],
                groups=args.groups, transposed=args.transposed,
                output_padding=args.output_padding if len(args.output_padding) > 1 else args.output_padding[0])
    out_shape = output_shape(args.input, args.weight, **conv)   # validates the shapes before anything is allocated
    check_run_memory(args.input, args.weight, out_shape, dtype)
    x = rng.standard_normal(args.input).astype(dtype)
    w = rng.standard_normal(args.weight).astype(dtype)
    dy = rng.standard_normal(out_shape).astype(dtype)
    common = dict(conv, math=args.math, deterministic=args.deterministic, backend=args.backend,
                  workspace_limit=args.workspace_limit)
    if args.op == "fprop":
        call = lambda: (api.conv_fprop(x, w, **common),)  # noqa: E731
        names = ("output",)
    else:
        call = lambda: api.convolution_backward(dy, x, w, output_mask=args.mask, **common)  # noqa: E731
        names = ("grad_input", "grad_weight", "grad_bias")
    with tracing.trace() as first:
        results = call()
    backend = registry.select_backend(args.backend, "numpy")
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
    if args.explain:
        for rec in first.records:
            for step in rec.legalized:
                print(f"explain: legalized: {step}")
            for path in (rec.path or "(the backend named no path)").split(" + "):
                print(f"explain: {rec.op} path: {path}")
    if times:
        print(f"time: median {1e3 * float(np.median(times)):.3f} ms over {len(times)} runs (min {1e3 * min(times):.3f} ms)")
    return 0


def plain(doc: str) -> str:
    """A docstring as --help text: without its reStructuredText ``literal`` markup."""
    return doc.replace("``", "")


def versions() -> str:
    """``xconv --version``: xconv's version, then each registered backend's version and availability."""
    from . import __version__

    lines = [f"xconv {__version__} (Python {platform.python_version()}, NumPy {np.__version__})"]
    try:
        kit = importlib.import_module("xconv_conformance")
        lines.append(f"conformance kit {kit.__version__}")
    except ImportError:
        pass
    for r in registry.list_backends():
        state = "available" if r.available else f"unavailable: {r.reason}"
        lines.append(f"backend {r.name} {r.version or '(no version)'} ({state})")
    return "\n".join(lines)


class _Version(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())
        parser.exit()


def build_parser(with_kit: bool = True) -> argparse.ArgumentParser:
    """The ``xconv`` parser; ``with_kit=False`` leaves ``conformance``'s own subcommands out (imports less)."""
    parser = argparse.ArgumentParser(prog="xconv", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print xconv's version and each backend's, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{backends,run,conformance}",
                                title="subcommands")
    backends = sub.add_parser("backends", help="list registered backends, availability, devices or reason",
                              description="List the registered backends, one line each within 100 columns: "
                                          "availability (\"yes (emulated)\" on an emulator or fake), devices, "
                                          "or the reason it is unavailable. -v: every field in full (versions, "
                                          "reasons with what to install, what emulates the device).")
    backends.add_argument("-v", "--verbose", action="store_true", help="every field of every backend, in full")
    run = sub.add_parser("run", help="run fprop or backward on random data; print shapes, checksums, time",
                         description="Run one convolution (fprop, or backward with a mask) on random data and "
                                     "print the shapes, checksums of the results and the time. Only --input is "
                                     "needed: the weight defaults to C_out = 2*C_in with a 3-wide kernel.")
    run.add_argument("--op", choices=("backward", "fprop"), default="backward")
    run.add_argument("--input", type=_ints, default=[4, 32, 28, 28],
                     help="N,C,*spatial, such as 4,32,28,28 or 4x32x28x28 (default 4,32,28,28)")
    run.add_argument("--weight", type=_ints, default=None,
                     help="weight shape (default: (2*C, C/groups, 3, ...), or (C, 2*C/groups, 3, ...) transposed)")
    run.add_argument("--stride", type=_ints, default=[1])
    run.add_argument("--padding", type=_padding, default=1,
                     help="int, per-dim ints (1,2), pre:post pairs (1:2,0:1), valid, same, same_lower, full "
                          "(default 1)")
    run.add_argument("--dilation", type=_ints, default=[1])
    run.add_argument("--groups", type=int, default=1)
    run.add_argument("--transposed", action="store_true")
    run.add_argument("--output-padding", type=_ints, default=[0])
    run.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    run.add_argument("--mask", type=_mask, default=(True, True, True), help="three 0/1 digits (default 111)")
    run.add_argument("--math", choices=MATH_MODES, default="keep_dtype")
    run.add_argument("--deterministic", nargs="?", const=True, default=False, type=_determinism,
                     help="run-to-run determinism; --deterministic batch_invariant adds batch invariance")
    run.add_argument("--explain", action="store_true",
                     help="print which path computed each output and the rule that chose it (the trace record)")
    run.add_argument("--workspace-limit", type=byte_option("--workspace-limit"), default=None,
                     help="most scratch bytes (4194304, 4MB, 4MiB, 4M, 512k: units are powers of 1024); default "
                          "$XCONV_WORKSPACE_LIMIT, else none")
    run.add_argument("--backend", default=None, help="backend name (default: $XCONV_BACKEND, else by array family)")
    run.add_argument("--repeat", type=int, default=5, help="timed repetitions after one warm-up call (default 5)")
    run.add_argument("--seed", type=int, default=0)
    conformance = sub.add_parser("conformance", help="the conformance kit: check, run, compare, cases "
                                                     "(xconv conformance --help)")
    try:
        kit = importlib.import_module("xconv_conformance.cli") if with_kit else None
    except ImportError as exc:
        conformance.description = f"The conformance kit is not installed here ({exc})."
        conformance.set_defaults(kit=None, kit_error=str(exc))
    else:
        if kit is not None:
            kit.configure(conformance)
        conformance.set_defaults(kit=kit, kit_error="")
    return parser


def _argv_with_defaults(argv: list[str]) -> list[str]:
    if argv[:1] == ["conformance"]:
        kit = sys.modules.get("xconv_conformance.cli")
        if kit is not None:
            return ["conformance", *kit.with_default_subcommand(argv[1:])]
    return argv


def _run(argv: list[str]) -> int:
    parser = build_parser(with_kit=argv[:1] == ["conformance"])
    argv = _argv_with_defaults(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand that was given them, with its own usage line
        _deepest(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "conformance":
        if args.kit is None:
            print(f"xconv conformance: the conformance kit is not installed ({args.kit_error})", file=sys.stderr)
            return 2
        return args.kit.dispatch(args, argv[1:])
    try:
        return {"backends": cmd_backends, "run": cmd_run}[args.command](args)
    except BackendError as exc:
        print(f"xconv {args.command}: BackendError: {exc}", file=sys.stderr)
        return 1
    except XconvError as exc:
        print(f"xconv {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _deepest(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)parser of the innermost subcommand named in ``args``."""
    for dest in ("command", "subcommand"):
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, dest, None)
        if not actions or chosen not in actions[0].choices:
            break
        parser = actions[0].choices[chosen]
    return parser


def guarded(function, *args) -> int:
    """``function(*args)`` as a command: SystemExit's code, a quiet end on a closed pipe, one line on Ctrl-C."""
    try:
        try:
            code = function(*args)
        except SystemExit as exc:  # argparse's --help, --version and usage errors
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader went away (``| head``): stop quietly; stdout goes to devnull so the final flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by a closed pipe
    except KeyboardInterrupt:
        print("\nxconv: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return guarded(_run, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
