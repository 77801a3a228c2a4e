"""The four sums, computed as literally as they are written: xconv's semantics as executable text.

Direct convolution (stride s, dilation d, groups g; x_pad is x zero-padded by (pre, post) per spatial
dim; i runs over the output positions, j over the kernel taps, c over the input channels of o's group)::

    y[n, o, i]               = sum_{c, j} x_pad[n, c, i*s + j*d] * w[o, c, j]  (+ bias[o])   fprop
    dx_pad[n, c, i*s + j*d] += dy[n, o, i] * w[o, c, j]       for every o, i, j              dgrad
    dw[o, c, j]              = sum_{n, i} dy[n, o, i] * x_pad[n, c, i*s + j*d]                wgrad
    db[o]                    = sum_{n, i} dy[n, o, i]                                         bgrad

and dx is dx_pad without its padding. A transposed convolution swaps the roles: its fprop is the
scatter (y_pad[n, o, i*s + j*d] += x[n, c, i] * w[c, o, j], then y = y_pad without its padding), its
dgrad the gather from dy_pad. One einsum per kernel tap, in float64, nothing chunked: for tests (an
oracle next to PyTorch) and for reading, never registered as a backend. ``p`` is a normalized
:class:`xconv.ConvParams`; the results are float64.
"""

import itertools

import numpy as np

_SP = "xyz"                                         # einsum letters of the spatial dims


def _taps(p):
    return itertools.product(*(range(k) for k in p.kernel))


def _at(a_pad, j, p, positions):
    """The view a_pad[n, g, c, i*s + j*d] over ``positions`` (the spatial shape i runs over)."""
    return a_pad[(..., *(slice(jj * d, jj * d + (m - 1) * s + 1, s)
                         for jj, d, s, m in zip(j, p.dilation, p.stride, positions)))]


def _grouped(a, g):
    """(N, C, *S) as (N, g, C/g, *S), in float64."""
    return np.asarray(a, np.float64).reshape(a.shape[0], g, a.shape[1] // g, *a.shape[2:])


def _grouped_weight(w, g):
    """(C, C', *k) as (g, C/g, C', *k), in float64."""
    return np.asarray(w, np.float64).reshape(g, w.shape[0] // g, *w.shape[1:])


def _padded(a, p):
    return np.pad(a, [(0, 0)] * 3 + list(p.padding))


def _unpadded(a_pad, p, shape):
    return a_pad[(..., *(slice(pre, pre + m) for (pre, _), m in zip(p.padding, shape[2:])))].reshape(shape)


def _gather(big, small_shape, w, p, spec):
    """sum_j einsum(spec, big_pad at tap j, w[..., j]) over the positions of ``small_shape``: direct fprop,
    transposed dgrad."""
    big_pad = _padded(big, p)
    return sum(np.einsum(spec, _at(big_pad, j, p, small_shape[2:]), w[(..., *j)]) for j in _taps(p))


def _scatter(small, w, p, big_shape, spec):
    """big_pad[tap j] += einsum(spec, small, w[..., j]), then the padding dropped: direct dgrad, transposed fprop."""
    n, g = small.shape[:2]
    big_pad = np.zeros((n, g, big_shape[1] // g, *(m + a + b for m, (a, b) in zip(big_shape[2:], p.padding))))
    for j in _taps(p):
        _at(big_pad, j, p, small.shape[3:])[...] += np.einsum(spec, small, w[(..., *j)])
    return _unpadded(big_pad, p, big_shape)


def _weight_sum(big, small, p, spec):
    big_pad = _padded(big, p)
    taps = [np.einsum(spec, small, _at(big_pad, j, p, small.shape[3:])) for j in _taps(p)]
    return np.stack(taps, axis=-1).reshape(taps[0].shape + p.kernel)


def fprop(x, w, bias, p):
    g, sp = p.groups, _SP[:p.nd]
    x, wg = _grouped(x, g), _grouped_weight(w, g)                 # x (N, g, C/g, *S); w (g, ., ., *k)
    if p.transposed:
        y = _scatter(x, wg, p, p.output_shape, f"ngc{sp},gco->ngo{sp}")
    else:
        y = _gather(x, p.output_shape, wg, p, f"ngc{sp},goc->ngo{sp}").reshape(p.output_shape)
    return y if bias is None else y + np.asarray(bias, np.float64).reshape(-1, *[1] * p.nd)


def dgrad(dy, w, p):
    g, sp = p.groups, _SP[:p.nd]
    dy, wg = _grouped(dy, g), _grouped_weight(w, g)
    if p.transposed:
        return _gather(dy, p.input_shape, wg, p, f"ngo{sp},gco->ngc{sp}").reshape(p.input_shape)
    return _scatter(dy, wg, p, p.input_shape, f"ngo{sp},goc->ngc{sp}")


def wgrad(x, dy, p):
    g, sp = p.groups, _SP[:p.nd]
    x, dy = _grouped(x, g), _grouped(dy, g)
    if p.transposed:
        return _weight_sum(dy, x, p, f"ngc{sp},ngo{sp}->gco").reshape(p.weight_shape)
    return _weight_sum(x, dy, p, f"ngo{sp},ngc{sp}->goc").reshape(p.weight_shape)


def bgrad(dy, p):
    return np.asarray(dy, np.float64).sum(axis=(0, *range(2, 2 + p.nd)))
