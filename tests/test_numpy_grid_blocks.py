"""grid_blocks.fprop: the small path's stride-1 loops per block of samples (float32: one C job per block) give the
bits of one small-path call (small_c.grid_fprop) for any worker count, dims, groups, bias and layout."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv.params import make_params

from xconv_numpy import grid_blocks, paths, small_c

CASES = [   # input, weight, groups, padding
    ((64, 16, 8, 8), (32, 4, 3, 3), 4, 1),
    ((40, 3, 20, 20), (8, 3, 3, 3), 1, 1),
    ((32, 6, 100), (16, 6, 5), 1, 2),
    ((12, 2, 8, 10, 10), (8, 2, 3, 3, 3), 1, 1),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_sample_blocks_give_one_small_calls_bits(case, dtype):
    xs, ws, g, pad = case
    nd = len(xs) - 2
    p = make_params(xs, ws, padding=pad, groups=g, dtype=dtype)
    assert len(grid_blocks.sample_blocks(p)) > 1
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    for bias in (None, b):
        want = small_c.grid_fprop(x, w, bias, p)
        for workers in (1, 2, 3):
            got = grid_blocks.fprop(x, w, bias, p, workers)
            assert got.dtype == want.dtype and np.array_equal(got, want), (workers, bias is None)
        strided = np.zeros(xs[:-1] + (xs[-1] + 3,), dtype)[..., 1:xs[-1] + 1]    # x inside a wider buffer
        strided[...] = x
        assert np.array_equal(grid_blocks.fprop(strided, w, bias, p, 2), want)
    exact = xconv.conv_fprop(x, w, bias=b, padding=pad, groups=g, backend="numpy-exact")
    np.testing.assert_allclose(grid_blocks.fprop(x, w, b, p, 2), exact, rtol=1e-4, atol=1e-4 * nd * 10)


def test_the_public_call_reports_the_blocks_and_their_scratch():
    x = np.random.default_rng(8).standard_normal((64, 16, 8, 8)).astype(np.float32)
    w = np.random.default_rng(9).standard_normal((32, 4, 3, 3)).astype(np.float32)
    with xconv.trace() as tr:
        y = xconv.conv_fprop(x, w, padding=1, groups=4)
    (r,) = tr.records
    assert r.path.startswith("small-c-blocks") and r.workspace_bytes > 0
    with paths.force("small-c"):
        assert np.array_equal(xconv.conv_fprop(x, w, padding=1, groups=4), y)
