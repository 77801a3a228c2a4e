"""Resource guards: a call whose memory would not fit is refused, with the bytes it needs, before allocating.

The limit is ``$XCONV_MEMORY_LIMIT`` (bytes, as :mod:`xconv.units` reads them: ``8G``, ``512MiB``;
units are powers of 1024; read through :mod:`xconv.settings`) when set,
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

from . import settings
from .errors import ResourceError

ENV = "XCONV_MEMORY_LIMIT"
#: Without $XCONV_MEMORY_LIMIT, requests below this many bytes are not checked against the available
#: memory (reading it costs a file read per check; a call this small fits any machine xconv runs on).
UNCHECKED_BYTES = 64 << 20


def memory_limit() -> int | None:
    """The bytes one call may allocate: $XCONV_MEMORY_LIMIT, else the available memory, else None (unknown)."""
    limit = settings.current().memory_limit
    return available_memory() if limit is None else limit


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
    if nbytes < UNCHECKED_BYTES and settings.current().memory_limit is None:
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
    if not what:
        what = f"the outputs {shapes}"
        if extra:   # name what the bytes are for: the core's contiguous/native-order/padded copies of the inputs
            what += f" with {extra:,} bytes of the core's converted copies of the inputs (broadcast, byte-swapped or padded)"
    require(total, what)
