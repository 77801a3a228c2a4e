"""The reference convolution: the four sums computed memory-bounded (what ``numpy-exact`` runs, in float64).

The executable definition is :mod:`xconv_numpy.definition` (the sums as written); this module agrees with it.

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
of one sample), at most :data:`CHUNK_BYTES` each, straight from x: a zeroed buffer receives, per
tap (or per output position, when a chunk has fewer positions than the kernel has taps), the
strided slice of x that the tap reads inside the input; the padding stays zero. No padded copy
of x or dx is ever made, so memory is proportional to the tensors and one chunk, whatever the
padding, stride or dilation. The chunks depend only on the shapes, so results do not vary.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from xconv import ConvParams, limits
from xconv.dtypes import DTYPES

from .bias import grad_bias

#: Each chunk's columns take at most this many bytes (but at least one line of the first output dim).
CHUNK_BYTES = 32 << 20


def columns_chunk_bytes(p: ConvParams, itemsize: int) -> int:
    """Bytes of the largest chunk of im2col columns (``itemsize`` bytes each): whole output lines, at most
    :data:`CHUNK_BYTES` unless one line is larger."""
    line = itemsize * p.input_shape[1] * math.prod(p.kernel) * math.prod(p.output_shape[3:])
    return max(line, min(CHUNK_BYTES, line * p.output_shape[2]))


def _require(p: ConvParams, acc, op: str, result: tuple) -> None:
    """Refuse (ResourceError) before allocating when ``op``'s memory would not fit: one chunk of columns,
    x or dx in ``acc``, the result in ``acc`` and in the output dtype."""
    it = np.dtype(acc).itemsize
    total = (columns_chunk_bytes(p, it) + math.prod(p.input_shape) * it
             + math.prod(result) * (it + DTYPES[p.dtype].itemsize))
    limits.require(total, f"{op}: im2col columns and result in {np.dtype(acc).name}")   # numpy or numpy-exact


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


def _out_ranges(p: ConvParams, chunk) -> list[tuple[int, int]]:
    """The chunk's [lo, hi) output indices per spatial dim."""
    return [(chunk[2], chunk[3])] + [(0, o) for o in p.output_shape[3:]]


def _pairs(p: ConvParams, chunk):
    """The (output, tap, input) slice triples covering every term of the chunk whose x_pad index lies
    inside x: per dim, out slice (relative to the chunk), tap index or slice, input slice.

    Loops over the taps, or over the chunk's output positions when there are fewer of them, so the
    Python work is min(taps, positions) per chunk; each triple is one strided block copy or add.
    """
    ranges = _out_ranges(p, chunk)
    dims = list(zip(p.input_shape[2:], p.padding, p.stride, p.dilation, p.kernel, ranges))
    by_tap = math.prod(p.kernel) <= math.prod(hi - lo for lo, hi in ranges)
    if by_tap:
        for j in itertools.product(*(range(k) for k in p.kernel)):
            outs, ins = [], []
            for jj, (size, (pre, _), s, d, _, (lo, hi)) in zip(j, dims):
                off = jj * d - pre                                   # input index of output i: i*s + off
                a, b = max(lo, -(off // s)), min(hi, (size - 1 - off) // s + 1)
                if a >= b:
                    break
                outs.append(slice(a - lo, b - lo))
                ins.append(slice(a * s + off, (b - 1) * s + off + 1, s))
            else:
                yield tuple(outs), j, tuple(ins)
    else:
        for i in itertools.product(*(range(lo, hi) for lo, hi in ranges)):
            taps, ins = [], []
            for ii, (size, (pre, _), s, d, k, _) in zip(i, dims):
                off = ii * s - pre                                   # input index of tap j: off + j*d
                a, b = max(0, -(off // d)), min(k, (size - 1 - off) // d + 1)
                if a >= b:
                    break
                taps.append(slice(a, b))
                ins.append(slice(off + a * d, off + (b - 1) * d + 1, d))
            else:
                yield tuple(ii - lo for ii, (lo, _) in zip(i, ranges)), tuple(taps), tuple(ins)


def _layout(buf: np.ndarray, nd: int) -> np.ndarray:
    """The (g, n, *out, C/g, *k) columns buffer viewed as (n, g, C/g, *out, *k)."""
    return buf.transpose([1, 0, 2 + nd, *range(2, 2 + nd), *range(3 + nd, 3 + 2 * nd)])


def _columns(x4: np.ndarray, p: ConvParams, acc, chunk) -> np.ndarray:
    """The chunk's windows of x_pad as a (groups, rows, C_in/groups*prod(k)) array: rows (n, i), columns (c, j).

    ``x4`` is x viewed as (N, groups, C_in/groups, *S)."""
    n0, n1 = chunk[:2]
    g, cg = x4.shape[1:3]
    out = tuple(hi - lo for lo, hi in _out_ranges(p, chunk))
    buf = np.zeros((g, n1 - n0) + out + (cg,) + tuple(p.kernel), acc)
    view = _layout(buf, p.nd)
    part = x4[n0:n1]
    for o, j, i in _pairs(p, chunk):
        view[(Ellipsis,) + o + j] = part[(Ellipsis,) + i]
    return buf.reshape(g, (n1 - n0) * math.prod(out), -1)


def _grad_rows(dy: np.ndarray, p: ConvParams, acc, chunk) -> np.ndarray:
    """The chunk of dy as a (groups, rows, C_out/groups) array."""
    n0, n1, o0, o1 = chunk
    part = np.ascontiguousarray(dy[n0:n1, :, o0:o1], dtype=acc)   # BLAS sees one layout, whatever dy's
    n, c_out = part.shape[:2]
    g = p.groups
    part = part.reshape((n, g, c_out // g, -1))
    return part.transpose(1, 0, 3, 2).reshape(g, -1, c_out // g)


def _weight_matrix(w: np.ndarray, p: ConvParams, acc) -> np.ndarray:
    """w as a (groups, C_out/groups, C_in/groups*prod(k)) array."""
    return np.ascontiguousarray(w, dtype=acc).reshape(p.groups, w.shape[0] // p.groups, -1)   # one layout for BLAS


def _grouped(x: np.ndarray, p: ConvParams) -> np.ndarray:
    """x (N, C_in, *S) viewed (or copied) as (N, groups, C_in/groups, *S)."""
    return x.reshape((x.shape[0], p.groups, x.shape[1] // p.groups) + x.shape[2:])


def _result(a: np.ndarray, p: ConvParams) -> np.ndarray:
    return np.ascontiguousarray(a.astype(DTYPES[p.dtype], copy=False))


def fprop(x, w, bias, p: ConvParams, acc) -> np.ndarray:
    _require(p, acc, "fprop", p.output_shape)
    x4 = _grouped(x, p)
    wt = _weight_matrix(w, p, acc).transpose(0, 2, 1)
    y = np.empty(p.output_shape, acc)
    for chunk in _chunks(p, acc):
        n0, n1, o0, o1 = chunk
        part = _columns(x4, p, acc, chunk) @ wt                              # (g, rows, C_out/g)
        shape = (p.groups, n1 - n0, o1 - o0) + tuple(p.output_shape[3:]) + (-1,)
        part = part.reshape(shape).transpose([1, 0, 2 + p.nd, *range(2, 2 + p.nd)])   # (n, g, C_out/g, *out)
        y[n0:n1, :, o0:o1] = part.reshape((n1 - n0, -1, o1 - o0) + tuple(p.output_shape[3:]))
    if bias is not None:
        y += bias.astype(acc).reshape((1, -1) + (1,) * p.nd)
    return _result(y, p)


def dgrad(dy, w, p: ConvParams, acc) -> np.ndarray:
    _require(p, acc, "dgrad", p.input_shape)
    n, c_in, g, nd = p.input_shape[0], p.input_shape[1], p.groups, p.nd
    wm = _weight_matrix(w, p, acc)
    dx = np.zeros((n, g, c_in // g) + tuple(p.input_shape[2:]), dtype=acc)
    for chunk in _chunks(p, acc):
        n0, n1 = chunk[:2]
        out = tuple(hi - lo for lo, hi in _out_ranges(p, chunk))
        cols = _grad_rows(dy, p, acc, chunk) @ wm                           # (g, rows, C_in/g*K)
        view = _layout(cols.reshape((g, n1 - n0) + out + (c_in // g,) + tuple(p.kernel)), nd)
        target = dx[n0:n1]
        for o, j, i in _pairs(p, chunk):                                   # terms landing inside x only
            target[(Ellipsis,) + i] += view[(Ellipsis,) + o + j]
    return _result(dx.reshape(p.input_shape), p)


def wgrad(x, dy, p: ConvParams, acc) -> np.ndarray:
    _require(p, acc, "wgrad", p.weight_shape)
    x4 = _grouped(x, p)
    dw = None
    for chunk in _chunks(p, acc):
        part = _grad_rows(dy, p, acc, chunk).transpose(0, 2, 1) @ _columns(x4, p, acc, chunk)  # (g, C_out/g, C/g*K)
        if dw is None:
            dw = part
        else:
            dw += part
    if dw is None:
        dw = np.zeros(p.weight_shape, acc)
    return _result(dw.reshape(p.weight_shape), p)


def bgrad(dy, p: ConvParams, acc) -> np.ndarray:
    """grad_y summed over the batch and spatial dims (one fixed order whatever grad_y's layout: see .bias)."""
    return grad_bias(dy, DTYPES[p.dtype])
