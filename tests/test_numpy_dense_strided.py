"""The forward at strides above 1 through the dense loops (xconv_numpy.dense_strided): against float64 sums, the same
bits for any worker count and input layout, and where the cost model takes it."""

import math

import numpy as np
import pytest

import xconv
from xconv.params import make_params
from xconv_numpy import cost, dense, dense_strided, native, paths
from xconv_numpy.grid.scratch import Lease

from test_numpy_fast import poison_scratch  # noqa: E402

pytestmark = pytest.mark.skipif(not dense.available(),
                                reason="the dense C loops are not loaded (no AVX2/AVX-512 build)")

CASES = [  # x, w, stride, padding, dilation, groups
    ((2, 16, 9, 9), (32, 16, 3, 3), 2, 1, 1, 1),
    ((2, 32, 7, 6), (32, 16, 3, 3), 2, ((2, 1), (1, 1)), 1, 2),           # groups, asymmetric padding
    ((2, 16, 9, 11), (16, 16, 3, 3), (2, 3), 1, (2, 1), 1),               # strides and dilations per dim
    ((3, 8, 23), (16, 8, 5), 3, 2, 1, 1),                                 # 1-D
    ((2, 3, 13, 13), (32, 3, 7, 7), 2, 3, 1, 1),                          # a stem's 3 channels (forced only)
    ((1, 16, 5, 5), (32, 16, 3, 3), 2, 0, 1, 1),
    ((2, 16, 4, 4), (16, 16, 5, 5), 2, ((0, 4), (2, 2)), 1, 1),           # output rows reading only padding
    ((2, 16, 3, 3), (16, 16, 3, 3), 2, ((5, 0), (1, 1)), 1, 1),           # padding past the kernel's reach
    ((2, 24, 33, 40), (64, 12, 3, 2), (2, 4), (1, 0), 1, 2),
]


def _arrays(rng, xs, ws):
    return (rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32),
            rng.standard_normal(ws[0]).astype(np.float32))


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CASES)
def test_matches_float64_sums(xs, ws, stride, padding, dilation, groups):
    rng = np.random.default_rng(3)
    x, w, b = _arrays(rng, xs, ws)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    p = make_params(xs, ws, **kw)
    assert dense.computes_fprop(p) and dense_strided.computes(p)
    with paths.force("dense"), xconv.trace() as tr:
        y = xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw)
    assert tr.records[-1].path.startswith("dense")
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), bias=b.astype(np.float64),
                            backend="numpy-exact", **kw)
    scale = xconv.conv_fprop(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), backend="numpy-exact", **kw)
    assert y.dtype == np.float32 and y.shape == want.shape
    assert np.all(np.abs(y - want) <= 1e-6 * scale + 1e-6), np.abs(y - want).max()


def test_bits_do_not_depend_on_workers_layout_or_scratch(monkeypatch):
    """Each output element is one job's sum in one order: 1 to 4 workers, a Fortran-ordered or strided x, and
    scratch handed out filled with 3e38 give the same bits."""
    rng = np.random.default_rng(4)
    xs, ws, kw = (3, 32, 13, 11), (64, 16, 3, 3), dict(stride=2, padding=1, groups=2)
    x, w, _ = _arrays(rng, xs, ws)
    p = make_params(xs, ws, **kw)
    wt = dense.tap_major(w, 2, True, 1)
    runs = []
    for poison in (False, True):
        if poison:
            poison_scratch(monkeypatch)
        for workers in (1, 2, 3, 4):
            for xin in (x, np.asfortranarray(x), np.repeat(x, 2, axis=3)[..., ::2]):
                with Lease() as lease:
                    runs.append(dense_strided.fprop(xin, wt, None, p, workers, lease).tobytes())
    assert len(runs) == 24 and len(set(runs)) == 1


def test_transposed_backward_input_gradient():
    """A strided transposed convolution's input gradient is a strided forward (U-Net's 2x2 up-sampling): the loops'
    result matches float64 sums."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 32, 6, 7)).astype(np.float32)
    w = rng.standard_normal((32, 16, 2, 2)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 12, 14)).astype(np.float32)
    kw = dict(stride=2, transposed=True)
    with paths.force("dense"), xconv.trace() as tr:
        dx = xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy", **kw)[0]
    assert "dense" in tr.records[-1].path
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      output_mask=(True, False, False), backend="numpy-exact", **kw)[0]
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-4)


def test_where_the_cost_model_may_take_it():
    """A 3x3 stride 2 with rows of 8 outputs or more and 16 channels or more is a candidate on the AVX-512 build, and
    on the AVX2 build for 2-D kernels of up to 256 input channels (dense.STRIDED_AVX2_CHANNELS: 1-D lost, and the speech
    encoder's 512 channels), rows of exactly 4 too at stride 2 in a call of 2^22 multiply-adds or more
    where the kind of CPU's rates cost them (cost.Rates.strided_q0); a strided 1x1, a stem's 3 channels, rows of 2,
    5-7, rows of 4 at stride 3 or in a small call are not (measured slower there, or unmeasured:
    dense.serves_fprop)."""
    isa = native.isa(native.library())
    wide_on = isa in dense.STRIDED_ISAS                  # 1-D, or past 256 input channels: the AVX-512 build only
    on = wide_on or isa == "avx2"
    assert dense.serves_fprop(make_params((8, 64, 16, 16), (128, 64, 3, 3), stride=2, padding=1)) == on
    assert dense.serves_fprop(make_params((2, 384, 16, 16), (128, 384, 3, 3), stride=2, padding=1)) == wide_on
    assert dense.serves_fprop(make_params((4, 512, 399), (512, 512, 3), stride=2)) == wide_on
    assert not dense.serves_fprop(make_params((8, 64, 16, 16), (128, 64, 1, 1), stride=2))
    assert not dense.serves_fprop(make_params((8, 3, 64, 64), (64, 3, 7, 7), stride=2, padding=3))
    short = make_params((8, 128, 8, 8), (256, 128, 3, 3), stride=2, padding=1)                         # 38 M
    assert dense.serves_fprop(make_params((8, 256, 8, 8), (512, 256, 3, 3), stride=2, padding=1)) == on   # 151 M
    assert dense.serves_fprop(short) == on
    for kind in ("zen4", "intel-avx512"):      # weighed where the kind has their Q0, infinite elsewhere
        with cost.choosing(kind):
            assert (cost.dense_forward(short) < math.inf) == (cost.rates().strided_q0 is not None)
    assert not dense.serves_fprop(make_params((16, 128, 14, 13), (128, 128, 3, 3), stride=3))          # rows of 4, s3
    assert not dense.serves_fprop(make_params((8, 64, 14, 14), (128, 64, 3, 3), stride=2, padding=1))  # rows of 7
    assert not dense.serves_fprop(make_params((2, 32, 24, 10), (48, 32, 1, 5), stride=(3, 2), padding=1,
                                              dilation=(2, 1)))                                 # rows of 4, 0.5 M
    assert not dense.serves_fprop(make_params((8, 256, 4, 4), (512, 256, 3, 3), stride=2, padding=1))   # rows of 2
    assert not dense.computes_fprop(make_params((2, 16, 9, 9), (24, 16, 3, 3), stride=2))     # 24 outputs: no vectors
    assert not dense.computes_fprop(make_params((2, 16, 5, 5, 5), (16, 16, 3, 3, 3), stride=2))   # 3-D


def test_blocks_of_samples_within_a_workspace_limit():
    """Under a workspace_limit the phase rows are leased for blocks of samples (dense_strided.block_samples): the same
    bits as the whole batch at once, blocks of one, of two with a shorter last one; a limit below one sample's rows is
    refused by name. A transposed call's input gradient (U-Net's up-sampling) runs so too."""
    rng = np.random.default_rng(6)
    xs, ws, kw = (5, 32, 14, 12), (32, 32, 3, 3), dict(stride=2, padding=1)
    x, w, _ = _arrays(rng, xs, ws)
    p = make_params(xs, ws, **kw)
    per = 4 * dense_strided.phase_floats(p) // xs[0]
    runs = {}
    with paths.force("dense"):
        for limit in (None, per + 64, 2 * per + 64, 1 << 30):
            assert dense_strided.block_samples(p, limit) == {None: 5, per + 64: 1, 2 * per + 64: 2}.get(limit, 5)
            with xconv.trace() as tr:
                runs[limit] = xconv.conv_fprop(x, w, backend="numpy", workspace_limit=limit, **kw).tobytes()
            assert tr.records[-1].path.startswith("dense")
        assert len(set(runs.values())) == 1
        with pytest.raises(xconv.UnsupportedError, match="workspace_limit"):
            xconv.conv_fprop(x, w, backend="numpy", workspace_limit=per // 2, **kw)
    xt, wt = rng.standard_normal((4, 64, 8, 8)).astype(np.float32), rng.standard_normal((64, 32, 2, 2)).astype(np.float32)
    dy = rng.standard_normal((4, 32, 16, 16)).astype(np.float32)
    tkw = dict(stride=2, transposed=True, output_mask=(True, False, False), backend="numpy")
    with paths.force("dense"):
        got = [xconv.convolution_backward(dy, xt, wt, workspace_limit=lim, **tkw)[0].tobytes() for lim in (None, 1 << 16)]
    assert got[0] == got[1]


def test_strides_past_64_phases_are_not_taken():
    """Each input row is copied into all of its stride phases: past 64 phases (the dense loops' bound) the scratch
    would grow with the stride, not the input, so such calls take other paths even when the loops are forced."""
    p = make_params((1, 16, 3, 3), (16, 16, 3, 3), stride=(1, 65), padding=1)
    assert not dense_strided.computes(p) and not dense.computes_fprop(p)
    x, w, _ = _arrays(np.random.default_rng(7), (1, 16, 3, 3), (16, 16, 3, 3))
    with paths.force("dense"), xconv.trace() as tr:
        y = xconv.conv_fprop(x, w, stride=(1, 65), padding=1, backend="numpy")
    assert not tr.records[-1].path.startswith("dense")
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, stride=(1, 65), padding=1, backend="numpy-exact"),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_long_rows_in_spans_give_the_sums_of_short_rows(stride):
    """Rows longer than two spans whose weights run channel block by channel block (csrc/direct_conv.c,
    dx_rows_spans: 512x512x3 weights, 3 MB) are computed span by span over the task's channel units: every output
    is bitwise the one the same positions give as short rows (the call cut into pieces of at most 100 outputs, each
    its own call below the span length), and within float32 rounding of float64 sums."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 512, 2 * 600 + 1 if stride == 2 else 602)).astype(np.float32)
    w = (rng.standard_normal((512, 512, 3)) / 40).astype(np.float32)
    with paths.force("dense"), xconv.trace() as t:
        y = xconv.conv_fprop(x, w, stride=stride, backend="numpy")
    assert y.shape[-1] == 600 and t.records[0].path.startswith("dense:"), t.records[0].path
    for o0 in range(0, 600, 100):
        piece = x[:, :, stride * o0:stride * (o0 + 99) + 3]
        with paths.force("dense"):
            part = xconv.conv_fprop(piece, w, stride=stride, backend="numpy")
        assert np.array_equal(part, y[:, :, o0:o0 + 100]), o0
    exact = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), stride=stride, backend="numpy-exact")
    np.testing.assert_allclose(y, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
