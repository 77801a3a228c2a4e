"""One cache of what the NumPy paths derive from a call's parameters (geometry, index tables, C plans).

Each derived thing is a function of ``ConvParams`` decorated with :func:`per_params`; its value is kept in the
entry of that ``ConvParams`` in one least-recently-used cache, so that all of a configuration's plans are kept,
and dropped, together. The cache holds at most :data:`MAX_CONFIGS` configurations and :data:`MAX_BYTES` bytes of
arrays (the small path's index tables take up to 8 bytes per column of a call); the least recently used
configurations are dropped first. A model's step cycles through all of its layers' configurations, so the count
must exceed a real model's (MobileNetV2: 36; with 32 kept, an LRU cache rebuilt 4-9 plans per step). Values
are read only.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

#: Configurations whose plans are kept.
MAX_CONFIGS = 256
#: Bytes of arrays (plans' index tables) kept, all configurations together.
MAX_BYTES = 64 << 20

_entries: "collections.OrderedDict[object, dict]" = collections.OrderedDict()
_sizes: dict = {}
_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0, "bytes": 0}
CacheInfo = collections.namedtuple("CacheInfo", "hits misses maxsize currsize bytes")


def _nbytes(value, depth: int = 2) -> int:
    """Bytes of the arrays ``value`` holds: itself, its attributes, tuple and list items (two levels down)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if depth == 0:
        return 0
    items = value if isinstance(value, (tuple, list)) else getattr(value, "__dict__", {}).values()
    return sum(_nbytes(v, depth - 1) for v in items)


def _entry(p) -> dict:
    entry = _entries.get(p)             # a hit takes no lock: each OrderedDict call is atomic under the GIL
    if entry is not None:
        try:
            _entries.move_to_end(p)
        except KeyError:                # dropped by another thread meanwhile: still a valid entry to use
            pass
        _stats["hits"] += 1
        return entry
    with _lock:
        entry = _entries.get(p)
        if entry is not None:
            return entry
        _stats["misses"] += 1
        entry = _entries[p] = {}
        _sizes[p] = 0
        _evict()
        return entry


def _evict() -> None:
    """Drop the least recently used configurations beyond the limits (the newest one is always kept)."""
    while len(_entries) > 1 and (len(_entries) > MAX_CONFIGS or _stats["bytes"] > MAX_BYTES):
        old, _ = _entries.popitem(last=False)
        _stats["bytes"] -= _sizes.pop(old)


def per_params(fn):
    """``fn(p)`` computed once per configuration ``p`` (a ``ConvParams``) and kept in the one cache."""
    def cached(p):
        entry = _entry(p)
        try:
            return entry[fn]
        except KeyError:
            value = fn(p)                       # two threads may both compute it: same value, one kept
            size = _nbytes(value)
            with _lock:
                if entry.setdefault(fn, value) is value and p in _sizes and _entries.get(p) is entry:
                    _sizes[p] += size
                    _stats["bytes"] += size
                    _evict()
            return entry[fn]
    cached.__name__, cached.__qualname__, cached.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    cached.__wrapped__ = fn
    return cached


def cache_info() -> CacheInfo:
    """The cache's statistics (configurations, not plans; bytes of arrays held)."""
    with _lock:
        return CacheInfo(_stats["hits"], _stats["misses"], MAX_CONFIGS, len(_entries), _stats["bytes"])


def clear() -> None:
    """Drop every configuration's plans."""
    with _lock:
        _entries.clear()
        _sizes.clear()
        _stats.update(hits=0, misses=0, bytes=0)
