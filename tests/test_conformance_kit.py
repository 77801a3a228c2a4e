"""Tests of the conformance kit itself (conformance/xconv_conformance): corpus, bound, checks, bundles, compare, CLI.

The corpus itself runs with ``pytest conformance --xconv-backend numpy``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import xconv
from xconv.dtypes import DTYPES, UNIT_ROUNDOFF
from core_helpers import register  # noqa: E402,F401  (a fixture)

xcc = pytest.importorskip("xconv_conformance")
from xconv_conformance import bundle as xbundle  # noqa: E402
from xconv_conformance import cli, runner, tolerance  # noqa: E402
from xconv_conformance.cases import corpus_hash, load_corpus, make_inputs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {c.id: c for c in load_corpus()}


# ---------------------------------------------------------------------------------------------
# Test backends: the NumPy backend behind a wrapper that can tamper with its results


class Wrapped(xconv.Backend):
    """The "numpy" backend's results, optionally altered by ``tamper(outputs, params, mask)``."""

    array_families = ("numpy",)

    def __init__(self, name, tamper=None, capabilities=None, available=(True, ""), transform_inputs=None):
        self.name = name
        self.inner = xconv.get_backend("numpy")
        self.capabilities = capabilities or self.inner.capabilities
        self.tamper = tamper
        self.available = available
        self.transform_inputs = transform_inputs or (lambda *a: a)

    def availability(self):
        return self.available

    def fprop(self, x, w, bias, p):
        x, w = self.transform_inputs(x, w)
        return self.inner.fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        dy, w = self.transform_inputs(dy, w)
        return self.inner.dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        x, dy = self.transform_inputs(x, dy)
        return self.inner.wgrad(x, dy, p)

    def bgrad(self, dy, p):
        return self.inner.bgrad(dy, p)

    def backward(self, dy, x, w, p, mask):
        dy2, w2 = self.transform_inputs(dy, w)
        x2, _ = self.transform_inputs(x, w)
        out = [None if o is None else np.array(o) for o in self.inner.backward(dy2, x2, w2, p, mask)]
        if self.tamper:
            out = self.tamper(out, p, mask)
        return tuple(out)


def _f32_case():
    return CASES["kernel/k3-s1-psym"]      # 2-D float32, direct, every gradient


# ---------------------------------------------------------------------------------------------
# Corpus


def test_corpus_is_large_varied_and_stable():
    cases = load_corpus()
    assert len(cases) >= 300
    assert len({c.id for c in cases}) == len(cases)
    valid = [c for c in cases if c.kind == "valid"]
    invalid = [c for c in cases if c.kind == "invalid"]
    assert len(invalid) >= 12
    assert {c.nd for c in valid} == {1, 2, 3}
    assert {c.dtype for c in valid} == set(DTYPES)
    assert {c.mask for c in valid} == {(a, b, d) for a in (0, 1) for b in (0, 1) for d in (0, 1)}
    assert {c.layout for c in valid} == {"contiguous", "channels_last", "strided"}
    assert {1, 3, 5, 7} <= {k for c in valid for k in c.kernel}
    assert {1, 2, 3} <= {s for c in valid for s in c.stride}
    assert any(c.stride[0] > 1 and c.dilation[0] > 1 for c in valid)
    assert any(k > s for c in valid for k, s in zip(c.kernel, c.spatial))          # kernel larger than input
    assert any(c.padding == "same" and max(c.stride) == 2 for c in valid)
    assert any(c.padding == "valid" for c in valid)
    assert any(isinstance(c.padding, tuple) and any(a != b for a, b in c.padding) for c in valid)
    assert any(c.groups == c.c_in == c.c_out > 1 for c in valid)                   # depthwise
    assert any(c.groups == c.c_in and c.c_out == 2 * c.c_in for c in valid)        # channel multiplier
    assert any(c.transposed and max(c.output_padding) > 0 for c in valid)
    assert any(0 in (c.n, c.c_in, c.c_out) for c in valid)                         # empty tensors
    assert any(c.deterministic for c in valid)
    assert {c.math for c in valid} == {"keep_dtype", "allow_tf32", "allow_fp16"}
    assert max(max(tolerance.reduction_lengths(c.params).values()) for c in valid) >= 100_000
    assert corpus_hash(cases) == corpus_hash(load_corpus())


# Inputs are a function of the case id only: these digests are the same on every machine.
PINNED_INPUTS = {
    "dtype/2d-f16-cl": "47a7da144957633bdaf5ad8a1fe2525cfd2ed99a894019ec5002506e4f2d1bf2",
    "dtype/3d-bf16-strided": "4563bfa3b51fbbc9bff2bca6c3a77bb73919333aed80909d35f10f9c2e313416",
    "kernel/k3-s2-pasym": "9008769bf040a7232257e04bd04c007534b48fc3457df44ad7df70e1b88aab62",
    "large/1d-long-f32": "8b9cea7267a925c3e2e8369cef28c5cfa1df7b1ec63fdb386498337d2a66f9f7",
    "deterministic/1d-direct-f64": "c985a500a5bb2e198d754f03a8a7db5e9c92b97d8a3b1f1dea3853e258deae9e",
}


@pytest.mark.parametrize("case_id", sorted(PINNED_INPUTS))
def test_inputs_are_pinned_across_machines(case_id):
    assert make_inputs(CASES[case_id]).digest() == PINNED_INPUTS[case_id]


def test_inputs_exact_in_dtype_and_layouts_are_views_of_the_same_values():
    from xconv_conformance.families import family
    case = CASES["dtype/2d-bf16-strided"]
    inputs = make_inputs(case)
    x = inputs.input
    assert x.dtype == DTYPES["bfloat16"]
    assert abs(float(x.astype(np.float64).std()) - 1.0) < 0.2
    fam = family("numpy")
    for layout in ("contiguous", "channels_last", "strided"):
        view = fam.make(x, layout)
        assert np.array_equal(view.astype(np.float64), x.astype(np.float64))
        assert view.flags.c_contiguous == (layout == "contiguous")


def test_corpus_spec_errors_are_reported():
    import tomllib
    from importlib import resources

    from xconv_conformance.cases import CorpusError, expand
    spec = tomllib.loads(resources.files("xconv_conformance").joinpath("corpus.toml").read_text())
    spec["case"].append({"id": "bad/kernel-too-big", "kernel": 20})
    with pytest.raises(CorpusError, match="bad/kernel-too-big"):
        expand(spec)
    spec["case"][-1] = {"id": "kernel/k3-s1-psym"}
    with pytest.raises(CorpusError, match="duplicate"):
        expand(spec)


# ---------------------------------------------------------------------------------------------
# The bound


def test_c_constant():
    assert tolerance.c_constant(1) == pytest.approx(3.0, rel=1e-3)             # worst case for short sums
    assert tolerance.c_constant(100_000) == pytest.approx(8 * (100_002) ** 0.5, rel=1e-3)
    assert tolerance.compute_roundoff("float32", "allow_tf32") == UNIT_ROUNDOFF["tf32"]
    assert tolerance.compute_roundoff("float32", "allow_fp16") == UNIT_ROUNDOFF["float16"]
    assert tolerance.compute_roundoff("bfloat16", "allow_fp16") == UNIT_ROUNDOFF["float32"]   # 16-bit: fp32 sums
    assert tolerance.compute_roundoff("float16") == UNIT_ROUNDOFF["float32"]
    assert tolerance.compute_roundoff("float64", "allow_tf32") == UNIT_ROUNDOFF["float64"]


def _planted(case, output: int, index, scale: float, ulps: int = 0):
    """A tamper function that sets one element to exact + scale*bound, then ``ulps`` further out."""
    ref = runner.reference_of(case)
    exact, bnd = float(ref.exact[output][index]), float(ref.bounds[output][index])
    dtype = DTYPES[case.dtype]
    value = np.array(exact + scale * bnd, dtype=dtype)
    for _ in range(abs(ulps)):
        value = np.nextafter(value, np.array(np.inf if ulps > 0 else -np.inf, dtype=dtype))

    def tamper(out, p, mask):
        out[output] = out[output].copy()
        out[output][index] = value
        return out
    return tamper


def test_bound_catches_a_result_a_few_ulps_beyond_it(register):
    case = _f32_case()
    index = (3, 1, 2, 0)
    name = register(Wrapped("planted-beyond", _planted(case, 1, index, 1.0, ulps=4)))
    out = xcc.run_case(case, name)
    assert out.status == "failed"
    assert "grad_weight" in out.message and str(index) in out.message
    assert 1.0 < out.ratios["grad_weight"] < 1.1


def test_bound_accepts_a_result_a_few_ulps_inside_it(register):
    case = _f32_case()
    name = register(Wrapped("planted-inside", _planted(case, 1, (3, 1, 2, 0), 1.0, ulps=-4)))
    out = xcc.run_case(case, name)
    assert out.status == "passed", out.message
    assert 0.9 < out.ratio <= 1.0


@pytest.mark.parametrize("case_id", ["dtype/2d-bf16-contig", "dtype/1d-f16-contig", "dilation/3d-d2-s2"])
def test_bound_catches_planted_errors_in_every_dtype_and_output(register, case_id):
    case = CASES[case_id]
    for output in range(3):
        ref = runner.reference_of(case)
        index = tuple(s // 2 for s in ref.exact[output].shape)
        name = register(Wrapped(f"planted-{output}", _planted(case, output, index, 3.0)))
        out = xcc.run_case(case, name)
        assert out.status == "failed", (output, out.message)
        assert tolerance.OUTPUTS[output] in out.message


def test_dropped_bias_gradient_is_caught(register):
    def drop(out, p, mask):
        out[2] = np.zeros_like(out[2])
        return out
    out = xcc.run_case(_f32_case(), register(Wrapped("drops-bias", drop)))
    assert out.status == "failed" and "grad_bias" in out.message


def test_masked_gradient_must_be_none_and_unmasked_present(register):
    case = CASES["mask/m110-direct-f32"]
    out = xcc.run_case(case, register(Wrapped("computes-masked", lambda o, p, m: [o[0], o[1], o[0].sum((0, 2, 3))])))
    assert out.status == "failed"                 # the core itself refuses a result for a False mask bit
    case = CASES["mask/m111-direct-f32"]
    out = xcc.run_case(case, register(Wrapped("forgets-bias", lambda o, p, m: [o[0], o[1], None])))
    assert out.status == "failed" and "grad_bias" in out.message


def test_wrong_dtype_is_caught(register):
    out = xcc.run_case(_f32_case(), register(Wrapped("returns-f64", lambda o, p, m: [a.astype(np.float64) for a in o])))
    assert out.status == "failed" and "dtype" in out.message


def _tf32(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
    return bits.astype(np.uint32).view(np.float32)


def test_silent_tf32_is_caught_but_allowed_when_asked(register):
    name = register(Wrapped("silent-tf32", transform_inputs=lambda a, b: (_tf32(a), _tf32(b))))
    case = _f32_case()
    assert xcc.run_case(case, name).status == "failed"
    allowed = dataclasses.replace(case, id="test/tf32-allowed", math="allow_tf32")
    out = xcc.run_case(allowed, name)
    assert out.status == "passed", out.message


def test_correct_float32_long_reductions_are_not_flagged(register):
    # The corpus's longest reductions (K = 100000 for grad_weight and grad_bias) on the NumPy backend.
    case = CASES["large/1d-long-f32"]
    assert tolerance.reduction_lengths(case.params)["grad_bias"] == 100_000
    out = xcc.run_case(case, "numpy")
    assert out.status == "passed" and out.ratio < 1.0

    # The same case summed the naive way: recursive float32 summation (np.cumsum) of grad_bias.
    def recursive_bias(out, p, mask):
        dy = runner.inputs_of(case).grad_output
        rows = np.moveaxis(dy, 1, 0).reshape(dy.shape[1], -1)
        out[2] = np.cumsum(rows, axis=1, dtype=np.float32)[:, -1].copy()
        return out
    out = xcc.run_case(case, register(Wrapped("recursive-sum", recursive_bias)))
    assert out.status == "passed", out.message

    # Worst realistic data for recursive summation: 100000 positive terms, no cancellation at all.
    rng = np.random.default_rng(1)
    k = 100_000
    terms = rng.random((64, k)).astype(np.float32) * rng.random((64, k)).astype(np.float32)
    exact = terms.astype(np.float64).sum(axis=1)
    got = np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]
    bnd = tolerance.bound(exact, exact, k, "float32")
    ratio = tolerance.error_ratio(got, exact, bnd)
    assert ratio.max() < 0.5
    assert ratio.max() > 1e-3      # ... and the bound is not vacuous: the error is a visible fraction of it


# ---------------------------------------------------------------------------------------------
# Determinism, refusals, unavailability, invalid arguments


class Noisy(Wrapped):
    """Adds a different 1-ulp change on every call: not deterministic."""

    calls = 0

    def backward(self, dy, x, w, p, mask):
        out = list(super().backward(dy, x, w, p, mask))
        Noisy.calls += 1
        if out[1] is not None and Noisy.calls % 2:
            out[1] = out[1].copy()
            out[1].flat[0] = np.nextafter(out[1].flat[0], np.inf)
        return tuple(out)


def test_nondeterminism_between_two_calls_is_caught(register):
    case = CASES["deterministic/2d-direct-f32"]
    out = xcc.run_case(case, register(Noisy("noisy")))
    assert out.status == "failed" and "second call differs" in out.message


def test_refusal_is_reported_as_refused_not_passed(register):
    caps = dataclasses.replace(xconv.get_backend("numpy").capabilities, deterministic=False)
    name = register(Wrapped("never-deterministic", capabilities=caps))
    out = xcc.run_case(CASES["deterministic/2d-direct-f32"], name)
    assert out.status == "refused" and "deterministic" in out.message
    caps = dataclasses.replace(xconv.get_backend("numpy").capabilities, dtypes=frozenset({"float32"}))
    out = xcc.run_case(CASES["dtype/2d-f16-contig"], register(Wrapped("f32-only", capabilities=caps)))
    assert out.status == "refused"


def test_unavailable_backend_is_reported_with_its_reason(register, capsys):
    name = register(Wrapped("absent-device", available=(False, "no such accelerator here")))
    out = xcc.run_case(_f32_case(), name)
    assert out.status == "unavailable" and out.message == "no such accelerator here"
    assert cli.main(["--backend", name, "--cases", "tiny/1d", "--no-progress"]) == 2
    text = capsys.readouterr().out
    assert "unavailable: no such accelerator here" in text
    assert xcc.run_case(_f32_case(), "no-such-backend").status == "unavailable"


def test_invalid_cases_raise_shape_error_before_backend_work():
    invalid = [c for c in load_corpus() if c.kind == "invalid"]
    for case in invalid:
        out = xcc.run_case(case, "numpy")
        assert out.status == "passed", (case.id, out.message)


def test_invalid_check_fails_when_no_shape_error_or_after_backend_work(register):
    valid_as_invalid = dataclasses.replace(_f32_case(), id="test/not-really-invalid", kind="invalid",
                                           argument="stride", call=(("stride", 1),))
    out = xcc.run_case(valid_as_invalid, "numpy")
    assert out.status == "failed" and "backend work" in out.message
    wrong_argument = dataclasses.replace(CASES["invalid/stride-zero"], id="test/wrong-argument", argument="padding")
    out = xcc.run_case(wrong_argument, "numpy")
    assert out.status == "failed" and "'stride'" in out.message


def test_spy_records_backend_work():
    spy = runner.Spy(xconv.get_backend("numpy"))
    inputs = make_inputs(_f32_case())
    xconv.convolution_backward(inputs.grad_output, inputs.input, inputs.weight, padding=2, backend=spy)
    assert spy.calls


# ---------------------------------------------------------------------------------------------
# Bundles


@pytest.fixture(scope="module")
def numpy_bundle(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bundles") / "numpy.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", path, "--cases", "tiny", "--cases", "mask/*f32",
                     "--cases", "deterministic/1d", "--cases", "invalid/stride", "--no-progress"]) == 0
    return path


def test_bundle_round_trip(numpy_bundle):
    b = xbundle.load_bundle(numpy_bundle)
    m = b.manifest
    assert m["format"] == xbundle.FORMAT and m["backend"]["name"] == "numpy"
    assert m["xconv_version"] == xconv.__version__
    assert {"numpy", "ml_dtypes", "pluggy"} <= set(m["libraries"])
    assert m["device"] and m["platform"]["python"] and m["created"]
    ids = m["corpus"]["case_ids"]
    assert len(ids) == len(m["cases"]) and len(ids) > 20
    assert m["corpus"]["hash"] == corpus_hash([CASES[i] for i in ids])
    for rec in m["cases"]:
        case = CASES[rec["id"]]
        assert rec["spec_digest"] == case.digest
        if case.kind != "valid":
            assert rec["outputs"] == {}
            continue
        fresh = xcc.run_case(case, "numpy", keep_outputs=True)
        for name, arr, bit in zip(tolerance.OUTPUTS, fresh.outputs, case.mask):
            got = b.output(rec, name)
            assert (got is None) == (not bit)
            if got is not None:
                assert got.dtype == arr.dtype and np.array_equal(got.view(np.uint8), arr.view(np.uint8))
    with zipfile.ZipFile(numpy_bundle) as zf:
        assert zf.namelist() == ["manifest.json", "outputs.npz"]
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())


def _rewrite(src, dst, members: dict | None = None, fix_sha: bool = True, extra: dict | None = None,
             drop: tuple = ()):
    """Copy a bundle, replacing member bytes (and by default keeping the manifest's sha256 consistent)."""
    with zipfile.ZipFile(src) as zf:
        data = {n: zf.read(n) for n in zf.namelist()}
    data.update(members or {})
    if fix_sha and members and "outputs.npz" in members:
        manifest = json.loads(data["manifest.json"])
        manifest["members"]["outputs.npz"] = {"sha256": hashlib.sha256(data["outputs.npz"]).hexdigest(),
                                              "size": len(data["outputs.npz"])}
        data["manifest.json"] = json.dumps(manifest).encode()
    data.update(extra or {})
    with zipfile.ZipFile(dst, "w") as zf:
        for name, blob in data.items():
            if name not in drop:
                zf.writestr(name, blob)
    return str(dst)


def _npz_with(src, change):
    with zipfile.ZipFile(src) as zf:
        npz = np.load(io.BytesIO(zf.read("outputs.npz")))
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _manifest_with(src, change):
    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    change(manifest)
    return json.dumps(manifest).encode()


def _first_key(arrays):
    return sorted(arrays)[0]


TAMPERINGS = {
    "truncated": lambda src, dst: (open(dst, "wb").write(open(src, "rb").read()[:4000]), str(dst))[1],
    "not-a-zip": lambda src, dst: (open(dst, "wb").write(b'{"format": "nope"}'), str(dst))[1],
    "flipped-byte": lambda src, dst: (open(dst, "wb").write(_flip(open(src, "rb").read())), str(dst))[1],
    "outputs-changed": lambda src, dst: _rewrite(src, dst, {"outputs.npz": _npz_with(
        src, lambda a: a.__setitem__(_first_key(a), a[_first_key(a)] * 2))}, fix_sha=False),
    "extra-member": lambda src, dst: _rewrite(src, dst, extra={"run_me.py": b"print('hi')"}),
    "path-escape": lambda src, dst: _rewrite(src, dst, extra={"../../evil.npy": b"x"}),
    "missing-member": lambda src, dst: _rewrite(src, dst, drop=("outputs.npz",)),
    "manifest-not-json": lambda src, dst: _rewrite(src, dst, extra={"manifest.json": b"{not json"}),
    "manifest-wrong-format": lambda src, dst: _rewrite(src, dst, extra={"manifest.json": _manifest_with(
        src, lambda m: m.__setitem__("format", "something-else"))}),
    "manifest-bad-status": lambda src, dst: _rewrite(src, dst, extra={"manifest.json": _manifest_with(
        src, lambda m: m["cases"][0].__setitem__("status", "great"))}),
    "pickled-array": lambda src, dst: _rewrite(src, dst, {"outputs.npz": _npz_with(
        src, lambda a: a.__setitem__(_first_key(a), np.array([{"x": 1}], dtype=object)))}),
    "wrong-dtype": lambda src, dst: _rewrite(src, dst, {"outputs.npz": _npz_with(
        src, lambda a: a.__setitem__(_first_key(a), a[_first_key(a)].astype(np.complex64)))}),
    "wrong-shape": lambda src, dst: _rewrite(src, dst, {"outputs.npz": _npz_with(
        src, lambda a: a.__setitem__(_first_key(a), a[_first_key(a)][..., None]))}),
    "unlisted-array": lambda src, dst: _rewrite(src, dst, {"outputs.npz": _npz_with(
        src, lambda a: a.__setitem__("99999.grad_input", np.zeros(3, np.float32)))}),
}
EXPECTED_MESSAGE = {
    "truncated": "not a zip archive|corrupt or truncated", "not-a-zip": "not a zip archive",
    "flipped-byte": "corrupt|does not match|not valid JSON|manifest", "outputs-changed": "does not match the manifest",
    "extra-member": "unexpected members", "path-escape": "outside the bundle", "missing-member": "missing members",
    "manifest-not-json": "not valid JSON", "manifest-wrong-format": "not an xconv conformance bundle",
    "manifest-bad-status": "status 'great'", "pickled-array": "unpickling|dtype object",
    "wrong-dtype": "has dtype complex64", "wrong-shape": "has shape", "unlisted-array": "does not list",
}


def _flip(blob: bytes) -> bytes:
    i = blob.index(b"\x93NUMPY") + 200          # inside the first stored array's data
    return blob[:i] + bytes([blob[i] ^ 0xFF]) + blob[i + 1:]


@pytest.mark.parametrize("kind", sorted(TAMPERINGS))
def test_tampered_bundles_are_rejected_with_a_clear_error(numpy_bundle, tmp_path, kind):
    bad = TAMPERINGS[kind](numpy_bundle, tmp_path / f"{kind}.xcr")
    with pytest.raises(xbundle.BundleError) as info:
        xbundle.load_bundle(bad)
    import re
    assert re.search(EXPECTED_MESSAGE[kind], str(info.value)), str(info.value)
    assert str(bad) in str(info.value)
    assert cli.main(["compare", str(bad)]) == 2


# ---------------------------------------------------------------------------------------------
# Compare


def test_compare_agreeing_bundles(numpy_bundle, tmp_path, capsys):
    other = str(tmp_path / "exact.xcr")
    assert cli.main(["run", "--backend", "numpy-exact", "--out", other, "--cases", "tiny", "--cases", "mask/*f32",
                     "--no-progress"]) == 0
    capsys.readouterr()
    report = tmp_path / "cmp.html"
    assert cli.main(["compare", numpy_bundle, other, "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert "all agree within the error bounds" in text and "[B]" in text
    assert "<svg" in report.read_text()


def test_compare_detects_a_planted_disagreement(numpy_bundle, tmp_path, capsys, register):
    case = CASES["mask/m111-direct-f32"]
    name = register(Wrapped("planted-for-compare", _planted(case, 0, (1, 2, 3, 4), 5.0)))
    other = str(tmp_path / "planted.xcr")
    assert cli.main(["run", "--backend", name, "--out", other, "--cases", "mask/*f32", "--no-progress"]) == 1
    capsys.readouterr()
    assert cli.main(["compare", numpy_bundle, other]) == 1
    text = capsys.readouterr().out
    assert "mask/m111-direct-f32" in text and "disagree" in text and "grad_input" in text


def test_compare_detects_an_edited_result(numpy_bundle, tmp_path, capsys):
    # A well-formed bundle (consistent sha256) whose recorded status says passed, but one value is 3 bounds off.
    b = xbundle.load_bundle(numpy_bundle)
    rec = b.records()["mask/m011-direct-f32"]
    ref = runner.reference_of(CASES[rec["id"]])
    arrays = {k: v.copy() for k, v in b.arrays.items()}
    key = rec["outputs"]["grad_weight"]["key"]
    arrays[key].flat[0] = np.float32(ref.exact[1].flat[0] + 3 * ref.bounds[1].flat[0])
    manifest = {k: v for k, v in b.manifest.items() if k not in ("format", "format_version", "members")}
    edited = str(tmp_path / "edited.xcr")
    xbundle.write_bundle(edited, manifest, arrays)
    assert cli.main(["compare", numpy_bundle, edited]) == 1
    text = capsys.readouterr().out
    assert "mask/m011-direct-f32" in text and "outside the bound" in text


def test_compare_rejects_bundles_with_different_inputs(numpy_bundle, tmp_path, capsys):
    def change(m):
        m["cases"][0]["input_digest"] = "0" * 64
    edited = _rewrite(numpy_bundle, tmp_path / "inputs.xcr", extra={"manifest.json": _manifest_with(numpy_bundle,
                                                                                                    change)})
    assert cli.main(["compare", numpy_bundle, edited]) == 1
    assert "different inputs" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Command line, report, pytest front end, third-party plugins


def test_cli_summary_and_report(tmp_path, capsys):
    report = tmp_path / "report.html"
    assert cli.main(["--backend", "numpy", "--cases", "tiny", "--cases", "invalid/", "--report", str(report),
                     "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "passed" in text and "refused" in text and "unavailable" in text and "numpy" in text
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "tiny/" in page
    assert "src=\"http" not in page and "href=\"http" not in page and "<script" not in page


def test_cli_no_arguments_form_covers_every_backend_but_the_oracle(capsys):
    assert cli.main(["--cases", "tiny/1d-f32", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "\nnumpy " in text and "numpy-exact" not in text


def test_cli_failure_exit_status(register, capsys):
    def drop(out, p, mask):
        if out[2] is not None:
            out[2] = np.zeros_like(out[2])
        return out
    name = register(Wrapped("drops-bias-cli", drop))
    assert cli.main(["--backend", name, "--cases", "kernel/k3-s1", "--no-progress"]) == 1
    assert "FAILED kernel/k3-s1" in capsys.readouterr().out


def test_cli_cases_listing(capsys):
    assert cli.main(["cases", "--cases", "invalid/*"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids and all(i.startswith("invalid/") for i in ids)


def test_progress_bar_draws_on_a_stream():
    stream = io.StringIO()
    bar = cli.Progress(4, enabled=True, stream=stream)
    for i in range(4):
        bar.step(f"case {i}")
    bar.close()
    assert "4/4" in stream.getvalue() and "[" in stream.getvalue()


PLUGIN = textwrap.dedent('''
    """A third-party backend, installed from elsewhere: the NumPy backend under another name."""
    import os
    import xconv
    from xconv_numpy import NumpyBackend

    FRESH = os.environ.get("XCONV_CONFORMANCE_ROLE") == "digest"   # the fresh process of the determinism check

    class ThirdParty(NumpyBackend):
        def __init__(self, name, drift=False):
            super().__init__()
            self.name = name
            self.drift = drift

        def version(self):
            return "thirdparty 0.1"

        def backward(self, dy, x, w, p, mask):
            out = list(super().backward(dy, x, w, p, mask))
            if self.drift and FRESH and out[0] is not None:   # differs only in a fresh process
                import numpy as np
                out[0] = out[0].copy()
                out[0].flat[0] = np.nextafter(out[0].flat[0], np.inf)
            return tuple(out)

    @xconv.hookimpl
    def xconv_backends():
        return [ThirdParty("thirdparty"), ThirdParty("thirdparty-drift", drift=True)]
''')


@pytest.fixture(scope="module")
def third_party_env(tmp_path_factory):
    """A plugin distribution on PYTHONPATH, found through its entry point: nothing in xconv names it."""
    root = tmp_path_factory.mktemp("site")
    pkg = root / "thirdparty_xconv"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(PLUGIN)
    dist = root / "thirdparty_xconv-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-xconv\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[xconv.backends]\nthirdparty = thirdparty_xconv.plugin\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), os.path.join(REPO, "conformance")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def test_third_party_plugin_runs_under_pytest(third_party_env):
    proc = subprocess.run([sys.executable, "-m", "pytest", os.path.join(REPO, "conformance"), "-q",
                           "-p", "no:cacheprovider", "--xconv-backend", "thirdparty", "--xconv-cases", "tiny/1d",
                           "--xconv-cases", "deterministic/1d-direct", "--xconv-cases", "invalid/groups",
                           "--xconv-backend", "not-installed-anywhere"],
                          cwd=REPO, env=third_party_env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "thirdparty" in out and "xconv conformance" in out
    assert "@thirdparty" in subprocess.run(
        [sys.executable, "-m", "pytest", os.path.join(REPO, "conformance"), "--collect-only", "-q",
         "-p", "no:cacheprovider", "--xconv-backend", "thirdparty", "--xconv-cases", "tiny/1d-f32"],
        cwd=REPO, env=third_party_env, capture_output=True, text=True, timeout=300).stdout
    assert "unavailable: backend 'not-installed-anywhere'" in out


def test_third_party_plugin_fresh_process_drift_is_caught(third_party_env):
    proc = subprocess.run([sys.executable, "-m", "xconv", "conformance", "--backend", "thirdparty-drift",
                           "--cases", "deterministic/1d-direct", "--no-progress"],
                          cwd=REPO, env=third_party_env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "fresh process computed different bits" in out


class Reuses(Wrapped):
    """Returns grad_bias as a view of one buffer that every call overwrites (a scratch-arena bug)."""

    buffer = np.zeros(64, np.float32)

    def backward(self, dy, x, w, p, mask):
        out = list(super().backward(dy, x, w, p, mask))
        if out[2] is not None and out[2].dtype == np.float32:
            view = Reuses.buffer[: out[2].size]
            view[...] = out[2]
            out[2] = view
        return tuple(out)


def test_results_overwritten_by_a_later_call_are_caught(register, capsys):
    name = register(Reuses("reuses-memory"))
    assert cli.main(["--backend", name, "--cases", "kernel/k3-s1", "--no-progress"]) == 1
    text = capsys.readouterr().out
    assert "changed results the backend had returned for earlier cases (grad_bias of kernel/k3-s1-p0)" in text
    watch = runner.Watch()
    first = watch.after(xcc.run_case(CASES["mask/m111-direct-f32"], name))
    second = watch.after(xcc.run_case(CASES["kernel/k3-s1-psym"], name))
    assert first.status == "passed" and second.status == "failed" and "mask/m111-direct-f32" in second.message


def test_compare_flags_a_passed_case_without_its_results(numpy_bundle, tmp_path, capsys):
    b = xbundle.load_bundle(numpy_bundle)
    manifest = json.loads(json.dumps({k: v for k, v in b.manifest.items()
                                      if k not in ("format", "format_version", "members")}))
    rec = next(r for r in manifest["cases"] if r["id"] == "mask/m111-direct-f32")
    key = rec["outputs"].pop("grad_bias")["key"]
    arrays = {k: v for k, v in b.arrays.items() if k != key}
    edited = str(tmp_path / "dropped.xcr")
    xbundle.write_bundle(edited, manifest, arrays)
    assert cli.main(["compare", numpy_bundle, edited]) == 1
    assert "records the case as passed but holds no grad_bias" in capsys.readouterr().out
