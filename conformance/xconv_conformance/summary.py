"""The terminal summary of a run: one table row per backend that ran, one line for those that could not.

- Backends whose every case is unavailable are folded into one line (their reasons: ``--verbose``,
  or ``xconv backends``).
- Beside each worst error/bound stands its rounding floor (:func:`.tolerance.rounding_floor`: the
  ratio of the exactly rounded result): for float16/bfloat16 the final rounding alone comes close
  to 1, and a worst ratio within that floor reads "at the rounding limit", not "borderline".
"""

from __future__ import annotations

from collections import Counter

from . import report, status
from .isolation import stderr_excerpt
from .tolerance import at_rounding_limit

DTYPE_ORDER = ("float16", "bfloat16", "float32", "float64")


def fmt(r) -> str:
    if r is None:
        return "-"
    return "inf" if r == float("inf") else f"{r:.3g}"


def with_floor(ratio, floor) -> str:
    """"0.997 (at the rounding limit)", "0.31 (floor 0.0012)" or "0.31"."""
    if ratio is None:
        return "-"
    if at_rounding_limit(ratio, floor):
        return f"{fmt(ratio)} (at the rounding limit)"
    return f"{fmt(ratio)} (floor {fmt(floor)})" if floor else fmt(ratio)


def unavailable_backends(results: dict) -> list[str]:
    """The backends whose every case is unavailable."""
    return [name for name, pairs in results.items()
            if pairs and all(o.status == status.UNAVAILABLE for _, o in pairs)]


def rows(cases, outcomes) -> list[dict]:
    """Report rows (:func:`.report.html_report`) of ``cases`` and their ``outcomes``."""
    return [{"id": c.id, "group": c.group, "dtype": c.dtype, "status": o.status, "ratio": o.ratio,
             "ratios": o.ratios, "message": o.message, "samples": o.ratio_samples, "stderr": o.stderr,
             "ran": report.ran(o.record), "floor": o.floor}
            for c, o in zip(cases, outcomes)]


def summary_table(results: dict, seconds: dict) -> str:
    """``results``: {backend: [(case, outcome)]} -> the summary: a table of the backends that ran, one line
    folding those that could not, and each backend's worst error/bound per dtype beside its rounding floor."""
    gone = unavailable_backends(results)
    table = [["backend", *(status.LABELS[s] for s in status.STATUSES), "worst error/bound", "worst case", "time"]]
    per_dtype = []
    for name, pairs in results.items():
        if name in gone:
            continue
        counts = Counter(o.status for _, o in pairs)
        judged = [(o.ratio, c.id, o.floor) for c, o in pairs if o.ratio is not None]
        worst = max(judged) if judged else (None, "", None)
        table.append([name, *(str(counts.get(s, 0)) for s in status.STATUSES),
                      with_floor(worst[0], worst[2]), worst[1], f"{seconds.get(name, 0.0):.1f}s"])
        by_dtype = {}
        for c, o in pairs:
            if o.ratio is not None and (c.dtype not in by_dtype or o.ratio > by_dtype[c.dtype][0]):
                by_dtype[c.dtype] = (o.ratio, o.floor)
        if by_dtype:
            per_dtype.append(f"  {name}: " + "; ".join(f"{d} {with_floor(*by_dtype[d])}" for d in DTYPE_ORDER
                                                        if d in by_dtype))
    lines = []
    if len(table) > 1:
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    if gone:
        n = len(results[gone[0]])
        lines.append(f"unavailable here ({len(gone)} backend(s), {n} case(s) each not run): {', '.join(gone)} "
                     "(--verbose or `xconv backends` says why)")
    if per_dtype:
        lines.append("worst error/bound per dtype (floor: what the exactly rounded result scores; at or below it "
                     "the error is the final rounding alone):")
        lines += per_dtype
    return "\n".join(lines)


def details(results: dict, verbose: bool, named=()) -> str:
    """Failures, crashes, time-outs and refusal reasons (all of them with ``verbose``), and why a backend is
    unavailable when it was ``named`` (--backend) or with ``verbose``."""
    lines = []
    for name, pairs in results.items():
        unavailable = [o.message for _, o in pairs if o.status == status.UNAVAILABLE]
        if unavailable and len(unavailable) == len(pairs):
            if verbose or name in named:
                lines.append(f"{name}: unavailable: {unavailable[0]}")
            continue
        for c, o in pairs:
            if o.status in status.DIED:
                lines.append(f"{o.status.upper().replace('_', ' ')} {c.id} on {name}: "
                             f"{o.message.splitlines()[0] if o.message else ''}"[:600])
                if verbose and o.stderr.strip():
                    lines += ["    | " + line[:300] for line in stderr_excerpt(o.stderr)]
        failed = [(c, o) for c, o in pairs if o.status == status.FAILED]
        for c, o in failed[: None if verbose else 20]:
            lines.append(f"FAILED {c.id} on {name}: {o.message.splitlines()[0] if o.message else ''}"[:600])
        if len(failed) > 20 and not verbose:
            lines.append(f"... and {len(failed) - 20} more failures on {name} (--verbose lists them all)")
        reasons = Counter(o.message.split(":")[0][:160] if o.message else ""
                          for _, o in pairs if o.status == status.REFUSED)
        for reason, n in reasons.most_common(5 if not verbose else None):
            lines.append(f"refused {n} case(s) on {name}: {reason}")
    return "\n".join(lines)
