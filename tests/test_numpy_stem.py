"""The stem path (backends/xconv_numpy/stem.py, csrc/stem.c): few input channels, forward and weight gradient as direct
loops along output rows.

Checked against float64 sums of the definition (numpy-exact on float64 copies) and, where installed, PyTorch's CPU
convolution in float64; its bits against themselves across worker counts, input layouts and masks of the
surrounding calls; non-finite inputs against the reference; the cost model's picks on real stems."""

import numpy as np
import pytest

import xconv
from xconv.params import make_params

from core_helpers import assert_same_non_finite
from xconv_numpy import paths, stem

needs_loops = pytest.mark.skipif(stem.built_for() not in stem.ISAS,
                                 reason=f"the stem loops serve the {stem.ISAS} builds only; this process loaded "
                                        f"{stem.built_for()} (None: XCONV_NUMPY_C=0, or no compiler at install)")
pytestmark = needs_loops

# x shape, w shape, stride, padding, dilation: 1-D/2-D/3-D, strides 1-3, dilation, asymmetric padding (legalized),
# output widths around the 16- and 32-lane blocks, channel counts around the 12-, 4- and 1-channel blocks
CASES = [
    ((8, 3, 64, 64), (64, 3, 7, 7), 2, 3, 1),             # ResNet's stem
    ((2, 3, 96, 96), (16, 3, 3, 3), 2, 1, 1),             # MobileNetV2's
    ((2, 3, 6, 40, 41), (13, 3, 3, 3, 3), (1, 2, 2), 1, 1),
    ((3, 1, 200), (5, 1, 10), 5, 0, 1),                   # 1-D, one channel (the table sends it to depthwise)
    ((2, 4, 17, 60), (1, 4, 3, 5), (2, 3), (1, 2), 1),
    ((1, 2, 9, 70), (29, 2, 3, 3), 1, ((0, 2), (3, 1)), 2),
    ((2, 3, 5, 16), (12, 3, 5, 1), 1, (2, 0), 1),
    ((2, 3, 4, 70), (4, 3, 2, 2), 3, 0, (1, 3)),
    ((1, 3, 3, 18), (7, 3, 3, 3), 1, 1, 1),
    ((2, 2, 3, 3, 40), (5, 2, 1, 2, 4), 1, 0, 1),
]


def _arrays(xs, ws, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype),
            rng.standard_normal(ws[0]).astype(dtype))


def _kw(s, pad, d):
    return dict(stride=s, padding=pad, dilation=d)


def _forced(x, w, b, kw, backend="numpy"):
    with xconv.trace() as t, paths.force("stem"):
        y = xconv.conv_fprop(x, w, bias=b, backend=backend, **kw)
    return y, t.records[0].path


def _stem_matches_definition(x, w, b, kw):
    """y of the forced stem loops (float32, 2-D), held against the definition's float64 sums; returned."""
    y, path = _forced(x, w, b, kw)
    assert path.startswith("stem"), path
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), bias=b.astype(np.float64),
                            backend="numpy-exact", **kw)
    scale = np.abs(x).max() * np.abs(w).sum(axis=(1, 2, 3)).max()
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * scale)
    return y


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_stem_matches_float64_sums_of_the_definition(case):
    xs, ws, s, pad, d = case
    x, w, b = _arrays(xs, ws)
    kw = _kw(s, pad, d)
    for bias in (None, b):
        y, path = _forced(x, w, bias, kw)
        assert path.startswith("stem"), path
        want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64),
                                bias=None if bias is None else bias.astype(np.float64), backend="numpy-exact", **kw)
        assert y.dtype == np.float32 and y.shape == want.shape and y.flags.c_contiguous
        scale = np.abs(x).max() * np.abs(w).sum(axis=tuple(range(1, w.ndim))).max()
        np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize("pad", range(6))
def test_stride_two_phase_rows_at_every_padding_and_width(pad):
    """Stride 2 on contiguous rows takes both phases from one pair of vector loads where the row holds them, element
    by element at the ends and zeros past them (csrc/stem.c, stem_phase_pairs): every padding 0-5 and row widths around
    the 16-lane loads (odd and even, a last block that overlaps the one before), forward and weight gradient, against
    float64 sums of the definition."""
    for width in (31, 32, 33, 47, 66, 97):
        for k in (3, 7):
            if (width + 2 * pad - k) // 2 + 1 < 16:
                continue                                    # rows shorter than a vector: not the stem's
            xs, ws = (2, 3, 5, width), (6, 3, 3, k)
            x, w, b = _arrays(xs, ws, seed=width + pad)
            kw = dict(stride=2, padding=(1, pad))
            y = _stem_matches_definition(x, w, b, kw)
            dy = np.random.default_rng(pad).standard_normal(y.shape).astype(np.float32)
            with xconv.trace() as t, paths.force("stem"):
                _, dw, _ = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), **kw)
            assert t.records[0].path.startswith("stem"), t.records[0].path
            _, ew, _ = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                                  output_mask=(False, True, False), backend="numpy-exact", **kw)
            np.testing.assert_allclose(dw, ew, rtol=0, atol=1e-5 * np.abs(dy).max() * np.abs(x).max() * dy[0, 0].size)


def test_stem_matches_pytorch():
    torch = pytest.importorskip("torch")
    x, w, b = _arrays((4, 3, 37, 52), (24, 3, 7, 7), seed=3)
    y, path = _forced(x, w, b, dict(stride=2, padding=3))
    assert path.startswith("stem")
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                      torch.from_numpy(b).double(), stride=2, padding=3).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


def test_a_hand_worked_case():
    """One channel of ones (4 x 32) through a 2x2 kernel 1, 2 / 3, 4 at stride 2 and padding 1: corners read one tap,
    edges two, the inside all four (plus the bias 0.5)."""
    x = np.ones((1, 2, 4, 32), np.float32)
    x[0, 1] = 0
    w = np.zeros((1, 2, 2, 2), np.float32)
    w[0, 0] = [[1, 2], [3, 4]]
    y, path = _forced(x, w, np.array([0.5], np.float32), dict(stride=2, padding=1))
    assert path.startswith("stem") and y.shape == (1, 1, 3, 17)
    row = lambda first, inner, last: [first] + [inner] * 15 + [last]       # noqa: E731
    np.testing.assert_array_equal(y[0, 0], np.array([row(4, 7, 3), row(6, 10, 4), row(2, 3, 1)], np.float32) + 0.5)


@pytest.mark.parametrize("case", CASES[:3] + CASES[4:6], ids=lambda c: "x".join(map(str, c[0])))
def test_bits_do_not_depend_on_workers_or_the_layout_of_x(case):
    xs, ws, s, pad, d = case
    x, w, b = _arrays(xs, ws, seed=1)
    kw = _kw(s, pad, d)
    base, _ = _forced(x, w, b, kw)
    p = _params(x, w, kw)
    for workers in (1, 2, 3, 7):
        assert stem.fprop(x, w, b, p, workers).tobytes() == base.tobytes()
    layouts = [np.asfortranarray(x), np.ascontiguousarray(x[..., ::-1])[..., ::-1],
               x.astype(x.dtype.newbyteorder("S")), np.moveaxis(np.moveaxis(x, 1, -1).copy(), -1, 1)]
    ro = x.copy()
    ro.flags.writeable = False
    for held in layouts + [ro]:
        assert _forced(held, w, b, kw)[0].tobytes() == base.tobytes()
    wide = np.zeros(xs[:-1] + (2 * xs[-1],), np.float32)
    wide[..., ::2] = x
    assert _forced(wide[..., ::2], w, b, kw)[0].tobytes() == base.tobytes()
    bx = np.broadcast_to(x[:1], x.shape)
    assert _forced(bx, w, b, kw)[0].tobytes() == _forced(np.array(bx), w, b, kw)[0].tobytes()


def _params(x, w, kw):
    """The call's normalized parameters (xconv's own checks), as the backend receives them."""
    return make_params(x.shape, w.shape, dtype=x.dtype.name, **kw)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_are_summed_in_float32(dtype):
    from xconv.dtypes import DTYPES
    dt = DTYPES[dtype]
    x, w, b = _arrays((2, 3, 20, 40), (16, 3, 3, 3), seed=4)
    x, w = x.astype(dt), w.astype(dt)
    y, path = _forced(x, w, None, dict(stride=2, padding=1))
    assert path.startswith("stem") and y.dtype == dt
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", stride=2, padding=1)
    # float32 sums rounded once to the half type: within one unit of its last place of the exact value
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2 ** -7 if dtype == "bfloat16" else 2 ** -10,
                               atol=1e-2)


@pytest.mark.parametrize("where", ["x", "w"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_inputs_agree_with_the_reference(where, value):
    """The reference multiplies the padding's zeros (0 * inf is NaN there); the stem loops skip the tap rows that read
    padding, so a non-finite weight detours to ``columns``; a non-finite x is multiplied as the reference does."""
    x, w, b = _arrays((2, 3, 9, 40), (5, 3, 3, 3), seed=5)
    (x if where == "x" else w)[0, 0, 0, 0] = value
    y, path = _forced(x, w, b, dict(stride=2, padding=1))
    assert path.startswith("columns" if where == "w" else "stem"), path
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), bias=b.astype(np.float64),
                            backend="numpy-exact", stride=2, padding=1)
    assert_same_non_finite([y], [want], rtol=1e-5)


@pytest.mark.parametrize("xs, ws, s, pad", [((8, 3, 64, 64), (64, 3, 7, 7), 2, 3), ((8, 3, 96, 96), (16, 3, 3, 3), 2, 1),
                                            ((2, 3, 224, 224), (64, 3, 7, 7), 2, 3)])
def test_the_cost_model_sends_real_stems_here(xs, ws, s, pad):
    x, w, _ = _arrays(xs, ws)
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, stride=s, padding=pad)
    assert t.records[0].path.startswith("stem: stem C loops [output: cost model: stem cheapest"), t.records[0].path


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_weight_gradient_matches_float64_sums_of_the_definition(case):
    xs, ws, s, pad, d = case
    x, w, _ = _arrays(xs, ws, seed=6)
    kw = _kw(s, pad, d)
    dy = np.random.default_rng(7).standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)
    with xconv.trace() as t, paths.force("stem"):
        dw = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), **kw)[1]
    assert t.records[0].path.startswith("stem"), t.records[0].path
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      output_mask=(False, True, False), backend="numpy-exact", **kw)[1]
    assert dw.dtype == np.float32 and dw.shape == w.shape
    scale = np.abs(dy).max() * np.abs(x).max() * np.prod(dy.shape) / dy.shape[1]
    np.testing.assert_allclose(dw, want, rtol=0, atol=1e-6 * scale)


def test_weight_gradient_matches_pytorch():
    torch = pytest.importorskip("torch")
    x, w, _ = _arrays((4, 3, 37, 52), (24, 3, 7, 7), seed=8)
    dy = np.random.default_rng(9).standard_normal((4, 24, 19, 26)).astype(np.float32)
    with xconv.trace() as t:
        dw = xconv.convolution_backward(dy, x, w, stride=2, padding=3, output_mask=(False, True, False))[1]
    assert t.records[0].path.startswith("stem")
    want = torch.ops.aten.convolution_backward(torch.from_numpy(dy).double(), torch.from_numpy(x).double(),
                                               torch.from_numpy(w).double(), None, [2, 2], [3, 3], [1, 1], False,
                                               [0, 0], 1, [False, True, False])[1].numpy()
    np.testing.assert_allclose(dw, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("case", CASES[:3] + CASES[4:6], ids=lambda c: "x".join(map(str, c[0])))
def test_weight_gradient_bits_do_not_depend_on_workers_masks_or_layouts(case):
    xs, ws, s, pad, d = case
    x, w, _ = _arrays(xs, ws, seed=10)
    kw = _kw(s, pad, d)
    dy = np.random.default_rng(11).standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)
    with paths.force("stem"):
        base = xconv.convolution_backward(dy, x, w, output_mask=(False, True, False), **kw)[1]
        full = xconv.convolution_backward(dy, x, w, bias_sizes=(ws[0],), **kw)
        assert full[1].tobytes() == base.tobytes()
        fortran = xconv.convolution_backward(np.asfortranarray(dy), np.asfortranarray(x), w,
                                             output_mask=(False, True, False), **kw)[1]
        assert fortran.tobytes() == base.tobytes()
    p = _params(x, w, kw)
    for workers in (1, 2, 3, 7):
        assert stem.wgrad(dy, x, p, workers).tobytes() == base.tobytes()


@pytest.mark.parametrize("where", ["x", "dy"])
def test_weight_gradient_with_non_finite_inputs_takes_the_detour(where):
    x, w, _ = _arrays((2, 3, 9, 40), (5, 3, 3, 3), seed=12)
    dy = np.random.default_rng(13).standard_normal((2, 5, 5, 20)).astype(np.float32)
    (x if where == "x" else dy)[0, 0, 0, 0] = np.inf
    with xconv.trace() as t, paths.force("stem"):
        dw = xconv.convolution_backward(dy, x, w, stride=2, padding=1, output_mask=(False, True, False))[1]
    assert t.records[0].path.startswith("columns"), t.records[0].path
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64), stride=2,
                                      padding=1, output_mask=(False, True, False), backend="numpy-exact")[1]
    assert_same_non_finite([dw], [want], rtol=1e-5)


def test_builds_outside_the_stem_isas_do_not_serve(monkeypatch):
    """stem.serves holds only where the loaded build is one of stem.ISAS (AVX-512, AVX2 today)."""
    x, w, _ = _arrays((2, 3, 9, 40), (4, 3, 3, 3))
    p = _params(x, w, dict(padding=1))
    assert stem.serves(p)
    monkeypatch.setattr(stem, "ISAS", ())
    assert not stem.serves(p)


def test_rows_shorter_than_a_vector_are_not_served():
    x, w, _ = _arrays((2, 3, 9, 9), (4, 3, 3, 3))
    assert not stem.serves(_params(x, w, dict(padding=1)))           # 9 output positions per row


def test_more_channels_groups_and_float64_are_not_served():
    x, w, _ = _arrays((2, 8, 9, 30), (4, 8, 3, 3))
    assert not stem.serves(_params(x, w, {}))
    x, w, _ = _arrays((2, 4, 9, 30), (4, 2, 3, 3))
    assert not stem.serves(_params(x, w, dict(groups=2)))
    x, w, _ = _arrays((2, 3, 9, 30), (4, 3, 3, 3), dtype=np.float64)
    assert not stem.serves(_params(x, w, {}))
    y, path = _forced(x, w, None, {})
    assert not path.startswith("stem")


def test_a_workspace_limit_below_its_bound_sends_the_call_elsewhere():
    x, w, _ = _arrays((8, 3, 64, 64), (64, 3, 7, 7))
    p = _params(x, w, dict(stride=2, padding=3))
    limit = stem.bound(p) - 1
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, stride=2, padding=3, workspace_limit=limit)
    assert not t.records[0].path.startswith("stem") and "excludes stem" in t.records[0].path
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, stride=2, padding=3), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("xs, ws, kw", [((4, 1, 2000), (64, 1, 10), dict(stride=5)),
                                        ((4, 1, 40, 40), (32, 1, 3, 3), dict(padding=1)),
                                        ((2, 1, 64, 64), (16, 1, 7, 7), dict(stride=2, padding=3))])
def test_a_single_channels_weight_gradient_runs_on_the_stem_loops_for_every_mask(xs, ws, kw):
    """One input channel in one group (paths.single_channel): the weight gradient on the stem loops, the input gradient
    on the depthwise loops, whatever the mask; dw's bits the same for every mask that asks for it, and both outputs
    within float32 rounding of float64 sums of the definition."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw), dtype=np.float32)
    exact = xconv.convolution_backward(*(a.astype(np.float64) for a in (dy, x, w)), backend="numpy-exact", **kw)
    dws = []
    for mask in [(True, True, True), (False, True, True), (False, True, False), (True, False, False)]:
        with xconv.trace() as t:
            got = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw)
        path = t.records[0].path
        assert ("stem: stem C loops [grad_weight" in path) == mask[1]
        assert ("depthwise: depthwise C loops [grad_input" in path) == mask[0]
        for g, e, bit in zip(got, exact, mask):
            if bit:
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3 * np.abs(e).max())
        if mask[1]:
            dws.append(got[1].tobytes())
    assert len(set(dws)) == 1


@pytest.mark.parametrize("co", [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 32])
def test_every_channel_count_in_blocks_of_four_to_six(co):
    """The stem loops' channel blocks (csrc/stem.c's stem_row: from 8 output channels the last blocks hold 4 or 5, never
    1-3, on the builds with blocks of 6) cover every channel once, for every remainder of 6: the definition's sums,
    and the same bits on one worker and two, with and without a bias."""
    x, w, b = _arrays((2, 3, 6, 40), (co, 3, 3, 3), seed=co)
    kw = _kw(1, 1, 1)
    y = _stem_matches_definition(x, w, b, kw)
    p = _params(x, w, kw)
    for workers in (1, 2, 3):
        assert stem.fprop(x, w, b, p, workers).tobytes() == y.tobytes()
    assert stem.fprop(x, w, None, p, 2).tobytes() == _forced(x, w, None, kw)[0].tobytes()
