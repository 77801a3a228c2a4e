"""The bias gradient: one summation order for every path, output mask, operand layout and both NumPy backends.

``grad_b[o] = sum_{n, i} grad_y[n, o, i]`` is computed, whatever else the call computes, as:

1. per sample ``n`` and channel ``o``, the row ``grad_y[n, o, :]`` (all spatial positions, C order) in
   float64, summed by NumPy's pairwise summation over a C-contiguous float64 row (rows are copied into a
   float64 buffer a block at a time unless grad_y already is C-contiguous float64, so the layout and dtype
   of grad_y cannot change the order);
2. those per-sample sums added in sample order (``n = 0, 1, ...``) in float64 (``np.add.accumulate``);
3. rounded once to the output dtype.

The paths' own by-products (the C loops' sums of their copies of grad_y, the pointwise path's per-sample
sums, a float32 ``np.sum`` over the axes) followed other orders, so grad_bias's bits depended on which
gradients the mask asked for and on grad_y's layout (issue 24); none is used any more. ``numpy`` and
``numpy-exact`` give the same bits. Cost: one float64 copy and sum of grad_y in blocks (0.55 ms for an
8x64x56x56 float32 grad_y on this machine, against 0.25 ms for the float32 sum it replaces).
"""

from __future__ import annotations

import math

import numpy as np

from xconv.dtypes import DTYPES

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
    return np.ascontiguousarray(total.astype(out_dtype))


def scratch_bytes(dy: np.ndarray) -> int:
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
    """grad_bias of the call ``p`` (the path ``bias-sum`` of :mod:`.paths`): :func:`grad_bias` in p's dtype."""
    return grad_bias(dy, DTYPES[p.dtype])
