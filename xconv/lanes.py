"""Lanes: one configuration validated once, then run again without the public call's per-call checks.

A converted torch module calls the same convolution with the same parameter objects (its ``torch_ops.Conf``)
over and over. A public call (:mod:`xconv.api`) reads its configuration anew each time: the plan key
(:mod:`xconv.plan_cache`), the family and array checks, the legalization tests, the trace. About 20 us of
Python per call, more than a small convolution's kernel. A *lane* keeps what one full public call resolved
(its backend and :class:`~xconv.params.ConvParams`) for one owner (a ``Conf``: a frozen, hashable value, so
that modules of one configuration share their lanes, and a ``Conf`` made anew per call, as for a transposed
module called with ``output_size=``, finds the lane of the last) and one set of array signatures, and
afterwards runs :mod:`xconv.legalize` on it (which calls the backend's primitive straight where it rewrites
nothing: :func:`xconv.legalize.run_fprop`). Where it rewrites nothing and the backend offers one
(:meth:`xconv.backend.Backend.lane`), the lane calls the backend's runner for the configuration instead: what the
primitive does without the per-call decisions the backend can make once (the NumPy backend's path choice; 20-30 us
of Python per call on a MobileNet layer). A transposed forward that legalization runs as one data gradient of the
direct convolution (the NumPy backend's ConvTranspose2d) calls the backend's runner for that dgrad
(``Backend.lane(q, "dgrad")``) and adds the bias as the legalization does. Inside a model each call finds the caches
cold (the layers before it streamed their weights through them) and every Python call costs a few µs: the lane's
checks are written in line where they run on every call.

Contract: :func:`fprop` and :func:`backward` return what ``xconv.conv_fprop`` / ``xconv.convolution_backward``
return for the same arguments: the same backend, params, error wrapping (:func:`xconv.guard.call`), output
checks, hence the same bits. A lane opens only for plain ``numpy.ndarray`` arrays in native byte order and
aligned (what :func:`xconv.arrays.host_ready` passes as they are) whose plan's memory guard cannot refuse
(``Plan.guard_each_call`` False). Each use re-checks what could change (else the public call runs, and may
open the lane again): no trace open (a traced call is recorded by the public call), the ``XCONV_*`` settings'
raw values, :data:`xconv.limits.UNCHECKED_BYTES` and the registry's generation as at opening (what the plan key
holds), the backend available and declaring what it runs (as a plan-cache hit re-checks),
each array's type, shape, dtype and alignment.
"""

from __future__ import annotations

import threading

import numpy as np

import xconv

from . import api, guard, legalize, limits, plan_cache, registry, settings, tracing
from .backend import Backend, availability_of

#: Lanes kept (a model holds one per distinct layer configuration and mask); past it the oldest opened is dropped.
MAX_LANES = 4096

_lanes: dict = {}
_lock = threading.Lock()
_NDARRAY = np.ndarray
_NO = object()                  # an array signature no lane is opened for


class _Lane:
    __slots__ = ("env", "unchecked", "generation", "backend", "params", "runner", "caps")

    def __init__(self, env, generation, backend, params, runner=None):
        self.env, self.generation, self.backend, self.params = env, generation, backend, params
        self.unchecked = limits.UNCHECKED_BYTES          # the memory guard's threshold the plan was judged by
        self.runner = runner                             # the backend's (Backend.lane), or None
        self.caps = getattr(backend, "capabilities", None)               # what the opening call was checked against

    def usable(self) -> bool:
        # (tracing.active() and registry.generation() read in line: each call here finds the caches cold in a model)
        b = self.backend
        # b.availability is the base class's (always available)? Read anew each call: a backend or a test may
        # replace it on the object or its class at any time
        base = getattr(getattr(b, "availability", None), "__func__", None) is _BASE_AVAILABILITY
        if (tracing._open or registry._generation != self.generation
                or settings._raw() != self.env or limits.UNCHECKED_BYTES != self.unchecked
                or not (base or availability_of(b)[0])):
            return False
        if b.capabilities is not self.caps:              # what it declares it runs may change: refused by name
            legalize.check_supported(b, self.params)    # (a Capabilities is frozen: the same object, the same check)
        return True


_BASE_AVAILABILITY = Backend.availability


def _signature(a):
    """(shape, dtype) of a plain, aligned, native-order ndarray (None for None); :data:`_NO` for anything else."""
    if a is None:
        return None
    if type(a) is not _NDARRAY or not a.flags.aligned or not a.dtype.isnative:
        return _NO
    return a.shape, a.dtype


def fprop(owner, x, w, bias, kwargs):
    """``xconv.conv_fprop(x, w, bias=bias, **kwargs())``, by ``owner``'s lane for these arrays' signatures when one
    is open and usable. ``owner`` is a hashable value fixing every keyword and equal only to owners that validate
    alike (an exact ``torch_ops.Conf``), or None: no lane, the public call; ``kwargs`` a callable returning the public
    keywords (called only when the lane misses)."""
    if owner is None:
        return xconv.conv_fprop(x, w, bias=bias, **kwargs())
    key = (owner, "fprop",                               # _signature of each, x's and w's in line (the usual call)
           (x.shape, x.dtype) if type(x) is _NDARRAY and x.flags.aligned and x.dtype.isnative else _NO,
           (w.shape, w.dtype) if type(w) is _NDARRAY and w.flags.aligned and w.dtype.isnative else _NO,
           None if bias is None else _signature(bias))
    lane = _lanes.get(key)
    if lane is not None and lane.usable():
        b = lane.backend
        if lane.runner is not None:
            y = guard.call(b, "conv_fprop", lane.runner, x, w, bias)
            if y is not NotImplemented:
                return legalize._expect(b, y, lane.params.output_shape, "fprop output")
        return guard.call(b, "conv_fprop", legalize.run_fprop, b, x, w, bias, lane.params)
    args = kwargs()
    y = xconv.conv_fprop(x, w, bias=bias, **args)
    if _NO not in key:
        backend = args.pop("backend")
        _open(key, {"input": x, "weight": w}, backend, ["output"], api.fprop_args(bias=bias, **args), "fprop")
    return y


def backward(owner, dy, x, w, bias_sizes, mask: tuple, kwargs):
    """``xconv.convolution_backward(dy, x, w, bias_sizes=bias_sizes, output_mask=mask, **kwargs())`` by ``owner``'s
    lane (see :func:`fprop`); ``mask`` a tuple of three bools, ``bias_sizes`` None or a list of ints."""
    if owner is None:
        return xconv.convolution_backward(dy, x, w, bias_sizes=bias_sizes, output_mask=mask, **kwargs())
    key = (owner, mask,                                  # _signature of each, in line (see fprop)
           (dy.shape, dy.dtype) if type(dy) is _NDARRAY and dy.flags.aligned and dy.dtype.isnative else _NO,
           (x.shape, x.dtype) if type(x) is _NDARRAY and x.flags.aligned and x.dtype.isnative else _NO,
           (w.shape, w.dtype) if type(w) is _NDARRAY and w.flags.aligned and w.dtype.isnative else _NO,
           None if bias_sizes is None else tuple(bias_sizes))
    lane = _lanes.get(key)
    if lane is not None and lane.usable():
        b = lane.backend
        if lane.runner is not None:
            results = guard.call(b, "convolution_backward", lane.runner, dy, x, w)
            if results is not NotImplemented:
                return legalize.checked_backward(b, results, lane.params, mask)
        return guard.call(b, "convolution_backward", legalize.run_backward, b, dy, x, w, lane.params, mask)
    args = kwargs()
    results = xconv.convolution_backward(dy, x, w, bias_sizes=bias_sizes, output_mask=mask, **args)
    if _NO not in key and any(mask):
        backend = args.pop("backend")
        outputs = [name for name, bit in zip(("input", "weight", "bias"), mask) if bit]
        _open(key, {"grad_output": dy, "input": x, "weight": w}, backend, outputs,
              api.backward_args(bias_sizes=bias_sizes, **args), "backward", mask)
    return results


def _open(key, tensors: dict, backend, outputs, args: dict, op: str, mask=None) -> None:
    """Keep a lane for ``key`` when the call just made (successfully) resolved to a plan that lets it open, with
    the backend's runner (:meth:`xconv.backend.Backend.lane`) where the call reaches its primitive unchanged."""
    env = settings.key()
    plan = plan_cache.plan_of(tensors, backend, outputs, args)
    if plan is None or plan.guard_each_call or plan.family != "numpy":
        return
    b, p = plan.backend, plan.params                     # no runner on any failure: the lane calls the primitive
    runner = plan_cache.backend_runner(b, p, op, mask)
    if runner is None and op == "fprop" and p.transposed:
        runner = _transposed_runner(b, p)
    lane = _Lane(env, registry.generation(), b, p, runner)
    with _lock:
        _lanes.pop(key, None)                          # reopened: counts as the newest
        _lanes[key] = lane
        while len(_lanes) > MAX_LANES:
            del _lanes[next(iter(_lanes))]


def _transposed_runner(b, p):
    """A transposed forward's runner where legalization runs it as one data gradient of the direct convolution
    (:func:`xconv.legalize.transposed_dgrad`) and the backend offers a runner for that (``b.lane(q, "dgrad")``):
    what :func:`xconv.legalize.fprop` does (the dgrad primitive's call, its result checked, the bias added), without
    the legalization's per-call decisions; else None."""
    if not _lane_serves_dgrad(b):                        # a backend's lane that knows only fprop and backward
        return None
    try:
        q = legalize.transposed_dgrad(b, p)
        make = getattr(b, "lane", None)
        dgrad = make(q, "dgrad") if q is not None and callable(make) else None
    except Exception:
        return None
    if not callable(dgrad):
        return None
    shape = q.input_shape

    def run(x, w, bias):
        dx = guard.call(b, "dgrad", dgrad, x, w)
        if dx is NotImplemented:
            return NotImplemented
        return legalize._add_bias(legalize._expect(b, dx, shape, "grad_input"), bias, (x, w))
    return run


def _lane_serves_dgrad(b) -> bool:
    """Whether the ``lane`` that ``b`` has declares op "dgrad": ``lane_dgrad = True`` where that ``lane`` is defined
    (the instance, or the class of its type's MRO that defines it), so that a subclass overriding ``lane`` with one
    of two ops does not inherit its base's declaration."""
    for owner in (b, *type(b).__mro__):
        found = vars(owner) if hasattr(owner, "__dict__") else {}
        if "lane" in found:
            return found.get("lane_dgrad") is True
    return False


def clear() -> None:
    """Drop every lane (the next call of each runs the public call)."""
    with _lock:
        _lanes.clear()
