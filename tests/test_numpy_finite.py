"""The non-finite check of the NumPy paths (xconv_numpy/finite.py, csrc/finite.c): the compiled pass and NumPy's
give numpy.isfinite's answer on every array a user can hold, and a NaN or an infinity anywhere still sends a call
to its detour."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv.params import make_params
from xconv_numpy import dense, finite, native, paths, small

COMPILED = native.library() is not None


def _arrays():
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64, np.float16):
        base = rng.standard_normal(1037).astype(dtype)
        yield base
        big = np.full(64, np.finfo(dtype).max, dtype)          # finite values whose sum overflows
        yield big
        yield np.array([np.finfo(dtype).tiny / 4, -0.0, 0.0], dtype)     # subnormal, signed zeros
        for bad in (np.nan, np.inf, -np.inf):
            for at in (0, 500, 1036):                            # first, middle, last (the vector tail)
                a = base.copy()
                a[at] = bad
                yield a
    a = rng.standard_normal((4, 6, 5)).astype(np.float32)
    a[3, 5, 4] = np.nan
    yield a.transpose(2, 0, 1)                                   # not contiguous: NumPy's route
    yield a.astype(">f4")                                        # byte-swapped: NumPy's route
    ro = rng.standard_normal(300).astype(np.float32)
    ro.flags.writeable = False
    yield ro
    yield np.broadcast_to(np.float32(np.inf), (3, 4))            # broadcast (stride 0)
    yield np.empty((0, 3), np.float32)


@pytest.mark.parametrize("i", range(len(list(_arrays()))))
def test_all_finite_is_numpy_isfinite_all(i, monkeypatch):
    a = list(_arrays())[i]
    want = bool(np.isfinite(a).all())
    assert finite.all_finite(a) is want
    cdt = np.float64 if a.dtype == np.float64 else np.float32
    assert finite.all_finite(a, cdt) is want
    monkeypatch.setenv("XCONV_NUMPY_C", "0")                      # NumPy's route
    assert finite.all_finite(a) is want
    assert finite.all_finite(a, cdt) is want


def test_scalars_and_a_narrower_summing_dtype():
    """A NumPy scalar is an array of one element; a summing dtype narrower than the array's is not used (float64
    values past float32's range are finite): the same answer on both routes."""
    for v, want in ((np.float32(np.nan), False), (np.float64(1.0), True), (np.float16(np.inf), False)):
        assert finite.all_finite(v) is want
    big = np.full(5000, 1e300)
    assert finite.all_finite(big, np.float32) is True
    big[4321] = np.inf
    assert finite.all_finite(big, np.float32) is False


@pytest.mark.skipif(not COMPILED, reason="the compiled loops are not built here")
def test_compiled_check_reads_every_element():
    """An infinity at each position of a vector's lanes and of the scalar tail is found (a reduction that skipped
    a block or the tail would miss one of them)."""
    lib = native.library()
    for n in (1, 15, 16, 17, 63, 64, 65, 257):
        for at in range(n):
            a = np.ones(n, np.float32)
            a[at] = -np.inf
            assert lib.xconv_all_finite_f32(native.address(a), n) == 0, (n, at)
            b = np.ones(n, np.float64)
            b[at] = np.nan
            assert lib.xconv_all_finite_f64(native.address(b), n) == 0, (n, at)
        assert lib.xconv_all_finite_f32(native.address(np.ones(n, np.float32)), n) == 1


def _inf_weight_case():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 32, 6, 6)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    w[1, 2, 0, 0] = np.inf
    dy = rng.standard_normal((2, 32, 6, 6)).astype(np.float32)
    return x, w, dy


def _same_nonfinite(got, want):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


def test_a_non_finite_weight_sends_the_dense_forward_to_its_detour():
    """The dense loops' forward with an infinite weight runs the columns path, as the definition (NaN only where a term
    is inf * 0 or inf - inf)."""
    x, w, dy = _inf_weight_case()
    if not dense.serves_fprop(make_params(x.shape, w.shape, padding=1)):
        pytest.skip("the dense loops do not serve this build's forward (baseline build, or no compiled loops)")
    with paths.force("dense"), xconv.trace() as t:
        y = xconv.conv_fprop(x, w, padding=1, backend="numpy")
    assert "non-finite detour" in t.records[-1].path, t.records[-1].path
    _same_nonfinite(y, xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), padding=1, backend="numpy-exact"))


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled column loops are not built here")
def test_colgemm_keeps_an_infinite_weight_as_the_definition_does():
    """colgemm's backward with an infinite weight runs on colgemm (no detour, no pass over w): its columns hold x_pad's
    windows, padding zeros included, as the definition's terms, and dx adds back only the columns' terms that land
    inside x, so dx and dW have the definition's infs and NaNs (float64 exact path)."""
    x, w, dy = _inf_weight_case()
    with paths.force("colgemm"), xconv.trace() as t:
        dx, dw, _ = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False), backend="numpy")
    assert t.records[-1].path == "colgemm: colgemm columns [grad_input, grad_weight: forced]", t.records[-1].path
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64), padding=1,
                                      output_mask=(True, True, False), backend="numpy-exact")
    _same_nonfinite(dx, want[0])
    assert not np.isfinite(dx).all()
    assert np.isfinite(dw).all()
    np.testing.assert_allclose(dw, want[1], rtol=2e-5, atol=2e-5 * np.abs(want[1]).max())


def _random_nonfinite_calls(n: int, seed: int):
    """``n`` random direct calls (1-, 2- and 3-D, groups, strides, dilations, paddings), each with an inf, -inf or NaN
    in dy, x or w (at a random element, and every other call also at the first: a corner that reads padding)."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < n:
        nd, g = int(rng.integers(1, 4)), int(rng.choice([1, 2]))
        C, Co, N = g * int(rng.integers(1, 6)), g * int(rng.integers(1, 6)), int(rng.integers(1, 4))
        k, s, d, pad = ([int(rng.integers(lo, hi)) for _ in range(nd)] for lo, hi in ((1, 4), (1, 3), (1, 3), (0, 3)))
        size = [int(rng.integers(4, 8)) for _ in range(nd)]
        out = [(size[i] + 2 * pad[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
        if min(out) < 1:
            continue
        x = rng.standard_normal((N, C, *size)).astype(np.float32)
        w = rng.standard_normal((Co, C // g, *k)).astype(np.float32)
        dy = rng.standard_normal((N, Co, *out)).astype(np.float32)
        a = (dy, x, w)[made % 3]
        value = (np.inf, -np.inf, np.nan)[(made // 3) % 3]
        a.reshape(-1)[int(rng.integers(a.size))] = value
        if made % 2:
            a.reshape(-1)[0] = value
        yield made, dy, x, w, dict(stride=s, padding=pad, dilation=d, groups=g)
        made += 1


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled column loops are not built here")
@pytest.mark.parametrize("path", ["colgemm", "small-cols"])
def test_the_column_paths_keep_non_finite_values_as_the_definition(path):
    """The C column paths run calls with a NaN or an infinity themselves (``nonfinite="keeps"``): every forward, dx and
    dW output they compute has the infs (with their signs) and NaNs of the float64 exact path, and its finite values
    agree with it. (Their columns are the definition's windows of x_pad, padding zeros as terms; dx is W^T @ dy added
    back only where a column lands inside x.)"""
    assert paths.PATHS[path].nonfinite == "keeps"
    ran = 0
    for i, dy, x, w, kw in _random_nonfinite_calls(60, seed=11):
        with paths.force(path), xconv.trace() as t:
            got = xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), backend="numpy", **kw)[:2]
            got += (xconv.conv_fprop(x, w, backend="numpy", **kw),)
        ran += sum(r.path.startswith(path + ":") for r in t.records)
        f64 = [a.astype(np.float64) for a in (dy, x, w)]
        want = xconv.convolution_backward(*f64, output_mask=(True, True, False), backend="numpy-exact", **kw)[:2]
        want += (xconv.conv_fprop(f64[1], f64[2], backend="numpy-exact", **kw),)
        for name, g_, w_ in zip(("dx", "dw", "y"), got, want):
            _same_nonfinite(g_, w_)
            np.testing.assert_array_equal(np.sign(g_[np.isinf(g_)]), np.sign(w_[np.isinf(w_)]), err_msg=f"{i} {name}")
            ok = np.isfinite(w_)
            np.testing.assert_allclose(g_[ok], w_[ok], rtol=1e-3, atol=1e-3, err_msg=f"call {i} {name} {kw}")
    assert ran >= 40, f"only {ran} of 60 calls ran on {path}"


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", [(0, 0, 0, 0), (31, 15, 2, 2), (7, 3, 1, 0)])
def test_the_dense_loops_find_a_non_finite_weight_in_its_copy(value, where, monkeypatch):
    """Without a trace open, the dense call's own job list checks w while it copies it (no pass of its own): a
    non-finite weight sends the forward to the columns detour and the input gradient to its fix-up run, with the
    definition's infs and NaNs (float64 exact path), and a finite w costs no check of its own (dy's pass, where the
    weight gradient may skip x's padding, dense.skips_padding, is dy's, not w's)."""
    from xconv_numpy import finite

    if not dense.serves_fprop(make_params((2, 16, 7, 7), (32, 16, 3, 3), padding=1)):
        pytest.skip("the dense loops do not serve this build's forward (baseline build, or no compiled loops)")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 7, 7)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 32, 7, 7)).astype(np.float32)
    passes = []
    real = dense.all_finite
    monkeypatch.setattr(dense, "all_finite", lambda a: passes.append(a.shape) or real(a))
    with paths.force("dense"):
        xconv.conv_fprop(x, w, padding=1, backend="numpy")
        xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False), backend="numpy")
        assert w.shape not in passes                         # finite: checked in the copies only
        assert passes == [dy.shape]                          # the weight gradient's pass over dy
        w[where] = value
        y = xconv.conv_fprop(x, w, padding=1, backend="numpy")
        dx, dw, _ = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False), backend="numpy")
    f64 = [a.astype(np.float64) for a in (x, w, dy)]
    _same_nonfinite(y, xconv.conv_fprop(f64[0], f64[1], padding=1, backend="numpy-exact"))
    want = xconv.convolution_backward(f64[2], f64[0], f64[1], padding=1, output_mask=(True, True, False),
                                      backend="numpy-exact")
    _same_nonfinite(dx, want[0])
    ok = np.isfinite(want[0])
    np.testing.assert_allclose(dx[ok], want[0][ok], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, want[1], rtol=1e-4, atol=1e-4)
    assert finite.all_finite(w) is False
