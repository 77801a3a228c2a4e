"""The small path's stride-1 grid loops (csrc/small_grid.c) for a forward of any size, on blocks of samples.

Each sample's output is computed by the same loops in the same order whatever the other samples of the call
(checked bitwise: a block of samples gives the same bits as the whole batch), so the batch is cut into blocks
fixed by the shapes alone (:func:`sample_blocks`), each block runs as one small-path call on any worker, and
the results are those of one small-path call. Inputs must be finite (padding zeros are multiplied); the
scratch grids are not leased.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES, accumulation_dtype

from . import small_c
from .cost import GRID_BLOCK_ELEMENTS
from .workers import run


def sample_blocks(p: ConvParams) -> list[tuple[int, int]]:
    """[n0, n1) blocks of samples, each with at least GRID_BLOCK_ELEMENTS output elements (the last may hold
    fewer), at most 8."""
    N = p.input_shape[0]
    per = math.prod(p.output_shape[1:])
    size = max(1, -(-GRID_BLOCK_ELEMENTS // max(per, 1)), -(-N // 8))
    return [(a, min(a + size, N)) for a in range(0, N, size)]


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias, stride 1, by the grid loops per block of samples."""
    cdt = accumulation_dtype(p.dtype)
    y = np.empty(p.output_shape, DTYPES[p.dtype])
    blocks = sample_blocks(p)
    if len(blocks) == 1:
        return small_c.grid_fprop(x, w, bias, p)
    w = np.ascontiguousarray(w, dtype=cdt)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=cdt)

    # one copy of the caller's context per block: the worker threads' small calls note their scratch in the
    # caller's trace record (a context is entered by one thread at a time)
    contexts = {n0: contextvars.copy_context() for n0, _ in blocks}

    def task(_, __, n0, n1):
        q = dataclasses.replace(p, input_shape=(n1 - n0,) + tuple(p.input_shape[1:]),
                                output_shape=(n1 - n0,) + tuple(p.output_shape[1:]))
        y[n0:n1] = contexts[n0].run(small_c.grid_fprop, x[n0:n1], w, b, q)

    run(blocks, task, lambda: None, workers)
    return y
