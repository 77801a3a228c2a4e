"""Merging the shard bundles of one backend (``xconv conformance run --shard K/N``) into one run.

``compare`` calls :func:`merge_shards` on the bundles it is given: the bundles that record a shard
(``manifest["shard"]``: index K, count N, and the hash of the selection they were cut from) and
share a backend and a selection become one :class:`~.bundle.Bundle`, their case records
interleaved back into the selection's order (shard K holds positions K-1, K-1+N, ...), so a merged
run compares exactly like the unsharded run would. Bundles without a shard record pass unchanged.

- Overlaps are refused (:class:`~.bundle.BundleError`, exit 2): the same shard twice, or a case
  recorded by two bundles of one selection, or shards of different counts N.
- Gaps are reported: the shards missing from 1..N and how many cases they held; ``compare`` then
  exits 1 (the run is incomplete) after comparing what is there.
"""

from __future__ import annotations

import dataclasses

from .bundle import Bundle, BundleError


@dataclasses.dataclass
class Merged:
    bundles: list            # what compare compares: merged runs and the bundles without a shard record
    notes: list              # one line per merged run: which shards, how many cases
    gaps: list               # one line per merged run with missing shards


def _shard_of(b: Bundle):
    s = b.manifest.get("shard")
    if s is None:
        return None
    ok = (isinstance(s, dict) and all(isinstance(s.get(k), int) and not isinstance(s.get(k), bool)
                                      for k in ("index", "count", "selection_count"))
          and isinstance(s.get("selection_hash"), str) and 1 <= s["index"] <= s["count"] <= 100_000)
    if not ok:
        raise BundleError(f"{b.path}: its shard record is malformed: {str(s)[:200]}")
    return s


def merge_shards(bundles: list[Bundle]) -> Merged:
    out, notes, gaps = [], [], []
    groups: dict = {}
    for b in bundles:
        s = _shard_of(b)
        if s is None:
            out.append(b)
            continue
        key = (b.backend, s["selection_hash"])
        if key not in groups:
            groups[key] = []
            out.append(key)                      # the merged run takes the place of its first shard
        groups[key].append((s, b))
    for i, item in enumerate(out):
        if isinstance(item, tuple):
            merged, note, gap = _merge(groups[item])
            out[i] = merged
            notes.append(note)
            if gap:
                gaps.append(gap)
    return Merged(out, notes, gaps)


def _merge(shards: list) -> tuple[Bundle, str, str]:
    counts = {s["count"] for s, _ in shards}
    first_s, first = shards[0]
    if len(counts) > 1:
        raise BundleError(f"shards of {first.backend} were cut into different counts {sorted(counts)}: "
                          + ", ".join(b.path for _, b in shards))
    n = counts.pop()
    by_index: dict = {}
    for s, b in shards:
        if s["index"] in by_index:
            raise BundleError(f"overlapping shards: {by_index[s['index']].path} and {b.path} are both shard "
                              f"{s['index']}/{n} of {b.backend}")
        by_index[s["index"]] = b
    seen: dict = {}
    for k, b in by_index.items():
        for rec in b.manifest["cases"]:
            if rec["id"] in seen:
                raise BundleError(f"overlapping shards: case {rec['id']} is in {seen[rec['id']]} and {b.path}")
            seen[rec["id"]] = b.path
    # interleave back: selection position p is shard (p % n) + 1, its (p // n)-th record
    records, arrays, ids = [], {}, []
    total = first_s["selection_count"]
    for p in range(total):
        b = by_index.get(p % n + 1)
        if b is None:
            continue
        cases = b.manifest["cases"]
        if p // n >= len(cases):
            raise BundleError(f"{b.path}: shard {p % n + 1}/{n} holds {len(cases)} cases, fewer than its "
                              f"selection of {total} puts in it")
        rec = dict(cases[p // n])
        outputs = {}
        for name, entry in (rec.get("outputs") or {}).items():
            key = f"{len(records):05d}.{name}"
            arrays[key] = b.arrays[entry["key"]]
            outputs[name] = dict(entry, key=key)
        rec["outputs"] = outputs
        records.append(rec)
        ids.append(rec["id"])
    held = sum(len(b.manifest["cases"]) for b in by_index.values())
    if held != len(records):
        raise BundleError(f"shards of {first.backend} hold {held} cases but their selection places {len(records)}")
    manifest = dict(first.manifest, cases=records)
    manifest["corpus"] = dict(first.manifest["corpus"], case_ids=ids, count=len(ids))
    manifest.pop("shard", None)
    missing = [k for k in range(1, n + 1) if k not in by_index]
    paths = " + ".join(by_index[k].path for k in sorted(by_index))
    label = f"{first.backend} merged from shards {sorted(by_index)} of {n}"
    note = f"{label}: {len(records)} of {total} cases ({paths})"
    gap = ""
    if missing:
        absent = sum(len(range(k - 1, total, n)) for k in missing)
        gap = (f"gap: {first.backend} lacks shard(s) {', '.join(f'{k}/{n}' for k in missing)}: {absent} of "
               f"{total} cases not run")
    return Bundle(manifest, arrays, f"[{label}]"), note, gap
