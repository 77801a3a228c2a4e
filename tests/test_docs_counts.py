"""Counts stated in the documents agree with the code: the corpus size, its group table, its valid and invalid
cases, and the examples' case counts (docs/conformance.md, docs/cudnn-backend.md). The cuDNN graph counts
are checked where they are computed (tests/test_cudnn_real_frontend.py)."""

import re
from pathlib import Path

from xconv_conformance.cases import load_corpus, select

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _corpus():
    cases = load_corpus()
    return cases, [c for c in cases if c.kind == "valid"], [c for c in cases if c.kind == "invalid"]


def test_conformance_doc_states_the_corpus_size():
    text = (DOCS / "conformance.md").read_text()
    cases, valid, invalid = _corpus()
    m = re.search(r"(\d+) cases \((\d+) valid, (\d+) invalid-argument", text)
    assert m, "the corpus size sentence is gone"
    assert tuple(map(int, m.groups())) == (len(cases), len(valid), len(invalid))
    m = re.search(r"\| `invalid` \| (\d+) invalid arguments", text)
    assert m and int(m.group(1)) == len(invalid)


def test_conformance_doc_group_table_lists_every_group():
    text = (DOCS / "conformance.md").read_text()
    section = text[text.index("| group | what it covers |"):]
    section = section[:section.index("\n\n")]
    documented = set()
    for line in section.splitlines()[2:]:
        documented |= set(re.findall(r"`([a-z0-9_-]+)`", line.split("|")[1]))
    assert documented == {c.group for c in load_corpus()}


def test_conformance_doc_examples_count_what_the_commands_count():
    text = (DOCS / "conformance.md").read_text()
    cases = load_corpus()
    tiny = select(cases, ["tiny"])
    assert f"xconv conformance: {len(tiny)} cases (corpus " in text            # the `check --cases tiny` example
    for backend in ("numpy", "torch-cpu"):
        assert re.search(rf"^{re.escape(backend)} +{len(tiny)} +0 +0 +0 +0 +0 ", text, flags=re.M), backend
    assert (f"\"{len(tiny)} case(s) compared in all 2 bundles, {len(cases) - len(tiny)} more present in only "
            "some of them") in " ".join(text.split())


def test_cudnn_doc_counts_the_valid_corpus_cases():
    text = " ".join((DOCS / "cudnn-backend.md").read_text().replace("> ", " ").split())
    valid = [c for c in _corpus()[1] if c.deterministic != "batch_invariant"]
    m = re.search(r"\((\d+) cases: the backward with its mask and the forward with a bias; ([\d,]+) graphs, "
                  r"([\d,]+) distinct", text)
    assert m and int(m.group(1)) == len(valid), m and m.groups()
