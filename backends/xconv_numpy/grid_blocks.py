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

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES, accumulation_dtype

from . import jobs, native, small, small_c
from .cost import grid_block_samples
from .workers import run


def sample_blocks(p: ConvParams) -> list[tuple[int, int]]:
    """[n0, n1) blocks of samples, each with at least GRID_BLOCK_ELEMENTS output elements (the last may hold
    fewer), at most 8 (:func:`cost.grid_block_samples`)."""
    size = grid_block_samples(p)
    return [(a, min(a + size, p.input_shape[0])) for a in range(0, p.input_shape[0], size)]


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias, stride 1, by the grid loops per block of samples."""
    cdt = accumulation_dtype(p.dtype)
    blocks = sample_blocks(p)
    if len(blocks) == 1 or (workers == 1 and small.serves(p)):
        return small_c.grid_fprop(x, w, bias, p)    # the same bits in one call (a small call's blocks on one thread:
        #                                             20% slower; past the small size the blocks bound the scratch)
    y = np.empty(p.output_shape, DTYPES[p.dtype])
    w = np.ascontiguousarray(w, dtype=cdt)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=cdt)
    if cdt == np.float32 and y.dtype == cdt:
        return _fprop_jobs(x, w, b, y, p, blocks, workers)

    # one copy of the caller's context per block: the worker threads' small calls note their scratch in the
    # caller's trace record (a context is entered by one thread at a time)
    contexts = {n0: contextvars.copy_context() for n0, _ in blocks}

    def task(_, __, n0, n1):
        y[n0:n1] = contexts[n0].run(small_c.grid_fprop, x[n0:n1], w, b, _block_params(p, n1 - n0))

    run(blocks, task, lambda: None, workers)
    return y


def _block_params(p: ConvParams, n: int) -> ConvParams:
    """``p`` for a block of ``n`` samples."""
    return dataclasses.replace(p, input_shape=(n,) + tuple(p.input_shape[1:]),
                               output_shape=(n,) + tuple(p.output_shape[1:]))


def _fprop_jobs(x, w, b, y, p: ConvParams, blocks, workers: int):
    """The blocks' small-path calls (float32) as C jobs (:mod:`.jobs`: torch's OpenMP team where it is loaded), each
    the C call :func:`small_c.grid_fprop` makes for its block."""
    x = small_c.readable(x, np.float32)
    plans = {n1 - n0: small_c.s1_plan(_block_params(p, n1 - n0)) for n0, n1 in blocks}      # held while C runs
    xs, xs_at = small_c.strides(x, plans[blocks[0][1] - blocks[0][0]].lift)
    out = np.zeros((len(blocks), 2), np.int64)                         # per block: status, scratch bytes
    xa, ya, wa, oa = (native.address(a) for a in (x, y, w, out))
    ba = 0 if b is None else native.address(b)
    table = [(xa + n0 * x.strides[0], wa, ba, ya + n0 * y.strides[0], plans[n1 - n0].address, xs_at, oa + 16 * i)
             for i, (n0, n1) in enumerate(blocks)]
    run = jobs.Jobs()
    run.rows("small_fprop", table)
    run.run(workers)
    if out[:, 0].any():
        raise small_c.scratch_failed(p)
    tracing.workspace(int(out[:min(workers, len(blocks)), 1].sum()))      # the blocks running at once, at most
    return y
