"""The small path's stride-1 grid loops (csrc/small_grid.c) for calls of any size, on blocks of samples.

Each sample's output (y, or dx) is computed by the same loops in the same order whatever the other samples of the
call (checked bitwise: a block of samples gives the same bits as the whole batch), so the batch is cut into blocks
fixed by the shapes alone (:func:`sample_blocks`), each block runs as one small-path call on any worker, and y and
dx are those of one small-path call. The weight gradient is each block's, added in block order (:func:`backward`):
its bits are the blocks', a function of the configuration, never of the workers or the mask. The forward's padding
zeros are multiplied (the definition's terms); the backward, as the small path's, reports an inf or a NaN in what it
reads (None) for the caller's detour. The scratch grids are not leased.
"""

from __future__ import annotations

import contextvars
import dataclasses

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES, accumulation_dtype

from . import small, small_c
from .aligned import empty_result
from .cost import grid_block_samples
from .plans import per_params
from .workers import run


def sample_blocks(p: ConvParams) -> list[tuple[int, int]]:
    """[n0, n1) blocks of samples, each with at least GRID_BLOCK_ELEMENTS output elements (the last may hold
    fewer), at most 8 (:func:`cost.grid_block_samples`)."""
    size = grid_block_samples(p)
    return [(a, min(a + size, p.input_shape[0])) for a in range(0, p.input_shape[0], size)]


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias, stride 1, by the grid loops per block of samples."""
    cdt = accumulation_dtype(p.dtype)
    blocks = _blocks(p)
    if len(blocks) == 1 or (workers == 1 and small.serves(p)):
        return small_c.grid_fprop(x, w, bias, p)    # the same bits in one call (a small call's blocks on one thread:
        #                                             20% slower; past the small size the blocks bound the scratch)
    y = empty_result(p.output_shape, DTYPES[p.dtype])
    w = np.ascontiguousarray(w, dtype=cdt)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=cdt)
    if cdt == np.float32 and y.dtype == cdt:                 # C jobs, one per block
        return small_c.grid_fprop_blocks(x, w, b, y, p, blocks, workers)

    # one copy of the caller's context per block: the worker threads' small calls note their scratch in the
    # caller's trace record (a context is entered by one thread at a time)
    contexts = {n0: contextvars.copy_context() for n0, _, _ in blocks}

    def task(_, __, n0, n1, q):
        y[n0:n1] = contexts[n0].run(small_c.grid_fprop, x[n0:n1], w, b, q)

    run(blocks, task, lambda: None, workers)
    return y


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, workers: int):
    """(dx, dw) (None where not needed) at stride 1, float32, by the grid loops per block of samples (one C job
    each), the blocks' dw added in block order; or None when an input read holds an inf or a NaN. Always in the
    blocks, whatever the workers (one worker runs them in turn): dw's bits must not depend on the thread count."""
    return small_c.grid_backward_blocks(dy, x, w, p, _blocks(p), need_dx, need_dw, workers)


def backward_runner(p: ConvParams, need_dx: bool, need_dw: bool):
    """:func:`backward` of ``p`` for the outputs asked, its blocks looked up once: ``run(dy, x, w, workers) -> (dx,
    dw)`` or None (an input read is not finite), for a lane's runner."""
    blocks = _blocks(p)

    def run(dy, x, w, workers):
        return small_c.grid_backward_blocks(dy, x, w, p, blocks, need_dx, need_dw, workers)
    return run


@per_params
def _blocks(p: ConvParams) -> tuple:
    """(n0, n1, the block's parameters) of :func:`sample_blocks`, kept with the configuration's plans."""
    return tuple((n0, n1, _block_params(p, n1 - n0)) for n0, n1 in sample_blocks(p))


def _block_params(p: ConvParams, n: int) -> ConvParams:
    """``p`` for a block of ``n`` samples."""
    return dataclasses.replace(p, input_shape=(n,) + tuple(p.input_shape[1:]),
                               output_shape=(n,) + tuple(p.output_shape[1:]))
