"""The NumPy backend's compiled depthwise loops (xconv_numpy.depthwise) against the float64 oracle and PyTorch.

The hypothesis tests of test_numpy_fast.py reach these loops too (every drawn convolution with
one input channel per group); here: larger planes, every stride/dilation/padding corner, channel
multipliers, dtypes and layouts, bitwise independence from the worker count, and proof that the
loops (not the BLAS path) ran.
"""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv.params import make_params

from core_helpers import count_calls, load_avx2_build  # noqa: E402
from test_numpy_fast import DTYPE_NAMES, compare, random_arrays  # noqa: E402

from xconv_numpy import depthwise, paths  # noqa: E402

pytestmark = pytest.mark.skipif(not depthwise.available(), reason=f"compiled loops not built: {depthwise.import_error()}")

CASES = {
    # name: input, weight, kwargs
    "3x3_s1": ((2, 5, 17, 19), (5, 1, 3, 3), dict(padding=1, groups=5)),
    "3x3_s2": ((2, 4, 17, 20), (4, 1, 3, 3), dict(stride=2, padding=1, groups=4)),
    "5x5_s3_d2": ((1, 3, 23, 22), (3, 1, 5, 5), dict(stride=3, padding=4, dilation=2, groups=3)),
    "asym_pad": ((2, 3, 11, 13), (3, 1, 3, 4), dict(padding=((0, 2), (3, 1)), groups=3)),
    "same": ((2, 3, 10, 9), (3, 1, 4, 3), dict(padding="same", groups=3)),
    "multiplier_3": ((2, 4, 9, 12), (12, 1, 3, 3), dict(stride=(1, 2), padding=(1, 0), groups=4)),
    "one_channel_many_out": ((3, 1, 12, 12), (6, 1, 3, 3), dict(padding=2)),
    "stride_gt_kernel": ((2, 2, 15, 15), (2, 1, 2, 2), dict(stride=4, groups=2)),
    "kernel_1x1_s2": ((2, 3, 9, 8), (3, 1, 1, 1), dict(stride=2, groups=3)),
    "1d": ((3, 4, 50), (8, 1, 5), dict(stride=2, padding=3, dilation=2, groups=4)),
    "kernel_fills_input": ((2, 3, 5, 6), (3, 1, 5, 6), dict(groups=3)),
}


def _case(name: str, dtype: str) -> dict:
    inp, wt, kw = CASES[name]
    kwargs = dict(stride=1, padding=0, dilation=1, groups=1, transposed=False, output_padding=0)
    kwargs.update(kw)
    return dict(input=inp, weight=wt, dtype=dtype, **kwargs)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("name", list(CASES))
def test_direct_matches_exact(name, dtype):
    c = _case(name, dtype)
    p = make_params(c["input"], c["weight"], stride=c["stride"], padding=c["padding"], dilation=c["dilation"],
                    groups=c["groups"], dtype=dtype)
    assert depthwise.serves(p)
    x, w, dy = random_arrays(np.random.default_rng(len(name)), c)
    for mask in [(True, True, True), (True, False, False), (False, True, False), (False, True, True)]:
        compare(c, x, w, dy, mask)


@pytest.mark.parametrize("layout", ["transposed", "negative", "sliced"])
def test_direct_non_contiguous(layout):
    c = _case("3x3_s2", "float32")
    x, w, dy = random_arrays(np.random.default_rng(1), c)
    compare(c, x, w, dy, (True, True, True), layout=layout)


def test_direct_loops_run_not_blas(monkeypatch):
    """Depthwise calls go to the compiled loops; others, and XCONV_NUMPY_DIRECT=0, to the BLAS path."""
    calls = count_calls(monkeypatch, depthwise, "backward")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    a = xconv.convolution_backward(dy, x, w, padding=1, groups=4, backend="numpy")
    assert len(calls) == 1
    monkeypatch.setenv("XCONV_NUMPY_DIRECT", "0")
    b = xconv.convolution_backward(dy, x, w, padding=1, groups=4, backend="numpy")
    assert len(calls) == 1
    for u, v in zip(a, b):      # both are float32 computations of the same sums
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)
    monkeypatch.delenv("XCONV_NUMPY_DIRECT")
    w2 = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    xconv.convolution_backward(dy, x, w2, padding=1, groups=2, backend="numpy")
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_direct_bitwise_independent_of_workers(dtype, monkeypatch):
    with paths.tune(depthwise_small_work=0):   # this small call would otherwise run on one thread
        rng = np.random.default_rng(5)
        p = make_params((3, 7, 21, 18), (14, 1, 3, 5), stride=(2, 1), padding=((1, 2), (2, 2)), dilation=(1, 2),
                        groups=7, dtype=dtype)
        x = rng.standard_normal(p.input_shape).astype(dtype)
        w = rng.standard_normal(p.weight_shape).astype(dtype)
        dy = rng.standard_normal(p.output_shape).astype(dtype)
        runs = [depthwise.backward(dy, x, w, p, True, True, True, workers) for workers in (1, 2, 3, 1)]
        for run in runs[1:]:
            for got, first in zip(run, runs[0]):
                assert got.tobytes() == first.tobytes()
        ys = [depthwise.fprop(x, w, None, p, workers).tobytes() for workers in (1, 3)]
        assert ys[0] == ys[1]


def test_direct_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16, 28, 30)).astype(np.float32)
    w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    kw = dict(stride=2, padding=1, dilation=1, groups=16)
    y = xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw)
    tx, tw, tb = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, **kw)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    ty.backward(torch.from_numpy(dy.astype(np.float64)))
    got = xconv.convolution_backward(dy, x, w, bias_sizes=(32,), backend="numpy", **kw)
    for g, t in zip(got, (tx.grad, tw.grad, tb.grad)):
        np.testing.assert_allclose(g, t.numpy(), rtol=1e-4, atol=1e-3)


def test_depthwise_calls_take_blas_s_worker_count_without_pinning_it(monkeypatch):
    """The depthwise loops call no BLAS: BLAS is not set to one thread around them, and they get the workers the
    pinned paths would get (NumPy's BLAS thread count, capped)."""
    from xconv_numpy import blas

    with blas.single_threaded_blas() as pinned:
        inside = blas.blas_workers()
    assert blas.blas_workers() == pinned == inside
    pins, workers = count_calls(monkeypatch, blas._Blas, "__enter__"), count_calls(monkeypatch, depthwise, "fprop")
    x = np.random.default_rng(0).standard_normal((4, 8, 16, 16)).astype(np.float32)
    with paths.tune(parallel_min_work=0, team_min_work=0):     # a call this small would otherwise run on one worker
        xconv.conv_fprop(x, np.ones((8, 1, 3, 3), np.float32), padding=1, groups=8)
    assert pins == [] and workers[0][-1] == pinned


def test_the_avx2_builds_channel_vector_loops_give_the_avx512_builds_bits(monkeypatch):
    """The loops across channels (depthwise_cv.py) on the AVX2 build (16-float vectors as two AVX halves, planes
    transposed in 8 x 8 tiles, positions past the last tile element by element) run MobileNet's small planes and give
    the AVX-512 build's bits: forward, dx, dw (planes of 9, 12 and 16 positions a row: whole tiles and tails)."""
    from xconv_numpy import depthwise_cv, native

    if native.library() is None or native.isa(native.library()) != "avx512" or native.library_path("avx2") is None:
        pytest.skip("needs the AVX-512 build loaded and the AVX2 build installed (an AVX-512 CPU)")
    cases = [((3, 48, 3, 3), 1), ((2, 32, 6, 6), 2), ((2, 16, 8, 8), 1), ((2, 32, 7, 5), 2), ((1, 16, 20, 7), 1),
             ((2, 32, 12, 12), 1), ((1, 16, 16, 16), 2), ((2, 16, 5, 9), 1)]
    rng = np.random.default_rng(23)
    data = []
    for xs, s in cases:
        C = xs[1]
        x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
        kw = dict(stride=s, padding=1, groups=C)
        dy = rng.standard_normal(xconv.output_shape(xs, w.shape, **kw)).astype(np.float32)
        data.append((x, w, dy, kw))

    def outputs():
        calls = []
        real = depthwise_cv._gather
        monkeypatch.setattr(depthwise_cv, "_gather", lambda *a, **k: calls.append(1) or real(*a, **k))   # a spy
        outs = [[xconv.conv_fprop(x, w, **kw), *xconv.convolution_backward(dy, x, w, **kw)[:2]]
                for x, w, dy, kw in data]
        monkeypatch.setattr(depthwise_cv, "_gather", real)
        assert len(calls) == 2 * len(data)                   # every forward and dx ran the loops across channels
        return outs

    wide = outputs()
    load_avx2_build(monkeypatch)
    wider = make_params((2, 16, 20, 20), (16, 1, 3, 3), padding=1, groups=16)
    assert not depthwise_cv.serves(wider)          # past MAX_WIDTH["avx2"]: the AVX2 build's plane loops
    narrow = outputs()
    for (x, w, dy, kw), a, b in zip(data, wide, narrow):
        assert all(np.array_equal(u, v) for u, v in zip(a, b)), kw
    exact = xconv.conv_fprop(data[0][0].astype(np.float64), data[0][1].astype(np.float64), backend="numpy-exact",
                             **data[0][3])
    np.testing.assert_allclose(narrow[0][0], exact, rtol=1e-5, atol=1e-5)
