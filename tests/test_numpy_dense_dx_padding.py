"""The dense loops' input-gradient rows (the backward's dx, the forward at stride 1 as its dual's dx, the strided
forward) skip, per tap, the positions of a row that read only the padding's zeros (dense_plan.dx_cols,
dense_strided.tap_cols). Their terms are +0 (the loops get finite weights) and a sum that starts at +0 is never -0, so
no bit changes: the same call with x padded by hand (padding 0, so every term run) gives the same bits, and both are
near the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest

import xconv

from xconv_numpy import dense, dense_plan, dense_strided, native, paths
from xconv.params import make_params

from core_helpers import assert_same_non_finite, lane_conf, load_avx2_build, validated  # noqa: E402
from xconv import lanes

pytestmark = pytest.mark.skipif(not dense.available(),
                                reason=f"compiled loops unavailable: {dense.build_error()}")

# (x shape, out channels, kernel, stride, padding per dim (before, after), dilation, groups)
CASES = [
    ((2, 32, 4, 4), 32, (3, 3), 1, ((1, 1), (1, 1)), 1, 1),            # rows of 4: every block at both edges
    ((3, 64, 2, 2), 32, (3, 3), 1, ((1, 1), (1, 1)), 1, 1),            # rows of 2
    ((2, 48, 5, 30), 32, (3, 5), 1, ((1, 1), (2, 2)), 1, 1),           # 30 positions: three blocks; 16-channel tail
    ((1, 32, 6, 9), 32, (3, 7), 1, ((1, 2), (3, 3)), 1, 1),            # 3 padding columns: 2 skipped, 1 run as zeros
    ((2, 32, 9, 9), 32, (5, 3), 1, ((4, 2), (1, 1)), (2, 1), 1),       # dilated, asymmetric
    ((2, 16, 3, 2), 16, (3, 5), 1, ((1, 1), (2, 2)), 1, 1),            # a kernel wider than the row
    ((2, 64, 5, 6), 64, (3, 3), 1, ((2, 0), (1, 2)), 1, 2),            # two groups
    ((3, 16, 40), 32, (3,), 1, ((2, 1),), 1, 1),                       # 1-D
    ((2, 16, 3, 5, 6), 32, (3, 3, 3), 1, ((1, 1), (1, 1), (1, 1)), 1, 1),  # 3-D
    ((2, 32, 7, 6), 32, (3, 3), 2, ((1, 1), (1, 1)), 1, 1),            # stride 2 (the strided forward)
    ((2, 16, 9, 11), 32, (5, 5), 2, ((2, 2), (2, 2)), 1, 1),           # stride 2, two columns each side
    ((3, 16, 50), 32, (10,), 5, ((3, 4),), 1, 1),                      # 1-D, stride 5
]


def _arrays(case, seed=0):
    shape, co, kernel, stride, padding, dilation, groups = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((co, shape[1] // groups) + kernel).astype(np.float32)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    dy = rng.standard_normal(xconv.conv_fprop(x, w, backend="numpy-exact", **kw).shape).astype(np.float32)
    return x, w, dy, kw


def _padded(x, padding):
    """x with its padding written as zeros (the same call then runs at padding 0)."""
    return np.pad(x, ((0, 0), (0, 0)) + tuple(padding))


def _interior(a, padding):
    return a[(slice(None), slice(None)) + tuple(slice(b, a.shape[2 + i] - e) for i, (b, e) in enumerate(padding))]


def _dense(fn, *args, **kw):
    """fn on the dense loops (the trace says they ran)."""
    with xconv.trace() as t, paths.force("dense"):
        out = fn(*args, backend="numpy", **kw)
    assert all(r.path.startswith("dense") for r in t.records), [r.path for r in t.records]
    return out


def _forward_and_dx(case):
    x, w, dy, kw = _arrays(case)
    pad = kw["padding"]
    y = _dense(xconv.conv_fprop, x, w, **kw)
    dx = _dense(xconv.convolution_backward, dy, x, w, output_mask=(True, False, False), **kw)[0]
    xp, kp = _padded(x, pad), dict(kw, padding=0)
    y_every = _dense(xconv.conv_fprop, xp, w, **kp)
    dx_every = _interior(_dense(xconv.convolution_backward, dy, xp, w, output_mask=(True, False, False), **kp)[0], pad)
    return (x, w, dy, kw), (y, dx), (y_every, dx_every)


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) + f"k{c[2]}s{c[3]}" for c in CASES])
def test_skipping_the_padding_columns_changes_no_bit(case):
    (x, w, dy, kw), (y, dx), (y_every, dx_every) = _forward_and_dx(case)
    assert y.tobytes() == y_every.tobytes()
    assert dx.tobytes() == dx_every.tobytes()
    exact_y = xconv.conv_fprop(x, w, backend="numpy-exact", **kw)
    exact_dx = xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy-exact", **kw)[0]
    np.testing.assert_allclose(y, exact_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, exact_dx, rtol=1e-4, atol=1e-4)


@pytest.fixture
def every_column(monkeypatch):
    """A function switching the loops' tables to every position of every tap (nothing skipped by column), the plans
    made anew on both sides of the switch (and after the test)."""
    def clear():
        dense_plan.plan.cache_clear()
        dense_plan.dx_tap_share.cache_clear()
        dense_strided.plan.cache_clear()

    def switch():
        clear()
        monkeypatch.setattr(dense_plan, "dx_cols", lambda idx, k, d, rho, s, lo, n, row_len:
                            np.array([[0, row_len]] * len(idx), np.int64).reshape(-1, 2))
        monkeypatch.setattr(dense_strided, "tap_cols", lambda kw, dw, sw, pw, W, Wo:
                            np.array([[0, Wo]] * len(kw), np.int64).reshape(-1, 2))
    clear()
    yield switch
    monkeypatch.undo()
    clear()


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) + f"k{c[2]}s{c[3]}" for c in CASES])
def test_the_loops_give_the_bits_of_every_column_run(case, every_column):
    """The forward and dx with the skip against the same loops running every position of every tap (x padded by
    hand runs every term of the forward only: at padding 0, dx still skips the taps outside dy)."""
    x, w, dy, kw = _arrays(case)
    y = validated(_dense, xconv.conv_fprop, x, w, **kw)
    dx = validated(_dense, xconv.convolution_backward, dy, x, w, output_mask=(True, False, False), **kw)[0]
    every_column()
    assert validated(_dense, xconv.conv_fprop, x, w, **kw).tobytes() == y.tobytes()
    assert validated(_dense, xconv.convolution_backward, dy, x, w, output_mask=(True, False, False),
                     **kw)[0].tobytes() == dx.tobytes()


def test_the_avx2_build_skips_the_same_terms(monkeypatch):
    """The AVX2 build's 8-float blocks (6, 4, 2, 1 positions) skip as the AVX-512 build's: the same bits, with and
    without the padding."""
    lib = native.library()
    if lib is None or native.isa(lib) != "avx512" or not native.library_path("avx2"):
        pytest.skip("needs the AVX-512 build loaded and the AVX2 build beside it")
    wide = [_forward_and_dx(case)[1] for case in CASES[:4] + CASES[9:10]]
    load_avx2_build(monkeypatch)
    for case, (y, dx) in zip(CASES[:4] + CASES[9:10], wide):
        _, got, every = _forward_and_dx(case)
        assert [a.tobytes() for a in got] == [y.tobytes(), dx.tobytes()] == [a.tobytes() for a in every]


def test_the_tables_skip_the_columns_that_read_padding():
    """Per tap, the positions of a row whose column is inside the input: 3x3 at width 4 with padding 1 (the forward's
    dual and the backward's dx: the leftmost tap skips the first position, the rightmost the last), and the strided
    forward's taps at stride 2; the shares the cost model counts, (10/12)^2 and (23/24)^2."""
    p = make_params((2, 32, 4, 4), (32, 32, 3, 3), padding=1)
    for q in (p, dense.dual(p)):
        job = dense_plan.plan(q, True, False, 1 << 30).dx_jobs[0]
        assert job.offs[len(job.taps):].reshape(-1, 2)[:3].tolist() == [[0, 3], [0, 4], [1, 4]]
    assert dense_plan.dx_tap_share(p) == pytest.approx(100 / 144)
    s = make_params((2, 16, 16, 16), (32, 16, 3, 3), stride=2, padding=1)
    f = dense_strided.plan(s)
    assert f.offs[f.K:].reshape(-1, 2)[:3].tolist() == [[0, 8], [0, 8], [1, 8]]    # flipped taps: kw = 2, 1, 0
    assert dense_strided.tap_share(s) == pytest.approx((23 / 24) ** 2)


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_a_non_finite_weight_meets_the_padding_as_the_definition_says(value, monkeypatch):
    """A weight's inf or NaN times the padding's zeros is a NaN of y's border (docs/semantics.md; dx's sums have no
    padding term): the forward and dx give the oracle's NaNs and infinities though the loops skip those terms (they get finite weights only: the
    forward detours, the dense backward runs zeros in the weight's place and adds its terms after)."""
    x, w, dy, kw = _arrays(CASES[0])
    w[3, 5, 0, 0] = value
    reached = []
    real = dense.fprop
    monkeypatch.setattr(dense, "fprop", lambda *a: reached.append(1) or real(*a))
    with paths.force("dense"):                              # no trace open: dense.fprop runs, its copy finds the
        y = validated(xconv.conv_fprop, x, w, backend="numpy", **kw)     # weight and the call detours
    assert reached
    dx = _dense(xconv.convolution_backward, dy, x, w, output_mask=(True, False, False), **kw)[0]
    exact = (xconv.conv_fprop(x, w, backend="numpy-exact", **kw),
             xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy-exact", **kw)[0])
    assert np.isnan(exact[0][:, 3, 0]).all() and np.isnan(exact[0][:, 3, :, 0]).all()   # y's border meets the padding
    if value == np.inf:
        assert not np.isnan(exact[1]).any()                                             # dx's terms never meet it
    assert_same_non_finite((y, dx), exact, rtol=1e-4)


@pytest.mark.parametrize("mask", [(True, False, False), (True, True, False), (True, True, True)])
@pytest.mark.parametrize("dy_value", [-np.inf, np.nan])
def test_a_non_finite_weight_meeting_a_non_finite_dy_gives_the_definitions_values(mask, dy_value):
    """The loops run a non-finite weight as a zero and add its terms after; where dy holds an inf or a NaN too, that
    zero times dy's would be a NaN the definition does not have (-inf * inf is -inf): dx then runs on the columns
    (the trace names that detour for grad_input alone), dw stays on the loops with the bits of a finite weight's call
    (dw does not read w), db on bias-sum, and all three are the oracle's; the same untraced (the loops find it) and
    through a lane's repeated calls."""
    x, w, dy, kw = _arrays(((2, 32, 5, 6), 32, (3, 3), 1, ((1, 1), (1, 1)), 1, 1))
    w[0, 0, 1, 1] = np.inf
    dy[0, 0, 2, 2] = dy_value
    bias = [32] if mask[2] else None
    with xconv.trace() as t, paths.force("dense"):
        got = xconv.convolution_backward(dy, x, w, output_mask=mask, bias_sizes=bias, backend="numpy", **kw)
    record = t.records[-1].path
    assert "columns: im2col columns (fallback) [grad_input: non-finite detour]" in record
    assert ("dense: C direct loops [grad_weight" in record) == mask[1] and "dense: C direct loops [grad_input" not in record
    exact = xconv.convolution_backward(dy, x, w, output_mask=mask, bias_sizes=bias, backend="numpy-exact", **kw)
    with paths.force("dense"):
        untraced = validated(xconv.convolution_backward, dy, x, w, output_mask=mask, bias_sizes=bias, backend="numpy",
                             **kw)
        conf = lane_conf(2, 1, 1)
        lanes.clear()
        w_finite = np.where(np.isfinite(w), w, 0).astype(np.float32)
        lanes.backward(conf, dy, x, w_finite, bias, mask, conf.kwargs)           # opens the lane (a public call)
        laned = lanes.backward(conf, dy, x, w, bias, mask, conf.kwargs)          # its template, then the dispatch
        lanes.clear()
    for a, b in zip(untraced, laned):
        assert (a is None and b is None) or a.tobytes() == b.tobytes()
    assert [a is None or a.tobytes() for a in untraced] == [a is None or a.tobytes() for a in got]
    if mask[1]:
        with paths.force("dense"):       # the loops' dw (the cost model may pick another path for it: AVX2 build)
            finite_dw = validated(xconv.convolution_backward, dy, x, w_finite, output_mask=(False, True, False),
                                  backend="numpy", **kw)[1]
        assert got[1].tobytes() == finite_dw.tobytes()
    if dy_value == -np.inf:
        assert exact[0][0, 0, 2, 2] == -np.inf                      # -inf * inf plus finite terms
    assert [a is None for a in got] == [b is None for b in exact]
    assert_same_non_finite([a for a in got if a is not None], [b for b in exact if b is not None], 1e-4, 1e-3)
