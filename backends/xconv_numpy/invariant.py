"""Batch-invariant execution (``deterministic="batch_invariant"``): the batched results, one sample at a time.

The fast path's chunks, and BLAS's blocking inside a matrix product, depend on the batch size: a
1x1 forward multiplies one (C_out, C_in) @ (C_in, N*positions) product whose blocking changes with
N, and a stride-2 input gradient gathers chunks of grid lines that span samples. Both change the
summation order of a sample's outputs with the batch. Here each sample's forward output and input
gradient is computed by the very call a batch of one would make (the same parameters with N = 1),
so it is bitwise what that sample gives alone, whatever the batch and its other samples. The
weight and bias gradients sum over the batch and are computed once, batched (run to run only).
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES

from .aligned import empty_result


def one_sample(p: ConvParams) -> ConvParams:
    """``p`` with a batch of one."""
    return p.replace(input_shape=(1,) + p.input_shape[1:], output_shape=(1,) + p.output_shape[1:])


def fprop(run, x, w, bias, p: ConvParams):
    """y of ``p`` by ``run(x, w, bias, p1)`` per sample."""
    p1 = one_sample(p)
    y = empty_result(p.output_shape, DTYPES[p.dtype])
    for n in range(p.input_shape[0]):
        y[n:n + 1] = run(x[n:n + 1], w, bias, p1)
    return y


def dgrad(run, dy, w, p: ConvParams):
    """dx of ``p`` by ``run(dy, w, p1)`` per sample."""
    p1 = one_sample(p)
    dx = empty_result(p.input_shape, DTYPES[p.dtype])
    for n in range(p.input_shape[0]):
        dx[n:n + 1] = run(dy[n:n + 1], w, p1)
    return dx


def backward(run, dy, x, w, p: ConvParams, mask):
    """(dx, dw, db): dx per sample by ``run(dy1, x1, w, p1, (True, False, False))``, dw and db batched."""
    dx = dgrad(lambda dy1, w1, p1: run(dy1, None, w1, p1, (True, False, False))[0], dy, w, p) if mask[0] else None
    rest = (False,) + tuple(mask[1:])
    _, dw, db = run(dy, x, w, p, rest) if any(rest) else (None, None, None)
    return dx, dw, db
