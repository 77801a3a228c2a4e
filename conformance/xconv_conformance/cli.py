"""``xconv conformance``: run the corpus on backends, write and compare result bundles, write reports.

    xconv conformance [--backend NAME]... [--cases PATTERN]... [--report FILE]
        Run the corpus on the named backends (default: every registered backend except the
        oracle "numpy-exact"), with a progress bar, and print a summary table.
    xconv conformance run --backend NAME --out FILE.xcr [--cases PATTERN]... [--report FILE]
        Run on one backend and write a portable result bundle.
    xconv conformance compare A.xcr B.xcr [...] [--report FILE] [--all]
        Hold bundles against the reference and against each other; a table; exit 1 on a disagreement.
    xconv conformance cases [--cases PATTERN]... [--json]
        List the case ids (or their specs).

Exit status: 0 when everything run passed (refusals and unavailable backends are reported, not
failures, except that a backend named with --backend must be available); 1 on a failure or a
disagreement; 2 on a usage error, an unavailable named backend or an unreadable bundle.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections import Counter

import xconv

from . import __version__, env, report
from .bundle import BundleError, build, load_bundle, write_bundle
from .cases import corpus_hash, load_corpus, select
from .compare import compare_bundles, format_comparison, report_runs
from .report import write_report
from .runner import ORACLE, Watch, apply_fresh_process, availability, fresh_process_digests, inputs_of, resolve, run_case

SUBCOMMANDS = ("run", "compare", "cases")


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, unless forced)."""

    def __init__(self, total: int, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.done, self.start = max(total, 1), 0, time.perf_counter()
        self.failed = 0

    def step(self, label: str, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        text = (f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.1f}s {'failed ' + str(self.failed) + ' ' if self.failed else ''}{label[:60]}")
        self.stream.write(text.ljust(120)[:120])
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()


def run_backend(cases, backend: str, progress: Progress | None = None, keep_outputs: bool = False,
                imports=()) -> list:
    """Outcomes of ``cases`` on ``backend``, with the batched fresh-process determinism check."""
    outcomes = []
    watch = Watch()
    for case in cases:
        out = watch.after(run_case(case, backend, keep_outputs=keep_outputs))
        outcomes.append(out)
        if progress:
            progress.step(f"{backend} {case.id}", out.status == "failed")
    det = [(c, o) for c, o in zip(cases, outcomes) if c.deterministic and c.kind == "valid" and o.status == "passed"]
    if det:
        try:
            fresh = fresh_process_digests(backend, [c for c, _ in det], imports)
        except Exception as exc:  # noqa: BLE001
            fresh = {c.id: f"error: {exc}" for c, _ in det}
        for c, o in det:
            apply_fresh_process(o, fresh.get(c.id, "error: no answer from the fresh process"))
    return outcomes


def _rows(cases, outcomes) -> list[dict]:
    return [{"id": c.id, "group": c.group, "dtype": c.dtype, "status": o.status, "ratio": o.ratio,
             "ratios": o.ratios, "message": o.message, "samples": o.ratio_samples, "ran": report.ran(o.record)}
            for c, o in zip(cases, outcomes)]


def _fmt(r) -> str:
    if r is None:
        return "-"
    return "inf" if r == float("inf") else f"{r:.3g}"


def summary_table(results: dict, seconds: dict) -> str:
    """``results``: {backend: [(case, outcome)]} -> the summary table text."""
    rows = [["backend", "passed", "failed", "refused", "unavailable", "worst error/bound", "worst case", "time"]]
    for name, pairs in results.items():
        counts = Counter(o.status for _, o in pairs)
        ratios = [(o.ratio, c.id) for c, o in pairs if o.ratio is not None]
        worst = max(ratios) if ratios else (None, "")
        rows.append([name, *(str(counts.get(s, 0)) for s in ("passed", "failed", "refused", "unavailable")),
                     _fmt(worst[0]), worst[1], f"{seconds.get(name, 0.0):.1f}s"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _details(results: dict, verbose: bool) -> str:
    lines = []
    for name, pairs in results.items():
        unavailable = [o.message for _, o in pairs if o.status == "unavailable"]
        if unavailable and len(unavailable) == len(pairs):
            lines.append(f"{name}: unavailable: {unavailable[0]}")
            continue
        failed = [(c, o) for c, o in pairs if o.status == "failed"]
        for c, o in failed[: None if verbose else 20]:
            lines.append(f"FAILED {c.id} on {name}: {o.message.splitlines()[0] if o.message else ''}"[:600])
        if len(failed) > 20 and not verbose:
            lines.append(f"... and {len(failed) - 20} more failures on {name} (--verbose lists them all)")
        reasons = Counter(o.message.split(":")[0][:160] if o.message else "" for _, o in pairs if o.status == "refused")
        for reason, n in reasons.most_common(5 if not verbose else None):
            lines.append(f"refused {n} case(s) on {name}: {reason}")
    return "\n".join(lines)


def _import(modules) -> None:
    for m in modules or ():
        importlib.import_module(m)


def _select(patterns):
    cases = select(load_corpus(), patterns)
    if not cases:
        raise SystemExit(f"xconv conformance: no case matches {patterns}")
    return cases


def cmd_check(args) -> int:
    _import(args.imports)
    cases = _select(args.cases)
    explicit = bool(args.backend)
    names = args.backend or [r.name for r in xconv.list_backends() if r.name != ORACLE]
    avail = {n: availability(n) for n in names}
    runnable = [n for n in names if avail[n][0]]
    progress = Progress(len(cases) * len(runnable), False if args.no_progress else None)
    results, seconds = {}, {}
    from .runner import Outcome
    for name in names:
        start = time.perf_counter()
        if avail[name][0]:
            outcomes = run_backend(cases, name, progress, imports=args.imports)
        else:
            outcomes = [Outcome(c.id, name, "unavailable", avail[name][1]) for c in cases]
        results[name] = list(zip(cases, outcomes))
        seconds[name] = time.perf_counter() - start
    progress.close()
    print(f"xconv conformance: {len(cases)} cases (corpus {corpus_hash(load_corpus())[:12]}), "
          f"xconv {xconv.__version__}, kit {__version__}")
    print(summary_table(results, seconds))
    details = _details(results, args.verbose)
    if details:
        print(details)
    if args.report:
        runs = [{"label": name, "detail": _backend_detail(name), "rows": _rows(cases, [o for _, o in pairs])}
                for name, pairs in results.items()]
        write_report(args.report, "xconv conformance report", runs, _intro(cases))
        print(f"report: {args.report}")
    if any(o.status == "failed" for pairs in results.values() for _, o in pairs):
        return 1
    if explicit and any(not avail[n][0] for n in names):
        return 2
    return 0


def _backend_detail(name: str) -> str:
    try:
        info = resolve(name).info()
    except xconv.BackendUnavailableError as exc:
        return exc.reason
    return f"{info.version} on {env.device_name(info.devices)}" if info.available else info.reason


def _intro(cases) -> str:
    return (f"{len(cases)} cases, corpus {corpus_hash(load_corpus())[:12]}, xconv {xconv.__version__}, kit "
            f"{__version__}, {env.platform_info()['platform']}, {env.now()}. A result passes when |got - exact| "
            "&le; bound per element (see docs/conformance.md).")


def manifest_for(name: str, cases, argv) -> dict:
    b = resolve(name)
    info = b.info()
    caps = b.capabilities
    return {
        "xconv_version": xconv.__version__, "kit_version": __version__,
        "backend": {"name": info.name, "version": info.version, "devices": list(info.devices),
                    "array_families": list(info.array_families),
                    "capabilities": {"spatial_dims": sorted(caps.spatial_dims), "dtypes": sorted(caps.dtypes),
                                     "transposed": caps.transposed, "strided": caps.strided,
                                     "deterministic": caps.deterministic, "math": sorted(caps.math)}},
        "libraries": env.library_versions(), "device": env.device_name(info.devices),
        "platform": env.platform_info(), "created": env.now(),
        "corpus": {"hash": corpus_hash(cases), "full_hash": corpus_hash(load_corpus()), "count": len(cases),
                   "case_ids": [c.id for c in cases]},
        "command": ["xconv", "conformance", *argv],
    }


def cmd_run(args, argv) -> int:
    _import(args.imports)
    cases = _select(args.cases)
    ok, reason = availability(args.backend)
    if not ok:
        print(f"xconv conformance: backend {args.backend!r} is unavailable: {reason}", file=sys.stderr)
        return 2
    progress = Progress(len(cases), False if args.no_progress else None)
    start = time.perf_counter()
    outcomes = run_backend(cases, args.backend, progress, keep_outputs=True, imports=args.imports)
    progress.close()
    seconds = time.perf_counter() - start
    manifest, arrays = build(manifest_for(args.backend, cases, argv),
                             [(c, o, inputs_of(c).digest()) for c, o in zip(cases, outcomes)])
    write_bundle(args.out, manifest, arrays)
    results = {args.backend: list(zip(cases, outcomes))}
    print(f"xconv conformance run: {len(cases)} cases on {args.backend} ({manifest['device']})")
    print(summary_table(results, {args.backend: seconds}))
    details = _details(results, args.verbose)
    if details:
        print(details)
    print(f"bundle: {args.out}")
    if args.report:
        write_report(args.report, f"xconv conformance: {args.backend}", [
            {"label": args.backend, "detail": _backend_detail(args.backend), "rows": _rows(cases, outcomes)}],
            _intro(cases))
        print(f"report: {args.report}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def cmd_compare(args) -> int:
    try:
        bundles = [load_bundle(p) for p in args.bundles]
    except BundleError as exc:
        print(f"xconv conformance compare: {exc}", file=sys.stderr)
        return 2
    cmp = compare_bundles(bundles)
    print(format_comparison(cmp, show_all=args.all))
    if args.report:
        write_report(args.report, "xconv conformance comparison", report_runs(cmp),
                     f"{len(bundles)} bundles: " + ", ".join(b.path for b in bundles)
                     + ". Each bundle is held against the float64 reference recomputed here.")
        print(f"report: {args.report}")
    return 1 if cmp.disagreements else 0


def cmd_cases(args) -> int:
    cases = select(load_corpus(), args.cases)
    for c in cases:
        print(json.dumps(c.spec(), sort_keys=True) if args.json else c.id)
    print(f"# {len(cases)} cases, corpus {corpus_hash(load_corpus())}", file=sys.stderr)
    return 0


def _common(p: argparse.ArgumentParser, backend_repeatable: bool = True) -> None:
    p.add_argument("--cases", action="append", metavar="PATTERN",
                   help="only cases whose id matches (glob, or substring); repeatable")
    p.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--verbose", "-v", action="store_true", help="list every failure and refusal reason")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help="import MODULE first (it may register backends with xconv.register_backend); repeatable")


def build_parsers() -> dict:
    check = argparse.ArgumentParser(prog="xconv conformance", description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--backend", action="append", metavar="NAME",
                       help="backend to test (repeatable; default: every registered backend but the oracle)")
    _common(check)
    run = argparse.ArgumentParser(prog="xconv conformance run",
                                  description="Run the corpus on one backend and write a portable bundle.")
    run.add_argument("--backend", required=True, metavar="NAME")
    run.add_argument("--out", required=True, metavar="FILE.xcr")
    _common(run)
    compare = argparse.ArgumentParser(prog="xconv conformance compare",
                                      description="Compare bundles against the reference and pairwise.")
    compare.add_argument("bundles", nargs="+", metavar="BUNDLE.xcr")
    compare.add_argument("--report", metavar="FILE.html")
    compare.add_argument("--all", action="store_true", help="list every case, not only disagreements")
    cases = argparse.ArgumentParser(prog="xconv conformance cases", description="List the corpus.")
    cases.add_argument("--cases", action="append", metavar="PATTERN")
    cases.add_argument("--json", action="store_true", help="print each case's spec as JSON")
    return {"check": check, "run": run, "compare": compare, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parsers = build_parsers()
    sub = argv[0] if argv and argv[0] in SUBCOMMANDS else "check"
    rest = argv[1:] if sub != "check" else argv
    try:
        args = parsers[sub].parse_args(rest)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if sub == "run":
            return cmd_run(args, argv)
        if sub == "compare":
            return cmd_compare(args)
        if sub == "cases":
            return cmd_cases(args)
        return cmd_check(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        return int(exc.code or 0)
    except BundleError as exc:
        print(f"xconv conformance: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
