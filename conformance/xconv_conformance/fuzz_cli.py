"""``xconv conformance fuzz --backend NAME [--seconds S] [--seed K] [--exact] [--out FILE]`` (see fuzz.py).

Prints each shrunk failing case as one JSON line (the format of ``xconv conformance cases --json``)
on stdout and writes the same lines to ``--out``; a summary goes to stderr. Exit 1 when a failing
case was found, 0 when the time ran out with none, 2 on a usage error or an unknown or unavailable
backend.
"""

from __future__ import annotations

import importlib
import sys

import xconv

from .runner import availability


def add_parser(sub) -> None:
    p = sub.add_parser("fuzz", help="search for failing cases beyond the corpus; print them shrunk",
                       description=__doc__.split("\n\n", 1)[1].replace("``", ""))
    p.add_argument("--backend", required=True, metavar="NAME")
    p.add_argument("--seconds", type=float, default=60.0, metavar="S",
                   help="stop drawing new cases after S seconds (default 60; shrinking a finding may take as long again)")
    p.add_argument("--seed", type=int, default=0, metavar="K",
                   help="seed of the search (default 0); give each machine of a CI matrix its own")
    p.add_argument("--exact", action="store_true", help="draw exact-mode cases (integer fills, bitwise agreement)")
    p.add_argument("--out", metavar="FILE", help="also write the failing cases there, one JSON line each")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help="import MODULE first (it may register backends); repeatable")


def cmd_fuzz(args) -> int:
    for module in args.imports:
        importlib.import_module(module)
    known = {r.name for r in xconv.list_backends()}
    if args.backend not in known:
        print(f"xconv conformance fuzz: no backend named {args.backend!r} is registered "
              f"(registered: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    ok, reason = availability(args.backend)
    if not ok:
        print(f"xconv conformance fuzz: backend {args.backend!r} is unavailable: {reason}", file=sys.stderr)
        return 2
    if not args.seconds > 0:
        print("xconv conformance fuzz: --seconds must be positive", file=sys.stderr)
        return 2
    from .fuzz import fuzz
    result = fuzz(args.backend, seconds=args.seconds, seed=args.seed, exact=args.exact)
    lines = [f.line() for f in result.findings]
    for line in lines:
        print(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    mode = " (exact mode)" if args.exact else ""
    summary = (f"xconv conformance fuzz: {args.backend}{mode}, seed {args.seed}: {result.examples} cases in "
               f"{result.seconds:.1f} s ({result.refused} refused by name): ")
    if result.findings:
        f = result.findings[0]
        summary += (f"found a failing case, shrunk to {f.case.id} ({f.status}: {f.message.splitlines()[0][:300]}); "
                    f"replay: xconv conformance run --backend {args.backend} --cases-from FILE --out x.xcr")
    else:
        summary += "none failed"
    print(summary, file=sys.stderr)
    return 1 if result.findings else 0
