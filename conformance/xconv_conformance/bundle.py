"""Portable result bundles (``.xcr``): what one machine computed, to be held against another's.

A bundle is a zip archive (stored, not compressed) with exactly two members:

- ``manifest.json``: format and version, xconv and kit versions, the backend (name, version,
  devices), library versions, device name, platform, creation date, the corpus hash and case
  ids, one record per case (status, message, worst error/bound, case and input digests, the
  result keys, dtypes and shapes; crashed and timed-out cases add ``signal`` and ``stderr``) and the SHA-256 and size of every other member;
- ``outputs.npz``: the results as plain arrays (bfloat16 stored as its uint16 bit pattern).

A bundle comes from another machine: :func:`load_bundle` treats it as hostile. Nothing in it is
unpickled or executed, and nothing is inflated past limits fixed before reading
(:mod:`.safezip`): each member's declared size is checked against its limit and against a budget
for the whole load (:data:`MAX_EXPANSION` times the file's size, plus :data:`EXPANSION_FLOOR`),
then read in counted chunks that stop at the declared size. The manifest is checked against its
schema (:mod:`.manifest_schema`) before anything reads it; each array's ``.npy`` header is
parsed on its own and must give exactly the dtype and shape the manifest records before its data
is read. Anything that does not fit is a :class:`BundleError` naming the file and the problem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tempfile
import zipfile

import numpy as np
from numpy.lib import format as npy_format

from xconv.dtypes import DTYPES
from xconv.errors import XconvError

from .manifest_schema import (FORMAT, FORMAT_VERSION, STATUSES, STORED_DTYPES, ManifestError, array_bytes,
                              check_manifest, parse_manifest)
from .safezip import ArchiveError, Budget, CountingReader, open_archive, read_member
from .tolerance import OUTPUTS

MANIFEST = "manifest.json"
OUTPUTS_MEMBER = "outputs.npz"
MEMBERS = (MANIFEST, OUTPUTS_MEMBER)
MAX_MANIFEST_BYTES = 32 << 20       # manifest.json (the whole corpus needs ~0.5 MiB)
MAX_OUTPUTS_BYTES = 1 << 30         # outputs.npz, and the arrays in it (the whole corpus needs ~8 MiB)
MAX_EXPANSION = 32                  # everything a load inflates, at most this times the file's size ...
EXPANSION_FLOOR = 16 << 20          # ... plus this (a stored bundle needs about twice its size)
MAX_NPY_HEADER = 4096               # bytes of one .npy header (np.save writes 128)
_SLACK = 16                         # members beyond the expected ones that are still listed by name, not counted

__all__ = ["Bundle", "BundleError", "FORMAT", "FORMAT_VERSION", "STATUSES", "build", "load_bundle", "write_bundle"]


class BundleError(XconvError, ValueError):
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
    try:
        check_manifest(json.loads(text))
    except ManifestError as exc:
        raise BundleError(f"{path}: not written: its {MANIFEST} would be refused on reading: {exc}") from None
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
    if not os.path.exists(path):
        raise BundleError(f"{where}: no such file")
    if not os.path.isfile(path):
        raise BundleError(f"{where}: not a regular file")
    try:
        with open(path, "rb") as f:
            manifest, npz = _read_members(f)
    except OSError as exc:
        raise BundleError(f"{where}: cannot be read: {exc}") from None
    except ArchiveError as exc:
        raise BundleError(f"{where}: {exc}") from None
    except ManifestError as exc:
        raise BundleError(f"{where}: {MANIFEST}: {exc}") from None
    recorded = manifest["members"][OUTPUTS_MEMBER]
    actual = hashlib.sha256(npz).hexdigest()
    if actual != recorded["sha256"] or len(npz) != recorded["size"]:
        raise BundleError(f"{where}: {OUTPUTS_MEMBER} does not match the manifest (sha256 {actual[:16]}..., "
                          f"{len(npz)} bytes; the manifest records {recorded['sha256'][:16]}..., "
                          f"{recorded['size']} bytes): the bundle was modified or corrupted")
    try:
        arrays = _read_arrays(npz, manifest)
    except ArchiveError as exc:
        raise BundleError(f"{where}: {exc}") from None
    return Bundle(manifest, arrays, where)


def _read_members(f) -> tuple[dict, bytes]:
    """(checked manifest, outputs.npz bytes) from the open bundle file ``f``.

    One budget covers the load: the manifest's and outputs.npz's declared sizes, and the bytes of
    the arrays the manifest lists (reserved before outputs.npz is read; :func:`_read_array` then
    holds each array to exactly its manifest dtype and shape).
    """
    zf = open_archive(f, "the bundle", max_members=len(MEMBERS) + _SLACK,
                      max_member_bytes={MANIFEST: MAX_MANIFEST_BYTES, OUTPUTS_MEMBER: MAX_OUTPUTS_BYTES})
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        unexpected = sorted(set(infos) - set(MEMBERS))
        if unexpected:
            raise ArchiveError(f"unexpected members {unexpected} (a bundle holds only {list(MEMBERS)})")
        missing = [m for m in MEMBERS if m not in infos]
        if missing:
            raise ArchiveError(f"missing members {missing}")
        budget = Budget(EXPANSION_FLOOR + MAX_EXPANSION * f.seek(0, 2))
        manifest = parse_manifest(read_member(zf, infos[MANIFEST], budget, MANIFEST))
        declared = array_bytes(manifest)
        if declared > MAX_OUTPUTS_BYTES:
            raise ManifestError(f"its arrays would take {declared} bytes (limit {MAX_OUTPUTS_BYTES})")
        budget.reserve(declared, f"the arrays listed in {MANIFEST}")
        npz = read_member(zf, infos[OUTPUTS_MEMBER], budget, OUTPUTS_MEMBER)
    return manifest, npz


def _read_arrays(npz: bytes, manifest: dict) -> dict:
    """The arrays the manifest lists, read from ``npz`` (an .npz archive's bytes) and nothing else."""
    expected = {e["key"]: e for rec in manifest["cases"] for e in rec["outputs"].values()}
    zf = open_archive(io.BytesIO(npz), OUTPUTS_MEMBER, max_members=len(expected) + _SLACK,
                      max_member_bytes=MAX_OUTPUTS_BYTES)
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        present = {name[:-4] for name in infos if name.endswith(".npy")}
        unexpected = sorted(set(infos) - {k + ".npy" for k in expected})
        if unexpected:
            raise ArchiveError(f"{OUTPUTS_MEMBER} holds arrays the manifest does not list: {unexpected[:5]}")
        missing = sorted(set(expected) - present)
        if missing:
            raise ArchiveError(f"{OUTPUTS_MEMBER} lacks arrays the manifest lists: {missing[:5]}")
        return {key: _read_array(zf, infos[key + ".npy"], entry) for key, entry in expected.items()}


def _read_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo, entry: dict) -> np.ndarray:
    """One .npy member: its header must give the manifest's dtype and shape before its data is read."""
    what = f"{OUTPUTS_MEMBER}: array {info.filename[:-4]}"
    want = np.dtype(STORED_DTYPES[entry["dtype"]])
    with CountingReader.open(zf, info, what) as reader:
        dtype, shape, fortran = _read_npy_header(reader, what)
        if dtype.hasobject or dtype.kind != want.kind or dtype.itemsize != want.itemsize or dtype.fields \
                or dtype.subdtype:
            raise ArchiveError(f"{what} has dtype {dtype}, expected {want} for {entry['dtype']}"
                               + (" (refused: reading it would need unpickling)" if dtype.hasobject else ""))
        if list(shape) != entry["shape"]:
            raise ArchiveError(f"{what} has shape {list(shape)}, the manifest records {entry['shape']}")
        count = int(np.prod(shape, dtype=object))
        if reader.count + count * want.itemsize != info.file_size:
            raise ArchiveError(f"{what}: its header gives {count * want.itemsize} bytes of data, its zip entry "
                               f"declares {info.file_size - reader.count}")
        a = np.empty(count, dtype=want)
        reader.readinto(memoryview(a).cast("B"))
        reader.finish()
    if not dtype.isnative and want.itemsize > 1:
        a.byteswap(inplace=True)
    return a.reshape(shape, order="F" if fortran else "C")


def _read_npy_header(reader: CountingReader, what: str) -> tuple:
    """(dtype, shape, fortran_order) from a .npy stream, reading only its magic string and header."""
    try:
        version = npy_format.read_magic(reader)
        if version not in ((1, 0), (2, 0)):
            raise ArchiveError(f"{what}: .npy format version {version} is not read")
        read = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran, dtype = read(reader, max_header_size=MAX_NPY_HEADER)
    except ArchiveError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy raises ValueError, SyntaxError, TypeError... for a bad header
        raise ArchiveError(f"{what} is not a readable .npy array: {type(exc).__name__}: {exc}") from None
    return np.dtype(dtype), tuple(shape), bool(fortran)
