"""The NumPy backend's small-call path (xconv_numpy.small): one gather or one strided copy and one matrix product
per gradient. Checked against the exact float64 path over the whole parameter space, at the digits sizes it is
chosen for, with non-finite inputs, and bitwise run to run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xconv
from xconv.params import make_params
from test_numpy_fast import compare, convolutions, random_arrays

from xconv_numpy import native, paths, small  # noqa: E402


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1), forced=st.sampled_from(["small-paths", "small-cols"]))
def test_small_path_matches_exact(conv, seed, forced):
    """Forced on for every convolution it can compute: the table's small paths in order (the C grid loops at
    stride 1, else the C columns), or the C columns at every stride."""
    c, mask, layout = conv
    x, w, dy = random_arrays(np.random.default_rng(seed), c)
    with paths.force(forced):
        compare(c, x, w, dy, mask, layout)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1), forced=st.sampled_from(["small-paths", "small-gather"]))
def test_numpy_fallback_matches_exact(conv, seed, forced):
    """Without the compiled copies (installed without a compiler, or XCONV_NUMPY_C=0) the NumPy paths serve: the
    padded-grid columns at stride 1, else the gathers; or the gathers at every stride."""
    c, mask, layout = conv
    x, w, dy = random_arrays(np.random.default_rng(seed), c)
    with pytest.MonkeyPatch.context() as mp, paths.force(forced):
        mp.setenv("XCONV_NUMPY_C", "0")                      # the documented switch (part of choose's key)
        compare(c, x, w, dy, mask, layout)


def test_forced_small_paths_run_as_named():
    """Each small path, forced, is the one that runs (the trace names it) and agrees with the exact path."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    kw = dict(padding=1, groups=2)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, **kw)).astype(np.float32)
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      backend="numpy-exact", **kw)
    for name in ("small-c", "small-cols", "small-grid", "small-gather"):
        with xconv.trace() as t, paths.force(name):
            got = xconv.convolution_backward(dy, x, w, backend="numpy", **kw)
            y = xconv.conv_fprop(x, w, backend="numpy", **kw)
        assert [r.path.split(":")[0] for r in t.records] == [name, name], [r.path for r in t.records]
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * np.abs(e).max())
        np.testing.assert_allclose(y, xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64),
                                                       backend="numpy-exact", **kw), rtol=1e-5, atol=1e-5)


SMALL_PATHS = {"small-c", "small-cols", "small-grid", "small-gather"}


def _ran(fn):
    """(fn's result, the paths its calls ran, in the order the trace records name them: ``name: note [...]``)."""
    with xconv.trace() as t:
        out = fn()
    return out, [part.split(":")[0] for r in t.records for part in (r.path or "").split(" + ")]


def test_compiled_copies_are_built_here():
    """CI installs with a compiler: the compiled copies must be what the tests above exercise."""
    assert small.compiled_available(), native.load_error()


def _awkward(a: np.ndarray, kind: str) -> np.ndarray:
    """``a``'s values as a read-only, byte-swapped or unaligned array."""
    if kind == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b
    if kind == "byteswapped":
        return a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder != ">" else "<"))
    raw = np.zeros(a.nbytes + 1, np.uint8)[1:].view(a.dtype).reshape(a.shape)   # unaligned
    raw[...] = a
    return raw


@pytest.mark.parametrize("kind", ["readonly", "byteswapped", "unaligned"])
@pytest.mark.parametrize("stride", [1, 2])
def test_awkward_inputs_read_not_written(kind, stride):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 6, 7, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    kw = dict(stride=stride, padding=1, groups=2)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, **kw)).astype(np.float32)
    args = [_awkward(a, kind) for a in (dy, x, w)]
    before = [a.copy() for a in args]
    got = xconv.convolution_backward(*args, backend="numpy", **kw)
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      backend="numpy-exact", **kw)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * np.abs(e).max())
    np.testing.assert_allclose(xconv.conv_fprop(args[1], args[2], backend="numpy", **kw),
                               xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact",
                                                **kw), rtol=1e-5, atol=1e-5)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)


def test_many_outputs_per_input_channel_leave_the_depthwise_loops():
    """One input channel to many (the digits decoder's direct form, a first layer): the small path's loops; a true
    depthwise layer keeps the depthwise loops. Both against the exact path."""

    rng = np.random.default_rng(3)
    for xs, ws, kw, to_small in [((32, 32, 4, 4), (32, 1, 4, 4), dict(stride=2, padding=1, transposed=True), True),
                                 ((32, 1, 8, 8), (16, 1, 3, 3), dict(padding=1), True),
                                 ((8, 16, 8, 8), (16, 1, 3, 3), dict(padding=1, groups=16), False)]:
        x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
        dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)
        got, ran = _ran(lambda: xconv.convolution_backward(dy, x, w, backend="numpy", **kw))
        grads = set(ran) - {"bias-sum"}
        assert grads <= (SMALL_PATHS if to_small else {"depthwise"}) and grads, (xs, ws, ran)
        want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                          backend="numpy-exact", **kw)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5 * np.abs(e).max())


DIGITS = [
    ((1, 4, 8, 8), (4, 4, 3, 3), dict(padding=1)),
    ((32, 16, 8, 8), (32, 4, 3, 3), dict(padding=1, groups=4)),
    ((16, 8, 64), (8, 8, 3), dict(padding=1)),
    ((32, 16, 4, 4), (16, 16, 1, 1), {}),
    ((16, 8, 8, 8), (16, 8, 3, 3), dict(stride=2, padding=1)),
    ((4, 3, 7, 6), (5, 3, 3, 2), dict(padding=((2, 0), (1, 1)), dilation=(1, 2))),
]


@pytest.mark.parametrize("xs, ws, kw", DIGITS)
def test_digits_layers_take_the_small_path(xs, ws, kw):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    y = xconv.conv_fprop(x, w, backend="numpy", **kw)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got, bwd = _ran(lambda: xconv.convolution_backward(dy, x, w, backend="numpy", **kw))
    y2, fwd = _ran(lambda: xconv.conv_fprop(x, w, backend="numpy", **kw))
    # the forward: the same small path, or (float32, 4 samples or more) its stride-1 loops in sample blocks, which
    # give one small call's bits (test_numpy_grid_blocks.py), or for a 1x1 the pointwise path's products
    # (paths._pointwise_forward: float32, faster on every small 1x1 forward measured)
    assert len(bwd) == 2 and bwd[0] in SMALL_PATHS and bwd[1] == "bias-sum", (bwd, fwd)
    one_by_one = len(kw) == 0 and all(k == 1 for k in ws[2:])
    assert fwd == (["pointwise"] if one_by_one else bwd[:1]) or \
        (list(fwd) == ["small-c-blocks"] and bwd[0] == "small-c" and xs[0] >= 4), (bwd, fwd)
    again = xconv.convolution_backward(dy, x, w, backend="numpy", **kw)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, again)) and y.tobytes() == y2.tobytes()
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      backend="numpy-exact", **kw)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5 * np.abs(e).max())
    np.testing.assert_allclose(y, xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64),
                                                   backend="numpy-exact", **kw), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("poisoned", ["grad_output", "input", "weight"])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False)])
@pytest.mark.parametrize("value", [np.inf, np.nan])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_one_c_call_finds_non_finite_inputs_it_reads(poisoned, mask, value, dtype):
    """The stride-1 C call checks what it reads (dy; x for dW; w for dx) and hands a call with an inf or a NaN there
    to the column path; a poisoned input it does not read leaves it on the C loops. Each output decides for itself
    (issue 24: the mask must not change an output's path): with x (or w) poisoned, a full call runs dW (or dx) on
    the columns and the other gradient again on the C loops. Either way the NaN and inf pattern and the finite
    values are the exact path's."""
    if not small.compiled_available():
        pytest.skip("the compiled loops are not built here (the C call is what this test checks)")
    rng = np.random.default_rng(5)
    arrays = {"grad_output": rng.standard_normal((3, 4, 6, 6)), "input": rng.standard_normal((3, 2, 6, 6)),
              "weight": rng.standard_normal((4, 2, 3, 3))}
    arrays = {k: v.astype(dtype) for k, v in arrays.items()}
    arrays[poisoned][1, 1, 2, 2] = value
    read = {"grad_output": True, "input": mask[1], "weight": mask[0]}[poisoned]
    got, ran = _ran(lambda: xconv.convolution_backward(arrays["grad_output"], arrays["input"], arrays["weight"],
                                                       padding=1, output_mask=mask, backend="numpy"))
    want = xconv.convolution_backward(*(arrays[k].astype(np.float64) for k in ("grad_output", "input", "weight")),
                                      padding=1, output_mask=mask, backend="numpy-exact")
    rerun = mask == (True, True, True) and poisoned != "grad_output"      # the clean gradient, on its own
    assert ("columns" in ran) == read and ("small-c" in ran) == (rerun or not read), ran
    for g, e in zip(got, want):
        assert (g is None) == (e is None)
        if g is not None:
            np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
            np.testing.assert_array_equal(np.isinf(g), np.isinf(e))
            fin = np.isfinite(e)
            np.testing.assert_allclose(g[fin], e[fin], rtol=1e-5, atol=1e-5)


def test_bias_gradient_of_the_c_call_is_summed_in_double():
    """db from the one C call: float32 values whose float32 running sum loses them (1 + 2**-24 repeated) come out
    as the float64 sum rounded once."""
    if not small.compiled_available():
        pytest.skip("the compiled loops are not built here (the C call is what this test checks)")
    dy = np.full((4, 2, 8, 8), 2.0 ** -24, np.float32)
    dy[0, :, 0, 0] = 1.0
    x = np.ones((4, 3, 8, 8), np.float32)
    w = np.ones((2, 3, 3, 3), np.float32)
    _, _, db = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy")
    exact = 1.0 + (4 * 64 - 1) * 2.0 ** -24
    assert db.dtype == np.float32 and db.tolist() == [np.float32(exact)] * 2
    assert np.float32(exact) != np.float32(1.0)


@pytest.mark.skipif(native.library() is None, reason=f"compiled loops unavailable: {native.load_error()}")
@pytest.mark.parametrize("width", [1, 3, 7, 8, 9, 13, 16, 17, 31])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_bias_gradient_lanes_are_the_documented_double_sums(width, layout):
    """The grid loops' db (small_grid_impl.h, xconv_small_bias: 8 float64 lanes, one register on AVX-512 builds for
    unit element stride, scalar elsewhere): element w of each dy row into lane w % 8 in row order, the lanes added
    in order, rounded once to float32, bit for bit; a NaN or an infinity in dy is reported (finite_only: None)."""
    from xconv.params import make_params
    from xconv_numpy import small_c
    from xconv_numpy.small import plan

    rng = np.random.default_rng(width)
    p = make_params((3, 4, 5, width), (6, 4, 3, 3), padding=1)
    x = rng.standard_normal(p.input_shape).astype(np.float32)
    w = rng.standard_normal(p.weight_shape).astype(np.float32)
    dy = (rng.standard_normal(p.output_shape) * 1e4).astype(np.float32)
    if layout == "strided":
        dy = np.repeat(dy, 2, axis=-1)[..., ::2]
    rows = dy.astype(np.float64).transpose(1, 0, 2, 3).reshape(6, -1, width)        # (C_out, n * h, w) in row order
    want = []
    for c in range(6):
        lanes = [0.0] * 8
        for row in rows[c]:
            for j, v in enumerate(row):
                lanes[j % 8] += v
        total = 0.0
        for v in lanes:
            total += v
        want.append(np.float32(total))
    _, _, db = small_c._backward_grid(dy, x, w, p, plan(p), np.float32, False, False, True)
    assert db.tobytes() == np.array(want, np.float32).tobytes()
    bad = dy.copy()
    bad[2, 5, 4, width - 1] = np.inf
    assert small_c._backward_grid(bad, x, w, p, plan(p), np.float32, False, False, True, finite_only=True) is None


def test_non_finite_inputs_keep_the_exact_paths_values():
    """The small path multiplies padding zeros; calls with an infinity go to the column path (no NaN from 0 * inf)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    w[1, 2, 0, 0] = np.inf
    x[0, 1, 2, 2] = -np.inf
    got, ran = _ran(lambda: xconv.convolution_backward(dy, x, w, padding=1, backend="numpy"))
    want = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy-exact")
    assert ran == ["columns", "bias-sum"], ran
    for g, e in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(e))


def test_xconv_backends_names_the_small_call_loops(monkeypatch):
    """`xconv backends` (status.describe) lists the small-call loops among the compiled paths, and says why they are
    off when XCONV_NUMPY_C=0 turns them off."""
    from xconv_numpy import status

    if not small.compiled_available():
        assert "small calls off" in status.describe() or "none" in status.describe()
        return
    assert "small calls" in status.describe().split(";")[0]
    monkeypatch.setenv("XCONV_NUMPY_C", "0")
    text = status.describe()
    assert "small calls off: XCONV_NUMPY_C=0" in text and not small.compiled_available()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", ">f4"])
@pytest.mark.parametrize("shape", [(5, 3, 4), (480, 8, 9), (2, 7, 1), (1, 1, 33), (3, 0, 4), (4, 2, 0)])
def test_rows_swapped_whole_are_numpys_transposing_copy(dtype, shape):
    """small._swap_rows (the channel-major copies of the small and colgemm paths): the same values as NumPy's
    transposing copy, whether rows move whole (one dtype, contiguous) or element by element (a cast, a byte-swapped
    or strided source)."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((shape[0], shape[1], shape[2] * 2)).astype(dtype)
    for src in (np.ascontiguousarray(base[:, :, :shape[2]]), base[:, :, ::2]):
        for out_dtype in {np.dtype(dtype).newbyteorder("="), np.dtype("float32")}:
            dst = np.empty((shape[1], shape[0], shape[2]), out_dtype)
            small._swap_rows(src, dst)
            want = src.transpose(1, 0, 2).astype(out_dtype)
            assert dst.tobytes() == want.tobytes()


def _numpy_im2col(x, p):
    """cols[c K + t, n Q + q] by NumPy slicing of x padded with zeros (the definition the C copy keeps)."""
    nd = p.nd
    xp = np.pad(x, [(0, 0), (0, 0)] + [tuple(ab) for ab in p.padding])
    O = p.output_shape[2:]
    parts = []
    for t in np.ndindex(*p.kernel):
        sl = tuple(slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in zip(t, p.dilation, O, p.stride))
        parts.append(xp[(slice(None), slice(None)) + sl])               # (N, C, *O)
    cols = np.stack(parts, 2)                                           # (N, C, K, *O)
    return cols.reshape(x.shape[0], x.shape[1] * len(parts), -1).transpose(1, 0, 2).reshape(x.shape[1] * len(parts), -1)


@pytest.mark.skipif(native.library() is None, reason=f"compiled loops unavailable: {native.load_error()}")
@pytest.mark.parametrize("spatial, kernel, stride, padding, dilation", [
    ((4, 4), (3, 3), 1, 1, 1), ((2, 2), (3, 3), 1, 1, 1), ((3, 5), (3, 3), 1, ((2, 0), (1, 1)), 1),    # planes <= 16
    ((4, 4), (3, 3), 2, 1, 1), ((4, 4), (2, 2), 1, 0, 2), ((2, 2, 4), (3, 1, 3), 1, 1, 1), ((16,), (5,), 1, 2, 1),
    ((1, 17), (1, 3), 1, ((0, 0), (1, 1)), 1),          # 17 elements: the 64-element planes (strided: the rows)
    ((8, 8), (3, 3), 1, 1, 1), ((6, 16), (3, 3), 1, 1, 1), ((7, 7), (3, 3), 2, 1, 1), ((5, 20), (3, 3), 1, 1, 1),
    ((8, 8), (2, 2), 2, 0, 1), ((5, 7), (3, 3), 1, 1, 2), ((6, 6), (5, 5), 1, 2, 1), ((64,), (3,), 1, 1, 1),  # <= 64
    ((2, 4, 8), (1, 3, 3), 1, 1, 1), ((8, 8), (5, 5), 1, 2, 1),                        # the last: 100 > 96 entries
    ((3, 1, 5), (3, 1, 3), 1, 1, 1), ((4, 1, 9), (3, 1, 3), 1, 1, 1),                  # 3-D, H == 1: D's stride read
])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "rows apart"])
def test_column_copies_are_numpys_slices(spatial, kernel, stride, padding, dilation, layout):
    """The C column copy (small_cols_impl.h: its plane-in-a-register permutations for planes of at most 16 elements,
    its four-register ones for planes of at most 64, and its masked row copies on AVX-512 builds, its row loops
    elsewhere) writes exactly NumPy's slices of x padded with zeros, for contiguous, strided and rows-apart x, 1-3
    dims, strides, dilation, asymmetric padding."""
    from xconv.params import make_params
    from xconv_numpy import small_c

    rng = np.random.default_rng(4)
    base = rng.standard_normal((3, 5) + tuple(s * 2 for s in spatial)).astype(np.float32)
    if layout == "contiguous":
        x = np.ascontiguousarray(base[(Ellipsis,) + tuple(slice(0, s) for s in spatial)])
    elif layout == "strided":
        x = base[(Ellipsis,) + tuple(slice(0, 2 * s, 2) for s in spatial)]
    else:               # each row contiguous, the rows (or planes) apart: the plane paths must not take it
        x = base[(Ellipsis,) + tuple(slice(0, 2 * s, 2) for s in spatial[:-1]) + (slice(0, spatial[-1]),)]
    p = make_params(x.shape, (4, 5) + kernel, stride=stride, padding=padding, dilation=dilation)
    xr, geo = small_c.im2col_input(x, p, np.float32)
    want = _numpy_im2col(x, p)
    cols = np.full(want.shape, np.nan, np.float32)
    native.library().xconv_small_im2col_f32(xr.ctypes.data, cols.ctypes.data, geo.ctypes.data)
    assert cols.tobytes() == want.tobytes()


@pytest.mark.skipif(native.library() is None, reason=f"compiled loops unavailable: {native.load_error()}")
@pytest.mark.parametrize("spatial, kernel, stride, padding, dilation", [
    ((4, 4), (3, 3), 1, 1, 1), ((2, 2), (3, 3), 1, 1, 1), ((3, 5), (3, 3), 1, ((2, 0), (1, 1)), 1),
    ((4, 4), (3, 3), 2, 1, 1), ((4, 4), (2, 2), 1, 0, 2), ((2, 2, 4), (3, 1, 3), 1, 1, 1), ((16,), (5,), 1, 2, 1),
    ((1, 17), (1, 3), 1, ((0, 0), (1, 1)), 1), ((8, 8), (3, 3), 1, 1, 1), ((7, 7), (3, 3), 2, 1, 1),
    ((8, 8), (2, 2), 2, 0, 1), ((5, 7), (3, 3), 1, 1, 2), ((6, 6), (5, 5), 1, 2, 1), ((64,), (3,), 1, 1, 1),
    ((2, 4, 8), (1, 3, 3), 1, 1, 1), ((8, 8), (5, 5), 1, 2, 1),
])
def test_column_sums_are_numpys_tap_by_tap_sums(spatial, kernel, stride, padding, dilation):
    """The C col2im (small_cols_impl.h: one permutation per tap for planes of at most 16 elements, one or two per
    16-element chunk for planes of at most 64, on AVX-512 builds; its row loops elsewhere): the bits of NumPy adding
    each tap's columns into dx in tap order, -0 columns included; NaNs (of two bit patterns) where NumPy's are."""
    from xconv.params import make_params
    from xconv_numpy import small_c

    rng = np.random.default_rng(6)
    p = make_params((3, 5) + spatial, (4, 5) + kernel, stride=stride, padding=padding, dilation=dilation)
    K, Q = int(np.prod(kernel)), int(np.prod(p.output_shape[2:]))
    dcols = rng.standard_normal((5 * K, 3 * Q)).astype(np.float32)
    dcols[:, ::3] = -0.0
    # NaNs of two bit patterns (NumPy's nan, and x86's default NaN that inf - inf gives): a NaN wherever one is added;
    # which of two NaNs meeting in one element comes out is the compiled add's operand order (IEEE 754 leaves it
    # open; the row loops' stride-1 and strided rows differ there), so NaN elements are compared as NaNs
    nans = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)
    some = max(2, dcols.size // 40)
    dcols.reshape(-1)[rng.choice(dcols.size, size=some, replace=False)] = nans[rng.integers(0, 2, size=some)]
    want = np.zeros((3, 5) + tuple(s + a + b for s, (a, b) in zip(spatial, p.padding)), np.float32)
    taps = dcols.reshape(5, K, 3, *p.output_shape[2:]).transpose(2, 0, 1, *range(3, 3 + p.nd))
    for i, t in enumerate(np.ndindex(*kernel)):
        sl = tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                   for k, d, o, s in zip(t, p.dilation, p.output_shape[2:], p.stride))
        want[(slice(None), slice(None)) + sl] += taps[:, :, i]
    want = want[(Ellipsis,) + tuple(slice(a, a + s) for s, (a, _) in zip(spatial, p.padding))]
    dx = small_c.col2im(dcols.reshape(1, 5 * K, 3 * Q), p, None, np.float32)
    want = np.ascontiguousarray(want)
    assert np.isnan(dx).any() and np.array_equal(np.isnan(dx), np.isnan(want))
    assert np.where(np.isnan(dx), 0, dx).tobytes() == np.where(np.isnan(want), 0, want).tobytes()


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled column copies are not built here")
def test_a_strided_input_gradient_counts_x_columns_on_small_cols():
    """small-cols computes a strided call's dx as W^T @ dy in x's columns' shape: the size rule counts those, not dy's
    (which small-c's grid and small-gather's columns hold); the memory bound still counts dy's for every small path.
    The digits model's transposed 4x4 stride-2 32 -> 1 (the dx of a 64x1x8x8 -> 32) then runs there."""
    p = make_params((64, 1, 8, 8), (32, 1, 4, 4), stride=2, padding=1)
    x_cols, dy_cols = 1 * 16 * 64 * 16, 32 * 16 * 64 * 64
    assert small.elements(p, True) == x_cols and small.elements(p, True, every_path=True) == dy_cols
    assert small.elements(make_params((64, 1, 8, 8), (32, 1, 3, 3), padding=1), True) == 32 * 9 * 64 * 64  # stride 1
    assert small.before_depthwise(p, True)
    larger = make_params((32, 1, 28, 28), (32, 1, 3, 3), stride=2)     # 1.8M multiply-adds: the depthwise loops' dx
    assert not small.before_depthwise(larger, True) and small.before_depthwise(larger, False)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((64, 32, 4, 4), dtype=np.float32), rng.standard_normal((32, 1, 4, 4), dtype=np.float32)
    kw = dict(stride=2, padding=1, transposed=True)
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, backend="numpy", **kw)
    assert t.records[-1].path.startswith("small-cols"), t.records[-1].path
    want = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", **kw)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
