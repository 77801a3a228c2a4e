"""The bounded LRU cache of built cuDNN graphs, and the autotune (benchmark) mode.

One entry per :func:`xconv_cudnn.compiler.plan_key`. An entry is one of:

- ``plan``: a built graph, its tensor uids, workspace size and, after autotuning, the index of
  the fastest plan (``None``: the heuristics' choice, run with ``execute``);
- ``delegate``: run the call another way, decided once: ``contiguous`` (cuDNN has no engine for
  these strides; copy the operands), ``symmetric`` (no engine for this asymmetric padding; let the
  core pad explicitly), ``unfused`` (no fused bias engine; run the parts), ``cupy`` (the bias
  gradient as a CuPy reduction on the same stream);
- ``error``: the configuration is unsupported; the same error is raised again without
  rebuilding anything.

Autotune mode (``XCONV_CUDNN_BENCHMARK=1``, like ``torch.backends.cudnn.benchmark``): plans are
built with ``build_plan_policy.ALL`` and each candidate is timed once per key on the call's own
buffers; later calls run the fastest. The flag is part of the key. Both variables are read and
validated by :mod:`xconv.settings` (a bad value is a ConfigError naming it).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import threading
from collections.abc import Callable

from xconv import settings

BENCHMARK_ENV = "XCONV_CUDNN_BENCHMARK"
CACHE_SIZE_ENV = "XCONV_CUDNN_PLAN_CACHE_SIZE"
DEFAULT_CACHE_SIZE = settings.DEFAULT_CUDNN_PLAN_CACHE_SIZE


def _settings(environ) -> settings.Settings:
    return settings.current() if environ is None else settings.from_environ(environ)


def benchmark_enabled(environ=None) -> bool:
    """Whether autotune mode is on (``XCONV_CUDNN_BENCHMARK`` is 1/true/yes/on) in ``environ`` (default: now)."""
    return _settings(environ).cudnn_benchmark


def cache_size_from_env(environ=None) -> int:
    """``XCONV_CUDNN_PLAN_CACHE_SIZE`` (a whole number >= 1; default 512) in ``environ`` (default: now)."""
    return _settings(environ).cudnn_plan_cache_size


@dataclasses.dataclass
class Entry:
    kind: str                       # "plan", "delegate" or "error"
    spec: object = None             # the GraphSpec of a plan
    graph: object = None            # the built cudnn pygraph
    inputs: tuple = ()              # (uid, operand name) per graph input
    outputs: tuple = ()             # (uid, array shape, dtype name) per graph output
    workspace: int = 0              # bytes
    plan_index: int | None = None   # autotuned plan; None = heuristics' choice
    timings: tuple = ()             # (plan index, median ms) measured by autotune
    delegate: str = ""              # "contiguous", "symmetric", "unfused" or "cupy"
    error: str = ""                 # UnsupportedError message, raised again on every call
    engine: str = ""                # the plan's engine name (id and knobs) where known (trace records)


class PlanCache:
    """A thread-safe LRU map from plan keys to :class:`Entry`, at most ``maxsize`` entries."""

    def __init__(self, maxsize: int | None = None):
        self.maxsize = cache_size_from_env() if maxsize is None else max(int(maxsize), 1)
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key, entry: Entry) -> Entry:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
                self.evictions += 1
        return entry

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = self.evictions = 0

    def stats(self) -> dict:
        with self._lock:
            return {"size": len(self._entries), "maxsize": self.maxsize, "hits": self.hits,
                    "misses": self.misses, "evictions": self.evictions}


def autotune(plan_count: int, time_plan: Callable[[int, int], list[float] | None], *, warmup: int = 1,
             repeats: int = 5) -> tuple[int, tuple]:
    """Time each candidate plan; return (fastest index, ((index, median ms), ...)).

    ``time_plan(index, warmup, repeats)`` runs plan ``index`` ``warmup`` times untimed, then
    returns ``repeats`` timings in ms, or None when that plan cannot run (not built, deselected, failed).
    Raises LookupError when no plan ran.
    """
    timings = []
    for index in range(plan_count):
        times = time_plan(index, warmup, repeats)
        if not times:
            continue
        timings.append((index, float(statistics.median(times))))
    if not timings:
        raise LookupError("no candidate plan could be executed")
    best = min(timings, key=lambda item: (item[1], item[0]))[0]
    return best, tuple(timings)
