"""The workspace budget: the most scratch memory one call's backend may use.

``workspace_limit=BYTES`` on a call, else ``$XCONV_WORKSPACE_LIMIT``, else no limit. Scratch is
memory a backend takes for the call beyond the arrays it returns (column buffers, padded grids,
weight layouts, partial sums; a vendor library's workspace). Each backend keeps within the limit or
refuses the call with UnsupportedError (docs/semantics.md, "Workspace budget"); the trace record's
``workspace_bytes`` is what the call used or asked for.
"""

from __future__ import annotations

import numbers
import os
import re

from .errors import ShapeError, UnsupportedError

ENV = "XCONV_WORKSPACE_LIMIT"

_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


def parse_bytes(text: str, name: str = ENV) -> int | None:
    """"4194304", "4MiB", "512k", "1G" (binary units) as bytes; "" or "none" as None (no limit)."""
    t = text.strip().lower()
    if t in ("", "none"):
        return None
    m = re.fullmatch(r"(\d+)\s*([a-z]*)", t)
    if m is None or m.group(2) not in _UNITS:
        raise ShapeError(name, "must be a byte count such as 4194304, 4MiB, 512k or 1G", expected="bytes",
                         given=repr(text))
    return int(m.group(1)) * _UNITS[m.group(2)]


def resolve_limit(value) -> int | None:
    """The call's limit: ``value`` (an int >= 0, or None for the environment default) checked."""
    if value is None:
        env = os.environ.get(ENV)
        return None if env is None else parse_bytes(env)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ShapeError("workspace_limit", "must be a number of bytes >= 0, or None", expected="int >= 0 or None",
                         given=repr(value))
    return int(value)


def check_request(backend: str, requested: int, limit: int | None, what: str = "workspace") -> None:
    """Raise UnsupportedError when a backend's ``requested`` scratch bytes exceed ``limit`` (None: no limit)."""
    if limit is not None and requested > limit:
        raise UnsupportedError(f"backend {backend!r}: this call needs {requested} bytes of {what}, above "
                               f"workspace_limit={limit}")
