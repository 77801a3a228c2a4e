"""Running one case on one backend and judging it: the checks every front end (pytest, CLI) shares.

Per valid case: the call's results have the right structure, shapes and dtypes; masked
gradients are None; every unmasked gradient is within the error bound of the float64 oracle
(:mod:`.tolerance`); for ``deterministic=True`` a second call is bitwise identical (and, via
:class:`.isolation.FreshDigests`, so is a call in a fresh process) unless the backend refused;
results stay unchanged by later calls (:class:`Watch`).
Per invalid case: :class:`xconv.ShapeError` naming the expected argument, with no backend
primitive called.

Outcomes: the statuses of :mod:`.status` ("crashed" and "timed_out" come from worker processes,
:mod:`.isolation`). Crashed and timed-out cases count as failures.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import time
import traceback

import numpy as np

import xconv
from xconv import Backend, BackendUnavailableError, ShapeError, UnsupportedError
from xconv.dtypes import dtype_name

from . import exact, invariance, tolerance, value_invariance
from .cases import Case, Inputs, make_inputs
from .families import FamilyError, family
from .status import DIED, FAILING, STATUSES  # noqa: F401  (runner.FAILING: the spelling front ends import)

ORACLE = "numpy-exact"
OUTPUTS = tolerance.OUTPUTS


@dataclasses.dataclass
class Outcome:
    """The verdict on one case x backend."""

    case_id: str
    backend: str
    status: str
    message: str = ""
    ratio: float | None = None                      # worst |got - exact| / bound over the unmasked outputs
    ratios: dict = dataclasses.field(default_factory=dict)       # per output name
    worst_index: dict = dataclasses.field(default_factory=dict)  # per output name: index of the worst element
    outputs: tuple | None = None                    # NumPy results (None where masked), kept for bundles
    digests: tuple | None = None                    # sha256 of each result (None where masked)
    seconds: float = 0.0
    ratio_samples: dict = dataclasses.field(default_factory=dict)  # per output: log10(ratio) histogram data
    live: tuple | None = dataclasses.field(default=None, repr=False)  # the backend's own result objects
    signal: str | None = None                       # crashed: the name of the signal that killed the worker
    stderr: str = ""                                # crashed / timed_out: the tail of what the case wrote there
    record: dict | None = None                      # xconv.trace() record of the call: which path/engine ran
    floor: float | None = None                      # worst rounding floor over the judged outputs (tolerance)

    @property
    def ok(self) -> bool:
        return self.status not in FAILING

    def summary(self) -> dict:
        """JSON-able record (no arrays); crashed and timed-out cases add ``signal`` and ``stderr``, cases whose
        call ran add ``record`` (its xconv.trace() record)."""
        record = {"id": self.case_id, "backend": self.backend, "status": self.status, "message": self.message,
                  "ratio": _json_float(self.ratio), "ratios": {k: _json_float(v) for k, v in self.ratios.items()},
                  "worst_index": {k: list(v) if v is not None else None for k, v in self.worst_index.items()},
                  "digests": list(self.digests) if self.digests is not None else None,
                  "seconds": round(self.seconds, 6)}
        if self.status in DIED:
            record.update(signal=self.signal, stderr=self.stderr)
        if self.record:
            record["record"] = self.record
        return record


def _json_float(v):
    if v is None:
        return None
    if math.isinf(v) or math.isnan(v):
        return str(v)
    return float(v)


# ---------------------------------------------------------------------------------------------
# The oracle


@dataclasses.dataclass
class Reference:
    """The float64 oracle's results for a case, the sums of absolute products, and the bounds."""

    exact: tuple
    abs_sum: tuple
    lengths: dict
    bounds: tuple
    input_digest: str
    floors: tuple = ()        # per output: tolerance.rounding_floor, the worst ratio of the exactly rounded result


def oracle_backend() -> Backend:
    try:
        return xconv.get_backend(ORACLE)
    except (xconv.BackendUnavailableError, xconv.UnknownBackendError):
        from xconv_numpy import NumpyBackend
        return NumpyBackend(exact=True)


class _LRU(collections.OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = self[key] = make()
        while len(self) > self.size:
            self.popitem(last=False)
        return value


_inputs_cache = _LRU(8)
_reference_cache = _LRU(8)


def inputs_of(case: Case) -> Inputs:
    return _inputs_cache.get_or(case.id, lambda: make_inputs(case))


def reference_of(case: Case) -> Reference:
    return _reference_cache.get_or(case.id, lambda: compute_reference(case, inputs_of(case)))


def compute_reference(case: Case, inputs: Inputs) -> Reference:
    """Run the oracle on float64 copies of the (cast) inputs, and on their absolute values."""
    oracle = oracle_backend()
    kw = dict(case.conv_kwargs(), output_mask=(True, True, True), backend=oracle)
    f64 = [np.ascontiguousarray(np.asarray(a, dtype=np.float64))
           for a in (inputs.grad_output, inputs.input, inputs.weight)]
    exact = xconv.convolution_backward(*f64, **kw)
    abs_sum = xconv.convolution_backward(*(np.abs(a) for a in f64), **kw)
    lengths = tolerance.reduction_lengths(case.params)
    bounds = tuple(tolerance.bound(e, a, lengths[name], case.dtype, case.math)
                   for name, e, a in zip(OUTPUTS, exact, abs_sum))
    floors = tuple(tolerance.rounding_floor(e, b, case.dtype) for e, b in zip(exact, bounds))
    return Reference(tuple(exact), tuple(abs_sum), lengths, bounds, inputs.digest(), floors)


# ---------------------------------------------------------------------------------------------
# Helpers


def resolve(backend) -> Backend:
    """The backend object; an unknown name raises BackendUnavailableError whose reason lists the registered names."""
    if not isinstance(backend, str):
        return backend
    try:
        return xconv.get_backend(backend)
    except xconv.UnknownBackendError as exc:
        raise BackendUnavailableError(backend, str(exc)) from None


def digest(a) -> str | None:
    """SHA-256 of an array's dtype, shape and bytes (None for None)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype}:{a.shape}\n".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def call_kwargs(case: Case) -> dict:
    kw = dict(case.conv_kwargs(), output_mask=case.mask, math=case.math, deterministic=case.deterministic)
    if case.bias_sizes:
        kw["bias_sizes"] = [case.c_out]
    return kw


def _backend_arrays(case: Case, inputs: Inputs, fam):
    return tuple(fam.make(a, case.layout) for a in (inputs.grad_output, inputs.input, inputs.weight))


class Spy(Backend):
    """Wraps a backend and records every primitive called on it."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.array_families = tuple(inner.array_families)
        self.priority = getattr(inner, "priority", 0)
        self.calls: list[str] = []

    def availability(self):
        info = self.inner.info()
        return info.available, info.reason

    def version(self):
        return self.inner.version()

    def devices(self):
        return self.inner.devices()

    def _record(self, what, *args):
        self.calls.append(what)
        return getattr(self.inner, what)(*args)

    def fprop(self, *args):
        return self._record("fprop", *args)

    def dgrad(self, *args):
        return self._record("dgrad", *args)

    def wgrad(self, *args):
        return self._record("wgrad", *args)

    def bgrad(self, *args):
        return self._record("bgrad", *args)

    def backward(self, *args):
        return self._record("backward", *args)


# ---------------------------------------------------------------------------------------------
# Running a case


def availability(backend) -> tuple[bool, str]:
    try:
        b = resolve(backend)
    except BackendUnavailableError as exc:
        return False, exc.reason
    info = b.info()
    return info.available, info.reason


def run_case(case: Case, backend, *, keep_outputs: bool = False, repeat_deterministic: bool = True) -> Outcome:
    """Run and judge ``case`` on ``backend`` (a name or a Backend object)."""
    start = time.perf_counter()
    name = backend if isinstance(backend, str) else backend.name
    try:
        b = resolve(backend)
    except BackendUnavailableError as exc:
        return Outcome(case.id, name, "unavailable", exc.reason)
    info = b.info()
    if not info.available:
        return Outcome(case.id, name, "unavailable", info.reason)
    fam_name = b.array_families[0] if b.array_families else "numpy"
    try:
        fam = family(fam_name)
    except ImportError as exc:
        return Outcome(case.id, name, "unavailable", f"array library {fam_name!r} cannot be imported: {exc}")
    try:
        if case.kind == "invalid":
            out = _run_invalid(case, b, fam)
        else:
            out = _run_valid(case, backend, b, fam, keep_outputs, repeat_deterministic)
    except Exception as exc:  # noqa: BLE001 - a crashing backend is a failed case, not a crashed kit
        out = Outcome(case.id, name, "failed", f"unexpected {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    out.seconds = time.perf_counter() - start
    return out


def _run_invalid(case: Case, b: Backend, fam) -> Outcome:
    spy = Spy(b)
    inputs = inputs_of(case)
    dy, x, w = _backend_arrays(case, inputs, fam)
    kw = call_kwargs(case)
    kw.update(dict(case.call))
    try:
        xconv.convolution_backward(dy, x, w, backend=spy, **kw)
    except ShapeError as exc:
        if spy.calls:
            return Outcome(case.id, b.name, "failed", f"ShapeError raised only after backend work {spy.calls}: {exc}")
        if exc.argument != case.argument:
            return Outcome(case.id, b.name, "failed",
                           f"ShapeError names argument {exc.argument!r}, expected {case.argument!r}: {exc}")
        return Outcome(case.id, b.name, "passed", f"ShapeError: {exc}")
    except BackendUnavailableError as exc:
        return Outcome(case.id, b.name, "unavailable", exc.reason)
    except Exception as exc:  # noqa: BLE001
        return Outcome(case.id, b.name, "failed",
                       f"expected ShapeError({case.argument!r}), got {type(exc).__name__}: {exc}"
                       + (f" after backend work {spy.calls}" if spy.calls else ""))
    return Outcome(case.id, b.name, "failed",
                   f"expected ShapeError({case.argument!r}) but the call returned"
                   + (f" after backend work {spy.calls}" if spy.calls else ""))


def _call(case, backend, arrays):
    return xconv.convolution_backward(*arrays, backend=backend, **call_kwargs(case))


def _traced_call(case, backend, arrays):
    """(results, record as a dict or None): the call under xconv.trace() (its record: this thread's call of this
    case's shapes, the trace being process-wide)."""
    with xconv.trace() as t:
        results = _call(case, backend, arrays)
    mine = [r for r in t.records if r.shapes.get("input") == list(case.input_shape) and r.op == "backward"]
    return results, (mine[-1].as_dict() if mine else None)


def _run_valid(case: Case, backend, b: Backend, fam, keep_outputs: bool, repeat: bool) -> Outcome:
    name = b.name
    inputs = inputs_of(case)
    try:
        arrays = _backend_arrays(case, inputs, fam)
    except FamilyError as exc:
        return Outcome(case.id, name, "refused", f"the kit cannot make these inputs as {fam.name} arrays: {exc}")
    try:
        results, record = _traced_call(case, backend, arrays)
    except UnsupportedError as exc:
        return Outcome(case.id, name, "refused", str(exc))
    except BackendUnavailableError as exc:
        return Outcome(case.id, name, "unavailable", exc.reason)
    except Exception as exc:  # noqa: BLE001
        return Outcome(case.id, name, "failed", f"the call raised {type(exc).__name__}: {exc}")
    problems: list[str] = []
    if not isinstance(results, (tuple, list)) or len(results) != 3:
        return Outcome(case.id, name, "failed", f"expected a 3-tuple of results, got {type(results).__name__}")
    ref = reference_of(case)
    shapes = (case.input_shape, case.weight_shape, (case.c_out,))
    outputs, ratios, worst_index, samples, floors = [], {}, {}, {}, []
    for i, (res, bit, shape, oname) in enumerate(zip(results, case.mask, shapes, OUTPUTS)):
        if not bit:
            if res is not None:
                problems.append(f"{oname}: output_mask bit is False but a result was returned")
            outputs.append(None)
            continue
        if res is None:
            problems.append(f"{oname}: output_mask bit is True but the result is None")
            outputs.append(None)
            continue
        got_dtype = dtype_name(getattr(res, "dtype", None)) if getattr(res, "dtype", None) is not None else None
        if got_dtype != case.dtype:
            problems.append(f"{oname}: dtype {getattr(res, 'dtype', None)} differs from the inputs' {case.dtype}")
        got_shape = tuple(int(s) for s in getattr(res, "shape", ()))
        if got_shape != tuple(shape):
            problems.append(f"{oname}: shape {got_shape}, expected {tuple(shape)}")
            outputs.append(None)
            continue
        arr = np.array(fam.to_numpy(res), order="C", copy=True)     # a copy: the check below needs one
        outputs.append(arr)
        ratio = tolerance.error_ratio(arr, ref.exact[i], ref.bounds[i])
        w, idx = tolerance.worst(ratio)
        ratios[oname], worst_index[oname] = w, idx
        floors.append(ref.floors[i])
        samples[oname] = _log_ratio_sample(ratio)
        if not w <= 1.0:
            e = float(ref.exact[i][idx]) if idx is not None else 0.0
            g = float(arr.astype(np.float64)[idx]) if idx is not None else 0.0
            bad = int(np.count_nonzero(~(ratio <= 1.0)))
            problems.append(f"{oname}: {bad} of {ratio.size} elements outside the error bound; worst at {idx}: "
                            f"got {g!r}, exact {e!r}, |error| {abs(g - e):.3e} = {w:.3g} x bound "
                            f"{float(ref.bounds[i][idx]):.3e} (K={ref.lengths[oname]})")
        elif case.fill == "exact":
            problems += exact.problems(oname, arr, ref.exact[i])
    digests = tuple(digest(o) for o in outputs)
    if case.deterministic and repeat and not problems:
        try:
            again = _call(case, backend, _backend_arrays(case, inputs, fam))
        except UnsupportedError as exc:
            return Outcome(case.id, name, "refused", f"second call: {exc}")
        for oname, first, res, bit in zip(OUTPUTS, outputs, again, case.mask):
            if bit and res is not None and first is not None:
                second = np.ascontiguousarray(fam.to_numpy(res))
                if digest(second) != digest(first):
                    differ = int(np.count_nonzero(first.view(np.uint8) != second.view(np.uint8)))
                    problems.append(f"{oname}: deterministic=True but a second call differs ({differ} bytes differ)")
    if case.deterministic == "batch_invariant" and not problems:
        try:
            problems += invariance.problems(case, backend, _backend_arrays(case, inputs, fam), outputs[0], fam,
                                            call_kwargs(case))
        except UnsupportedError as exc:
            return Outcome(case.id, name, "refused", f"batch-invariance check: {exc}")
    if case.deterministic and not problems and any(value_invariance.declared(b)):
        try:
            problems += value_invariance.problems(case, backend, b, inputs, outputs, fam, call_kwargs(case))
        except UnsupportedError as exc:
            return Outcome(case.id, name, "refused", f"mask/layout check: {exc}")
    ratio = max(ratios.values()) if ratios else None
    status = "failed" if problems else "passed"
    return Outcome(case.id, name, status, "; ".join(problems), ratio, ratios, worst_index,
                   tuple(outputs) if keep_outputs else None, digests, ratio_samples=samples,
                   live=(fam, tuple(results)), record=record, floor=max(floors) if floors else None)


def _log_ratio_sample(ratio: np.ndarray, limit: int = 2048) -> np.ndarray:
    """log10 of up to ``limit`` ratios (the largest ones and an even sample), for the report's histograms."""
    flat = ratio.ravel()
    if flat.size > limit:
        step = flat.size // limit + 1
        flat = np.concatenate([flat[::step], np.sort(flat)[-64:]])
    with np.errstate(divide="ignore"):
        return np.log10(np.maximum(flat, 1e-30)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Results must stay valid: a later call must not change them


class Watch:
    """Holds the results a backend returned for recent cases and notices when a later call changes them.

    A backend that returns views of memory it reuses (a scratch arena, a cache) hands its caller
    results that a later call silently overwrites. After each case, :meth:`after` re-hashes the
    results of up to ``window`` earlier cases (at most ``max_bytes`` of them) and fails the case
    whose call changed one.
    """

    def __init__(self, window: int = 32, max_bytes: int = 64 << 20):
        self.window, self.max_bytes = window, max_bytes
        self.kept: list = []          # (case id, family, results, digests, nbytes)

    def after(self, outcome: Outcome) -> Outcome:
        changed = []
        for cid, fam, results, digests, _ in self.kept:
            for oname, res, before in zip(OUTPUTS, results, digests):
                if res is not None and before is not None and digest(fam.to_numpy(res)) != before:
                    changed.append(f"{oname} of {cid}")
        if changed:
            self.kept = [k for k in self.kept if not any(k[0] in c for c in changed)]
            if outcome.status in ("passed", "failed"):
                outcome.status = "failed"
                note = (f"this call changed results the backend had returned for earlier cases ({', '.join(changed)}): "
                        "they are views of memory the backend reuses")
                outcome.message = f"{outcome.message}; {note}" if outcome.message else note
        if outcome.live is not None and outcome.digests is not None:
            fam, results = outcome.live
            nbytes = sum(int(getattr(r, "nbytes", 0) or 0) for r in results if r is not None)
            if nbytes <= self.max_bytes:
                self.kept.append((outcome.case_id, fam, results, outcome.digests, nbytes))
        outcome.live = None
        while self.kept and (len(self.kept) > self.window or sum(k[4] for k in self.kept) > self.max_bytes):
            self.kept.pop(0)
        return outcome


# ---------------------------------------------------------------------------------------------
# The fresh-process determinism check (the digests come from :class:`.isolation.FreshDigests`)


def apply_fresh_process(outcome: Outcome, fresh) -> Outcome:
    """Fail ``outcome`` when a fresh process's digests differ from this process's (deterministic cases).

    ``fresh``: the digests, a string saying why there are none, or an :class:`.isolation.Died`
    (the fresh process crashed or hung on this case: the case takes that status, signal and stderr).
    """
    if outcome.status != "passed" or outcome.digests is None:
        return outcome
    if getattr(fresh, "status", None) in DIED:
        from .isolation import _hint
        outcome.status, outcome.signal, outcome.stderr = fresh.status, fresh.signal, fresh.stderr
        outcome.message = f"in the fresh process of the determinism check: {fresh.detail}{_hint(fresh.stderr)}"
        return outcome
    if isinstance(fresh, str):
        if fresh.startswith("refused"):
            outcome.status, outcome.message = "failed", f"refused in a fresh process but not here: {fresh}"
        elif fresh.startswith("unregistered"):
            outcome.message = (outcome.message + "; " if outcome.message else "") + f"fresh-process check skipped: {fresh}"
        else:
            outcome.status, outcome.message = "failed", f"fresh process: {fresh}"
        return outcome
    for oname, here, there in zip(OUTPUTS, outcome.digests, fresh):
        if here != there:
            outcome.status = "failed"
            outcome.message = (f"{oname}: deterministic=True but a fresh process computed different bits "
                               f"(sha256 {str(there)[:12]} vs {str(here)[:12]})")
            break
    return outcome
