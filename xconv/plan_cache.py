"""Per-configuration plans of the public calls, cached like cuDNN's: a repeated call skips re-validation.

A call's validation (:func:`xconv.api._prepare`: shapes, dtypes, every parameter, the backend
choice, the memory guard) is a pure function of what it reads: each tensor's type, shape and
dtype, the value and type of every parameter, the ``backend=`` argument, the ``XCONV_*`` settings
(:func:`xconv.settings.key`: ``$XCONV_BACKEND``, ``$XCONV_MEMORY_LIMIT``, ``$XCONV_WORKSPACE_LIMIT``, ...)
and the registry's contents. :func:`prepared` keys a plan on exactly
those and keeps the validated result (backend, :class:`~xconv.params.ConvParams`) of each call
that passed, so a call with the same key gets the same result without running the checks again.
A call that fails validation is never stored: a bad argument is refused with the same error
whether or not a good call with the same shapes came before it.

What can change without changing the key is re-checked on every hit: the backend's
availability (an unavailable one sends the call through validation again, which selects anew or
says why nothing can run) and what it declares it runs (:func:`xconv.legalize.check_supported`), and the
memory guard unless the call is too small to be checked (see :data:`xconv.limits.UNCHECKED_BYTES`).
Parameter values of types other than ``int``, ``bool``, ``str``, ``float``, ``None``, NumPy
scalars and tuples or lists of them (a NumPy array as ``padding``, say) make a call uncacheable:
it is validated in full, as before.

A plan also keeps its backend's runner (:func:`runner`, :meth:`xconv.backend.Backend.lane`, made at the plan's first
reuse): a repeated call of NumPy arrays (no trace open, a memory guard that cannot refuse, legalization rewriting
nothing) runs it instead of the primitive, as :mod:`xconv.lanes` runs a torch module's repeated calls: the same
results, bits and errors without the backend's per-call decisions.

Thread safety: lookups are plain dict reads; inserts and evictions take a lock. At most
:data:`MAX_PLANS` plans are kept, the oldest inserted evicted first.
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

from . import legalize, limits, registry, settings
from .backend import availability_of
from .dtypes import DTYPES

#: Plans kept (the oldest inserted evicted first).
MAX_PLANS = 256

_plans: dict = {}
_lock = threading.Lock()
_SCALARS = frozenset({int, bool, str, float, type(None), np.bool_, np.int8, np.int16, np.int32, np.int64,
                      np.uint8, np.uint16, np.uint32, np.uint64})


class Plan(NamedTuple):
    """A validated call: its backend (the object the backend argument resolved to) and params, and
    whether the memory guard must run again on each call (False: too small to be checked); ``runners`` holds the
    backend's runner for the call, made at the plan's first reuse (:func:`runner`)."""

    backend: object
    params: object
    guard_each_call: bool
    family: str | None
    runners: dict


class _Uncacheable(Exception):
    pass


#: id(tuple) -> (the tuple, its key) for tuples of scalars and such tuples: a call repeated with the very same
#: parameter objects (a converted torch module's) skips the walk; the tuple is held, so its id is not reused.
_tuple_keys: dict = {}
_MAX_TUPLE_KEYS = 1024


def _value_key(v):
    """``v`` as a hashable key that tells apart every value validation tells apart (type included)."""
    t = type(v)
    if t in _SCALARS:
        return t, v
    if t is tuple:
        hit = _tuple_keys.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        key = t, tuple(_value_key(e) for e in v)
        if all(type(e) in _SCALARS or (type(e) is tuple and id(e) in _tuple_keys) for e in v):   # immutable
            if len(_tuple_keys) >= _MAX_TUPLE_KEYS:
                _tuple_keys.clear()
            _tuple_keys[id(v)] = (v, key)
        return key
    if t is list:
        return t, tuple(_value_key(e) for e in v)
    raise _Uncacheable


def _array_key(a):
    if a is None:
        return None
    try:
        key = (type(a), tuple(a.shape), a.dtype)
        hash(key)
    except (AttributeError, TypeError):
        raise _Uncacheable from None
    return key


def _key(tensors: dict, backend, outputs, args: dict, bias, env: tuple):
    """One flat tuple: the tensors' names and (type, shape, dtype), the bias's, the outputs, each argument's name
    and typed value, the backend, the settings snapshot ``env`` and the registry state validation reads."""
    key = [backend if backend is None or type(backend) is str else ("object", id(backend)), tuple(outputs),
           env, limits.UNCHECKED_BYTES, registry.generation(),
           _array_key(bias), tuple(tensors), tuple(args)]         # the names fix where each entry below belongs
    for a in tensors.values():
        key.append(_array_key(a))
    for name, v in args.items():
        if name != "bias":
            t = type(v)
            key += (t, v) if t in _SCALARS else (t, _value_key(v))
    return tuple(key)


def _static_guard(p, outputs, tensors: dict, bias) -> bool:
    """Whether the memory guard can never refuse this call (no $XCONV_MEMORY_LIMIT, and even with every
    input copied and the padded input or output materialized it stays below UNCHECKED_BYTES)."""
    if settings.current().memory_limit is not None:
        return False
    shapes = {"input": p.input_shape, "weight": p.weight_shape, "bias": (p.bias_size,), "output": p.output_shape}
    grown = p.output_shape if p.transposed else p.input_shape
    padded = math.prod(grown[:2]) * math.prod(n + a + b for n, (a, b) in zip(grown[2:], p.padding))
    elements = (sum(math.prod(shapes[o]) for o in outputs) + padded
                + sum(math.prod(a.shape) for a in (*tensors.values(), bias) if a is not None))
    itemsize = max(DTYPES[p.dtype].itemsize if p.dtype in DTYPES else 8, 8)
    return elements * itemsize < limits.UNCHECKED_BYTES


def prepared(tensors: dict, backend, outputs, args: dict, validate, guard_memory):
    """(backend, params) of a call: from its plan when an identical call passed before, else from
    ``validate(tensors, backend, outputs, **args)`` (stored when it passes).

    ``guard_memory(backend, params, outputs, arrays)`` is the memory guard :func:`validate` runs
    for NumPy arrays; a hit runs it again unless the plan says it cannot refuse.
    """
    return prepared_plan(tensors, backend, outputs, args, validate, guard_memory)[:2]


def prepared_plan(tensors: dict, backend, outputs, args: dict, validate, guard_memory):
    """(backend, params, plan) of a call, as :func:`prepared`: ``plan`` the :class:`Plan` the call was found in (a
    hit, everything it keys on checked as for any hit), None where the call was validated now."""
    bias = args.get("bias")
    env = settings.key()                    # a bad XCONV_* variable is refused here, cached call or not
    try:
        key = _key(tensors, backend, outputs, args, bias, env)
    except _Uncacheable:
        return (*validate(tensors, backend, outputs, **args), None)
    plan = _plans.get(key)
    if plan is None:
        b, p = validate(tensors, backend, outputs, **args)
        family = _family(tensors, bias)
        key = _key(tensors, backend, outputs, args, bias, env)  # validation may have loaded the registry
        _store(key, Plan(b, p, not _static_guard(p, outputs, tensors, bias), family, {}))
        return b, p, None
    b, p = plan.backend, plan.params
    if backend is not None and type(backend) is not str and backend is not b:
        return (*validate(tensors, backend, outputs, **args), None)     # an id reused by another object
    if not availability_of(b)[0]:
        return (*validate(tensors, backend, outputs, **args), None)     # selects again, or says why nothing can run
    legalize.check_supported(b, p)
    if plan.guard_each_call and plan.family == "numpy":
        guard_memory(b, p, outputs, dict(tensors, bias=bias))
    return b, p, plan


def runner(plan: Plan, op: str, mask=None):
    """The backend's runner for the plan's call (:meth:`xconv.backend.Backend.lane`: ``op`` "fprop" or "backward",
    ``mask`` the latter's output mask), made once per plan, or None: a plan of a call whose memory guard may refuse,
    of arrays other than NumPy's, or whose backend offers no runner or legalization rewrites the call (the runner is
    the backend's primitive without its per-call decisions; it may still return NotImplemented for a call)."""
    kept = plan.runners.get((op, mask), _MISSING)
    if kept is _MISSING:
        kept = None
        if not plan.guard_each_call and plan.family == "numpy":
            kept = backend_runner(plan.backend, plan.params, op, mask)
        plan.runners[(op, mask)] = kept
    return kept


_MISSING = object()


def backend_runner(b, p, op: str, mask=None):
    """``b.lane(p, op, mask)`` where the call reaches the backend's primitive unchanged
    (:func:`xconv.legalize._kept_direct`) and it returns a callable; else None (also when it raises: the primitive
    runs instead)."""
    try:
        make = getattr(b, "lane", None)
        made = make(p, op, mask) if callable(make) and legalize._kept_direct(b, p, op) else None
    except Exception:
        made = None
    return made if callable(made) else None


def plan_of(tensors: dict, backend, outputs, args: dict) -> Plan | None:
    """The plan kept for a call with exactly these arguments (as :func:`prepared` takes them), or None; validates
    nothing (the caller has just made that call, which passed)."""
    try:
        key = _key(tensors, backend, outputs, args, args.get("bias"), settings.key())
    except _Uncacheable:
        return None
    plan = _plans.get(key)
    if plan is None or (backend is not None and type(backend) is not str and backend is not plan.backend):
        return None
    return plan


def _family(tensors: dict, bias):
    from .arrays import common_family

    return common_family(dict(tensors, bias=bias))


def _store(key, plan: Plan) -> None:
    with _lock:
        _plans[key] = plan
        while len(_plans) > MAX_PLANS:
            del _plans[next(iter(_plans))]


def clear() -> None:
    """Forget every plan (the next call of each configuration is validated in full), and what legalization kept of
    their params (:func:`xconv.legalize.clear`)."""
    with _lock:
        _plans.clear()
    legalize.clear()


def size() -> int:
    """The number of plans kept."""
    return len(_plans)
