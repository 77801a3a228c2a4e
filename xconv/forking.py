"""Whether this process is a forked child of one that imported xconv.

Thread pools do not survive ``fork``: a child has the parent's memory, including a pool's bookkeeping,
but none of its threads. libgomp (torch's OpenMP runtime) has no fork handler, so a child that enters
an OpenMP parallel region on a pool its parent had started waits forever. Backends that run work on
another library's pool ask :func:`forked` first. Imported by ``import xconv``, so any process that
imported xconv before forking is covered; a child of a parent that never imported xconv cannot be told
from a fresh process (set ``XCONV_NUMPY_OPENMP=0`` there).
"""

from __future__ import annotations

import os

_PID = os.getpid()
_forked = False


def _in_child() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def forked() -> bool:
    """True in a process forked (by ``os.fork``, or by C code: the pid changed) after xconv was imported."""
    return _forked or os.getpid() != _PID
