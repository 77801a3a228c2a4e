"""Every array a user can hold, and non-finite values, on the NumPy backend's compiled paths (depthwise loops of
xconv_numpy.depthwise, dense C loops of xconv_numpy.dense), against the float64 oracle; inputs never written.

Also the scratch and planning bounds of the depthwise loops (scratch does not grow with the stride; huge kernels
do not enumerate their taps there).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import xconv
from xconv import plan_cache
from xconv.params import make_params

from core_helpers import assert_same_non_finite, count_calls  # noqa: E402

from xconv_numpy import dense, depthwise, paths  # noqa: E402

pytestmark = pytest.mark.skipif(not (depthwise.available() and dense.available()),
                                reason=f"compiled loops not built: {depthwise.import_error()}")

KINDS = ("readonly", "memmap", "frombuffer", "negative", "broadcast", "unaligned", "fortran", "gapped",
         "byteswapped")

PATHS = {
    # name: module, input, weight, kwargs, dtypes
    "depthwise": (depthwise, (2, 4, 7, 9), (8, 1, 3, 3), dict(stride=2, padding=1, groups=4), ("float32", "float64")),
    "depthwise_1d": (depthwise, (2, 3, 17), (3, 1, 5), dict(padding=2, dilation=2, groups=3), ("float32",)),
    "dense_c": (dense, (2, 32, 6, 7), (16, 32, 3, 3), dict(padding=1), ("float32",)),
}


def _kind(a: np.ndarray, kind: str, tmp_path) -> np.ndarray:
    """``a``'s values (or, for "broadcast", its first sample's broadcast over the batch) held as ``kind``."""
    if kind == "readonly":
        b = a.copy()
        b.flags.writeable = False
    elif kind == "memmap":
        path = tmp_path / f"{a.shape}-{a.dtype}.bin"
        a.tofile(path)
        b = np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape)
    elif kind == "frombuffer":
        b = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
    elif kind == "negative":
        b = np.ascontiguousarray(a[..., ::-1])[..., ::-1]
    elif kind == "broadcast":
        b = np.broadcast_to(a[:1], a.shape)
    elif kind == "unaligned":
        raw = np.zeros(a.nbytes + 1, np.uint8)
        b = raw[1:].view(a.dtype).reshape(a.shape)
        b[...] = a
        assert not b.flags.aligned
    elif kind == "fortran":
        b = np.asfortranarray(a)
    elif kind == "gapped":
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        b = big[..., ::2]
    else:
        b = a.astype(a.dtype.newbyteorder("S"))
    np.testing.assert_array_equal(b if kind != "broadcast" else b[:1], a if kind != "broadcast" else a[:1])
    return b


def _arrays(xs, ws, kw, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(dtype)
    return x, w, dy


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("shift", [0, 1, 2])
def test_every_array_kind_on_the_compiled_paths(path, shift, tmp_path, monkeypatch):
    """Each tensor held as one of the kinds (a different kind per tensor, every kind on every tensor over the
    three shifts): the compiled path runs, matches the exact path on the same values, and leaves inputs as
    they were."""
    module, xs, ws, kw, dtypes = PATHS[path]
    calls = count_calls(monkeypatch, module, "backward")
    with paths.without_cost_model():      # the rules that send these shapes to the compiled paths
        for dtype in dtypes:
            for i in range(len(KINDS)):
                kx, kwt, kdy = (KINDS[(i + j * (shift + 1)) % len(KINDS)] for j in range(3))
                x, w, dy = _arrays(xs, ws, kw, dtype, seed=i)
                xh, wh, dyh = _kind(x, kx, tmp_path), _kind(w, kwt, tmp_path), _kind(dy, kdy, tmp_path)
                before = [np.array(a, copy=True) for a in (xh, wh, dyh)]
                plan_cache.clear()  # a validated call: the dispatch runs (a repeated one runs the plan's runner)
                got = xconv.convolution_backward(dyh, xh, wh, bias_sizes=(ws[0],), backend="numpy", **kw)
                want = xconv.convolution_backward(*(np.array(a) for a in (dyh, xh, wh)), bias_sizes=(ws[0],),
                                                  backend="numpy-exact", **kw)
                for g, e in zip(got, want):
                    assert g.dtype == np.dtype(dtype) and g.flags.c_contiguous
                    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"{kx}/{kwt}/{kdy}")
                for b, a in zip(before, (xh, wh, dyh)):
                    assert b.tobytes() == np.array(a).tobytes()
                y = xconv.conv_fprop(xh, wh, backend="numpy", **kw)
                np.testing.assert_allclose(y, xconv.conv_fprop(np.array(xh), np.array(wh), backend="numpy-exact", **kw),
                                           rtol=1e-4, atol=1e-4)
    assert len(calls) == len(dtypes) * len(KINDS)


def test_one_inf_in_x_stays_where_the_exact_path_has_it_depthwise():
    """The depthwise form of the issue's reproducer: grad_weight [[inf, 9], [9, 9]], not NaN."""
    f = np.float32
    x = np.ones((1, 2, 4, 4), f)
    x[0, 0, 0, 0] = np.inf
    got = xconv.convolution_backward(np.ones((1, 2, 3, 3), f), x, np.ones((2, 1, 2, 2), f), groups=2)
    np.testing.assert_array_equal(got[1][0, 0], [[np.inf, 9], [9, 9]])
    np.testing.assert_array_equal(got[1][1, 0], [[9, 9], [9, 9]])


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("where", ["x", "w", "dy"])
def test_non_finite_values_propagate_as_on_the_exact_path(path, where):
    """An Inf, a -Inf and a NaN in one tensor: every gradient has NaN and Inf exactly where the exact path has
    them (the grids' padding never meets an Inf through a multiplication by zero), the rest close."""
    module, xs, ws, kw, _ = PATHS[path]
    x, w, dy = _arrays(xs, ws, kw, "float32", seed=7)
    a = dict(x=x, w=w, dy=dy)[where]
    flat = a.reshape(-1)
    flat[0], flat[flat.size // 2], flat[-1] = np.inf, -np.inf, np.nan
    for mask in [(True, True, True), (True, False, False), (False, True, False)]:
        got = xconv.convolution_backward(dy, x, w, output_mask=mask, bias_sizes=(ws[0],), backend="numpy", **kw)
        want = xconv.convolution_backward(dy, x, w, output_mask=mask, bias_sizes=(ws[0],), backend="numpy-exact",
                                          **kw)
        assert_same_non_finite([g for g in got if g is not None], [e for e in want if e is not None], rtol=1e-4)
    if where != "dy":
        assert_same_non_finite([xconv.conv_fprop(x, w, backend="numpy", **kw)],
                               [xconv.conv_fprop(x, w, backend="numpy-exact", **kw)], rtol=1e-4)


def test_inf_weight_leaves_the_other_grad_input_rows_finite():
    f = np.float32
    w = np.ones((3, 1, 3, 3), f)
    w[0, 0, 0, 0] = np.inf
    dx = xconv.convolution_backward(np.ones((1, 3, 6, 6), f), np.ones((1, 3, 6, 6), f), w, padding=1, groups=3)[0]
    # tap (0, 0) reaches input (o - 1) for outputs o: rows and columns 0..4, never the last ones
    assert np.isposinf(dx[0, 0, :5, :5]).all() and np.isfinite(dx[0, 0, 5]).all() and np.isfinite(dx[0, 0, :, 5]).all()
    assert np.isfinite(dx[0, 1:]).all()


def test_depthwise_scratch_does_not_grow_with_the_stride():
    """stride 10**4 on an 8x8 input: the phases no tap reads are not kept (was 950 MB)."""
    f = np.float32
    tracemalloc.start()
    try:
        got = xconv.convolution_backward(np.ones((1, 1, 1, 1), f), np.ones((1, 1, 8, 8), f), np.ones((1, 1, 3, 3), f),
                                         stride=10**4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    want = np.zeros((8, 8), f)
    want[:3, :3] = 1
    np.testing.assert_array_equal(got[0][0, 0], want)
    np.testing.assert_array_equal(got[1], np.ones((1, 1, 3, 3), f))
    assert got[2].tolist() == [1.0]


def test_depthwise_plan_of_a_huge_kernel_is_not_built():
    """A kernel of 10**10 taps is not planned tap by tap here (the depthwise loops decline it at once)."""
    p = make_params((1, 1, 1, 1), (1, 1, 10**5, 10**5), padding=50000)
    assert not depthwise.serves(p)
    assert depthwise.serves(make_params((1, 1, 70, 70), (1, 1, 64, 64)))


def test_depthwise_stride_near_and_beyond_int64():
    """A depthwise call with stride 2**62 (one output per dim): planning stays in int64, the result is the exact one;
    stride 2**70 does not fit int64 and the core refuses it by name before any work (as aten does)."""
    f = np.float32
    args = (np.full((1, 1, 1, 1), 2, f), np.ones((1, 1, 8, 8), f), np.ones((1, 1, 3, 3), f))
    got = xconv.convolution_backward(*args, stride=2**62)
    want = np.zeros((8, 8), f)
    want[:3, :3] = 2
    np.testing.assert_array_equal(got[0][0, 0], want)
    np.testing.assert_array_equal(got[1], np.full((1, 1, 3, 3), 2, f))
    with pytest.raises(xconv.ShapeError, match="stride.*64-bit"):
        xconv.convolution_backward(*args, stride=2**70)


