"""The workspace budget: the most scratch memory one call's backend may use.

``workspace_limit=BYTES`` on a call, else ``$XCONV_WORKSPACE_LIMIT`` (read through :mod:`xconv.settings`;
bytes as :mod:`xconv.units` reads them, or ``none``), else no limit. Scratch is
memory a backend takes for the call beyond the arrays it returns (column buffers, padded grids,
weight layouts, partial sums; a vendor library's workspace). Each backend keeps within the limit or
refuses the call with UnsupportedError (docs/semantics.md, "Workspace budget"); the trace record's
``workspace_bytes`` is what the call used or asked for.
"""

from __future__ import annotations

import numbers

from . import settings, units
from .errors import ShapeError, UnsupportedError

ENV = "XCONV_WORKSPACE_LIMIT"


def parse_bytes(text: str, name: str = ENV) -> int | None:
    """A workspace limit as text: :func:`xconv.units.parse_limit` ("4MiB" as bytes; "" or "none" as None)."""
    return units.parse_limit(text, name)


def resolve_limit(value) -> int | None:
    """The call's limit: ``value`` (an int >= 0, or None for the environment default) checked."""
    if value is None:
        return settings.current().workspace_limit
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ShapeError("workspace_limit", "must be a number of bytes >= 0, or None", expected="int >= 0 or None",
                         given=repr(value))
    return int(value)


def check_request(backend: str, requested: int, limit: int | None, what: str = "workspace") -> None:
    """Raise UnsupportedError when a backend's ``requested`` scratch bytes exceed ``limit`` (None: no limit)."""
    if limit is not None and requested > limit:
        raise UnsupportedError(f"backend {backend!r}: this call needs {requested} bytes of {what}, above "
                               f"workspace_limit={limit}")
