"""Portable result bundles (``.xcr``): what one machine computed, to be held against another's.

A bundle is a zip archive (stored, not compressed) with exactly two members:

- ``manifest.json``: format and version, xconv and kit versions, the backend (name, version,
  devices), library versions, device name, platform, creation date, the corpus hash and case
  ids, one record per case (status, message, worst error/bound, case and input digests, the
  result keys, dtypes and shapes; crashed and timed-out cases add ``signal`` and ``stderr``) and the SHA-256 and size of every other member;
- ``outputs.npz``: the results as plain arrays (bfloat16 stored as its uint16 bit pattern).

Nothing in a bundle is ever unpickled or executed: the arrays are read with
``numpy.load(..., allow_pickle=False)``, and :func:`load_bundle` rejects anything that does not
fit the format (not a zip, truncated, unexpected or path-escaping members, a member whose
SHA-256 differs from the manifest, object or unexpected dtypes, shapes that differ from the
manifest) with a :class:`BundleError` that names the problem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import tempfile
import zipfile

import numpy as np

from xconv.dtypes import DTYPES

from .tolerance import OUTPUTS

FORMAT = "xconv-conformance-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OUTPUTS_MEMBER = "outputs.npz"
MEMBERS = (MANIFEST, OUTPUTS_MEMBER)
MAX_MEMBER_BYTES = 4 << 30          # refuse members that claim more than 4 GiB uncompressed
MAX_MANIFEST_BYTES = 256 << 20
_STORED_DTYPES = {"float16": "float16", "bfloat16": "uint16", "float32": "float32", "float64": "float64"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEY = re.compile(r"^[0-9]{5}\.(grad_input|grad_weight|grad_bias)$")
STATUSES = ("passed", "failed", "crashed", "timed_out", "refused", "unavailable")


class BundleError(Exception):
    """A bundle is malformed, truncated or tampered with; the message names the file and the problem."""


@dataclasses.dataclass
class Bundle:
    """A loaded (and verified) bundle."""

    manifest: dict
    arrays: dict
    path: str = ""

    @property
    def backend(self) -> str:
        return self.manifest["backend"]["name"]

    @property
    def label(self) -> str:
        return f"{self.backend}@{self.manifest.get('device', '?')}"

    def records(self) -> dict:
        return {r["id"]: r for r in self.manifest["cases"]}

    def output(self, record: dict, name: str):
        """The result ``name`` of a case record as an array of its case dtype, or None."""
        entry = (record.get("outputs") or {}).get(name)
        if entry is None:
            return None
        a = self.arrays[entry["key"]]
        return a.view(DTYPES["bfloat16"]) if entry["dtype"] == "bfloat16" else a


# ---------------------------------------------------------------------------------------------
# Writing


def _stored(a: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint16) if dtype == "bfloat16" else a


def build(manifest: dict, case_rows: list[tuple]) -> tuple[dict, dict]:
    """(manifest with case records, arrays) from (case, outcome, input digest) rows."""
    arrays: dict = {}
    records = []
    for i, (case, outcome, input_digest) in enumerate(case_rows):
        rec = outcome.summary()
        rec.pop("backend", None)
        rec.update(spec_digest=case.digest, input_digest=input_digest, dtype=case.dtype, kind=case.kind,
                   outputs={})
        for name, arr in zip(OUTPUTS, outcome.outputs or (None, None, None)):
            if arr is None:
                continue
            key = f"{i:05d}.{name}"
            arrays[key] = _stored(arr, case.dtype)
            rec["outputs"][name] = {"key": key, "dtype": case.dtype, "shape": list(arr.shape)}
        records.append(rec)
    manifest = dict(manifest, cases=records)
    return manifest, arrays


def write_bundle(path: str, manifest: dict, arrays: dict) -> None:
    """Write ``manifest`` and ``arrays`` as an .xcr bundle at ``path`` (atomically)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz = buf.getvalue()
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION,
                    members={OUTPUTS_MEMBER: {"sha256": hashlib.sha256(npz).hexdigest(), "size": len(npz)}})
    text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False).encode()
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".xcr-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr(zipfile.ZipInfo(MANIFEST, date_time=(1980, 1, 1, 0, 0, 0)), text)
            zf.writestr(zipfile.ZipInfo(OUTPUTS_MEMBER, date_time=(1980, 1, 1, 0, 0, 0)), npz)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# Loading


def load_bundle(path: str) -> Bundle:
    """Read and verify an .xcr bundle; BundleError naming the problem when it is not a sound one."""
    where = str(path)
    if not os.path.isfile(path):
        raise BundleError(f"{where}: no such file")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"{where}: not an .xcr bundle: not a zip archive (a truncated download, or another kind "
                          "of file)")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            for name in names:
                if (name.startswith(("/", "\\")) or "\\" in name or ".." in name.split("/")
                        or re.match(r"^[A-Za-z]:", name)):
                    raise BundleError(f"{where}: member {name!r} has a path outside the bundle")
            if len(set(names)) != len(names):
                raise BundleError(f"{where}: duplicate members {sorted({n for n in names if names.count(n) > 1})}")
            unexpected = sorted(set(names) - set(MEMBERS))
            if unexpected:
                raise BundleError(f"{where}: unexpected members {unexpected} (a bundle holds only {list(MEMBERS)})")
            missing = [m for m in MEMBERS if m not in names]
            if missing:
                raise BundleError(f"{where}: missing members {missing}")
            for info in infos:
                if info.flag_bits & 0x1:
                    raise BundleError(f"{where}: member {info.filename!r} is encrypted")
                limit = MAX_MANIFEST_BYTES if info.filename == MANIFEST else MAX_MEMBER_BYTES
                if info.file_size > limit:
                    raise BundleError(f"{where}: member {info.filename!r} claims {info.file_size} bytes "
                                      f"(limit {limit})")
            manifest_bytes = zf.read(MANIFEST)
            npz_bytes = zf.read(OUTPUTS_MEMBER)
    except BundleError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise BundleError(f"{where}: corrupt or truncated zip archive: {exc}") from None
    try:
        manifest = json.loads(manifest_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{where}: {MANIFEST} is not valid JSON: {exc}") from None
    _check_manifest(manifest, where)
    recorded = manifest["members"][OUTPUTS_MEMBER]
    actual = hashlib.sha256(npz_bytes).hexdigest()
    if actual != recorded["sha256"] or len(npz_bytes) != recorded["size"]:
        raise BundleError(f"{where}: {OUTPUTS_MEMBER} does not match the manifest (sha256 {actual[:16]}..., "
                          f"{len(npz_bytes)} bytes; the manifest records {recorded['sha256'][:16]}..., "
                          f"{recorded['size']} bytes): the bundle was modified or corrupted")
    arrays = _load_arrays(npz_bytes, manifest, where)
    return Bundle(manifest, arrays, where)


def _fail(where: str, what: str):
    raise BundleError(f"{where}: {MANIFEST}: {what}")


def _check_manifest(m, where: str) -> None:
    if not isinstance(m, dict):
        _fail(where, "is not a JSON object")
    if m.get("format") != FORMAT:
        _fail(where, f"format is {m.get('format')!r}, not {FORMAT!r} (not an xconv conformance bundle)")
    if m.get("format_version") != FORMAT_VERSION:
        _fail(where, f"format_version {m.get('format_version')!r} is not supported (this kit reads "
                     f"{FORMAT_VERSION})")
    for key, kind in (("xconv_version", str), ("kit_version", str), ("backend", dict), ("libraries", dict),
                      ("device", str), ("platform", dict), ("created", str), ("corpus", dict), ("cases", list),
                      ("members", dict)):
        if not isinstance(m.get(key), kind):
            _fail(where, f"{key!r} is missing or not a {kind.__name__}")
    if not isinstance(m["backend"].get("name"), str) or not m["backend"]["name"]:
        _fail(where, "backend.name is missing")
    corpus = m["corpus"]
    if not isinstance(corpus.get("hash"), str) or not _HEX64.match(corpus["hash"]):
        _fail(where, "corpus.hash is not a SHA-256")
    if not isinstance(corpus.get("case_ids"), list) or not all(isinstance(c, str) for c in corpus["case_ids"]):
        _fail(where, "corpus.case_ids is not a list of strings")
    member = m["members"].get(OUTPUTS_MEMBER)
    if (not isinstance(member, dict) or not isinstance(member.get("sha256"), str)
            or not _HEX64.match(member["sha256"]) or not isinstance(member.get("size"), int)):
        _fail(where, f"members[{OUTPUTS_MEMBER!r}] lacks its sha256 and size")
    if set(m["members"]) != {OUTPUTS_MEMBER}:
        _fail(where, f"members lists {sorted(m['members'])}, expected [{OUTPUTS_MEMBER!r}]")
    ids = []
    for n, rec in enumerate(m["cases"]):
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            _fail(where, f"case record {n} has no id")
        cid = rec["id"]
        if rec.get("status") not in STATUSES:
            _fail(where, f"case {cid}: status {rec.get('status')!r} is not one of {STATUSES}")
        for key in ("spec_digest", "input_digest"):
            if not isinstance(rec.get(key), str) or not _HEX64.match(rec[key]):
                _fail(where, f"case {cid}: {key} is not a SHA-256")
        if rec.get("dtype") not in _STORED_DTYPES:
            _fail(where, f"case {cid}: dtype {rec.get('dtype')!r} is not one of {list(_STORED_DTYPES)}")
        outputs = rec.get("outputs")
        if not isinstance(outputs, dict) or set(outputs) - set(OUTPUTS):
            _fail(where, f"case {cid}: outputs must map some of {list(OUTPUTS)} to arrays")
        for name, entry in outputs.items():
            if (not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not _KEY.match(entry["key"])
                    or entry.get("dtype") != rec["dtype"] or not isinstance(entry.get("shape"), list)
                    or not all(isinstance(s, int) and s >= 0 for s in entry["shape"])):
                _fail(where, f"case {cid}: output {name} entry is malformed: {entry!r}")
        ids.append(cid)
    if len(set(ids)) != len(ids):
        _fail(where, "case ids repeat")
    if ids != corpus["case_ids"]:
        _fail(where, "the case records do not match corpus.case_ids")


def _load_arrays(npz_bytes: bytes, manifest: dict, where: str) -> dict:
    expected = {}
    for rec in manifest["cases"]:
        for entry in rec["outputs"].values():
            if entry["key"] in expected:
                raise BundleError(f"{where}: {MANIFEST}: output key {entry['key']} is used twice")
            expected[entry["key"]] = entry
    try:
        npz = np.load(io.BytesIO(npz_bytes), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises several kinds for a bad archive
        raise BundleError(f"{where}: {OUTPUTS_MEMBER} is not a readable .npz archive: {exc}") from None
    with npz:
        present = set(npz.files)
        unexpected = sorted(present - set(expected))
        if unexpected:
            raise BundleError(f"{where}: {OUTPUTS_MEMBER} holds arrays the manifest does not list: {unexpected[:5]}")
        missing = sorted(set(expected) - present)
        if missing:
            raise BundleError(f"{where}: {OUTPUTS_MEMBER} lacks arrays the manifest lists: {missing[:5]}")
        arrays = {}
        for key, entry in expected.items():
            try:
                a = npz[key]
            except ValueError as exc:
                raise BundleError(f"{where}: {OUTPUTS_MEMBER}: array {key} cannot be loaded without unpickling "
                                  f"(refused): {exc}") from None
            except Exception as exc:  # noqa: BLE001
                raise BundleError(f"{where}: {OUTPUTS_MEMBER}: array {key} is unreadable: {exc}") from None
            want = np.dtype(_STORED_DTYPES[entry["dtype"]])
            if a.dtype.hasobject or a.dtype != want:
                raise BundleError(f"{where}: {OUTPUTS_MEMBER}: array {key} has dtype {a.dtype}, expected {want} "
                                  f"for {entry['dtype']}")
            if list(a.shape) != entry["shape"]:
                raise BundleError(f"{where}: {OUTPUTS_MEMBER}: array {key} has shape {list(a.shape)}, the manifest "
                                  f"records {entry['shape']}")
            arrays[key] = a
    return arrays
