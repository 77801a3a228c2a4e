"""Holding bundles from different machines against the reference and against each other.

For each case in the bundles, the reference and the bound are recomputed here (from the case
id: the inputs are rebuilt bit for bit, which the recorded input digest confirms). Each
bundle's results are judged against the reference (|got - exact| <= bound), and each pair of
bundles against each other: |a - b| <= bound_a + bound_b, the sum of the two bounds being what
the triangle inequality allows two correct results to differ by.

A disagreement is: a result outside its bound, a pair outside the pairwise bound, a case that
failed, crashed or timed out on its own machine, or a bundle whose inputs (or case spec) differ from this corpus.
Refused and unavailable cases are listed, not counted as disagreements.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np

from . import env, exact, report, tolerance, verify
from .bundle import Bundle
from .cases import corpus_hash, load_corpus
from .manifest_schema import printable
from .runner import _log_ratio_sample, reference_of
from .summary import with_floor
from .status import ABSENT, DIED, LABELS, REFUSED, STATUSES, UNAVAILABLE

OUTPUTS = tolerance.OUTPUTS
SKIPPED_SHOWN = 20                 # cases not compared listed by id on the terminal (all with --all)
_COUNTED = (*STATUSES, ABSENT)


@dataclasses.dataclass
class CaseRow:
    case_id: str
    group: str
    dtype: str
    statuses: list                     # per bundle: status or "absent"
    ratios: list                       # per bundle: worst error/bound against the reference (None: no results)
    pairwise: dict                     # (i, j) -> worst |a-b| / (bound_a + bound_b)
    problems: list
    samples: list                      # per bundle: {output: log10 ratios}
    messages: list
    ran: list = dataclasses.field(default_factory=list)   # per bundle: what its call ran (its trace record)
    per_output: list = dataclasses.field(default_factory=list)  # per bundle: {output: worst error/bound}
    floor: float | None = None         # the worst rounding floor over the case's outputs (tolerance.rounding_floor)

    @property
    def disagrees(self) -> bool:
        return bool(self.problems)


@dataclasses.dataclass
class Comparison:
    bundles: list
    rows: list
    notes: list
    warnings: list = dataclasses.field(default_factory=list)
    skipped: dict = dataclasses.field(default_factory=dict)   # bundle index -> [(case id, why not compared)]

    @property
    def disagreements(self) -> list:
        return [r for r in self.rows if r.disagrees]

    @property
    def nothing_compared(self) -> str | None:
        """One line when some bundle gave nothing to judge (no case, only unknown ids, only refused or
        unavailable cases), else None. Such a comparison does not pass."""
        for i, b in enumerate(self.bundles):
            held = len(b.manifest["cases"])
            where = f"[{_letter(i)}] {b.path}"
            if not held:
                return f"nothing compared: {where} holds no case"
            mine = [row.statuses[i] for row in self.rows if row.statuses[i] != ABSENT]
            if not mine:
                return (f"nothing compared: none of the {held} case(s) of {where} is in this kit's corpus "
                        f"(or in its version of them)")
            if all(s in (REFUSED, UNAVAILABLE) for s in mine):
                return (f"nothing compared: every case of {where} is refused or unavailable "
                        f"({mine.count(REFUSED)} refused, {mine.count(UNAVAILABLE)} unavailable)")
        return None

    @property
    def passes(self) -> bool:
        return not self.disagreements and self.nothing_compared is None


def _same_bundle(a: Bundle, b: Bundle) -> bool:
    try:
        if a.path and b.path and os.path.samefile(a.path, b.path):
            return True
    except OSError:
        pass
    return json.dumps(a.manifest, sort_keys=True) == json.dumps(b.manifest, sort_keys=True)


def compare_bundles(bundles: list[Bundle], corpus=None) -> Comparison:
    """Each case of the bundles that this kit's corpus holds (in the same version) judged against the
    reference and pairwise. Cases of another corpus version, or unknown here, are listed in
    ``skipped``, not compared; within one corpus version a changed spec is a disagreement."""
    corpus = list(corpus if corpus is not None else load_corpus())
    ours = corpus_hash(corpus)
    corpus = {c.id: c for c in corpus}
    notes, warnings, skipped = [], [], {}
    hashes = {b.manifest["corpus"].get("full_hash", b.manifest["corpus"]["hash"]) for b in bundles}
    if len(hashes) > 1 or hashes != {ours}:
        notes.append("the bundles were made from other corpus versions than this kit's "
                     f"({ours[:12]}); cases both hold are compared, the others are listed")
    if len({tuple(b.manifest["corpus"]["case_ids"]) for b in bundles}) > 1:
        notes.append("the bundles hold different selections of cases; a case absent from a bundle is not compared")
    for i, j in itertools.combinations(range(len(bundles)), 2):
        if _same_bundle(bundles[i], bundles[j]):
            warnings.append(f"[{_letter(i)}] and [{_letter(j)}] are the same bundle: a bundle always agrees with "
                            "itself, so their pairwise agreement says nothing")
    records = []
    for i, b in enumerate(bundles):
        same_version = b.manifest["corpus"].get("full_hash", b.manifest["corpus"]["hash"]) == ours
        kept = {}
        for cid, rec in b.records().items():
            case = corpus.get(cid)
            if case is None:
                skipped.setdefault(i, []).append((cid, "not in this kit's corpus"))
            elif rec["spec_digest"] != case.digest and not same_version:
                skipped.setdefault(i, []).append((cid, "another version of this case"))
            else:
                kept[cid] = rec
        records.append(kept)
    order = []
    for recs in records:
        for cid in recs:
            if cid not in order:
                order.append(cid)
    rows = [_compare_case(corpus[cid], bundles, records) for cid in order]
    return Comparison(bundles, rows, notes, warnings, skipped)


def _compare_case(case, bundles, records) -> CaseRow:
    n = len(bundles)
    statuses, ratios, samples, messages, problems, per_output = [], [], [], [], [], []
    results: list = [None] * n
    ref = reference_of(case) if case.kind == "valid" else None
    ran = [report.ran((recs.get(case.id) or {}).get("record")) for recs in records]
    for i, (b, recs) in enumerate(zip(bundles, records)):
        rec = recs.get(case.id)
        samples.append({})
        per_output.append({})
        if rec is None:
            statuses.append("absent"), ratios.append(None), messages.append("")
            continue
        statuses.append(rec["status"])
        messages.append(printable(rec.get("message", "")))       # it may hold terminal escapes
        tag = f"[{_letter(i)}]"
        if rec["spec_digest"] != case.digest:
            problems.append(f"{tag} was run on a different spec of this case")
            ratios.append(None)
            continue
        problems += [f"{tag} {p}" for p in verify.record_problems(case, b, rec)]
        if rec["status"] == "failed":
            problems.append(f"{tag} failed on its machine: {messages[-1][:300]}")
        elif rec["status"] in DIED:
            how = f"crashed ({rec.get('signal') or 'exit'})" if rec["status"] == "crashed" else "timed out"
            problems.append(f"{tag} {how} on its machine: {messages[-1][:300]}")
        if case.kind != "valid":
            ratios.append(None)
            continue
        if rec["input_digest"] != ref.input_digest:
            problems.append(f"{tag} built different inputs (input digest {rec['input_digest'][:12]} vs "
                            f"{ref.input_digest[:12]} here): its results are not comparable")
            ratios.append(None)
            continue
        outs = {name: b.output(rec, name) for name in OUTPUTS}
        if not any(o is not None for o in outs.values()):
            ratios.append(None)
            continue
        worst = 0.0
        for k, name in enumerate(OUTPUTS):
            got = outs[name]
            if got is None:
                continue
            if got.shape != ref.exact[k].shape:
                continue                          # verify.record_problems named it
            ratio = tolerance.error_ratio(got, ref.exact[k], ref.bounds[k])
            w, idx = tolerance.worst(ratio)
            samples[i][name] = _log_ratio_sample(ratio)
            per_output[i][name] = w
            if not w <= 1.0:
                problems.append(f"{tag} {name} is outside the bound: worst {w:.3g} x bound at {idx}")
            elif case.fill == "exact":
                problems += [f"{tag} {p}" for p in exact.problems(name, got, ref.exact[k])]
            worst = max(worst, w)
        results[i] = outs
        ratios.append(worst)
    pairwise = {}
    if case.kind == "valid":
        for i, j in itertools.combinations(range(n), 2):
            if results[i] is None or results[j] is None:
                continue
            worst = None
            for k, name in enumerate(OUTPUTS):
                a, b = results[i][name], results[j][name]
                if a is None or b is None or a.shape != b.shape or a.shape != ref.exact[k].shape:
                    continue
                with np.errstate(invalid="ignore", over="ignore"):
                    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)) / (2.0 * ref.bounds[k])
                diff = np.where(np.isfinite(a.astype(np.float64)) & np.isfinite(b.astype(np.float64)), diff, np.inf)
                w, idx = tolerance.worst(diff)
                worst = w if worst is None else max(worst, w)
                if not w <= 1.0:
                    problems.append(f"[{_letter(i)}] and [{_letter(j)}] disagree on {name}: worst {w:.3g} x "
                                    f"(bound_a + bound_b) at {idx}")
                elif case.fill == "exact" and (differ := exact.pair_problems(name, a, b)):
                    problems.append(f"[{_letter(i)}] and [{_letter(j)}] differ on {name} in exact mode: {differ} "
                                    "element(s)")
            pairwise[(i, j)] = worst
    floor = max((f for f, bit in zip(ref.floors, case.mask) if bit), default=None) if ref is not None else None
    return CaseRow(case.id, case.group, case.dtype, statuses, ratios, pairwise, problems, samples, messages, ran,
                   per_output, floor)


def emulated(b: Bundle) -> str:
    """What bundle ``b``'s results ran on when its manifest records an emulator or fake, else ""."""
    backend = b.manifest["backend"]
    if not backend.get("emulated"):
        return ""
    return backend.get("emulation") or "an emulator"


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"#{i + 1}"


def _fmt(r) -> str:
    if r is None:
        return "-"
    return "inf" if r == float("inf") else f"{r:.3g}"


def format_comparison(cmp: Comparison, show_all: bool = False) -> str:
    """The comparison as text tables."""
    bundles = cmp.bundles
    lines = ["Bundles:"]
    for i, b in enumerate(bundles):
        m = b.manifest
        lines.append(f"  [{_letter(i)}] {b.path}: backend {m['backend']['name']} "
                     f"({m['backend'].get('version', '')}) on {m['device']}; xconv {m['xconv_version']}; "
                     f"{m['platform'].get('platform', '')}; {m['created']}; {len(m['cases'])} cases, corpus "
                     f"{m['corpus']['hash'][:12]}")
        if emulated(b):
            lines.append(f"      {env.emulated_words(emulated(b))}")
        if m.get("interrupted"):
            lines.append(f"      PARTIAL: its run was interrupted after {m['interrupted']['after']} of "
                         f"{m['interrupted']['of']} cases")
    for note in cmp.notes:
        lines.append(f"  note: {note}")
    for warning in cmp.warnings:
        lines.append(f"  warning: {warning}")
    for i, items in sorted(cmp.skipped.items()):
        shown = items if show_all else items[:SKIPPED_SHOWN]
        more = f" ... and {len(items) - len(shown)} more (--all lists them)" if len(shown) < len(items) else ""
        lines.append(f"  not compared: {len(items)} case(s) of [{_letter(i)}]: "
                     + ", ".join(f"{cid} ({why})" for cid, why in shown) + more)
    lines.append("")
    lines.append("Against the reference (float64 oracle recomputed here): results per bundle")
    header = ["bundle", *(LABELS[s] for s in _COUNTED), "outside bound", "worst error/bound (rounding floor)"]
    table = [header]
    for i in range(len(bundles)):
        counts = {s: 0 for s in _COUNTED}
        outside, worst, floor = 0, None, None
        for row in cmp.rows:
            counts[row.statuses[i]] = counts.get(row.statuses[i], 0) + 1
            r = row.ratios[i]
            if r is not None:
                if worst is None or r > worst:
                    worst, floor = r, row.floor
                outside += not r <= 1.0
        table.append([f"[{_letter(i)}] {bundles[i].backend}", *(str(counts[s]) for s in _COUNTED),
                      str(outside), with_floor(worst, floor)])
    lines += _table(table)
    if len(bundles) > 1:
        lines.append("")
        lines.append("Pairwise: worst |a - b| / (bound_a + bound_b) over the cases both computed (cases outside)")
        table = [[""] + [f"[{_letter(j)}]" for j in range(len(bundles))]]
        for i in range(len(bundles)):
            cells = [f"[{_letter(i)}]"]
            for j in range(len(bundles)):
                if i == j:
                    cells.append("-")
                    continue
                key = (min(i, j), max(i, j))
                vals = [row.pairwise[key] for row in cmp.rows if row.pairwise.get(key) is not None]
                bad = sum(not v <= 1.0 for v in vals)
                cells.append(f"{_fmt(max(vals)) if vals else '-'} ({bad} of {len(vals)})")
            table.append(cells)
        lines += _table(table)
    shown = cmp.rows if show_all else cmp.disagreements
    lines.append("")
    if shown:
        lines.append("Cases" + (":" if show_all else " that disagree:"))
        table = [["case", *(f"[{_letter(i)}]" for i in range(len(bundles))), "problem"]]
        for row in shown:
            cells = [row.case_id]
            for i in range(len(bundles)):
                st = row.statuses[i]
                cells.append(st if row.ratios[i] is None else f"{st} {_fmt(row.ratios[i])}")
            ran = "; ".join(f"[{_letter(i)}] {r}" for i, r in enumerate(row.ran) if r)
            cells.append(("; ".join(row.problems)[:400] or "") + (f" (ran: {ran})" if ran else ""))
            table.append(cells)
        lines += _table(table)
    refused = [(row.case_id, _letter(i), row.messages[i]) for row in cmp.rows for i, s in enumerate(row.statuses)
               if s == "refused"]
    if refused and not show_all:
        lines.append(f"{len(refused)} refused result(s) (not disagreements), e.g. {refused[0][0]} [{refused[0][1]}]: "
                     f"{refused[0][2][:200]}")
    lines.append("")
    n_bad = len(cmp.disagreements)
    empty = cmp.nothing_compared
    fakes = [f"[{_letter(i)}]" for i, b in enumerate(bundles) if emulated(b)]
    lines.append(count_line(cmp) + ": " + (f"{n_bad} disagreement(s)" if n_bad else empty if empty
                                           else "all agree within the error bounds")
                 + (f" ({', '.join(fakes)} emulated, not vendor hardware)" if fakes else ""))
    return "\n".join(lines)


def count_line(cmp: Comparison) -> str:
    """How many cases were compared in every bundle, and how many only in some (absent from the others)."""
    n = len(cmp.bundles)
    everywhere = sum("absent" not in row.statuses for row in cmp.rows)
    some = len(cmp.rows) - everywhere
    text = (f"{everywhere} case(s) compared in all {n} bundles" if n > 1
            else f"{everywhere} case(s) checked in the bundle")
    if some:
        text += f", {some} more present in only some of them (compared where present)"
    return text


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows if c < len(r)) for c in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip() for r in rows]


def report_runs(cmp: Comparison) -> list[dict]:
    """The comparison as report runs (one per bundle), for :func:`report.html_report`."""
    runs = []
    for i, b in enumerate(cmp.bundles):
        m = b.manifest
        rows = [{"id": row.case_id, "group": row.group, "dtype": row.dtype,
                 "status": "failed" if row.statuses[i] not in DIED and any(
                     p.startswith(f"[{_letter(i)}] ") and not p.startswith(f"[{_letter(i)}] and")
                     for p in row.problems) else row.statuses[i],
                 "ratio": row.ratios[i], "message": row.messages[i], "samples": row.samples[i],
                 "ratios": row.per_output[i] if row.per_output else {}, "floor": row.floor,
                 "ran": row.ran[i] if row.ran else ""}
                for row in cmp.rows if row.statuses[i] != "absent"]
        runs.append({"label": f"[{_letter(i)}] {b.backend}", "detail": f"{m['backend'].get('version', '')} on "
                     f"{m['device']}; {m['created']}", "rows": rows, "emulation": emulated(b)})
    return runs
