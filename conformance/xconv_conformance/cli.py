"""``xconv conformance``: run the corpus on backends, write and compare result bundles, write reports.

subcommands (``xconv conformance SUBCOMMAND --help`` describes each):
  check    run the corpus on backends and print a summary table (the default: ``xconv conformance
           [--backend NAME]...`` is ``xconv conformance check ...``); every registered backend but
           the oracle "numpy-exact" unless --backend names some
  run      run on one backend and write a portable result bundle (--backend NAME --out FILE.xcr)
  compare  hold bundles against the reference and against each other; exit 1 on a disagreement,
           or when a bundle gives nothing to compare (no case, unknown ids, all refused/unavailable)
  cases    list the case ids or their specs (also: list)
  fuzz     search for failing cases beyond the corpus, shrunk to minimal ones (fuzz.py)

check and run run the backend in worker processes: a case that crashes its worker is recorded as
"crashed" (with the signal), one past --case-timeout SECONDS as "timed out", and the run goes on;
--no-isolate runs in this process (for debugging).

Exit status: 0 when everything run passed (refusals and unavailable backends are reported, not
failures, except that a backend named with --backend must be available); 1 on a failure (crashed
and timed-out cases included) or a disagreement; 2 on a usage error, an unknown or unavailable
named backend or an unreadable bundle; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import xconv

from . import __version__, env, outpaths, selection, summary
from .bundle import BundleError, build, load_bundle, write_bundle
from .cases import corpus_hash, load_corpus, select
from .compare import compare_bundles, count_line, format_comparison, report_runs
from .report import write_report
from .isolation import DEFAULT_CASE_TIMEOUT, CaseRunner, FreshDigests
from .runner import FAILING, ORACLE, apply_fresh_process, availability, inputs_of, resolve
from .progress import Progress, _nothing, phase, prepare  # noqa: F401  (re-exported: cli.X stays importable)
from .summary import summary_table  # noqa: F401  (re-exported: cli.summary_table stays importable)


class Interrupted(Exception):
    """Ctrl-C during :func:`run_backend`: ``outcomes`` holds the cases that finished, in order."""

    def __init__(self, outcomes: list):
        super().__init__(f"interrupted after {len(outcomes)} case(s)")
        self.outcomes = outcomes


def run_backend(cases, backend: str, progress: Progress | None = None, keep_outputs: bool = False,
                imports=(), isolate: bool = True, case_timeout: float = DEFAULT_CASE_TIMEOUT, notes=None) -> list:
    """Outcomes of ``cases`` on ``backend`` (in a worker process unless not ``isolate``), with the
    fresh-process determinism check of the deterministic cases that passed. Lines worth telling
    the user (a run that could not be isolated) are appended to ``notes``. Ctrl-C raises
    :class:`Interrupted` with the outcomes of the cases that finished."""
    outcomes, checked = [], set()
    det_ids = {c.id for c in cases if c.deterministic and c.kind == "valid"}
    fresh = FreshDigests(backend, imports, case_timeout)
    try:
        with CaseRunner(backend, isolate=isolate, case_timeout=case_timeout, imports=imports,
                        keep_outputs=keep_outputs) as runner:
            for case in cases:
                out = runner.run(case)
                outcomes.append(out)
                if det_ids and len(outcomes) == 1:
                    fresh.worker.spawn()    # its start-up overlaps the run (after the judge's, not competing with it)
                if progress:
                    progress.step(f"{backend} {case.id}", out.status in FAILING)
            if runner.note and notes is not None:
                notes.append(runner.note)
        for c, o in zip(cases, outcomes):
            if c.id in det_ids and o.status == "passed":
                apply_fresh_process(o, fresh.digest(c))
            checked.add(c.id)
    except KeyboardInterrupt:
        for c, o in zip(cases, outcomes):
            if c.id in det_ids and o.status == "passed" and c.id not in checked:
                o.message = (o.message + "; " if o.message else "") + "fresh-process check not run: interrupted"
        raise Interrupted(outcomes) from None
    finally:
        fresh.close()
    return outcomes


def _import(modules) -> None:
    for m in modules or ():
        importlib.import_module(m)


def _select(patterns):
    cases = select(load_corpus(), patterns)
    if not cases:
        raise SystemExit(f"xconv conformance: no case matches {patterns}")
    return cases


def _load(args):
    """Imports, plugins and the corpus, each reported as one phase line unless --no-progress."""
    quiet = args.no_progress
    with phase("loading backend plugins") if not quiet else _nothing():
        _import(args.imports)
        xconv.list_backends()
    with phase("loading the case corpus") if not quiet else _nothing():
        if getattr(args, "cases_from", None) or getattr(args, "exact", False) or getattr(args, "shard", None):
            try:
                cases = selection.choose(args)         # --cases-from, --exact (selection.py)
            except (OSError, ValueError) as exc:
                raise SystemExit(f"xconv conformance: {exc}") from None
            if not cases:
                raise SystemExit(f"xconv conformance: no case matches {args.cases or ''} {args.cases_from or ''}")
            args.selection = cases
            return selection.shard(cases, *args.shard) if args.shard else cases
        return _select(args.cases)


def _unknown(names) -> str | None:
    known = {r.name for r in xconv.list_backends()}
    bad = [n for n in names if n not in known]
    if bad:
        return (f"xconv conformance: no backend named {', '.join(map(repr, bad))} is registered "
                f"(registered: {', '.join(sorted(known))}; `xconv backends` lists them)")
    return None


def cmd_check(args) -> int:
    cases = _load(args)
    explicit = bool(args.backend)
    if explicit and (msg := _unknown(args.backend)):
        print(msg, file=sys.stderr)
        return 2
    names = args.backend or [r.name for r in xconv.list_backends() if r.name != ORACLE]
    avail = {n: availability(n) for n in names}
    runnable = [n for n in names if avail[n][0]]
    for n in runnable:
        prepare(n, quiet=args.no_progress, isolate=not args.no_isolate)
    progress = Progress(len(cases) * len(runnable), False if args.no_progress else None)
    results, seconds, notes, stopped = {}, {}, [], None
    from .runner import Outcome
    for name in names:
        start = time.perf_counter()
        if avail[name][0]:
            try:
                outcomes = run_backend(cases, name, progress, imports=args.imports, isolate=not args.no_isolate,
                                       case_timeout=args.case_timeout, notes=notes)
            except Interrupted as exc:
                outcomes = exc.outcomes
                stopped = (f"interrupted (Ctrl-C) after {len(outcomes)} of {len(cases)} case(s) on {name}; "
                           f"not started: {', '.join(names[names.index(name) + 1:]) or 'none'}. "
                           "The summary covers what finished.")
        else:
            outcomes = [Outcome(c.id, name, "unavailable", avail[name][1]) for c in cases]
        results[name] = list(zip(cases, outcomes))
        seconds[name] = time.perf_counter() - start
        if stopped:
            break
    progress.close()
    emulations = {n: env.emulation(resolve(n)) for n in runnable}
    notes += [f"{n}: {env.emulated_words(text)}" for n, text in emulations.items() if text]
    print(f"xconv conformance: {len(cases)} cases (corpus {corpus_hash(load_corpus())[:12]}), "
          f"xconv {xconv.__version__}, kit {__version__}")
    print(summary_table(results, seconds))
    details = summary.details(results, args.verbose, named=args.backend or ())
    if details:
        print(details)
    for note in notes:
        print(f"note: {note}")
    if args.report:
        runs = [{"label": name, "detail": _backend_detail(name), "rows": summary.rows(cases, [o for _, o in pairs]),
                 "emulation": emulations.get(name, "")} for name, pairs in results.items()]
        title = "xconv conformance report" + (" (interrupted)" if stopped else "")
        outpaths.writing("--report", args.report, lambda: write_report(args.report, title, runs, _intro(cases)))
        print(f"report: {args.report}")
    if stopped:
        print(f"xconv conformance: {stopped}")
        print("xconv: interrupted", file=sys.stderr)
        return 130
    if any(o.status in FAILING for pairs in results.values() for _, o in pairs):
        return 1
    if explicit and any(not avail[n][0] for n in names):
        return 2
    return 0


def _backend_detail(name: str) -> str:
    try:
        b = resolve(name)
        info = b.info()
    except xconv.BackendUnavailableError as exc:
        return exc.reason
    if not info.available:
        return info.reason
    emulated = env.emulated_words(env.emulation(b))
    return f"{info.version} on {env.device_name(info.devices)}" + (f"; {emulated}" if emulated else "")


def _intro(cases) -> str:
    return (f"{len(cases)} cases, corpus {corpus_hash(load_corpus())[:12]}, xconv {xconv.__version__}, kit "
            f"{__version__}, {env.platform_info()['platform']}, {env.now()}. A result passes when |got - exact| "
            "&le; bound per element (see docs/conformance.md).")


def manifest_for(name: str, cases, argv) -> dict:
    b = resolve(name)
    info = b.info()
    caps = b.capabilities
    emulation = env.emulation(b)
    return {
        "xconv_version": xconv.__version__, "kit_version": __version__,
        "backend": {"name": info.name, "version": info.version, "devices": list(info.devices),
                    "emulated": bool(emulation), "emulation": emulation,
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
    cases = _load(args)
    if msg := _unknown([args.backend]):
        print(msg, file=sys.stderr)
        return 2
    ok, reason = availability(args.backend)
    if not ok:
        print(f"xconv conformance: backend {args.backend!r} is unavailable: {reason}", file=sys.stderr)
        return 2
    prepare(args.backend, quiet=args.no_progress, isolate=not args.no_isolate)
    progress = Progress(len(cases), False if args.no_progress else None)
    start = time.perf_counter()
    notes = []
    total, stopped = len(cases), False
    try:
        outcomes = run_backend(cases, args.backend, progress, keep_outputs=True, imports=args.imports,
                               isolate=not args.no_isolate, case_timeout=args.case_timeout, notes=notes)
    except Interrupted as exc:                   # a partial bundle of the cases that finished, marked so
        outcomes, stopped = exc.outcomes, True
        cases = cases[:len(outcomes)]
    progress.close()
    seconds = time.perf_counter() - start
    manifest = manifest_for(args.backend, cases, argv)
    if stopped:
        manifest["interrupted"] = {"after": len(cases), "of": total}
    if args.shard:
        manifest["shard"] = selection.shard_record(args.selection, *args.shard)
    manifest, arrays = build(manifest, [(c, o, inputs_of(c).digest()) for c, o in zip(cases, outcomes)])
    outpaths.writing("--out", args.out, lambda: write_bundle(args.out, manifest, arrays))
    results = {args.backend: list(zip(cases, outcomes))}
    print(f"xconv conformance run: {len(cases)} cases on {args.backend} ({manifest['device']})")
    if manifest["backend"]["emulated"]:
        print(f"note: {env.emulated_words(manifest['backend']['emulation'])}")
    print(summary_table(results, {args.backend: seconds}))
    details = summary.details(results, args.verbose)
    if details:
        print(details)
    for note in notes:
        print(f"note: {note}")
    print(f"bundle: {args.out}" + (f" (partial: interrupted after {len(cases)} of {total} cases)" if stopped else ""))
    if args.report:
        runs = [{"label": args.backend, "detail": _backend_detail(args.backend), "rows": summary.rows(cases, outcomes),
                 "emulation": manifest["backend"]["emulation"]}]
        outpaths.writing("--report", args.report, lambda: write_report(
            args.report, f"xconv conformance: {args.backend}", runs, _intro(cases)))
        print(f"report: {args.report}")
    if stopped:
        print(f"xconv conformance run: interrupted (Ctrl-C) after {len(cases)} of {total} case(s); the bundle "
              "holds those, marked interrupted")
        print("xconv: interrupted", file=sys.stderr)
        return 130
    return 1 if any(o.status in FAILING for o in outcomes) else 0


def cmd_compare(args) -> int:
    try:
        bundles = [load_bundle(p) for p in args.bundles]
    except BundleError as exc:
        print(f"xconv conformance compare: {exc}", file=sys.stderr)
        return 2
    from .merge import merge_shards
    try:
        merged = merge_shards(bundles)         # shard bundles of one backend become one run (merge.py)
    except BundleError as exc:
        print(f"xconv conformance compare: {exc}", file=sys.stderr)
        return 2
    bundles = merged.bundles
    for line in merged.notes + merged.gaps:
        print(line)
    cmp = compare_bundles(bundles)
    print(format_comparison(cmp, show_all=args.all))
    if args.report:
        intro = (f"{len(bundles)} bundles: " + ", ".join(b.path for b in bundles)
                 + f". {count_line(cmp)}. Each bundle is held against the float64 reference recomputed here.")
        outpaths.writing("--report", args.report,
                         lambda: write_report(args.report, "xconv conformance comparison", report_runs(cmp), intro))
        print(f"report: {args.report}")
    return 0 if cmp.passes and not merged.gaps else 1


def cmd_cases(args) -> int:
    cases = select(load_corpus(), args.cases)
    for c in cases:
        print(json.dumps(c.spec(), sort_keys=True) if args.json else c.id)
    print(f"# {len(cases)} cases, corpus {corpus_hash(load_corpus())}", file=sys.stderr)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", action="append", metavar="PATTERN",
                   help="only cases whose id matches (glob, or substring); repeatable")
    p.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML report")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (neither the preparation lines nor the bar)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="list every failure and refusal reason, and the stderr of crashed and timed-out cases")
    p.add_argument("--case-timeout", type=_seconds, default=DEFAULT_CASE_TIMEOUT, metavar="SECONDS",
                   help=f"record a case still running after SECONDS as timed out (default {DEFAULT_CASE_TIMEOUT:g})")
    p.add_argument("--no-isolate", action="store_true",
                   help="run the backend in this process, not in worker processes (for debugging: a crash "
                        "then ends the run)")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help="import MODULE first (it may register backends with xconv.register_backend); repeatable")
    selection.add_arguments(p)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give ``parser`` (``xconv conformance``) its subcommands; each has its own --help."""
    parser.description = __doc__.replace("``", "")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="subcommand", metavar="{check,run,compare,cases,list,fuzz}", title="subcommands")
    check = sub.add_parser("check", help="run the corpus on backends; a summary table (the default)",
                           description="Run the corpus on the named backends (default: every registered "
                                       "backend but the oracle numpy-exact) and print a summary table. "
                                       "Exit 1 on a failure, 2 when a named backend is unknown or unavailable.")
    check.add_argument("--backend", action="append", metavar="NAME",
                       help="backend to test (repeatable; default: every registered backend but the oracle)")
    _common(check)
    run = sub.add_parser("run", help="run on one backend and write a portable bundle",
                         description="Run the corpus on one backend and write a portable result bundle.")
    run.add_argument("--backend", required=True, metavar="NAME")
    run.add_argument("--out", required=True, metavar="FILE.xcr")
    _common(run)
    compare = sub.add_parser("compare", help="compare bundles against the reference and pairwise",
                             description="Compare bundles against the float64 reference and pairwise; "
                                         "exit 1 on a disagreement or when a bundle gives nothing to compare "
                                         "(no case, unknown ids, every case refused or unavailable), 2 on an "
                                         "unreadable bundle. The same bundle twice is a warning.")
    compare.add_argument("bundles", nargs="+", metavar="BUNDLE.xcr")
    compare.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML report")
    compare.add_argument("--all", action="store_true", help="list every case, not only disagreements")
    cases = sub.add_parser("cases", aliases=["list"], help="list the case ids or specs (alias: list)",
                           description="List the corpus: one case id per line, or each spec as JSON.")
    cases.add_argument("--cases", action="append", metavar="PATTERN",
                       help="only cases whose id matches (glob, or substring); repeatable")
    cases.add_argument("--json", action="store_true", help="print each case's spec as JSON")
    from .fuzz_cli import add_parser as add_fuzz_parser
    add_fuzz_parser(sub)
    return parser


def with_default_subcommand(argv: list[str]) -> list[str]:
    """``argv`` with "check" put first when it names no subcommand (options only, or nothing)."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        return ["check", *argv]
    return argv


def dispatch(args, argv: list[str]) -> int:
    """Run the parsed subcommand; ``argv`` is what followed ``xconv conformance`` (for bundle manifests).
    Every output path is checked first: a bad one ends the command (exit 2, one line) before any work."""
    name = f"xconv conformance {args.subcommand or 'check'}"
    bad = outpaths.check({"--out": getattr(args, "out", None), "--report": getattr(args, "report", None)})
    if bad:
        print(f"{name}: {bad}", file=sys.stderr)
        return 2
    try:
        if args.subcommand == "run":
            return cmd_run(args, argv)
        if args.subcommand == "compare":
            return cmd_compare(args)
        if args.subcommand in ("cases", "list"):
            return cmd_cases(args)
        if args.subcommand == "fuzz":
            from .fuzz_cli import cmd_fuzz
            return cmd_fuzz(args)
        return cmd_check(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        return int(exc.code or 0)
    except BundleError as exc:
        print(f"xconv conformance: {exc}", file=sys.stderr)
        return 2
    except outpaths.WriteFailed as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``xconv conformance`` on its own (the ``xconv`` command calls :func:`configure` and :func:`dispatch`)."""
    argv = with_default_subcommand(sys.argv[1:] if argv is None else list(argv))
    parser = configure(argparse.ArgumentParser(prog="xconv conformance"))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return dispatch(args, argv)


if __name__ == "__main__":
    from xconv.cli import guarded

    sys.exit(guarded(main))
