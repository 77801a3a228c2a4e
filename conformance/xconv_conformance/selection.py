"""Which cases a ``check`` or ``run`` runs: the corpus (``--cases``), found cases (``--cases-from``),
exact mode (``--exact``), and one shard of them (``--shard K/N``).

- ``--cases-from FILE``: the cases of a JSON-lines file in the format of ``xconv conformance cases
  --json`` (what ``xconv conformance fuzz --out`` writes), or of a bundle (``.xcr``: its case ids,
  looked up in this corpus). ``--cases`` patterns then select among them.
- ``--exact``: only exact-mode cases (the corpus group ``exact/``, or the exact cases of the file).
- ``--shard K/N``: the K-th of N interleaved slices (cases K-1, K-1+N, K-1+2N, ... of the selection),
  so that every group is spread over all shards. The bundle records the shard and the selection
  it was cut from, and ``compare`` merges the shard bundles of one backend (:mod:`.merge`).
"""

from __future__ import annotations

import argparse
import hashlib
import json

from .cases import CorpusError, case_from_spec, corpus_hash, load_corpus, select


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases-from", metavar="FILE",
                   help="run the cases of FILE (JSON lines from `xconv conformance fuzz --out` or `cases --json`, "
                        "or a bundle's case ids) instead of the corpus")
    p.add_argument("--exact", action="store_true",
                   help="only exact-mode cases (integer fills, bitwise agreement with the reference)")
    p.add_argument("--shard", type=shard_arg, metavar="K/N", help="run only the K-th of N interleaved shards")


def shard_arg(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N such as 2/4, got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"expected 1 <= K <= N in K/N, got {text!r}")
    return k, n


def read_cases(path: str) -> list:
    """The cases of a JSON-lines file of case specs, or of a bundle's case ids (looked up in the corpus)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        from .bundle import load_bundle
        ids = load_bundle(path).manifest["corpus"]["case_ids"]
        corpus = {c.id: c for c in load_corpus()}
        missing = [i for i in ids if i not in corpus]
        if missing:
            raise CorpusError(f"{path}: {len(missing)} case(s) of this bundle are not in this corpus: {missing[:5]}")
        return [corpus[i] for i in ids]
    cases = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                spec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{number}: not JSON ({exc})") from None
            cases.append(case_from_spec(spec))
    if not cases:
        raise CorpusError(f"{path}: holds no case")
    return cases


def choose(args) -> list:
    """The cases of a check or run (before sharding): the corpus or --cases-from, --cases, --exact."""
    cases = read_cases(args.cases_from) if getattr(args, "cases_from", None) else list(load_corpus())
    cases = select(cases, args.cases)
    if getattr(args, "exact", False):
        cases = [c for c in cases if c.fill == "exact"]
    return cases


def shard(cases: list, k: int, n: int) -> list:
    """The K-th (1-based) of N interleaved shards of ``cases``."""
    return cases[k - 1::n]


def shard_record(cases: list, k: int, n: int) -> dict:
    """What a shard bundle records about where it was cut from (read by :mod:`.merge`)."""
    return {"index": k, "count": n, "selection_hash": corpus_hash(cases), "selection_count": len(cases),
            "selection_ids_sha256": hashlib.sha256("\n".join(c.id for c in cases).encode()).hexdigest()}
