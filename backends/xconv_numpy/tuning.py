"""The NumPy paths' tuning knobs: how a chosen path runs (chunk sizes, strategy A's variants, when a call is too
small to share with the workers), never which path runs.

Each knob has a default, measured and explained where it is used; :func:`get` reads it. Tests and experiments
change knobs only through :func:`tuned` (exposed as ``paths.tune``), within a block, never by patching modules.
An override holds for the whole process (every thread's calls) until the block ends: a tool for tests and
experiments, not for use while other threads compute.
Knobs can change bits (other chunks, other partial sums), not which sums are computed: outputs stay within the
same error bounds.
"""

from __future__ import annotations

import contextlib

#: name: (default, what it means). None: the path decides by its own rule.
KNOBS = {
    "chunk_bytes": ((1 << 20, 32 << 20),
                    "the grid's working-set budget per call, (at least, at most) bytes; between the two it is the "
                    "bytes of the call's inputs plus outputs (grid/chunks.py)"),
    "implicit_outer": (None, "strategy A: first-dim taps as line-shifted views of inner-tap columns (True), not "
                             "(False), or by its cost rule (None) (grid/strategy_a.py)"),
    "compact_inner": (None, "strategy A: gather only the valid positions of each grid line (True), whole lines "
                            "(False), or by channel count (None) (grid/strategy_a.py)"),
    "parallel_min_work": (1 << 24, "multiply-adds (of the full call: forward, or dx and dw) below which every path "
                                   "runs on the calling thread alone: a hand-off to the worker pool costs 120-250 us "
                                   "of wall time (fast.py, _share)"),
    "team_min_work": (1 << 18, "multiply-adds (as parallel_min_work) below which a path that runs its work as C jobs "
                               "(jobs.py) keeps it on the calling thread, when torch's OpenMP team runs them: a "
                               "region there costs a few microseconds (fast.py, _share)"),
    "depthwise_small_work": (1 << 20, "multiply-adds of a block of samples below which the depthwise loops run it "
                                      "as one part, on the calling thread (depthwise.py)"),
}

_overrides: dict = {}


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


_CHECKS = {"chunk_bytes": lambda v: isinstance(v, tuple) and len(v) == 2 and all(_count(b) and b > 0 for b in v)
                                    and v[0] <= v[1],
           "implicit_outer": lambda v: v is None or isinstance(v, bool),
           "compact_inner": lambda v: v is None or isinstance(v, bool)}
_CHECKS.update(depthwise_small_work=_count, parallel_min_work=_count, team_min_work=_count)
_EXPECTED = {"chunk_bytes": "a tuple (at least, at most) of positive byte counts, at least <= at most",
             "implicit_outer": "True, False or None", "compact_inner": "True, False or None",
             "parallel_min_work": "a count of multiply-adds (int >= 0)",
             "team_min_work": "a count of multiply-adds (int >= 0)",
             "depthwise_small_work": "a count of multiply-adds (int >= 0)"}


def get(name: str):
    """The knob's value: an override of :func:`tuned`, else its default."""
    over = _overrides
    return over[name] if name in over else KNOBS[name][0]


@contextlib.contextmanager
def tuned(**knobs):
    """Within the block (process-wide), the knobs given take these values; e.g. ``tuned(chunk_bytes=(1, 200))``
    (chunks of a few lines), ``tuned(implicit_outer=True)``, ``tuned(parallel_min_work=0)`` (share every call)."""
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown tuning knob(s) {unknown}; knobs are {sorted(KNOBS)}")
    for name, value in knobs.items():
        if not _CHECKS[name](value):
            raise ValueError(f"tuning knob {name}: expected {_EXPECTED[name]}, got {value!r}")
    global _overrides
    before = _overrides
    _overrides = {**before, **knobs}
    try:
        yield
    finally:
        _overrides = before
