"""The bias gradient: one summation order for every path, output mask, operand layout and both NumPy backends.

``grad_b[o] = sum_{n, i} grad_y[n, o, i]`` is computed, whatever else the call computes, as:

1. per sample ``n`` and channel ``o``, the row ``grad_y[n, o, :]`` (all spatial positions, C order) in
   float64, summed by NumPy's pairwise summation over a C-contiguous float64 row (rows are copied into a
   float64 buffer a block at a time unless grad_y already is C-contiguous float64, so the layout and dtype
   of grad_y cannot change the order);
2. those per-sample sums added in sample order (``n = 0, 1, ...``) in float64 (``np.add.accumulate``);
3. a NaN sum replaced by the canonical NaN (``np.nan``, bits 0x7ff8000000000000): which of two NaN operands an
   add returns (their signs and payloads) is the compiler's choice, not the order's, and differs between NumPy's
   build and ours, so a NaN result's bits are fixed instead (a finite or infinite result is untouched);
4. rounded once to the output dtype.

The paths' own by-products (the C loops' sums of their copies of grad_y, the pointwise path's per-sample
sums, a float32 ``np.sum`` over the axes) followed other orders, so grad_bias's bits depended on which
gradients the mask asked for and on grad_y's layout (issue 24); none is used any more. ``numpy`` and
``numpy-exact`` give the same bits.

Two routes to those bits. :func:`grad_bias` is the definition in NumPy (``numpy-exact`` runs it): a float64
copy of grad_y in blocks, summed by ``np.sum`` (NumPy 2.x: per row, ``0.0 + pairwise(row)``, the row whole,
never split at the ufunc buffer size). :func:`bias_sum` (the ``numpy`` backend's path ``bias-sum``) runs the
compiled sum (``csrc/bias_sum.c``) when the compiled part is on (``$XCONV_NUMPY_C``, the small loops' switch)
and grad_y is float64, float32, float16 or bfloat16 in native byte order and aligned (any strides): it reads
grad_y in place, converts each element to double and adds in NumPy's pairwise order, with no copy;
otherwise :func:`grad_bias` serves. tests/test_bias_order.py holds the two to the same bits on this machine's
NumPy (a NumPy whose ``np.sum`` changed its order would fail it).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from xconv import tracing
from xconv.dtypes import DTYPES

from . import native
from .layout import BIAS_GEO

#: Bytes of the float64 buffer the rows are copied into (at most this and grad_y's own bytes, at least one row).
BLOCK_BYTES = 1 << 20
#: grad_y of at most this many elements is copied whole (small calls: fewer NumPy calls; 64 KiB of float64).
SMALL_ELEMENTS = 1 << 13


def grad_bias(dy: np.ndarray, out_dtype) -> np.ndarray:
    """grad_y summed over the batch and spatial dims, in the order above; a new C-contiguous array."""
    N, C = dy.shape[0], dy.shape[1]
    spatial = tuple(dy.shape[2:])
    P = math.prod(spatial)
    if N == 0 or C == 0 or P == 0:
        return np.zeros(C, out_dtype)
    if dy.dtype == np.float64 and dy.flags.c_contiguous and dy.flags.aligned and dy.dtype.isnative:
        rows = dy.reshape(N, C, P).sum(axis=2)
    elif dy.size <= SMALL_ELEMENTS:                # tiny: one C-order float64 copy (the same rows, fewer calls)
        rows = np.array(dy, dtype=np.float64, order="C").reshape(N, C, P).sum(axis=2)
    else:
        rows = np.empty((N, C), np.float64)
        per_row = P * 8
        block = min(BLOCK_BYTES, dy.nbytes)
        if C * per_row <= block:                   # blocks of whole samples
            nb = max(1, min(N, block // (C * per_row)))
            buf = np.empty((nb, C) + spatial, np.float64)
            for n0 in range(0, N, nb):
                n1 = min(N, n0 + nb)
                b = buf[:n1 - n0]
                b[...] = dy[n0:n1]
                rows[n0:n1] = b.reshape(n1 - n0, C, P).sum(axis=2)
        else:                                      # blocks of channels of one sample
            cb = max(1, min(C, block // per_row))
            buf = np.empty((cb,) + spatial, np.float64)
            for n in range(N):
                for c0 in range(0, C, cb):
                    c1 = min(C, c0 + cb)
                    b = buf[:c1 - c0]
                    b[...] = dy[n, c0:c1]
                    rows[n, c0:c1] = b.reshape(c1 - c0, P).sum(axis=1)
    total = rows[0] if N == 1 else np.add.accumulate(rows, axis=0)[-1]
    nan = np.isnan(total)
    if nan.any():
        total = np.where(nan, np.nan, total)
    return np.ascontiguousarray(total.astype(out_dtype))


def scratch_bytes(dy: np.ndarray) -> int:
    """Bytes of scratch :func:`bias_sum` takes for ``dy`` (by the route the settings give it)."""
    return _route_bytes(dy, _suffix(dy) is not None and dy.size > 0 and _compiled_on())


def _route_bytes(dy: np.ndarray, compiled: bool) -> int:
    """On the compiled route none on the heap (one row's block of 128 doubles on the stack; float16 and bfloat16
    add the C float64 sums before their rounding), else :func:`numpy_scratch_bytes`."""
    if compiled:
        return 0 if dy.dtype.itemsize > 2 else 8 * dy.shape[1]
    return numpy_scratch_bytes(dy)


def numpy_scratch_bytes(dy: np.ndarray) -> int:
    """Bytes of scratch :func:`grad_bias` takes for ``dy``: the per-sample rows and the float64 copy (if any)."""
    N, C = dy.shape[0], dy.shape[1]
    P = math.prod(dy.shape[2:])
    rows = 8 * N * C
    if N == 0 or C == 0 or P == 0 or (dy.dtype == np.float64 and dy.flags.c_contiguous and dy.flags.aligned
                                      and dy.dtype.isnative):
        return rows
    if dy.size <= SMALL_ELEMENTS:
        return rows + 8 * dy.size
    block = min(BLOCK_BYTES, dy.nbytes)
    if C * P * 8 <= block:
        return rows + max(1, min(N, block // (C * P * 8))) * C * P * 8
    return rows + max(1, min(C, block // (P * 8))) * P * 8


def bias_sum(dy, p) -> np.ndarray:
    """grad_bias of the call ``p`` (the path ``bias-sum`` of :mod:`.paths`) in p's dtype: the compiled sum where it
    reads grad_y, else :func:`grad_bias`; the same bits either way. The route's scratch goes to the trace record."""
    out_dtype = DTYPES[p.dtype]
    db = compiled_grad_bias(dy, out_dtype)
    if tracing.active():
        tracing.workspace(_route_bytes(dy, db is not None))
    return grad_bias(dy, out_dtype) if db is None else db


# ---------------------------------------------------------------------------------------------
# The compiled route (csrc/bias_sum.c)

#: The switch of the compiled sum (the settings field of ``$XCONV_NUMPY_C``, as for the small-call loops).
SWITCH = "numpy_c"
#: grad_y's dtypes the compiled sum reads (native byte order only) -> the C function's suffix; bfloat16 joins
#: once ml_dtypes is imported (no array holds it before).
_SUFFIXES = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
#: (shape, strides, dtype, output dtype) -> :func:`_prepare`'s call (a handful of distinct layouts per program).
_CALLS: dict = {}


def _compiled_on() -> bool:
    return native.part_on(SWITCH)


def _suffix(dy: np.ndarray, aligned: bool = False) -> str | None:
    """The C function's suffix for grad_y's dtype, or None when the compiled sum cannot read ``dy`` (``aligned``:
    its alignment already checked)."""
    suffix = _SUFFIXES.get(dy.dtype)
    if suffix is None and "ml_dtypes" in sys.modules and dy.dtype == DTYPES["bfloat16"] and dy.dtype.isnative:
        suffix = _SUFFIXES[dy.dtype] = "bf16"
    if suffix is None or not (aligned or dy.flags.aligned) or not 3 <= dy.ndim <= 5:
        return None
    return suffix


def _geo(dy: np.ndarray) -> np.ndarray:
    """BIAS_GEO of ``dy`` (sizes, element strides; spatial dims lifted to 3) as a read-only int64 array."""
    it, nd = dy.itemsize, dy.ndim - 2
    dims = (1,) * (3 - nd) + dy.shape[2:]
    # a size-1 dim's stride may be any number of bytes (never used): 0 there
    st = [0 if size == 1 else stride // it for size, stride in zip(dy.shape, dy.strides)]
    st = st[:2] + [0] * (3 - nd) + st[2:]
    geo = np.array(BIAS_GEO.pack(n=dy.shape[0], c=dy.shape[1], d=dims[0], h=dims[1], w=dims[2], s=st), np.int64)
    geo.flags.writeable = False
    return geo


def _prepare(dy: np.ndarray, out_dtype):
    """The compiled call for grad_y's shape, strides and dtype and this output dtype: (C function, geo, geo's
    address, the dtype C writes, whether that is float32, whether it is the output dtype), or False when the
    compiled sum cannot read such a grad_y (dtype, byte order, rank, empty)."""
    suffix = _suffix(dy, aligned=True)
    if suffix is None or dy.size == 0:
        return False
    out_dtype = np.dtype(out_dtype)
    written = out_dtype if out_dtype in (np.dtype(np.float64), np.dtype(np.float32)) else np.dtype(np.float64)
    geo = _geo(dy)
    return (getattr(native.library(), "xconv_bias_sum_" + suffix), geo, geo.ctypes.data, written,
            written.itemsize == 4, written == out_dtype)


def compiled_grad_bias(dy: np.ndarray, out_dtype) -> np.ndarray | None:
    """:func:`grad_bias`'s bits by the compiled sum, reading ``dy`` in place; None when the compiled part is off or
    cannot read ``dy`` (dtype, byte order, alignment, rank), or ``dy`` is empty (the NumPy route then serves)."""
    if not dy.flags.aligned or not _compiled_on():
        return None
    key = (dy.shape, dy.strides, dy.dtype, out_dtype)
    call = _CALLS.get(key)
    if call is None:
        call = _prepare(dy, out_dtype)
        if len(_CALLS) > 256:
            _CALLS.clear()
        _CALLS[key] = call
    if call is False:
        return None
    fn, geo, geo_at, written, f32, final = call         # geo held: the C call reads it (another thread may clear)
    out = np.empty(dy.shape[1], written)
    fn(native.address(dy), geo_at, native.address(out), f32)
    return out if final else np.ascontiguousarray(out.astype(out_dtype))
