"""Per-call provenance: ``with xconv.trace() as t:`` records what each xconv call really ran.

Coverage: process-wide. While a trace block is open, every public xconv call (``conv_fprop``,
``conv_dgrad``, ``conv_wgrad``, ``convolution_backward``, and what the torch modules call) that
*starts* in any thread of the process is recorded into every trace block open at that moment;
blocks opened in other threads see it too. A block nested in another records into both. A call
that raises is recorded with ``error`` set. Outside any trace block each hook (the call's start,
each note by the core or a backend) pays one check (is the list of open blocks empty?) and
nothing more.

While a call runs, its :class:`Record` is the calling thread's (a context variable); the core and
the backends fill it through :func:`note`, :func:`legalized` and :func:`workspace`, each of which is
one check when no trace is open. Helper threads a backend starts do not see the record: a backend
notes from the thread that called it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time

#: Delivered determinism, weakest first.
LEVELS = ("none", "run_to_run", "batch_invariant")

_lock = threading.Lock()
_open: list["Trace"] = []                      # the open trace blocks, all threads
_current: contextvars.ContextVar = contextvars.ContextVar("xconv_trace_record", default=None)


@dataclasses.dataclass
class Record:
    """What one xconv call ran.

    - ``op``: "fprop", "dgrad", "wgrad" or "backward"; ``backend``: the backend's name.
    - ``path``: what the backend ran (its own words: e.g. numpy "grid-a: blas-grid strategy A (dy-columns)
      [grad_input, grad_weight: cost: A cheaper]" (path: note [outputs: rule]), cuDNN
      "engine 3 (knobs ...)", aclnn "aclnnConvolutionBackward cubeMathType=1"); several distinct
      paths of one call (a legalized call runs several primitives) are joined by " + ".
    - ``math``: the math mode in effect (the backend's; the requested one if it did not say).
    - ``deterministic``: the guarantee delivered, "none", "run_to_run" or "batch_invariant" (the
      weakest over the call's primitives; the requested level if the backend did not say).
    - ``legalized``: the core's rewrites, in the order applied.
    - ``workspace_bytes``: the most scratch bytes the backend used or requested (None: not reported).
    - ``plan_cache``: "hit", "miss" or None (no plan cache).
    - ``seconds``: wall time of the call after validation (legalization and backend).
    - ``shapes``: input, weight and output shapes; ``error``: the exception's text when the call raised.
    """

    op: str
    backend: str
    path: str | None = None
    math: str | None = None
    deterministic: str | None = None
    legalized: list = dataclasses.field(default_factory=list)
    workspace_bytes: int | None = None
    plan_cache: str | None = None
    seconds: float | None = None
    shapes: dict = dataclasses.field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict:
        """A JSON-ready copy (conformance bundles keep it per case)."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: backend, path, math, determinism, legalization, workspace, cache, time."""
        parts = [f"{self.op} on {self.backend}", f"path={self.path}", f"math={self.math}",
                 f"deterministic={self.deterministic}",
                 f"legalized=[{', '.join(self.legalized)}]" if self.legalized else "legalized=[]",
                 f"workspace_bytes={self.workspace_bytes}", f"plan_cache={self.plan_cache}"]
        if self.seconds is not None:
            parts.append(f"seconds={self.seconds:.6f}")
        if self.error:
            parts.append(f"error={self.error}")
        return "  ".join(parts)


class Trace:
    """An open (or closed) trace block; ``records`` in the order the calls finished."""

    def __init__(self):
        self.records: list[Record] = []

    def __enter__(self) -> "Trace":
        with _lock:
            _open.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            for i in range(len(_open) - 1, -1, -1):
                if _open[i] is self:
                    del _open[i]
                    break
        return False


def trace() -> Trace:
    """``with xconv.trace() as t:`` — every xconv call started while the block is open is in ``t.records``."""
    return Trace()


def active() -> bool:
    """Whether any trace block is open (in any thread)."""
    return bool(_open)


def run(op: str, backend, p, fn):
    """``fn()`` (the legalized call of ``op`` on ``backend`` with params ``p``), recorded when a trace is open."""
    if not _open:
        return fn()
    with _lock:
        targets = list(_open)
    level = LEVELS[1] if p.deterministic is True else (p.deterministic or LEVELS[0])
    rec = Record(op=op, backend=getattr(backend, "name", str(backend)),
                 shapes=dict(input=list(p.input_shape), weight=list(p.weight_shape), output=list(p.output_shape)))
    token = _current.set(rec)
    start = time.perf_counter()
    try:
        return fn()
    except BaseException as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        rec.seconds = time.perf_counter() - start
        _current.reset(token)
        if rec.math is None:
            rec.math = p.math
        if rec.deterministic is None:
            rec.deterministic = level
        with _lock:
            for t in targets:
                t.records.append(rec)


def current() -> Record | None:
    """The record of the call running in this thread, or None (no trace open, or not inside a call)."""
    return _current.get() if _open else None


def note(path: str | None = None, *, math: str | None = None, deterministic: str | None = None,
         plan_cache: str | None = None, workspace_bytes: int | None = None) -> None:
    """Fill the running call's record (no-op outside a trace). ``path`` adds to distinct paths; ``deterministic``
    keeps the weakest level noted; ``workspace_bytes`` the largest; ``plan_cache`` "miss" wins over "hit"."""
    if not _open:
        return
    rec = _current.get()
    if rec is None:
        return
    if path is not None:
        if rec.path is None:
            rec.path = path
        elif path not in rec.path.split(" + "):
            rec.path += " + " + path
    if math is not None:
        rec.math = math
    if deterministic is not None:
        if rec.deterministic is None or LEVELS.index(deterministic) < LEVELS.index(rec.deterministic):
            rec.deterministic = deterministic
    if plan_cache is not None and rec.plan_cache != "miss":
        rec.plan_cache = plan_cache
    if workspace_bytes is not None:
        rec.workspace_bytes = max(rec.workspace_bytes or 0, int(workspace_bytes))


def legalized(step: str) -> None:
    """Add one of the core's rewrites to the running call's record (once; no-op outside a trace)."""
    if not _open:
        return
    rec = _current.get()
    if rec is not None and step not in rec.legalized:
        rec.legalized.append(step)


def workspace(nbytes: int) -> None:
    """Report ``nbytes`` of scratch used or requested by the running call (the record keeps the largest)."""
    note(workspace_bytes=nbytes)
