"""One cache of what the NumPy paths derive from a call's parameters (geometry, index tables, C plans).

Each derived thing is a function of ``ConvParams`` decorated with :func:`per_params`; its value is kept in the
entry of that ``ConvParams`` of one LRU cache (:data:`MAX_CONFIGS` configurations), so that all of a
configuration's plans are kept, and dropped, together. Values are read only.
"""

from __future__ import annotations

import functools

#: Configurations whose plans are kept (the small path's index tables take up to 8 bytes per column of a call:
#: below 16 MiB each).
MAX_CONFIGS = 32


@functools.lru_cache(maxsize=MAX_CONFIGS)
def _entry(p) -> dict:
    return {}


def per_params(fn):
    """``fn(p)`` computed once per configuration ``p`` (a ``ConvParams``) and kept in the one cache."""
    @functools.wraps(fn)
    def cached(p):
        entry = _entry(p)
        try:
            return entry[fn]
        except KeyError:
            value = entry[fn] = fn(p)           # two threads may both compute it: same value, one kept
            return value
    return cached


def cache_info():
    """The cache's statistics (configurations, not plans)."""
    return _entry.cache_info()


def clear() -> None:
    """Drop every configuration's plans."""
    _entry.cache_clear()
