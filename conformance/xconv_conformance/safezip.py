"""Reading a zip archive that came from another machine, within limits fixed before a byte is inflated.

A hostile archive can claim any size in its headers, hold a deflate stream that inflates a
thousandfold, end early, list thousands of entries or names that climb out of a directory. This
module reads one only through checks that make none of that costly:

- :func:`open_archive` requires the end-of-central-directory record to close the file exactly
  (no archive comment, no ZIP64 records, no bytes before the first entry, the central directory
  right before it): a file cut short is refused as truncated even when its new last bytes happen
  to be another archive's end record (a bundle cut by its 22-byte end record ends with its inner
  ``.npz``'s). The entry count and the central directory's size are checked before zipfile parses
  them; then every name must be a plain relative path, unique, unencrypted, stored or deflated,
  and declare at most its limit.
- :func:`read_member` and :class:`CountingReader` read a member in bounded chunks charged to a
  :class:`Budget`: the declared size is reserved before the first byte is read, and reading stops
  with an error as soon as the inflated bytes would pass the declared size, or when they end short
  of it (zipfile's CRC-32 check applies on top).

Every problem is an :class:`ArchiveError` whose message says what is wrong; the caller adds where.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib

from xconv.errors import XconvError

CHUNK = 1 << 20                       # bytes read (and inflated) per step
_END = struct.Struct("<4s4H2LH")      # signature, disk, cd disk, entries here, entries, cd size, cd offset, comment
_END_SIG = b"PK\x05\x06"
_LOCAL_SIG = b"PK\x03\x04"
_CD_ENTRY_MAX = 46 + 1024             # a central-directory entry: fixed part plus room for a name and extras
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(XconvError, ValueError):
    """An archive is truncated, corrupt, or breaks a limit; the message says which (the caller says where)."""


class Budget:
    """The bytes one load may inflate to, in all: each read reserves its declared size first."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0

    def reserve(self, nbytes: int, what: str) -> None:
        if nbytes > self.limit - self.used:
            raise ArchiveError(f"{what} would inflate to {nbytes} bytes, which with the {self.used} bytes already "
                               f"read passes this load's limit of {self.limit} bytes (refused before reading)")
        self.used += nbytes


def open_archive(fileobj, what: str, max_members: int, max_member_bytes: dict | int) -> zipfile.ZipFile:
    """A ZipFile over seekable ``fileobj`` once its layout and every entry pass the checks above.

    ``max_member_bytes``: one limit for every member, or {name: limit} (a name not in it is refused).
    """
    size = fileobj.seek(0, 2)
    count = _check_layout(fileobj, size, what, max_members)
    try:
        zf = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError,
            struct.error) as exc:
        raise ArchiveError(f"{what} is a corrupt zip archive: {exc}") from None
    infos = zf.infolist()
    if len(infos) != count:
        raise ArchiveError(f"{what} is corrupt: its end record counts {count} entries, its directory lists "
                           f"{len(infos)}")
    seen = set()
    for info in infos:
        name = info.filename
        if (not name or name.startswith(("/", "\\")) or "\\" in name or "\0" in name
                or ".." in name.split("/") or _DRIVE.match(name)):
            raise ArchiveError(f"member {name!r} has a path outside {what}")
        if name in seen:
            raise ArchiveError(f"{what}: member {name!r} appears more than once")
        seen.add(name)
        if info.flag_bits & 0x1:
            raise ArchiveError(f"{what}: member {name!r} is encrypted")
        if info.compress_type not in _METHODS:
            raise ArchiveError(f"{what}: member {name!r} uses compression method {info.compress_type}; only "
                               f"stored and deflated members are read")
        limit = max_member_bytes if isinstance(max_member_bytes, int) else max_member_bytes.get(name)
        if limit is not None and info.file_size > limit:
            raise ArchiveError(f"{what}: member {name!r} declares {info.file_size} bytes (limit {limit})")
    return zf


def _check_layout(f, size: int, what: str, max_members: int) -> int:
    """The entry count, once the end record is known to close the file and frame the central directory."""
    if size < _END.size:
        raise ArchiveError(f"{what} is not a zip archive ({size} bytes: too short even for an empty one)")
    f.seek(0)
    starts_as_zip = f.read(4) in (_LOCAL_SIG, _END_SIG)
    f.seek(size - _END.size)
    sig, disk, cd_disk, here, count, cd_size, cd_offset, comment = _END.unpack(f.read(_END.size))
    if sig != _END_SIG:
        if starts_as_zip:
            raise ArchiveError(f"{what} is corrupt or truncated: it begins as a zip archive but does not end with "
                               "a zip end record (a cut-off copy or download?)")
        raise ArchiveError(f"{what} is not a zip archive")
    if comment:
        raise ArchiveError(f"{what}: corrupt end record (comment length {comment} but the file ends there)")
    if disk or cd_disk or here != count:
        raise ArchiveError(f"{what}: multi-volume zip archives are not read")
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        raise ArchiveError(f"{what}: ZIP64 end records are not read (a bundle never needs them)")
    if cd_offset + cd_size != size - _END.size:
        raise ArchiveError(f"{what} is corrupt or truncated: its end record places the central directory at "
                           f"bytes {cd_offset}..{cd_offset + cd_size} of a {size}-byte file, not right before the "
                           "end record (bytes cut off or added, or the end record of an archive inside it)")
    if count and not starts_as_zip:
        raise ArchiveError(f"{what} is corrupt: it does not begin with a zip entry")
    if count > max_members:
        raise ArchiveError(f"{what} lists {count} members (at most {max_members} are allowed)")
    if cd_size > count * _CD_ENTRY_MAX:
        raise ArchiveError(f"{what}: its central directory claims {cd_size} bytes for {count} entries")
    return count


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget, what: str) -> bytes:
    """All of one member's bytes: exactly its declared size, reserved in ``budget`` before reading."""
    budget.reserve(info.file_size, what)
    out = bytearray(info.file_size)
    with CountingReader.open(zf, info, what) as reader:
        reader.readinto(memoryview(out))
        reader.finish()
    return bytes(out)


class CountingReader:
    """A member's inflated bytes, read in chunks and counted: never past the declared size, nor short of it."""

    def __init__(self, stream, declared: int, what: str):
        self.stream, self.declared, self.what, self.count = stream, declared, what, 0

    @classmethod
    def open(cls, zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> CountingReader:
        try:
            return cls(zf.open(info), info.file_size, what)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError, zlib.error,
                struct.error) as exc:
            raise ArchiveError(f"{what} is corrupt: {exc}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stream.close()

    def _chunk(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error) as exc:
            raise ArchiveError(f"{self.what} is corrupt after {self.count} bytes: {exc}") from None

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes (the next ones), or an ArchiveError."""
        out = bytearray(n)
        self.readinto(memoryview(out))
        return bytes(out)

    def readinto(self, view: memoryview) -> None:
        """Fill ``view`` (bytes) from the member, or raise: past the declared size, or the data ends first."""
        n = view.nbytes
        if n > self.declared - self.count:
            raise ArchiveError(f"{self.what}: reading {n} bytes at byte {self.count} would pass the "
                               f"{self.declared} bytes its header declares")
        view = view.cast("B")
        done = 0
        while done < n:
            data = self._chunk(min(CHUNK, n - done))
            if not data:
                raise ArchiveError(f"{self.what} is corrupt or truncated: its data ends after {self.count} bytes; "
                                   f"its header declares {self.declared}")
            view[done:done + len(data)] = data
            done += len(data)
            self.count += len(data)

    def finish(self) -> None:
        """Confirm the member ends at its declared size (zipfile checks its CRC-32 there)."""
        if self.count != self.declared:
            raise ArchiveError(f"{self.what}: {self.declared - self.count} of its {self.declared} declared bytes "
                               "were not accounted for")
        if self._chunk(1):
            raise ArchiveError(f"{self.what} holds more data than the {self.declared} bytes its header declares")
