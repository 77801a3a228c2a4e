"""The argument vectors the NumPy backend passes to its compiled loops, declared once on the Python side.

``csrc/layout.h`` declares the same vectors for C (one ``X(NAME, width)`` list each; NAME is the prefix and the
slot's name in capitals). A build reports its layout: ``xconv_layout(0)`` the version, ``xconv_layout(which)``
a vector's length, ``xconv_layout_slots(which)`` its slots as ``"NAME:width ..."``. :func:`check`, run when the
library is loaded, compares all of them with the lists below and refuses a library that differs
(:class:`LayoutError`, naming the vector and both values): the compiled part then reports itself off with that
reason and the NumPy paths serve. Change a list here and in layout.h together, and bump :data:`VERSION` in both.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

#: The layout version; csrc/layout.h's XCONV_LAYOUT_VERSION.
VERSION = 2


class LayoutError(RuntimeError):
    """A compiled library whose argument layout is not the one this package declares."""


@dataclass(frozen=True)
class Vector:
    """One int64 argument vector: its slots in order as (name, width), and the C enum prefix of their names."""

    label: str
    which: int            # its number in xconv_layout() / xconv_layout_slots()
    prefix: str
    slots: tuple

    @property
    def length(self) -> int:
        """Number of int64 values (a trailing width-0 slot marks where a variable tail begins)."""
        return sum(w for _, w in self.slots)

    def index(self, name: str) -> int:
        """The first position of slot ``name``."""
        at = 0
        for slot, width in self.slots:
            if slot == name:
                return at
            at += width
        raise KeyError(f"{self.label} has no slot {name!r}")

    def text(self) -> str:
        """The slots as the library reports them."""
        return "".join(f"{self.prefix}{name.upper()}:{width} " for name, width in self.slots)

    def pack(self, **values) -> list:
        """The vector's values in slot order from one keyword per slot (a width-1 slot takes a number, a wider one
        a sequence of that width; a width-0 slot is not given)."""
        out = []
        for name, width in self.slots:
            if width == 0:
                continue
            v = values.pop(name)
            if width == 1:
                out.append(v)
            else:
                v = tuple(v)
                if len(v) != width:
                    raise ValueError(f"{self.label}: slot {name!r} takes {width} values, given {len(v)}")
                out.extend(v)
        if values:
            raise ValueError(f"{self.label}: no slot {sorted(values)!r}")
        return out


#: csrc/depthwise.c's geometry (XCONV_DEPTHWISE_GEO).
DEPTHWISE_GEO = Vector("depthwise geo", 1, "G_", (
    ("c", 1), ("m", 1), ("h", 1), ("w", 1), ("oh", 1), ("ow", 1), ("lh", 1), ("lw", 1), ("k", 1), ("nrw", 1),
    ("nslots", 1), ("dx", 1), ("dw", 1), ("db", 1), ("xs", 4), ("dys", 4), ("sw", 1), ("flatdx", 1), ("f", 1)))
#: csrc/small_cols.c's geometry (XCONV_SMALL_COLS_GEO).
SMALL_COLS_GEO = Vector("small-call column geo", 2, "S_", (
    ("n", 1), ("c", 1), ("d", 1), ("h", 1), ("w", 1), ("od", 1), ("oh", 1), ("ow", 1), ("kd", 1), ("kh", 1),
    ("kw", 1), ("sd", 1), ("sh", 1), ("sw", 1), ("dd", 1), ("dh", 1), ("dw", 1), ("pd", 1), ("ph", 1),
    ("pw", 1), ("xs", 5)))
#: csrc/small_grid.c's plan of a stride-1 call (XCONV_SMALL_S1_PLAN); the taps' offsets follow at "off".
SMALL_S1_PLAN = Vector("small-call stride-1 plan", 3, "P_", (
    ("n", 1), ("c", 1), ("co", 1), ("g", 1), ("cig", 1), ("cog", 1), ("k", 1), ("xg", 8), ("dg", 8),
    ("dbase", 1), ("keep", 3), ("s", 3), ("o", 3), ("dz", 1), ("corner", 1), ("ycrop", 3), ("xcrop", 3),
    ("off", 0)))
#: csrc/small_grid.c's element strides of x and dy (XCONV_SMALL_S1_STRIDES).
SMALL_S1_STRIDES = Vector("small-call element strides", 4, "E_", (
    ("n", 1), ("c", 1), ("d", 1), ("h", 1), ("w", 1)))

#: csrc/bias_sum.c's geometry (XCONV_BIAS_GEO): grad_y's sizes and element strides, spatial dims lifted to 3.
BIAS_GEO = Vector("bias-sum geo", 5, "B_", (
    ("n", 1), ("c", 1), ("d", 1), ("h", 1), ("w", 1), ("s", 5)))

VECTORS = (DEPTHWISE_GEO, SMALL_COLS_GEO, SMALL_S1_PLAN, SMALL_S1_STRIDES, BIAS_GEO)


#: The job lists of csrc/jobs.c (see jobs.py): int64 values per job (kind, wait phase, wait count, signal phase,
#: up to 20 arguments) and per run's state (next job, next slot, four phase counts, scratch base and stride).
JOB_LEN, JOB_STATE = 24, 8


def check(lib) -> None:
    """Raise :class:`LayoutError` unless ``lib`` (a loaded build, or any object with the two functions) reports
    this module's version and vectors."""
    try:
        size, slots = lib.xconv_layout, lib.xconv_layout_slots
    except AttributeError:
        raise LayoutError("the compiled library does not report its argument layout (built from older "
                          "sources); rebuild it") from None
    if isinstance(size, ctypes._CFuncPtr):
        size.argtypes, size.restype = [ctypes.c_int], ctypes.c_int64
        slots.argtypes, slots.restype = [ctypes.c_int], ctypes.c_char_p
    version = int(size(0))
    if version != VERSION:
        raise LayoutError(f"the compiled library's argument layout is version {version}, expected {VERSION}; "
                          "rebuild it from these sources")
    for v in VECTORS:
        length, text = int(size(v.which)), slots(v.which)
        text = text.decode() if isinstance(text, bytes) else text
        if length != v.length or text != v.text():
            raise LayoutError(f"the compiled library's {v.label} is {length} values ({text!r}), expected "
                              f"{v.length} ({v.text()!r}); rebuild it from these sources")
    jobs = getattr(lib, "xconv_jobs_layout", None)
    if jobs is None:
        raise LayoutError("the compiled library has no job lists (built from older sources); rebuild it")
    if isinstance(jobs, ctypes._CFuncPtr):
        jobs.argtypes, jobs.restype = [ctypes.c_int], ctypes.c_int64
    if (int(jobs(0)), int(jobs(1))) != (JOB_LEN, JOB_STATE):
        raise LayoutError(f"the compiled library's job record is {int(jobs(0))} values and its state {int(jobs(1))}, "
                          f"expected {JOB_LEN} and {JOB_STATE}; rebuild it from these sources")
