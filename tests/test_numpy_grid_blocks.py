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


def _backward_case(case, seed=3):
    xs, ws, g, pad = case
    p = make_params(xs, ws, padding=pad, groups=g)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    return p, dy, x, w


@pytest.mark.parametrize("case", CASES)
def test_backward_blocks_give_one_small_calls_dx_and_the_blocks_dw_in_block_order(case):
    """grid_blocks.backward: dx bitwise one small call's (each sample's sums are the loops' whatever the batch);
    dw bitwise the blocks' own small calls added in block order (recomputed here block by block), the same for
    every worker count and mask, and within float32 rounding of the float64 definition."""
    p, dy, x, w = _backward_case(case)
    blocks = grid_blocks.sample_blocks(p)
    assert len(blocks) > 1
    one_dx = small_c.grid_backward(dy, x, w, p, True, False, False)[0]
    want_dw = None
    for n0, n1 in blocks:                      # the blocks' weight gradients, added in block order
        part = small_c.grid_backward(dy[n0:n1], x[n0:n1], w, grid_blocks._block_params(p, n1 - n0), False, True,
                                     False)[1]
        want_dw = part.copy() if want_dw is None else want_dw + part
    for workers in (1, 2, 3):
        dx, dw = grid_blocks.backward(dy, x, w, p, True, True, workers)
        assert dx.dtype == dw.dtype == np.float32
        assert dw.base is None or dw.base.nbytes == dw.nbytes     # its own buffer, not a view of the blocks' parts
        assert np.array_equal(dx, one_dx), workers
        assert np.array_equal(dw, want_dw), workers
        assert grid_blocks.backward(dy, x, w, p, False, True, workers)[0] is None
        assert np.array_equal(grid_blocks.backward(dy, x, w, p, False, True, workers)[1], want_dw)
        assert np.array_equal(grid_blocks.backward(dy, x, w, p, True, False, workers)[0], one_dx)
    wide = np.zeros(dy.shape[:-1] + (dy.shape[-1] + 5,), np.float32)[..., 2:dy.shape[-1] + 2]   # dy in a wider buffer
    wide[...] = dy
    dx, dw = grid_blocks.backward(wide, x[::-1][::-1], w, p, True, True, 2)
    assert np.array_equal(dx, one_dx) and np.array_equal(dw, want_dw)
    exact = xconv.convolution_backward(*(a.astype(np.float64) for a in (dy, x, w)), padding=case[3], groups=case[2],
                                       output_mask=(True, True, False), backend="numpy-exact")
    for got, e in zip((dx, dw), exact):
        np.testing.assert_allclose(got, e, rtol=1e-4, atol=1e-4 * np.abs(e).max())


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_backward_blocks_report_a_non_finite_input_and_the_call_detours(value):
    """A block that reads an inf or a NaN reports it (None), and the public call then gives the definition's
    non-finite values (the loops would multiply the dy grid's padding zeros by the weights)."""
    case = CASES[0]
    p, dy, x, w = _backward_case(case)
    for name, arr in (("dy", dy), ("x", x), ("w", w)):
        bad = [a.copy() for a in (dy, x, w)]
        bad[("dy", "x", "w").index(name)].reshape(-1)[-7] = value
        assert grid_blocks.backward(*bad, p, True, True, 2) is None, name
        with xconv.trace() as tr:
            got = xconv.convolution_backward(*bad, padding=case[3], groups=case[2], output_mask=(True, True, False),
                                             backend="numpy")
        assert "non-finite detour" in tr.records[0].path, tr.records[0].path
        want = xconv.convolution_backward(*(a.astype(np.float64) for a in bad), padding=case[3], groups=case[2],
                                          output_mask=(True, True, False), backend="numpy-exact")
        for g_, e in zip(got[:2], want[:2]):
            assert np.array_equal(np.isnan(g_), np.isnan(e)) and np.array_equal(np.isinf(g_), np.isinf(e)), name


def test_the_public_backward_runs_the_blocks_for_a_batch_the_model_gives_the_small_loops():
    """The digits model's grouped layer at batch 64 (4.7 M multiply-adds: the small loops, in four blocks): the
    path is small-c-blocks for both gradients whatever the mask, dw's bits the same under every mask and on the
    repeated call (the plan's runner), and every output within float32 rounding of torch-independent float64 sums."""
    case = CASES[0]
    p, dy, x, w = _backward_case(case, seed=5)
    kw = dict(padding=case[3], groups=case[2])
    with xconv.trace() as tr:
        full = xconv.convolution_backward(dy, x, w, bias_sizes=(w.shape[0],), **kw)
    assert tr.records[0].path.startswith("small-c-blocks: "), tr.records[0].path
    assert "[grad_input, grad_weight: cost model: small-c cheapest, in two or more sample blocks" in tr.records[0].path
    for mask in ((False, True, False), (False, True, True), (True, True, False)):
        part = xconv.convolution_backward(dy, x, w, bias_sizes=(w.shape[0],), output_mask=mask, **kw)
        assert np.array_equal(part[1], full[1]), mask
        if mask[0]:
            assert np.array_equal(part[0], full[0])
    for _ in range(3):                          # repeated calls: the plan's runner, the same bits
        again = xconv.convolution_backward(dy, x, w, bias_sizes=(w.shape[0],), **kw)
        assert all(np.array_equal(a, b) for a, b in zip(again, full))
    exact = xconv.convolution_backward(*(a.astype(np.float64) for a in (dy, x, w)), bias_sizes=(w.shape[0],),
                                       backend="numpy-exact", **kw)
    for got, e in zip(full, exact):
        np.testing.assert_allclose(got, e, rtol=1e-4, atol=1e-4 * np.abs(e).max())
