"""One cache of what the NumPy paths derive from a call's parameters (geometry, index tables, C plans).

Each derived thing is a function of ``ConvParams`` decorated with :func:`per_params`; its value is kept in the
entry of that ``ConvParams`` in one least-recently-used cache (``functools.lru_cache``: a hit costs what a dict
lookup does), so that all of a configuration's plans are kept, and dropped, together. The cache holds
:data:`MAX_CONFIGS` configurations: a model's step cycles through all of its layers' configurations, so the count must
exceed a real model's (MobileNetV2: 36; with 32 kept, the cache rebuilt 4-9 plans per step). Arrays are bounded too
(the small path's index tables take up to 8 bytes per column of a call): when the live configurations' arrays pass
:data:`MAX_BYTES`, every configuration but the one being planned is dropped. Values are read only.
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

#: Configurations whose plans are kept.
MAX_CONFIGS = 256
#: Bytes of arrays (plans' index tables) kept, all configurations together.
MAX_BYTES = 64 << 20

_lock = threading.Lock()
_live: "weakref.WeakValueDictionary[int, _Entry]" = weakref.WeakValueDictionary()    # the cached entries, by id
#                                                                       (an evicted entry is collected and leaves)


class _Entry(dict):
    """One configuration's plans {function: value} and the bytes of their arrays."""

    __slots__ = ("__weakref__", "bytes")


def _nbytes(value, depth: int = 2) -> int:
    """Bytes of the arrays ``value`` holds: itself, its attributes, tuple and list items (two levels down)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if depth == 0:
        return 0
    items = value if isinstance(value, (tuple, list)) else getattr(value, "__dict__", {}).values()
    return sum(_nbytes(v, depth - 1) for v in items)


@functools.lru_cache(maxsize=MAX_CONFIGS)
def _entry(p) -> _Entry:
    entry = _Entry()
    entry.bytes = 0
    with _lock:
        _live[id(entry)] = entry
    return entry


def per_params(fn):
    """``fn(p)`` computed once per configuration ``p`` (a ``ConvParams``) and kept in the one cache."""
    @functools.wraps(fn)
    def cached(p):
        entry = _entry(p)
        try:
            return entry[fn]
        except KeyError:
            value = fn(p)                       # two threads may both compute it: same value, one kept
            size = _nbytes(value)
            with _lock:
                value = entry.setdefault(fn, value)
                entry.bytes += size
                over = size and sum(e.bytes for e in list(_live.values())) > MAX_BYTES
            if over:                            # the arrays' bound: drop the others, keep this configuration's
                _entry.cache_clear()
                kept = _entry(p)
                kept.update(entry)
                kept.bytes = entry.bytes
            return value
    return cached


def cache_info():
    """The cache's statistics (configurations, not plans)."""
    return _entry.cache_info()


def live_bytes() -> int:
    """Bytes of arrays held by the cached configurations' plans."""
    with _lock:
        return sum(e.bytes for e in list(_live.values()))


def clear() -> None:
    """Drop every configuration's plans."""
    _entry.cache_clear()
