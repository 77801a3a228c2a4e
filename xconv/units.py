"""Byte counts as people write them: the one parser of every size xconv reads from text.

:func:`parse_bytes` takes an int, or a number (``4194304``, ``1.5``) with an optional unit. **Every unit is
binary** (powers of 1024), whatever its spelling, as in most command-line tools' size options::

    B = 1    K = k = KB = KiB = 2**10    M = MB = MiB = 2**20    G = GB = GiB = 2**30    T = TB = TiB = 2**40

(case-insensitive; ``1MB`` is 1,048,576 bytes, not 1,000,000). A fraction is allowed when the result is a
whole number of bytes (``1.5GiB``, ``0.5k``; not ``1.5``). Refused with :class:`~xconv.errors.ConfigError`
naming ``what``: negatives, signs, exponents, NaN and infinity, other units, junk, and anything above
:data:`MAX_BYTES` (int64, the largest size xconv handles).
"""

from __future__ import annotations

import numbers
import re
from fractions import Fraction

from .errors import ConfigError

#: The largest byte count accepted (int64's maximum).
MAX_BYTES = (1 << 63) - 1
#: Each accepted unit (lower case) and its bytes.
UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", start=1):
    UNITS.update({_letter: 1 << (10 * _i), _letter + "b": 1 << (10 * _i), _letter + "ib": 1 << (10 * _i)})
#: The form :func:`parse_bytes` takes, as its errors state it.
FORM = "bytes such as 4194304, 512k, 4MiB or 1.5G (units K, M, G, T, also as KB/KiB etc.; all powers of 1024)"

_NUMBER = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)")


def parse_bytes(text, what: str) -> int:
    """``text`` (a str such as "4MiB", or an int) as a number of bytes >= 0; ConfigError naming ``what`` if not."""
    if isinstance(text, numbers.Integral) and not isinstance(text, bool):
        value = int(text)
        if not 0 <= value <= MAX_BYTES:
            raise ConfigError(what, "must be a number of bytes from 0 to 2**63-1", expected=FORM, given=repr(text))
        return value
    if not isinstance(text, str):
        raise ConfigError(what, "must be a byte count", expected=FORM, given=f"{type(text).__name__} {text!r}")
    m = _NUMBER.fullmatch(text.strip())
    if m is not None and len(m.group(1)) > 40:
        raise ConfigError(what, "is larger than 2**63-1 bytes", expected=FORM, given=repr(text[:60]))
    if m is None or m.group(2).lower() not in UNITS:
        raise ConfigError(what, "is not a byte count", expected=FORM, given=repr(text))
    value = Fraction(m.group(1)) * UNITS[m.group(2).lower()]
    if value.denominator != 1:
        raise ConfigError(what, "is not a whole number of bytes", expected=FORM, given=repr(text))
    if value > MAX_BYTES:
        raise ConfigError(what, "is larger than 2**63-1 bytes", expected=FORM, given=repr(text))
    return int(value)


def parse_limit(text, what: str) -> int | None:
    """A byte limit: :func:`parse_bytes`, except that None, "" and "none" (any case) mean no limit (None)."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "none")):
        return None
    return parse_bytes(text, what)
