"""The dense loops' weight gradient skips the terms that multiply x's padding (dense_plan._dw_taps) where dy is finite:
the same bits as every term run, near the float64 oracle; where dy holds an inf or a NaN those terms are NaNs of the
definition (docs/semantics.md), so it runs them all."""

from __future__ import annotations

import numpy as np
import pytest

import xconv

from xconv_numpy import dense, dense_plan, native, paths
from xconv_numpy.grid.scratch import Lease
from xconv.params import make_params

from core_helpers import load_avx2_build  # noqa: E402

pytestmark = pytest.mark.skipif(not dense.available(),
                                reason=f"compiled loops unavailable: {dense.build_error()}")

CASES = [
    ((2, 32, 4, 4), (3, 3), 1, 1, 1),                         # every row and column at an edge
    ((2, 16, 3, 5, 6), (3, 3, 3), 1, 1, 1),                    # 3-D: planes, rows and columns of padding
    ((2, 32, 7, 6), (3, 3), 2, ((2, 1), (1, 1)), 1),           # stride 2
    ((1, 32, 9, 9), (5, 3), 1, ((4, 2), (1, 1)), (2, 1)),      # dilated, taps reading padding only on some rows
    ((2, 16, 2, 2), (7, 7), 1, 3, 1),                          # taps reading no input at all
    ((3, 16, 40), (3,), 1, 2, 1),                              # 1-D: columns only
]
GROUPED = ((3, 64, 5, 6), (32, 32, 3, 3), dict(padding=((2, 0), (1, 2)), groups=2))     # asymmetric, two groups


def _arrays(shape, kernel, kw, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((32, shape[1]) + kernel).astype(np.float32)
    dy = rng.standard_normal(xconv.conv_fprop(x, w, backend="numpy-exact", **kw).shape).astype(np.float32)
    return x, w, dy


def _dw(dy, x, w, kw, mask=(False, True, False)):
    with paths.force("dense"):
        return xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw)[1]


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation", CASES)
def test_skipping_the_padding_terms_changes_no_bit(shape, kernel, stride, padding, dilation, monkeypatch):
    kw = dict(stride=stride, padding=padding, dilation=dilation)
    x, w, dy = _arrays(shape, kernel, kw)
    p = make_params(x.shape, w.shape, **kw)
    assert dense_plan.dw_tap_share(p) < 1                      # there is padding to skip
    skipping = [_dw(dy, x, w, kw), _dw(dy, x, w, kw, (True, True, True))]
    monkeypatch.setattr(dense, "skips_padding", lambda f, dy: False)
    every = [_dw(dy, x, w, kw), _dw(dy, x, w, kw, (True, True, True))]
    assert [a.tobytes() for a in skipping] == [b.tobytes() for b in every]
    exact = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), backend="numpy-exact", **kw)[1]
    np.testing.assert_allclose(skipping[0], exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_a_non_finite_dy_meets_the_padding_as_the_definition_says(value, monkeypatch):
    """dy's corner times the padding's zeros is a NaN of dw at the taps that read the padding there; the skipping table
    would drop it (checked by forcing it), so a non-finite dy runs every term."""
    shape, kernel, kw = (2, 32, 5, 6), (3, 3), dict(padding=1)
    x, w, dy = _arrays(shape, kernel, kw)
    dy[1, 3, 0, 0] = value
    exact = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), backend="numpy-exact", **kw)[1]
    got = _dw(dy, x, w, kw)
    assert np.isnan(exact[3, :, 0, 0]).all()                   # tap (0, 0) reads the padding at output (0, 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(exact))
    finite = np.isfinite(exact)
    np.testing.assert_allclose(got[finite], exact[finite], rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(dense, "skips_padding", lambda f, dy: f.dw_skips)
    forced = _dw(dy, x, w, kw)
    assert not np.isnan(forced[3, :, 0, 0]).any()             # the table does skip those terms


def test_the_share_of_terms_run_counts_the_padding():
    """dw_tap_share (the padding skip's share; not the cost model's): 3x3 on 4x4 with padding 1 runs (10/12)^2 of the terms; without padding all."""
    assert dense_plan.dw_tap_share(make_params((2, 32, 4, 4), (32, 32, 3, 3), padding=1)) == pytest.approx(100 / 144)
    assert dense_plan.dw_tap_share(make_params((2, 32, 4, 4), (32, 32, 3, 3))) == 1.0
    assert dense_plan.dw_tap_share(make_params((2, 32, 4, 4, 4), (32, 32, 3, 3, 3), padding=1)) == \
        pytest.approx((10 / 12) ** 3)


def test_blocks_of_samples_groups_and_the_avx2_build_skip_the_same_terms(monkeypatch):
    """The table's rows are one sample's (row r of a block is row r % R): several blocks of samples (budget 1: one
    sample a block, their weight gradients added in order), two groups, and the AVX2 build's blocks give the bits of
    every term run."""
    xs, ws, kw = GROUPED
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    p = make_params(xs, ws, **kw)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)

    def grads():
        out = []
        for budget in (1 << 30, 1):
            with Lease() as lease:
                out.append(dense.backward(dy, x, w, p, True, True, False, 2, budget, lease)[1])
        return out

    def both():
        dense_plan.plan.cache_clear()
        skipping = grads()
        with monkeypatch.context() as m:
            m.setattr(dense, "skips_padding", lambda f, dy: False)
            dense_plan.plan.cache_clear()
            every = grads()
        dense_plan.plan.cache_clear()
        assert dense_plan.plan(p, True, True, 1).nb == 1                  # the budget of 1 runs three blocks
        assert [a.tobytes() for a in skipping] == [b.tobytes() for b in every]
        return skipping

    wide = both()
    exact = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), backend="numpy-exact", **kw)[1]
    np.testing.assert_allclose(wide[0], exact, rtol=1e-4, atol=1e-4)
    if native.library() is not None and native.isa(native.library()) == "avx512" and native.library_path("avx2"):
        load_avx2_build(monkeypatch)
        assert [a.tobytes() for a in both()] == [b.tobytes() for b in wide]


def test_a_kept_template_that_skips_never_serves_a_non_finite_dy():
    """The call's job template is kept per table: a finite dy first (the skipping template kept), then an inf in dy on
    the same configuration, by the public call and by a converted torch layer's repeated calls (lanes), runs every
    term: dw's NaNs where the definition has them; then a finite dy again skips as before, the same bits."""
    torch = pytest.importorskip("torch")
    import xconv.torch as xt

    shape, kernel, kw = (2, 32, 5, 6), (3, 3), dict(padding=1)
    x, w, dy = _arrays(shape, kernel, kw, seed=9)
    bad = dy.copy()
    bad[0, 5, 0, 3] = np.inf
    want = xconv.convolution_backward(bad, x, w, output_mask=(False, True, False), backend="numpy-exact", **kw)[1]
    assert np.isnan(want).any()
    first = _dw(dy, x, w, kw)
    got = _dw(bad, x, w, kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert _dw(dy, x, w, kw).tobytes() == first.tobytes()

    layer = xt.convert(torch.nn.Conv2d(32, 32, 3, padding=1, bias=False), backend="numpy")
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    tx = torch.from_numpy(x)

    def weight_grad(g):
        layer.weight.grad = None
        with paths.force("dense"):
            layer(tx).backward(torch.from_numpy(g))
        return layer.weight.grad.numpy().copy()

    for g in (dy, dy, dy):                              # the lane and its kept template
        assert weight_grad(g).tobytes() == first.tobytes()
    np.testing.assert_array_equal(np.isnan(weight_grad(bad)), np.isnan(want))
    assert weight_grad(dy).tobytes() == first.tobytes()
