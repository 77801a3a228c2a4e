"""Bundles (.xcr) as a hostile machine would send them: bombs, lies in zip headers, truncation, bad manifests.

Each hostile bundle is built here byte by byte (a zip writer that can lie about sizes, CRCs and
counts), small on disk, and must be refused with a BundleError that says what is wrong, before
the bytes it claims are inflated (memory measured in a fresh process), and ``xconv conformance
compare`` must answer it with exit status 2 ("unreadable bundle"), never a traceback or 1.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest

from xconv.errors import XconvError
from xconv_conformance import cli
from xconv_conformance import bundle as xbundle
from xconv_conformance import compare as xcompare
from xconv_conformance import manifest_schema
from xconv_conformance import report as xreport

BOMB = 128 << 20                     # bytes a bomb inflates to; the fresh process may grow by at most a third of it
GROWTH_LIMIT_KB = (BOMB >> 10) // 3


# ---------------------------------------------------------------------------------------------
# A zip writer that can lie


def member(name: str, data: bytes = b"", deflate: bool = False, payload: bytes | None = None,
           size: int | None = None, crc: int | None = None, method: int | None = None, flags: int = 0) -> dict:
    """One zip entry: ``data`` stored or deflated, unless ``payload`` (the bytes on disk) and the header fields
    ``size`` (declared inflated size), ``crc`` and ``method`` are given to say something else."""
    if payload is None:
        payload = _deflate_chunks([data])[0] if deflate else data
    return {"name": name.encode(), "payload": payload, "size": len(data) if size is None else size,
            "crc": zlib.crc32(data) if crc is None else crc, "flags": flags,
            "method": method if method is not None else (zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)}


def write_zip(members: list[dict], prefix: bytes = b"", comment: bytes = b"", count: int | None = None) -> bytes:
    """The archive bytes; ``count`` overrides the entry count in the end record."""
    out, central = bytearray(prefix), bytearray()
    for m in members:
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, m["flags"], m["method"], 0, 0x21, m["crc"],
                           len(m["payload"]), m["size"], len(m["name"]), 0) + m["name"] + m["payload"]
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, m["flags"], m["method"], 0, 0x21, m["crc"],
                               len(m["payload"]), m["size"], len(m["name"]), 0, 0, 0, 0, 0, offset) + m["name"]
    n = len(members) if count is None else count
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(central), len(out), len(comment))
    return bytes(out + central + end + comment)


def _deflate_chunks(chunks) -> tuple[bytes, int, int, str]:
    """(raw deflate stream, crc32, size, sha256) of the concatenated chunks, never holding them all."""
    comp, crc, size, sha = zlib.compressobj(9, zlib.DEFLATED, -15), 0, 0, hashlib.sha256()
    parts = []
    for c in chunks:
        parts.append(comp.compress(c))
        crc, size = zlib.crc32(c, crc), size + len(c)
        sha.update(c)
    parts.append(comp.flush())
    return b"".join(parts), crc, size, sha.hexdigest()


def _zeros(n: int):
    step = bytes(1 << 20)
    for i in range(0, n, len(step)):
        yield step[:min(len(step), n - i)]


@functools.lru_cache(maxsize=None)
def deflated_zeros(n: int, prefix: bytes = b"") -> tuple[bytes, int, int, str]:
    return _deflate_chunks([prefix, *_zeros(n)])


def npy_header(descr, shape, fortran: bool = False) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": fortran, "shape": tuple(shape)})
    return f.getvalue()


def npy(a: np.ndarray, **kw) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, a, allow_pickle=kw.get("allow_pickle", False))
    return f.getvalue()


# ---------------------------------------------------------------------------------------------
# A real bundle to start from, and ways to rebuild it


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "good.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", path, "--cases", "tiny", "--cases", "invalid/stride",
                     "--no-progress"]) == 0
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        with np.load(io.BytesIO(zf.read("outputs.npz"))) as npz:
            arrays = {k: npz[k] for k in npz.files}
    return path, manifest, arrays


def float32_key(manifest) -> tuple[int, str, str]:
    """(case index, output name, array key) of the first float32 result."""
    for i, rec in enumerate(manifest["cases"]):
        for name, entry in rec["outputs"].items():
            if entry["dtype"] == "float32":
                return i, name, entry["key"]
    raise AssertionError("the fixture bundle holds no float32 result")


def npz_bytes(arrays: dict, deflate: bool = False) -> bytes:
    f = io.BytesIO()
    (np.savez_compressed if deflate else np.savez)(f, **arrays)
    return f.getvalue()


def signed(manifest: dict, npz: bytes) -> dict:
    """``manifest`` recording the sha256 and size of ``npz``."""
    return dict(manifest, members={"outputs.npz": {"sha256": hashlib.sha256(npz).hexdigest(), "size": len(npz)}})


def bundle_bytes(manifest: dict, npz: bytes | dict, fix_sha: bool = True, deflate: bool = False,
                 manifest_text: bytes | None = None) -> bytes:
    """An .xcr of ``manifest`` (or ``manifest_text``) and ``npz`` (an archive's bytes, or an outputs.npz member)."""
    npz_member = npz if isinstance(npz, dict) else member("outputs.npz", npz, deflate=deflate)
    if fix_sha and not isinstance(npz, dict):
        manifest = signed(manifest, npz)
    text = manifest_text if manifest_text is not None else json.dumps(manifest).encode()
    return write_zip([member("manifest.json", text, deflate=deflate), npz_member])


def with_outputs(m: dict) -> dict:
    """The first case record that holds results."""
    return next(rec for rec in m["cases"] if rec["outputs"])


def edited(manifest: dict, change) -> dict:
    m = json.loads(json.dumps(manifest))
    change(m)
    return m


def save(tmp_path, name: str, blob: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(blob)
    return str(p)


def refused(path: str, pattern: str) -> str:
    """Load ``path``: it must be refused naming ``pattern``; ``compare`` must exit 2 on it. The message."""
    with pytest.raises(xbundle.BundleError) as info:
        xbundle.load_bundle(path)
    msg = str(info.value)
    assert re.search(pattern, msg), msg
    assert msg.startswith(path + ": ")
    assert isinstance(info.value, XconvError)
    assert cli.main(["compare", path]) == 2
    return msg


# ---------------------------------------------------------------------------------------------
# The writer used here writes what zipfile and np.load read (so the hostile variants are only hostile)


def test_hand_written_bundle_of_the_same_content_loads(good, tmp_path):
    path, manifest, arrays = good
    p = save(tmp_path, "rewritten.xcr", bundle_bytes(manifest, npz_bytes(arrays)))
    b = xbundle.load_bundle(p)
    for k, a in arrays.items():
        assert b.arrays[k].dtype == a.dtype and np.array_equal(b.arrays[k], a)


def test_a_bundle_deflated_at_both_layers_loads_with_the_same_results(good, tmp_path):
    path, manifest, arrays = good
    p = save(tmp_path, "deflated.xcr", bundle_bytes(manifest, npz_bytes(arrays, deflate=True), deflate=True))
    with zipfile.ZipFile(p) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
    b = xbundle.load_bundle(p)
    ref = xbundle.load_bundle(path)
    assert b.arrays.keys() == ref.arrays.keys()
    for k in ref.arrays:
        assert b.arrays[k].dtype == ref.arrays[k].dtype
        assert np.array_equal(b.arrays[k].view(np.uint8), ref.arrays[k].view(np.uint8))


def test_big_endian_and_fortran_order_arrays_are_read_as_their_values(good, tmp_path):
    path, manifest, arrays = good
    i, name, key = float32_key(manifest)
    a = arrays[key]
    swapped = dict(arrays)
    swapped[key] = a.astype(a.dtype.newbyteorder(">"))
    b = xbundle.load_bundle(save(tmp_path, "be.xcr", bundle_bytes(manifest, npz_bytes(swapped))))
    assert b.arrays[key].dtype == np.float32 and b.arrays[key].dtype.isnative
    assert np.array_equal(b.arrays[key], a)
    if a.ndim > 1:
        fortran = dict(arrays)
        fortran[key] = np.asfortranarray(a)
        b = xbundle.load_bundle(save(tmp_path, "f.xcr", bundle_bytes(manifest, npz_bytes(fortran))))
        assert np.array_equal(b.arrays[key], a)


@pytest.mark.parametrize("status", manifest_schema.STATUSES)
def test_every_declared_status_is_accepted(good, tmp_path, status):
    path, manifest, arrays = good
    m = edited(manifest, lambda m: m["cases"][0].__setitem__("status", status))
    b = xbundle.load_bundle(save(tmp_path, f"{status}.xcr", bundle_bytes(m, npz_bytes(arrays))))
    assert b.manifest["cases"][0]["status"] == status


# ---------------------------------------------------------------------------------------------
# Bombs: refused before the bytes they claim are inflated, memory measured in a fresh process


def _bombs(good, tmp_path) -> dict:
    """{path: pattern its refusal must match}."""
    path, manifest, arrays = good
    i, name, key = float32_key(manifest)
    count = BOMB // 4
    header = npy_header("<f4", (count,))
    stream, crc, size, _ = deflated_zeros(BOMB, header)
    honest = member(key + ".npy", payload=stream, size=size, crc=crc, method=zipfile.ZIP_DEFLATED)
    others = [member(k + ".npy", npy(a)) for k, a in arrays.items() if k != key]
    inner = write_zip([honest, *others])
    big_manifest = edited(manifest, lambda m: m["cases"][i]["outputs"][name].__setitem__("shape", [count]))
    small = npy_header("<f4", arrays[key].shape)
    declared = len(small) + arrays[key].nbytes
    s_stream, s_crc, s_size, _ = deflated_zeros(BOMB, small)
    liar = member(key + ".npy", payload=s_stream, size=declared, crc=s_crc, method=zipfile.ZIP_DEFLATED)
    z_stream, z_crc, z_size, z_sha = deflated_zeros(BOMB)
    outer_bomb = member("outputs.npz", payload=z_stream, size=z_size, crc=z_crc, method=zipfile.ZIP_DEFLATED)
    outer_manifest = edited(manifest, lambda m: m.__setitem__("members", {"outputs.npz": {"sha256": z_sha,
                                                                                          "size": z_size}}))
    huge_claim = member("outputs.npz", payload=z_stream, size=0xFFFF0000, crc=z_crc, method=zipfile.ZIP_DEFLATED)
    bombs = {
        # the reproducer: the inner .npy member deflated, the manifest listing the shape it inflates to
        "inner-deflate.xcr": (bundle_bytes(big_manifest, inner), r"passes this load's limit"),
        # the same member under the manifest's true shape: its .npy header is refused before its data is read
        "inner-deflate-header.xcr": (bundle_bytes(manifest, inner), r"has shape \[%d\]" % count),
        # a member that declares its true small size but whose deflate stream goes on (and whose CRC is the long one)
        "inner-size-lie.xcr": (bundle_bytes(manifest, write_zip([liar, *others])), r"corrupt|CRC"),
        # the outer outputs.npz member deflated from 128 MiB, sha256 and size recorded honestly
        "outer-deflate.xcr": (bundle_bytes(outer_manifest, {**outer_bomb}, fix_sha=False),
                              r"outputs.npz would inflate to %d bytes.*passes this load's limit" % BOMB),
        # a member that claims almost 4 GiB
        "outer-claim.xcr": (bundle_bytes(outer_manifest, huge_claim, fix_sha=False), r"declares 4294901760 bytes "
                            r"\(limit %d\)" % xbundle.MAX_OUTPUTS_BYTES),
    }
    out = {}
    for fname, (blob, pattern) in bombs.items():
        assert len(blob) < BOMB // 100, (fname, len(blob))        # small on disk
        out[save(tmp_path, fname, blob)] = pattern
    return out


_MEASURE = r"""
import json, resource, sys
from xconv_conformance.bundle import BundleError, load_bundle
load_bundle(sys.argv[1])                      # warm: imports and one sound load
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {}
for p in sys.argv[2:]:
    try:
        load_bundle(p)
        out[p] = None
    except BundleError as exc:
        out[p] = str(exc)
out["growth_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps(out))
"""


def test_bombs_are_refused_before_inflating_in_bounded_memory(good, tmp_path):
    bombs = _bombs(good, tmp_path)
    proc = subprocess.run([sys.executable, "-c", _MEASURE, good[0], *bombs], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for p, pattern in bombs.items():
        assert got[p] is not None, f"{p} was loaded"
        assert re.search(pattern, got[p]), got[p]
    assert got["growth_kb"] < GROWTH_LIMIT_KB, f"loading the bombs grew the process by {got['growth_kb']} KiB"
    for p in bombs:
        assert cli.main(["compare", p]) == 2


def test_budget_counts_every_byte_a_load_inflates(good, monkeypatch):
    path, manifest, arrays = good
    with zipfile.ZipFile(path) as zf:
        needed = sum(i.file_size for i in zf.infolist()) + sum(a.nbytes for a in arrays.values())
    size = os.path.getsize(path)
    monkeypatch.setattr(xbundle, "MAX_EXPANSION", 1)
    monkeypatch.setattr(xbundle, "EXPANSION_FLOOR", needed - size - 1)
    refused(path, r"passes this load's limit of %d bytes" % (needed - 1))
    monkeypatch.setattr(xbundle, "EXPANSION_FLOOR", needed - size)
    xbundle.load_bundle(path)


# ---------------------------------------------------------------------------------------------
# Truncated, extended and re-framed files


def _end_record(blob: bytes) -> tuple:
    return struct.unpack("<4s4H2LH", blob[-22:])


@pytest.mark.parametrize("cut", ["1", "22", "22+cd", "23", "1000", "half"])
def test_a_cut_bundle_is_reported_as_truncated(good, tmp_path, cut):
    blob = open(good[0], "rb").read()
    cd_size = _end_record(blob)[5]
    n = {"22+cd": 22 + cd_size, "half": len(blob) // 2}.get(cut) or int(cut)
    short = blob[:-n]
    if cut == "22+cd":        # the file now ends exactly with the inner outputs.npz's end record
        assert short[-22:-18] == b"PK\x05\x06"
    p = save(tmp_path, f"cut{cut}.xcr", short)
    msg = refused(p, r"corrupt or truncated")
    assert "unexpected members" not in msg and ".npy" not in msg


def test_bytes_before_or_after_the_archive_are_refused(good, tmp_path):
    blob = open(good[0], "rb").read()
    refused(save(tmp_path, "appended.xcr", blob + b"\0" * 10), r"not a zip archive|corrupt or truncated")
    refused(save(tmp_path, "prepended.xcr", b"#!/bin/sh\n" + blob), r"corrupt")
    end = _end_record(blob)
    commented = blob[:-2] + struct.pack("<H", 5) + b"hello"
    assert _end_record(commented[:-5])[:7] == end[:7]
    refused(save(tmp_path, "comment.xcr", commented), r"corrupt|not a zip archive")


def test_not_a_regular_file(tmp_path):
    d = tmp_path / "dir.xcr"
    d.mkdir()
    refused(str(d), r"not a regular file")
    refused(str(tmp_path / "absent.xcr"), r"no such file")
    refused(save(tmp_path, "empty.xcr", b""), r"not a zip archive")


# ---------------------------------------------------------------------------------------------
# Manifests of the wrong types, shapes and sizes


def _set(path: str, value):
    def change(m):
        keys = path.split(".")
        target = m
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return change


def _first_entry(m: dict) -> dict:
    return next(iter(with_outputs(m)["outputs"].values()))


def _refused_case(m):
    m["cases"][0]["status"] = "refused"
    m["cases"][0]["message"] = {"reason": "dict"}


MANIFEST_EDITS = {
    # the reproducers
    "message-int": (_set("cases.0.message", 12345), r"cases\[0\]\.message 12345 \(int\) is not a string"),
    "full-hash-list": (_set("corpus.full_hash", ["x"]), r"corpus\.full_hash \['x'\] \(array\) is not a SHA-256"),
    "refused-dict-message": (_refused_case, r"cases\[0\]\.message \{'reason': 'dict'\} \(object\) is not a string"),
    # and their neighbours: every field compare and report read
    "status-unknown": (_set("cases.0.status", "great"), r"status 'great' \(string\) is not one of"),
    "backend-name-int": (_set("backend.name", 5), r"backend\.name 5 \(int\) is not a non-empty string"),
    "backend-version-list": (_set("backend.version", [1]), r"backend\.version"),
    "device-null": (_set("device", None), r"device None \(null\) is not a string"),
    "platform-list": (_set("platform", ["linux"]), r"platform \['linux'\] \(array\) is not an object"),
    "platform-value": (_set("platform.platform", {"a": 1}), r"platform\.platform"),
    "created-missing": (lambda m: m.pop("created"), r"created is missing"),
    "cases-object": (_set("cases", {}), r"cases \{\} \(object\) is not an array"),
    "case-string": (_set("cases.0", "a case"), r"cases\[0\] 'a case' \(string\) is not an object"),
    "case-id-int": (_set("cases.0.id", 7), r"cases\[0\]\.id 7 \(int\) is not a non-empty string"),
    "spec-digest-short": (_set("cases.0.spec_digest", "abc"), r"cases\[0\]\.spec_digest 'abc'"),
    "outputs-list": (_set("cases.0.outputs", []), r"cases\[0\]\.outputs \[\] \(array\) is not an object"),
    "output-unknown-name": (lambda m: with_outputs(m)["outputs"].__setitem__("grad_x", {}),
                            r"cases\[\d+\]\.outputs .* is not an object with keys among"),
    "shape-strings": (lambda m: _first_entry(m).__setitem__("shape", ["2"]),
                      r"shape\[0\] '2' \(string\) is not an integer >= 0"),
    "shape-bool": (lambda m: _first_entry(m).__setitem__("shape", [True]),
                   r"shape\[0\] True \(boolean\) is not an integer"),
    "shape-negative": (lambda m: _first_entry(m).__setitem__("shape", [-1]),
                       r"shape\[0\] -1 \(int\) is not an integer >= 0"),
    "shape-rank": (lambda m: _first_entry(m).__setitem__("shape", [1] * 9),
                   r"shape .* is not an array \(of an integer >= 0.*at most 8 long\)"),
    "key-twice": (lambda m: list(with_outputs(m)["outputs"].values())[1].__setitem__("key", _first_entry(m)["key"]),
                  r"does not name|used twice"),
    "entry-dtype": (lambda m: _first_entry(m).__setitem__("dtype", "float64" if _first_entry(m)["dtype"] != "float64"
                                                                     else "float32"), r"differs from the case's"),
    "ratio-string": (_set("cases.0.ratio", "big"), r"cases\[0\]\.ratio 'big'"),
    "members-extra": (lambda m: m["members"].__setitem__("run_me.py", {"sha256": "0" * 64, "size": 1}),
                      r"members: unexpected keys \['run_me.py'\]"),
    "size-string": (lambda m: m["members"]["outputs.npz"].__setitem__("size", "12"), r"outputs\.npz\.size '12'"),
    "format-version-true": (_set("format_version", True), r"format_version True is not supported"),
    "not-an-object": (lambda m: None, r"not a JSON object"),
    "case-ids-mismatch": (lambda m: m["corpus"]["case_ids"].reverse(), r"do not match corpus\.case_ids"),
}


@pytest.mark.parametrize("kind", sorted(MANIFEST_EDITS))
def test_manifest_of_the_wrong_types_is_refused_naming_the_field(good, tmp_path, kind):
    path, manifest, arrays = good
    change, pattern = MANIFEST_EDITS[kind]
    npz = npz_bytes(arrays)
    if kind == "not-an-object":
        blob = bundle_bytes(manifest, npz, manifest_text=b"[1, 2]")
    else:
        blob = bundle_bytes(edited(signed(manifest, npz), change), npz, fix_sha=False)
    msg = refused(save(tmp_path, f"{kind}.xcr", blob), pattern)
    assert "manifest.json: " in msg


def _text_with(manifest, raw: str, field: str = "command") -> bytes:
    """The manifest's JSON with the value of ``field`` replaced by the raw JSON text ``raw``."""
    m = dict(manifest, **{field: "@@"})
    return json.dumps(m).replace('"@@"', raw).encode()


RAW_MANIFESTS = {
    "deep-100000": ("[" * 100_000 + "]" * 100_000, r"nests 100001 levels deep \(at most 32\)"),
    "deep-in-strings-ok": (json.dumps("[" * 100_000 + '\\"{'), None),
    "many-values": ("[" + ",".join(["[]"] * (manifest_schema.MAX_JSON_VALUES // 2 + 1)) + "]", r"JSON values"),
    "nan": ("NaN", r"NaN is not a JSON number"),
    "huge-int": ("1" * 5000, r"not valid JSON"),
    "not-utf8": (None, "set below"),
}


@pytest.mark.parametrize("kind", sorted(RAW_MANIFESTS))
def test_manifest_text_too_deep_too_large_or_not_json(good, tmp_path, kind):
    path, manifest, arrays = good
    value, pattern = RAW_MANIFESTS[kind]
    npz = npz_bytes(arrays)
    manifest = signed(manifest, npz)
    if kind == "not-utf8":
        text = json.dumps(manifest).encode()[:-1] + b', "command": "\xff"}'
        pattern = r"not valid JSON: not UTF-8"
    else:
        text = _text_with(manifest, value, "device" if pattern is None else "command")
    p = save(tmp_path, f"{kind}.xcr", bundle_bytes(manifest, npz, fix_sha=False, manifest_text=text))
    if pattern is None:
        assert xbundle.load_bundle(p).manifest["device"] == "[" * 100_000 + '\\"{'
    else:
        refused(p, pattern)


def test_duplicate_keys_in_a_manifest_are_refused(good, tmp_path):
    path, manifest, arrays = good
    npz = npz_bytes(arrays)
    text = json.dumps(signed(manifest, npz)).encode()[:-1] + b', "device": "another"}'
    refused(save(tmp_path, "dupkey.xcr", bundle_bytes(manifest, npz, manifest_text=text)),
            r"key 'device' appears twice")


def test_cli_exit_status_two_and_no_traceback_in_a_fresh_process(good, tmp_path):
    path, manifest, arrays = good
    bad = save(tmp_path, "msg.xcr", bundle_bytes(edited(manifest, _set("cases.0.message", 12345)), npz_bytes(arrays)))
    npz = npz_bytes(arrays)
    deep = save(tmp_path, "deep.xcr", bundle_bytes(manifest, npz, manifest_text=_text_with(
        signed(manifest, npz), "[" * 100_000 + "]" * 100_000)))
    for p in (bad, deep):
        proc = subprocess.run([sys.executable, "-m", "xconv", "conformance", "compare", good[0], p],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and p in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# Members: names, counts, duplicates, methods, arrays that are not plain numbers


def _npz_members(arrays: dict, replace: dict | None = None, extra: tuple = ()) -> bytes:
    members = [member(k + ".npy", (replace or {}).get(k, npy(a))) for k, a in arrays.items()]
    return write_zip([*members, *extra])


class _Marker:
    """Unpickling this would create a directory: the test asserts it never appears."""

    path = ""

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_pickled_arrays_are_never_unpickled(good, tmp_path):
    path, manifest, arrays = good
    i, name, key = float32_key(manifest)
    marker = _Marker()
    marker.path = str(tmp_path / "unpickled")
    obj = np.empty(arrays[key].shape, dtype=object)
    obj.flat[0] = marker
    blob = npy(obj, allow_pickle=True)
    p = save(tmp_path, "pickle.xcr", bundle_bytes(manifest, _npz_members(arrays, {key: blob})))
    refused(p, r"has dtype object.*unpickling")
    assert not os.path.exists(marker.path)


@pytest.mark.parametrize("dtype", ["<U1", "?", "<i4", "<c8", "V4", "[('a', '<f2'), ('b', '<f2')]", "('<f4', (1,))"])
def test_non_numeric_or_foreign_dtypes_are_refused_before_their_data(good, tmp_path, dtype):
    path, manifest, arrays = good
    i, name, key = float32_key(manifest)
    shape = arrays[key].shape
    descr = ast.literal_eval(dtype) if dtype.startswith(("[", "(")) else dtype
    header = npy_header(descr, shape)
    data = header + bytes(int(np.prod(shape)) * 4)
    p = save(tmp_path, "dtype.xcr", bundle_bytes(manifest, _npz_members(arrays, {key: data})))
    refused(p, r"has dtype .* expected float32|not a readable \.npy")


@pytest.mark.parametrize("kind", ["version-3", "header-too-long", "header-not-dict", "header-deep", "no-magic",
                                  "trailing-bytes", "short-data"])
def test_malformed_npy_members_are_refused(good, tmp_path, kind):
    path, manifest, arrays = good
    i, name, key = float32_key(manifest)
    good_npy = npy(arrays[key])
    if kind == "version-3":
        data = good_npy[:6] + b"\x03\x00" + good_npy[8:]
        pattern = r"version \(3, 0\) is not read"
    elif kind == "header-too-long":
        text = b"{'descr': '<f4', 'fortran_order': False, 'shape': %r, 'x': '%s'}" % (
            arrays[key].shape, b"y" * 6000)
        data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text
        pattern = r"not a readable \.npy"
    elif kind == "header-not-dict":
        text = b"[1, 2, 3]" + b" " * 54 + b"\n"
        data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text
        pattern = r"not a readable \.npy"
    elif kind == "header-deep":
        text = b"{'descr': " + b"[" * 1000 + b"]" * 1000 + b"}\n"
        data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text
        pattern = r"not a readable \.npy"
    elif kind == "no-magic":
        data = b"PK" + good_npy[2:]
        pattern = r"not a readable \.npy"
    elif kind == "trailing-bytes":
        data = good_npy + b"\0" * 64
        pattern = r"its header gives \d+ bytes of data, its zip entry declares \d+"
    else:
        data = good_npy[:-4]
        pattern = r"its header gives \d+ bytes of data"
    p = save(tmp_path, f"{kind}.xcr", bundle_bytes(manifest, _npz_members(arrays, {key: data})))
    refused(p, pattern)


def test_inner_member_names_counts_and_duplicates(good, tmp_path):
    path, manifest, arrays = good
    k0 = sorted(arrays)[0]
    cases = {
        "traversal": (_npz_members({k: a for k, a in arrays.items() if k != k0},
                                   extra=(member("../" + k0 + ".npy", npy(arrays[k0])),)),
                      r"member '\.\./.*' has a path outside outputs\.npz"),
        "absolute": (_npz_members(arrays, extra=(member("/etc/x.npy", b""),)), r"path outside outputs\.npz"),
        "duplicate": (_npz_members(arrays, extra=(member(k0 + ".npy", npy(arrays[k0])),)),
                      r"appears more than once"),
        "not-npy": (_npz_members(arrays, extra=(member("notes.txt", b"hi"),)), r"does not list: \['notes.txt'\]"),
        "many": (_npz_members(arrays, extra=tuple(member(f"{n:05d}.grad_bias.npy", b"") for n in range(3000))),
                 r"lists \d+ members \(at most \d+ are allowed\)"),
        "forged-count": (write_zip([member(k + ".npy", npy(a)) for k, a in arrays.items()], count=60000),
                         r"lists 60000 members"),
    }
    for kind, (npz, pattern) in cases.items():
        refused(save(tmp_path, f"inner-{kind}.xcr", bundle_bytes(manifest, npz)), pattern)


def test_outer_member_names_counts_methods_and_flags(good, tmp_path):
    path, manifest, arrays = good
    npz = npz_bytes(arrays)
    text = json.dumps(edited(manifest, lambda m: m.__setitem__(
        "members", {"outputs.npz": {"sha256": hashlib.sha256(npz).hexdigest(), "size": len(npz)}}))).encode()
    base = [member("manifest.json", text), member("outputs.npz", npz)]
    cases = {
        "duplicate": (write_zip([*base, member("manifest.json", b"{}")]), r"'manifest.json' appears more than once"),
        "traversal": (write_zip([*base, member("../../evil.npy", b"x")]), r"path outside the bundle"),
        "drive": (write_zip([*base, member("C:/evil", b"x")]), r"path outside the bundle"),
        "many": (write_zip([*base, *(member(f"m{n}", b"") for n in range(5000))]), r"lists 5002 members"),
        "forged-count": (write_zip(base, count=65000), r"lists 65000 members"),
        "bzip2": (write_zip([base[0], member("outputs.npz", npz, method=zipfile.ZIP_BZIP2)]),
                  r"compression method 12"),
        "encrypted": (write_zip([base[0], member("outputs.npz", npz, flags=1)]), r"is encrypted"),
        "manifest-too-big": (write_zip([member("manifest.json", payload=deflated_zeros(1 << 20)[0],
                                               size=xbundle.MAX_MANIFEST_BYTES + 1, method=zipfile.ZIP_DEFLATED),
                                        base[1]]), r"'manifest.json' declares \d+ bytes \(limit"),
        "crc": (write_zip([base[0], member("outputs.npz", payload=npz, size=len(npz), crc=1)]), r"corrupt.*CRC"),
        "short": (write_zip([base[0], member("outputs.npz", payload=npz[:-10], size=len(npz),
                                             crc=zlib.crc32(npz[:-10]))]),
                  r"corrupt or truncated: its data ends after"),
    }
    for kind, (blob, pattern) in cases.items():
        refused(save(tmp_path, f"outer-{kind}.xcr", blob), pattern)


# ---------------------------------------------------------------------------------------------
# What compare prints from a bundle


def test_names_with_control_characters_are_refused(good, tmp_path):
    path, manifest, arrays = good
    for field, value in (("device", "gpu\x1b]0;owned\x07"), ("created", "2026\r"), ("xconv_version", "1\x9b2J")):
        m = edited(manifest, _set(field, value))
        refused(save(tmp_path, f"{field}.xcr", bundle_bytes(m, npz_bytes(arrays))),
                field + r" .* is not a string without control characters")


def test_compare_prints_messages_with_control_characters_escaped(good, tmp_path, capsys):
    path, manifest, arrays = good
    m = edited(manifest, lambda m: (m["cases"][0].update(status="failed", message="boom\x1b[2J\nline two"),
                                    m["cases"][1].update(status="refused", message="no\x07")))
    p = save(tmp_path, "escapes.xcr", bundle_bytes(m, npz_bytes(arrays)))
    capsys.readouterr()
    assert cli.main(["compare", p]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert r"boom\x1b[2J\nline two" in out and r"no\x07" in out


def test_the_writer_refuses_a_manifest_its_reader_would_refuse(good, tmp_path):
    path, manifest, arrays = good
    bad = edited(manifest, _set("cases.0.status", "exploded"))
    target = tmp_path / "never.xcr"
    with pytest.raises(xbundle.BundleError, match=r"not written: .*cases\[0\]\.status 'exploded'"):
        xbundle.write_bundle(str(target), bad, arrays)
    assert not target.exists() and not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Sweeps: every field given a wrong type, random damage to the members; only BundleError, or a sound load


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from _paths(v, path + (i,))


def test_every_manifest_field_with_a_wrong_type_is_refused_or_harmless(good, tmp_path, capsys):
    """A manifest that loads must also compare and report without an exception."""
    path, manifest, arrays = good
    npz = npz_bytes(arrays)
    base = signed(manifest, npz)
    reference = xbundle.load_bundle(path)
    loaded = 0
    for where in list(_paths(base))[1:]:
        for value in (12345, ["x"], {"a": 1}, None):
            m = json.loads(json.dumps(base))
            target = m
            for k in where[:-1]:
                target = target[k]
            target[where[-1]] = value
            p = save(tmp_path, "sweep.xcr", bundle_bytes(m, npz, fix_sha=False))
            try:
                b = xbundle.load_bundle(p)
            except xbundle.BundleError:
                continue
            loaded += 1
            cmp = xcompare.compare_bundles([reference, b])
            xcompare.format_comparison(cmp, show_all=True)
            xreport.html_report("sweep", xcompare.report_runs(cmp))
    assert 0 < loaded                       # fields no code reads (e.g. "seconds" given null) do load


def test_random_damage_inside_the_members_gives_a_bundle_error_or_a_sound_load(good, tmp_path):
    """Bytes changed or cut inside manifest.json, or inside outputs.npz under a manifest recording its new sha256."""
    path, manifest, arrays = good
    with zipfile.ZipFile(path) as zf:
        text, npz = zf.read("manifest.json"), zf.read("outputs.npz")
    rng = np.random.default_rng(13)
    outcomes = set()
    for trial in range(300):
        in_manifest = trial % 2 == 0
        damaged = bytearray(text if in_manifest else npz)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(damaged)))
            if rng.random() < 0.7:
                damaged[i] = int(rng.choice(list(b'[{",1\\\0') + [int(rng.integers(256))]))
            else:
                del damaged[i:i + int(rng.integers(1, 16))]
        if in_manifest:
            members = [member("manifest.json", bytes(damaged)), member("outputs.npz", npz)]
        else:
            members = [member("manifest.json", json.dumps(signed(manifest, bytes(damaged))).encode()),
                       member("outputs.npz", bytes(damaged))]
        p = save(tmp_path, "damaged.xcr", write_zip(members))
        try:
            xbundle.load_bundle(p)
            outcomes.add("loaded")
        except xbundle.BundleError as exc:
            outcomes.add(str(exc)[len(p) + 2:][:24])
    assert len(outcomes) > 5, outcomes
