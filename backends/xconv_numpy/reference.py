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

Non-finite values follow from these sums and nothing else: a padding zero of x_pad is a term
(so an infinite weight or grad_output meets it: NaN), no other zero is ever multiplied.

The columns are built a chunk of rows at a time (whole samples, or lines of the first output dim
of one sample), at most :data:`CHUNK_BYTES` each, so memory stays proportional to the call's
tensors; x_pad covers only the extent the windows read (a stride far above the kernel reads a
small part of a large padding). The chunks depend only on the shapes, so results do not vary.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from xconv import ConvParams, limits
from xconv.dtypes import DTYPES

#: Each chunk's columns take at most this many bytes (but at least one line of the first output dim).
CHUNK_BYTES = 32 << 20


def _extent(p: ConvParams) -> tuple[int, ...]:
    """Per spatial dim, how much of x_pad the windows read: at most S + pre + post."""
    return tuple(min(n + a + b, s * (o - 1) + d * (k - 1) + 1)
                 for n, (a, b), s, o, d, k in zip(p.input_shape[2:], p.padding, p.stride, p.output_shape[2:],
                                                  p.dilation, p.kernel))


def _require(p: ConvParams, acc, op: str, result: tuple, padded: bool) -> None:
    """Refuse (ResourceError) before allocating when ``op``'s memory would not fit: the padded input or
    grad_input in ``acc``, one chunk of columns, the result in ``acc`` and in the output dtype."""
    it = np.dtype(acc).itemsize
    line = it * p.input_shape[1] * math.prod(p.kernel) * math.prod(p.output_shape[3:])
    total = max(line, min(CHUNK_BYTES, line * p.output_shape[2])) + math.prod(result) * (it + DTYPES[p.dtype].itemsize)
    if padded:
        total += math.prod(p.input_shape[:2]) * math.prod(_extent(p)) * it
    limits.require(total, f"numpy {op}: padded {'input' if op != 'dgrad' else 'grad_input'}, im2col columns "
                          "and result")


def _padded(x: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """x_pad in ``acc``, over the extent the windows read (see :func:`_extent`)."""
    ext = _extent(p)
    out = np.zeros(x.shape[:2] + ext, acc)
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for n, (pre, _), e in zip(x.shape[2:], p.padding, ext):
        take = max(0, min(n, e - pre))
        dst.append(slice(pre, pre + take))
        src.append(slice(0, take))
    out[tuple(dst)] = x[tuple(src)]
    return out


def _chunks(p: ConvParams, acc) -> list[tuple[int, int, int, int]]:
    """(n0, n1, o0, o1): samples [n0, n1), lines [o0, o1) of the first output dim; fixed by the shapes."""
    n, out = p.output_shape[0], p.output_shape[2:]
    row_bytes = np.dtype(acc).itemsize * p.input_shape[1] * math.prod(p.kernel)
    line = row_bytes * math.prod(out[1:])
    sample = line * out[0]
    if sample <= CHUNK_BYTES:
        nb = max(1, CHUNK_BYTES // max(sample, 1))
        return [(a, min(a + nb, n), 0, out[0]) for a in range(0, n, nb)]
    lines = max(1, CHUNK_BYTES // max(line, 1))
    return [(a, a + 1, o, min(o + lines, out[0])) for a in range(n) for o in range(0, out[0], lines)]


def _windows(xp: np.ndarray, p: ConvParams) -> np.ndarray:
    """The (N, C_in, *out, *k) view of x_pad's windows (no copy)."""
    span = [d * (k - 1) + 1 for d, k in zip(p.dilation, p.kernel)]
    windows = sliding_window_view(xp, span, axis=tuple(range(2, 2 + p.nd)))
    pick = ((slice(None), slice(None))
            + tuple(slice(0, s * (o - 1) + 1, s) for s, o in zip(p.stride, p.output_shape[2:]))
            + tuple(slice(None, None, d) for d in p.dilation))
    return windows[pick]


def _columns(windows: np.ndarray, p: ConvParams, chunk) -> np.ndarray:
    """The chunk's windows as a (groups, rows, C_in/groups*prod(k)) array: rows (n, i), columns (c, j)."""
    n0, n1, o0, o1 = chunk
    nd, g = p.nd, p.groups
    part = windows[n0:n1, :, o0:o1]                                       # (n, C_in, *out, *k)
    n, c_in = part.shape[:2]
    part = part.reshape((n, g, c_in // g) + part.shape[2:])
    spatial = list(range(3, 3 + nd))
    kernel_axes = list(range(3 + nd, 3 + 2 * nd))
    rows_first = part.transpose([1, 0, *spatial, 2, *kernel_axes])     # (g, n, *out, C/g, *k)
    return rows_first.reshape(g, n * math.prod(part.shape[3:3 + nd]), -1)


def _grad_rows(dy: np.ndarray, p: ConvParams, acc, chunk) -> np.ndarray:
    """The chunk of dy as a (groups, rows, C_out/groups) array."""
    n0, n1, o0, o1 = chunk
    part = dy[n0:n1, :, o0:o1].astype(acc, copy=False)
    n, c_out = part.shape[:2]
    g = p.groups
    part = part.reshape((n, g, c_out // g, -1))
    return part.transpose(1, 0, 3, 2).reshape(g, -1, c_out // g)


def _weight_matrix(w: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """w as a (groups, C_out/groups, C_in/groups*prod(k)) array."""
    return w.astype(acc, copy=False).reshape(p.groups, w.shape[0] // p.groups, -1)


def _result(a: np.ndarray, p: ConvParams) -> np.ndarray:
    return np.ascontiguousarray(a.astype(DTYPES[p.dtype], copy=False))


def fprop(x, w, bias, p: ConvParams, acc) -> np.ndarray:
    _require(p, acc, "fprop", p.output_shape, True)
    windows = _windows(_padded(x, p, acc), p)
    wt = _weight_matrix(w, p, acc).transpose(0, 2, 1)
    y = np.empty(p.output_shape, acc)
    for chunk in _chunks(p, acc):
        n0, n1, o0, o1 = chunk
        part = _columns(windows, p, chunk) @ wt                              # (g, rows, C_out/g)
        shape = (p.groups, n1 - n0, o1 - o0) + tuple(p.output_shape[3:]) + (-1,)
        part = part.reshape(shape).transpose([1, 0, 2 + p.nd, *range(2, 2 + p.nd)])   # (n, g, C_out/g, *out)
        y[n0:n1, :, o0:o1] = part.reshape((n1 - n0, -1, o1 - o0) + tuple(p.output_shape[3:]))
    if bias is not None:
        y += bias.astype(acc).reshape((1, -1) + (1,) * p.nd)
    return _result(y, p)


def dgrad(dy, w, p: ConvParams, acc) -> np.ndarray:
    n, c_in, g, nd = p.input_shape[0], p.input_shape[1], p.groups, p.nd
    kernel, ext = p.kernel, _extent(p)
    _require(p, acc, "dgrad", p.input_shape, True)
    wm = _weight_matrix(w, p, acc)
    dx = np.zeros((n, g, c_in // g) + ext, dtype=acc)
    for chunk in _chunks(p, acc):
        n0, n1, o0, o1 = chunk
        out = (o1 - o0,) + tuple(p.output_shape[3:])
        cols = _grad_rows(dy, p, acc, chunk) @ wm                           # (g, rows, C_in/g*K)
        cols = cols.reshape((g, n1 - n0) + out + (c_in // g,) + tuple(kernel))
        cols = cols.transpose([1, 0, 2 + nd, *range(2, 2 + nd), *range(3 + nd, 3 + 2 * nd)])  # (n, g, C/g, *out, *k)
        target = dx[n0:n1]
        first = (o0,) + (0,) * (nd - 1)
        if math.prod(kernel) <= math.prod(out):      # one strided add per tap
            for j in itertools.product(*(range(k) for k in kernel)):
                sl = tuple(slice(f * s + jj * d, f * s + jj * d + s * (o - 1) + 1, s)
                           for f, jj, d, s, o in zip(first, j, p.dilation, p.stride, out))
                target[(Ellipsis,) + sl] += cols[(Ellipsis,) + j]
        else:                                         # fewer positions than taps: one add per position
            for i in itertools.product(*(range(o) for o in out)):
                sl = tuple(slice((f + ii) * s, (f + ii) * s + d * (k - 1) + 1, d)
                           for f, ii, d, s, k in zip(first, i, p.dilation, p.stride, kernel))
                target[(Ellipsis,) + sl] += cols[(Ellipsis,) + i + (slice(None),) * nd]
    dx = dx.reshape((n, c_in) + ext)
    result = np.zeros(p.input_shape, DTYPES[p.dtype])
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for size, (pre, _), e in zip(p.input_shape[2:], p.padding, ext):
        take = max(0, min(size, e - pre))
        dst.append(slice(0, take))
        src.append(slice(pre, pre + take))
    result[tuple(dst)] = dx[tuple(src)]
    return result


def wgrad(x, dy, p: ConvParams, acc) -> np.ndarray:
    _require(p, acc, "wgrad", p.weight_shape, True)
    windows = _windows(_padded(x, p, acc), p)
    dw = None
    for chunk in _chunks(p, acc):
        part = _grad_rows(dy, p, acc, chunk).transpose(0, 2, 1) @ _columns(windows, p, chunk)  # (g, C_out/g, C/g*K)
        if dw is None:
            dw = part
        else:
            dw += part
    if dw is None:
        dw = np.zeros(p.weight_shape, acc)
    return _result(dw.reshape(p.weight_shape), p)


def bgrad(dy, p: ConvParams, acc) -> np.ndarray:
    axes = (0,) + tuple(range(2, dy.ndim))
    return _result(dy.astype(acc, copy=False).sum(axis=axes), p)
