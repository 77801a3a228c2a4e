"""Resource guards: a call whose memory would not fit is refused, with the bytes it needs, before allocating.

The limit is ``$XCONV_MEMORY_LIMIT`` (bytes; suffixes K, M, G, T for powers of 1024) when set,
else the memory the operating system reports available now (``MemAvailable`` of /proc/meminfo,
else ``sysconf`` available pages), else no limit. The core checks each call's outputs and the
copies it makes itself (explicit padding, converted inputs) against it (:func:`check_call`);
backends check their own scratch with :func:`require`. Without the variable, requests below
:data:`UNCHECKED_BYTES` (64 MiB) are let through unchecked. Sizes beyond int64 are refused by
:mod:`xconv.params` whatever the limit.
"""

from __future__ import annotations

import math
import os

from .errors import ResourceError, ShapeError

ENV = "XCONV_MEMORY_LIMIT"
#: Without $XCONV_MEMORY_LIMIT, requests below this many bytes are not checked against the available
#: memory (reading it costs a file read per check; a call this small fits any machine xconv runs on).
UNCHECKED_BYTES = 64 << 20
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_limit() -> int | None:
    """The bytes one call may allocate: $XCONV_MEMORY_LIMIT, else the available memory, else None (unknown)."""
    text = os.environ.get(ENV, "").strip()
    if text:
        unit = text[-1].upper() if text[-1].isalpha() else ""
        number = text[:-1] if unit else text
        if unit.endswith("B"):
            unit = ""
        try:
            value = int(float(number) * _SUFFIXES[unit])
        except (KeyError, ValueError):
            raise ShapeError(ENV, "must be a number of bytes, optionally with a K, M, G or T suffix",
                             expected="e.g. 8G or 8589934592", given=repr(text)) from None
        return max(value, 0)
    return available_memory()


def available_memory() -> int | None:
    """Memory available to new allocations now, as the operating system reports it (None if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def require(nbytes: int, what: str) -> None:
    """Raise ResourceError when ``nbytes`` (needed at once by ``what``) exceed the memory limit."""
    if nbytes < UNCHECKED_BYTES and not os.environ.get(ENV):
        return
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        raise ResourceError(what, int(nbytes), limit, f"set ${ENV} to change the limit")


def nbytes(shape, itemsize: int) -> int:
    return math.prod(shape) * itemsize


def check_call(itemsize: int, outputs, extra: int = 0, what: str = "") -> None:
    """Refuse a call whose ``outputs`` (shapes) plus ``extra`` bytes (the core's own copies) exceed the limit."""
    total = sum(nbytes(s, itemsize) for s in outputs) + extra
    shapes = ", ".join(str(tuple(s)) for s in outputs)
    require(total, what or f"the outputs {shapes}")
