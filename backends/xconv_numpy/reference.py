"""The reference convolution: the executable definition of xconv's semantics.

For a direct convolution with stride s, dilation d, padding (pre, post), groups g, input x of
shape (N, C_in, *S) and weight w of shape (C_out, C_in/g, *k), with x_pad the input zero-padded
by (pre, post) along each spatial dim, and c ranging over the input channels of o's group:

    y[n, o, i]   = sum_{c, j} x_pad[n, c, i*s + j*d] * w[o, c, j]                  (fprop)
    dx_pad[n, c, i*s + j*d] += dy[n, o, i] * w[o, c, j]   for all o, i, j          (dgrad)
    dw[o, c, j]  = sum_{n, i} dy[n, o, i] * x_pad[n, c, i*s + j*d]                 (wgrad)
    db[o]        = sum_{n, i} dy[n, o, i]                                          (bgrad)

with i and j multi-indices over the output and kernel spatial dims, and dx the interior of
dx_pad. Each sum is one matrix product per group over the "columns" of x: the windows
x_pad[n, c, i*s + j*d] laid out as rows (n, i) and columns (c, j). Arithmetic is in ``acc``
(float32 or float64); results are cast to the input dtype.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from xconv import ConvParams
from xconv.dtypes import DTYPES


def _padded(x: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    return np.pad(x.astype(acc, copy=False), ((0, 0), (0, 0)) + tuple(p.padding))


def columns(x: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """The windows of x as a (groups, N*prod(out), C_in/groups*prod(k)) array: rows (n, i), columns (c, j)."""
    nd, g = p.nd, p.groups
    out, kernel = p.output_shape[2:], p.kernel
    span = [d * (k - 1) + 1 for d, k in zip(p.dilation, kernel)]
    windows = sliding_window_view(_padded(x, p, acc), span, axis=tuple(range(2, 2 + nd)))
    pick = ((slice(None), slice(None))
            + tuple(slice(0, s * (o - 1) + 1, s) for s, o in zip(p.stride, out))
            + tuple(slice(None, None, d) for d in p.dilation))
    windows = windows[pick]                                   # (N, C_in, *out, *k)
    n, c_in = windows.shape[:2]
    windows = windows.reshape((n, g, c_in // g) + windows.shape[2:])
    spatial = list(range(3, 3 + nd))
    kernel_axes = list(range(3 + nd, 3 + 2 * nd))
    rows_first = windows.transpose([1, 0, *spatial, 2, *kernel_axes])  # (g, N, *out, C/g, *k)
    return rows_first.reshape(g, n * int(np.prod(out)), -1)


def _grad_rows(dy: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """dy as a (groups, N*prod(out), C_out/groups) array."""
    n, c_out = dy.shape[:2]
    g = p.groups
    dy = dy.astype(acc, copy=False).reshape((n, g, c_out // g, -1))
    return dy.transpose(1, 0, 3, 2).reshape(g, -1, c_out // g)


def _weight_matrix(w: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """w as a (groups, C_out/groups, C_in/groups*prod(k)) array."""
    return w.astype(acc, copy=False).reshape(p.groups, w.shape[0] // p.groups, -1)


def _result(a: np.ndarray, p: ConvParams) -> np.ndarray:
    return np.ascontiguousarray(a.astype(DTYPES[p.dtype], copy=False))


def fprop(x, w, bias, p: ConvParams, acc) -> np.ndarray:
    y = columns(x, p, acc) @ _weight_matrix(w, p, acc).transpose(0, 2, 1)   # (g, N*P, C_out/g)
    n, out = p.output_shape[0], p.output_shape[2:]
    y = y.reshape((p.groups, n) + tuple(out) + (-1,))                       # (g, N, *out, C_out/g)
    y = y.transpose([1, 0, 2 + p.nd, *range(2, 2 + p.nd)]).reshape(p.output_shape)
    if bias is not None:
        y = y + bias.astype(acc).reshape((1, -1) + (1,) * p.nd)
    return _result(y, p)


def dgrad(dy, w, p: ConvParams, acc) -> np.ndarray:
    cols = _grad_rows(dy, p, acc) @ _weight_matrix(w, p, acc)              # (g, N*P, C_in/g*K)
    n, c_in, g, nd = p.input_shape[0], p.input_shape[1], p.groups, p.nd
    out, kernel = p.output_shape[2:], p.kernel
    cols = cols.reshape((g, n) + tuple(out) + (c_in // g,) + tuple(kernel))
    cols = cols.transpose([1, 0, 2 + nd, *range(2, 2 + nd), *range(3 + nd, 3 + 2 * nd)])  # (N, g, C/g, *out, *k)
    padded = tuple(size + pre + post for size, (pre, post) in zip(p.input_shape[2:], p.padding))
    dx = np.zeros((n, g, c_in // g) + padded, dtype=acc)
    for j in itertools.product(*(range(k) for k in kernel)):
        target = tuple(slice(jj * d, jj * d + s * (o - 1) + 1, s)
                       for jj, d, s, o in zip(j, p.dilation, p.stride, out))
        dx[(Ellipsis,) + target] += cols[(Ellipsis,) + j]
    interior = tuple(slice(pre, pre + size) for size, (pre, _) in zip(p.input_shape[2:], p.padding))
    return _result(dx.reshape((n, c_in) + padded)[(slice(None), slice(None)) + interior], p)


def wgrad(x, dy, p: ConvParams, acc) -> np.ndarray:
    dw = _grad_rows(dy, p, acc).transpose(0, 2, 1) @ columns(x, p, acc)    # (g, C_out/g, C_in/g*K)
    return _result(dw.reshape(p.weight_shape), p)


def bgrad(dy, p: ConvParams, acc) -> np.ndarray:
    axes = (0,) + tuple(range(2, dy.ndim))
    return _result(dy.astype(acc, copy=False).sum(axis=axes), p)
