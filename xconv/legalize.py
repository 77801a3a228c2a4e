"""Legalization: run a validated call on a backend using only what the backend declares.

The core does this once, for every backend:

- empty tensors (N, C_in or C_out of 0) give zeros without calling the backend;
- 1-D runs as 2-D with a unit H dim when the backend lacks 1-D;
- transposed convolution maps onto direct primitives when the backend lacks it:
  transposed fprop = direct dgrad, its dgrad = direct fprop, its wgrad = direct wgrad with
  the roles of input and grad_output swapped, its bias gradient = the sum of grad_output;
- asymmetric padding becomes explicit zero padding of the input plus symmetric padding;
- non-contiguous arrays are copied when the backend takes only contiguous ones.

Each function here takes a backend and normalized :class:`ConvParams` and returns what the
public call returns. :func:`run_fprop` and :func:`run_backward`, what the public calls run, send a call none of
these rewrites touches straight to the primitive, that answer kept per plan params object (:func:`_kept_direct`).
"""

from __future__ import annotations

import math as _math
import sys as _sys
import threading

import numpy as np

from . import guard, registry, tracing
from .arrays import contiguous, crop, zero_pad, zeros
from .backend import Backend
from .errors import UnsupportedError, XconvError
from .params import ConvParams

_NDARRAY = np.ndarray


def capabilities(b: Backend, p: ConvParams, op: str):
    """What ``b`` runs natively for this configuration and primitive (see Backend.capabilities_for).

    Backends need not subclass Backend: one without ``capabilities_for`` has ``capabilities`` everywhere."""
    narrow = getattr(b, "capabilities_for", None)
    return b.capabilities if narrow is None else guard.call(b, f"capabilities_for({op})", narrow, p, op)


def check_supported(b: Backend, p: ConvParams) -> None:
    """Raise UnsupportedError, before any work, for what legalization cannot make runnable."""
    caps = b.capabilities
    rank = 2 if p.nd == 1 and 1 not in caps.spatial_dims else p.nd
    if rank not in caps.spatial_dims:
        raise UnsupportedError(f"backend {b.name!r} does not run {p.nd}-D convolution "
                               f"(it runs {sorted(caps.spatial_dims)}-D)")
    if p.dtype not in caps.dtypes:
        raise UnsupportedError(f"backend {b.name!r} does not take dtype {p.dtype} (it takes {sorted(caps.dtypes)})")
    if p.math not in caps.math:
        raise UnsupportedError(f"backend {b.name!r} does not offer math={p.math!r} (it offers {sorted(caps.math)})")
    if p.deterministic and not caps.deterministic:
        raise UnsupportedError(f"backend {b.name!r} cannot promise deterministic results")
    if p.deterministic == "batch_invariant" and not getattr(caps, "batch_invariant", False):
        raise UnsupportedError(f"backend {b.name!r} cannot promise batch-invariant results "
                               "(deterministic='batch_invariant'); deterministic=True is run-to-run only")


# ---------------------------------------------------------------------------------------------
# The rewrites, as the trace record's ``legalized`` names them

EMPTY = "empty tensors as zeros (backend not called)"
LIFT_1D = "1-D as 2-D (unit H dim)"
TRANSPOSED = "transposed as direct primitives"
EXPLICIT_PADDING = "asymmetric padding as explicit zero padding"
STRIDED_COPIED = "strided input copied to contiguous"


# ---------------------------------------------------------------------------------------------
# The four primitives and the combined backward


def run_fprop(b: Backend, x, w, bias, p: ConvParams):
    """:func:`fprop` for a public call's plan params ``p`` (the object the plan cache hands out on each hit): the
    primitive straight where legalization rewrites nothing (:func:`_kept_direct`)."""
    if _kept_direct(b, p, "fprop"):
        return _expect(b, guard.call(b, "fprop", b.fprop, x, w, bias, p), p.output_shape, "fprop output")
    return fprop(b, x, w, bias, p)


def run_backward(b: Backend, dy, x, w, p: ConvParams, mask):
    """:func:`backward` for a public call's plan params ``p`` (see :func:`run_fprop`)."""
    if any(mask) and _kept_direct(b, p, "backward"):
        return checked_backward(b, guard.call(b, "backward", b.backward, dy, x, w, p, mask), p, mask)
    return backward(b, dy, x, w, p, mask)


def fprop(b: Backend, x, w, bias, p: ConvParams):
    if _empty(p):
        tracing.legalized(EMPTY)
        return _add_bias(zeros(x, p.output_shape), bias)
    caps = capabilities(b, p, "fprop")
    if _lift(caps, p):
        tracing.legalized(LIFT_1D)
        return _squeeze(fprop(b, _unsqueeze(x), _unsqueeze(w), bias, _lifted(p)))
    if p.transposed and not caps.transposed:
        tracing.legalized(TRANSPOSED)
        q = p.as_direct()
        return _add_bias(dgrad(b, _extend(x, q.output_shape), w, q), bias, (x, w))
    if _needs_explicit_padding(caps, p):
        tracing.legalized(EXPLICIT_PADDING)
        q, pads = _symmetric(p)
        if p.transposed:  # the symmetric output is larger: crop it
            return crop(fprop(b, x, w, bias, q), [pre for pre, _ in pads], p.output_shape[2:])
        return fprop(b, zero_pad(x, pads), w, bias, q)
    return _expect(b, guard.call(b, "fprop", b.fprop, *_native(caps, x, w, bias), p), p.output_shape,
                   "fprop output")


def transposed_dgrad(b: Backend, p: ConvParams) -> ConvParams | None:
    """The direct params ``q`` whose data gradient :func:`fprop` computes for the transposed ``p`` where nothing else
    is rewritten (not empty, not lifted, x not extended: output_padding below the stride) and ``b.dgrad`` takes
    ``q``'s arrays as they are (:func:`_kept_direct`); else None. :mod:`xconv.lanes` runs such a forward as the
    backend's dgrad runner, then :func:`_add_bias`, as :func:`fprop` does."""
    if not p.transposed or _empty(p):
        return None
    caps = capabilities(b, p, "fprop")
    if caps.transposed or _lift(caps, p):
        return None
    q = p.as_direct()
    if tuple(q.output_shape) != tuple(p.input_shape) or not _kept_direct(b, q, "dgrad"):
        return None
    return q


def dgrad(b: Backend, dy, w, p: ConvParams):
    if _empty(p):
        tracing.legalized(EMPTY)
        return zeros(dy, p.input_shape)
    caps = capabilities(b, p, "dgrad")
    if _lift(caps, p):
        tracing.legalized(LIFT_1D)
        return _squeeze(dgrad(b, _unsqueeze(dy), _unsqueeze(w), _lifted(p)))
    if p.transposed and not caps.transposed:
        tracing.legalized(TRANSPOSED)
        q = p.as_direct()
        return crop(fprop(b, dy, w, None, q), (0,) * p.nd, p.input_shape[2:])
    if _needs_explicit_padding(caps, p):
        tracing.legalized(EXPLICIT_PADDING)
        q, pads = _symmetric(p)
        if p.transposed:  # grad_output of the larger symmetric output: zeros where p's output was cropped
            return dgrad(b, zero_pad(dy, pads), w, q)
        return crop(dgrad(b, dy, w, q), [pre for pre, _ in pads], p.input_shape[2:])
    return _expect(b, guard.call(b, "dgrad", b.dgrad, *_native(caps, dy, w), p), p.input_shape, "grad_input")


def wgrad(b: Backend, x, dy, p: ConvParams):
    if _empty(p):
        tracing.legalized(EMPTY)
        return zeros(dy, p.weight_shape)
    caps = capabilities(b, p, "wgrad")
    if _lift(caps, p):
        tracing.legalized(LIFT_1D)
        return _squeeze(wgrad(b, _unsqueeze(x), _unsqueeze(dy), _lifted(p)))
    if p.transposed and not caps.transposed:
        tracing.legalized(TRANSPOSED)
        q = p.as_direct()
        return wgrad(b, dy, _extend(x, q.output_shape), q)
    if _needs_explicit_padding(caps, p):
        tracing.legalized(EXPLICIT_PADDING)
        q, pads = _symmetric(p)
        if p.transposed:
            return wgrad(b, x, zero_pad(dy, pads), q)
        return wgrad(b, zero_pad(x, pads), dy, q)
    return _expect(b, guard.call(b, "wgrad", b.wgrad, *_native(caps, x, dy), p), p.weight_shape, "grad_weight")


def bgrad(b: Backend, dy, p: ConvParams):
    """Sum of dy over N and the spatial dims; ``p`` may be transposed (bgrad reads only its dtype and flags)."""
    if _math.prod(dy.shape) == 0:
        return zeros(dy, (p.bias_size,))
    return _expect(b, guard.call(b, "bgrad", b.bgrad, *_native(capabilities(b, p, "bgrad"), dy), p),
                   (p.bias_size,), "grad_bias")


def backward(b: Backend, dy, x, w, p: ConvParams, mask):
    m_in, m_w, m_b = mask
    if not any(mask):
        return None, None, None
    if _empty(p):
        tracing.legalized(EMPTY)
        return (zeros(dy, p.input_shape) if m_in else None, zeros(dy, p.weight_shape) if m_w else None,
                bgrad(b, dy, p) if m_b else None)
    caps = capabilities(b, p, "backward")
    if _lift(caps, p):
        tracing.legalized(LIFT_1D)
        dx, dw, db = backward(b, _unsqueeze(dy), _unsqueeze(x), _unsqueeze(w), _lifted(p), mask)
        return _squeeze(dx), _squeeze(dw), db
    if p.transposed and not caps.transposed:
        tracing.legalized(TRANSPOSED)
        return (dgrad(b, dy, w, p) if m_in else None, wgrad(b, x, dy, p) if m_w else None,
                bgrad(b, dy, p) if m_b else None)
    if _needs_explicit_padding(caps, p):
        tracing.legalized(EXPLICIT_PADDING)
        q, pads = _symmetric(p)
        if p.transposed:
            return backward(b, zero_pad(dy, pads), x, w, q, mask)
        dx, dw, db = backward(b, dy, zero_pad(x, pads), w, q, mask)
        return (crop(dx, [pre for pre, _ in pads], p.input_shape[2:]) if m_in else None), dw, db
    return checked_backward(b, guard.call(b, "backward", b.backward, *_native(caps, dy, x, w), p, mask), p, mask)


def checked_backward(b: Backend, results, p: ConvParams, mask):
    """``results`` of ``b.backward`` when they are what ``mask`` asks for, with the shapes ``p`` gives; else
    XconvError naming the backend."""
    if not isinstance(results, (tuple, list)) or len(results) != 3:
        raise XconvError(f"backend {b.name!r} returned {type(results).__name__} from backward, "
                         "expected (grad_input, grad_weight, grad_bias)")
    gx, gw, gb = results
    if mask[0] and mask[1] and not mask[2] and gb is None and type(gx) is _NDARRAY and type(gw) is _NDARRAY \
            and gx.shape == tuple(p.input_shape) and gw.shape == tuple(p.weight_shape):
        return gx, gw, None                          # a training step's usual call, checked in line
    expected = (p.input_shape, p.weight_shape, (p.bias_size,))
    what = ("grad_input", "grad_weight", "grad_bias")
    return tuple(_expect(b, r, shape, name) if bit else _expect_none(b, r, name)
                 for r, bit, shape, name in zip(results, mask, expected, what))


def direct(b: Backend, p: ConvParams, op: str) -> bool:
    """Whether ``op`` ("fprop" or "backward") on ``p`` reaches ``b``'s primitive with the arrays as they are: none of
    the rewrites above applies (no empty tensor, 1-D lift, transposed mapping or explicit padding) and ``b`` takes
    strided arrays (no contiguous copy)."""
    if _empty(p):
        return False
    caps = capabilities(b, p, op)
    return bool(caps.strided and not _lift(caps, p) and not (p.transposed and not caps.transposed)
                and not _needs_explicit_padding(caps, p))


#: (id(b), id(p), op) -> (b, p, b.capabilities, direct(b, p, op)) for the plan cache's params objects (held, so
#: that their ids are not reused); the oldest dropped past _MAX_DIRECT; emptied (:func:`clear`) by plan_cache.clear
#: and, at the next public call, after the registry changed.
_DIRECT: dict = {}
_DIRECT_LOCK = threading.Lock()
_DIRECT_GENERATION = [None]
_MAX_DIRECT = 4096


def _kept_direct(b: Backend, p: ConvParams, op: str) -> bool:
    """:func:`direct`, kept per (backend, params object, op) while ``b.capabilities`` is the same object, for a
    backend without a ``capabilities_for`` of its own (its own may read device state: it is asked on every call,
    once, by the functions above, and this answers False)."""
    narrow = getattr(b, "capabilities_for", None)
    if narrow is not None and getattr(narrow, "__func__", None) is not Backend.capabilities_for:
        return False
    generation = registry.generation()
    if _DIRECT_GENERATION[0] != generation:
        clear()
        _DIRECT_GENERATION[0] = generation
    caps = getattr(b, "capabilities", None)
    hit = _DIRECT.get((id(b), id(p), op))
    if hit is not None and hit[0] is b and hit[1] is p and hit[2] is caps:
        return hit[3]
    answer = direct(b, p, op)
    with _DIRECT_LOCK:                                # readers only get: writers take turns
        _DIRECT[(id(b), id(p), op)] = (b, p, caps, answer)
        while len(_DIRECT) > _MAX_DIRECT:            # the oldest kept answer makes room
            del _DIRECT[next(iter(_DIRECT))]
    return answer


def clear() -> None:
    """Forget every kept :func:`direct` answer (and the backends and params they hold)."""
    with _DIRECT_LOCK:
        _DIRECT.clear()


# ---------------------------------------------------------------------------------------------
# Helpers


def _empty(p: ConvParams) -> bool:
    return 0 in (p.input_shape[0], p.input_shape[1], p.output_shape[1])


def _lift(caps, p: ConvParams) -> bool:
    return p.nd == 1 and 1 not in caps.spatial_dims and 2 in caps.spatial_dims


def _lifted(p: ConvParams) -> ConvParams:
    """The 1-D convolution ``p`` as a 2-D one with a unit H dim."""
    def unit(shape):
        return shape[:2] + (1,) + shape[2:]
    return p.replace(input_shape=unit(p.input_shape), weight_shape=unit(p.weight_shape),
                     output_shape=unit(p.output_shape), stride=(1,) + p.stride, padding=((0, 0),) + p.padding,
                     dilation=(1,) + p.dilation, output_padding=(0,) + p.output_padding)


def _unsqueeze(a):
    return a[:, :, None]


def _squeeze(a):
    return None if a is None else a[:, :, 0]


def _needs_explicit_padding(caps, p: ConvParams) -> bool:
    return not p.symmetric and p.nd not in caps.asymmetric_padding


def _symmetric(p: ConvParams):
    """(q, pads): ``p`` with padding min(pre, post) per dim, and the (pre, post) difference per dim.

    Direct: q's input is p's input zero-padded by ``pads``; the outputs are equal.
    Transposed: the inputs are equal; q's output is p's output extended by ``pads`` (p's output
    is q's cropped, and p's grad_output zero-padded by ``pads`` is q's).
    """
    sym = [min(pair) for pair in p.padding]
    pads = tuple((pre - s, post - s) for (pre, post), s in zip(p.padding, sym))
    grown = p.output_shape if p.transposed else p.input_shape
    grown = grown[:2] + tuple(n + pre + post for n, (pre, post) in zip(grown[2:], pads))
    padding = tuple((s, s) for s in sym)
    if p.transposed:
        return p.replace(output_shape=grown, padding=padding), pads
    return p.replace(input_shape=grown, padding=padding), pads


def _extend(a, shape):
    """``a`` zero-extended at the end to ``shape`` (a transposed input when output_padding >= stride)."""
    return zero_pad(a, [(0, want - have) for want, have in zip(shape[2:], a.shape[2:])])


def _sole(y: np.ndarray) -> bool:
    """Whether nothing but ``y`` holds its memory: its own, or a view of a block that no other object refers to (a
    backend's result placed in a larger block: the NumPy backend's results start a cache line, aligned.py)."""
    if y.flags.owndata:
        return True
    base = y.base
    return type(base) is np.ndarray and base.flags.owndata and _sys.getrefcount(base) <= 3   # y, base, the call


def _add_bias(y, bias, inputs=()):
    """y + bias (over the channels of dim 1) in y's dtype: in place where y is a primitive's new NumPy array (its
    own or its block's only view, :func:`_sole`; writable, C-contiguous, none of ``inputs`` nor bias in its memory)
    and the sum's dtype is y's (the same ufunc loop, so the same bits, without a second array: 0.26 ms against 0.15
    for a 2 MB float32 result)."""
    if bias is None:
        return y
    b = bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    if (type(y) is np.ndarray and type(b) is np.ndarray and _sole(y) and y.flags.writeable
            and y.flags.c_contiguous and np.result_type(y, b) == y.dtype
            and not any(type(a) is np.ndarray and np.may_share_memory(y, a) for a in (*inputs, b))):
        y += b
        return y
    z = y + b
    return contiguous(z if z.dtype == y.dtype else z.astype(y.dtype))


def _native(caps, *arrays):
    if caps.strided:
        return arrays
    out = tuple(None if a is None else contiguous(a) for a in arrays)
    if any(a is not b for a, b in zip(arrays, out)):
        tracing.legalized(STRIDED_COPIED)
    return out


def _expect(b: Backend, result, shape, what):
    got = tuple(getattr(result, "shape", ()) or ()) if result is not None else None
    if got != tuple(shape):
        raise XconvError(f"backend {b.name!r} returned {what} of shape {got}, expected {tuple(shape)}")
    return result


def _expect_none(b: Backend, result, what):
    if result is not None:
        raise XconvError(f"backend {b.name!r} computed {what} although its output_mask bit is False")
    return None
