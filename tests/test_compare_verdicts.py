"""`compare` passes only what it should: records are held to their cases, digests are recomputed from
the stored arrays, a bundle with nothing to compare does not pass, the same bundle twice is a warning,
and bundles of another corpus version are compared on the cases both hold."""

import json

import numpy as np
import pytest

from xconv_conformance import bundle as xbundle
from xconv_conformance import cli
from xconv_conformance import compare as xcompare
from xconv_conformance.runner import digest

CASES = ["--cases", "tiny", "--cases", "dtype/1d-f16-*", "--cases", "dtype/1d-bf16-contig",
         "--cases", "invalid/stride"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("verdicts") / "good.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", path, *CASES, "--no-progress"]) == 0
    return path


def rewrite(src: str, dst, change) -> str:
    """``src`` loaded, its manifest and arrays edited by ``change(manifest, arrays)``, written (re-signed) at ``dst``."""
    b = xbundle.load_bundle(src)
    manifest = json.loads(json.dumps(b.manifest))
    manifest.pop("members")
    arrays = dict(b.arrays)
    change(manifest, arrays)
    xbundle.write_bundle(str(dst), manifest, arrays)
    return str(dst)


def compare(capsys, *paths):
    code = cli.main(["compare", *paths])
    return code, capsys.readouterr().out


def test_the_good_bundle_passes(good, capsys):
    code, out = compare(capsys, good)
    assert code == 0 and "all agree within the error bounds" in out, out


def test_float16_cases_holding_float64_results_fail(good, tmp_path, capsys):
    def widen(m, arrays):
        for rec in m["cases"]:
            if rec["dtype"] != "float16":
                continue
            digests = []
            for name in ("grad_input", "grad_weight", "grad_bias"):
                entry = rec["outputs"].get(name)
                if entry is None:
                    digests.append(None)
                    continue
                wide = arrays[entry["key"]].astype(np.float64)
                arrays[entry["key"]] = wide
                entry["dtype"] = "float64"
                digests.append(digest(wide))
            rec["dtype"], rec["digests"] = "float64", digests
    path = rewrite(good, tmp_path / "wide.xcr", widen)
    code, out = compare(capsys, path)
    assert code == 1, out
    assert "records dtype float64, the case is float16" in out
    assert "stores grad_input as float64, the case is float16" in out


def test_results_of_the_wrong_shape_or_outside_the_mask_fail(good, tmp_path):
    def damage(m, arrays):
        rec = next(r for r in m["cases"] if r["id"] == "tiny/1d-f32")
        key = rec["outputs"]["grad_weight"]["key"]
        arrays[key] = np.concatenate([arrays[key].ravel()] * 2)
        rec["outputs"]["grad_weight"]["shape"] = list(arrays[key].shape)
        rec["digests"][1] = digest(arrays[key])
    b = xbundle.load_bundle(rewrite(good, tmp_path / "shape.xcr", damage))
    row = next(r for r in xcompare.compare_bundles([b]).rows if r.case_id == "tiny/1d-f32")
    assert any("stores grad_weight with shape" in p for p in row.problems), row.problems


def test_digests_that_disagree_with_the_stored_arrays_fail(good, tmp_path, capsys):
    def tamper(m, arrays):
        rec = next(r for r in m["cases"] if r["id"] == "tiny/2d-f32")
        key = rec["outputs"]["grad_input"]["key"]
        a = arrays[key].copy()
        a.flat[0] = np.nextafter(a.flat[0], np.inf)           # one ulp: still within the bound
        arrays[key] = a
    path = rewrite(good, tmp_path / "tampered.xcr", tamper)
    code, out = compare(capsys, path)
    assert code == 1, out
    assert "grad_input: recorded digest" in out and "but the stored array gives" in out


def test_a_refusal_without_reason_fails(good, tmp_path):
    def refuse(m, arrays):
        rec = next(r for r in m["cases"] if r["id"] == "tiny/1d-f32")
        for entry in rec["outputs"].values():
            arrays.pop(entry["key"])
        rec.update(status="refused", message="", outputs={}, digests=None)
    b = xbundle.load_bundle(rewrite(good, tmp_path / "refused.xcr", refuse))
    row = next(r for r in xcompare.compare_bundles([b]).rows if r.case_id == "tiny/1d-f32")
    assert "[A] records a refusal without a reason" in row.problems


def _empty(m, arrays):
    m["cases"] = []
    m["corpus"]["case_ids"] = []
    arrays.clear()


def _unknown(m, arrays):
    for rec in m["cases"]:
        rec["id"] = "elsewhere/" + rec["id"]
    m["corpus"]["case_ids"] = [rec["id"] for rec in m["cases"]]


def _all_refused(m, arrays):
    arrays.clear()
    for rec in m["cases"]:
        rec.update(status="refused", message="UnsupportedError: not here", outputs={}, digests=None)


def _all_unavailable(m, arrays):
    arrays.clear()
    for rec in m["cases"]:
        rec.update(status="unavailable", message="no device", outputs={}, digests=None)


@pytest.mark.parametrize("change, line", [
    (_empty, "holds no case"), (_unknown, "is in this kit's corpus"),
    (_all_refused, "every case of [A]"), (_all_unavailable, "every case of [A]")])
def test_a_bundle_with_nothing_to_compare_does_not_pass(good, tmp_path, capsys, change, line):
    path = rewrite(good, tmp_path / "nothing.xcr", change)
    code, out = compare(capsys, path)
    last = out.strip().splitlines()[-1]
    assert code == 1, out
    assert "nothing compared" in last and line in last, last
    assert "all agree" not in out


def test_the_same_bundle_twice_is_a_warning(good, tmp_path, capsys):
    code, out = compare(capsys, good, good)
    assert code == 0 and "warning: [A] and [B] are the same bundle" in out, out
    copy = tmp_path / "copy.xcr"
    copy.write_bytes(open(good, "rb").read())
    code, out = compare(capsys, good, str(copy))
    assert "warning: [A] and [B] are the same bundle" in out, out


def test_a_bundle_of_another_corpus_version_is_compared_on_the_cases_both_hold(good, tmp_path, capsys):
    def older(m, arrays):
        m["corpus"]["full_hash"] = m["corpus"]["hash"] = "0" * 64
        m["cases"][0]["spec_digest"] = "1" * 64                  # that case changed between the versions
        m["cases"][1]["id"] = "retired/case"                     # and this one is gone
        m["corpus"]["case_ids"][1] = "retired/case"
    path = rewrite(good, tmp_path / "older.xcr", older)
    code, out = compare(capsys, good, path)
    assert code == 0, out
    assert "not compared: 2 case(s) of [B]:" in out and "retired/case (not in this kit's corpus)" in out
    assert "(another version of this case)" in out
    # within one corpus version a changed spec is still a disagreement
    def changed(m, arrays):
        m["cases"][0]["spec_digest"] = "1" * 64
    code, out = compare(capsys, rewrite(good, tmp_path / "changed.xcr", changed))
    assert code == 1 and "was run on a different spec of this case" in out, out
