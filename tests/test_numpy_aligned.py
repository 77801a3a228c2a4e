"""The NumPy backend's results start a 64-byte line, in blocks a later torch tensor of their size can take
(backends/xconv_numpy/aligned.py): checked on the block, then on the results of every path real models run."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv_numpy import aligned, paths


@pytest.mark.parametrize("shape,dtype", [((3, 1000, 17), np.float32), ((2, 5, 7), np.float64),
                                         ((4, 33), np.float16), ((), np.float32)])
def test_line_aligned_starts_a_line_in_a_block_slack_bytes_longer(shape, dtype):
    """The array is C-contiguous, writeable, of the shape and dtype asked, starts a line, and its block holds SLACK
    bytes past it (so that a freed block holds a posix_memalign(64, n) of the array's n bytes)."""
    for _ in range(4):                                   # NumPy's own blocks start a line one time in four, or never
        a = aligned.line_aligned(shape, dtype)
        assert (a.shape, a.dtype) == (shape, np.dtype(dtype))
        assert a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % 64 == 0
        assert a.base.nbytes == a.nbytes + aligned.SLACK
        assert a.ctypes.data + a.nbytes <= a.base.ctypes.data + a.base.nbytes


def test_small_results_are_numpys_own():
    """Below RESULT_MIN_BYTES a result is NumPy's own array (no block placed: small calls pay nothing)."""
    a = aligned.empty_result((4, 4), np.float32)
    assert a.base is None and a.shape == (4, 4) and a.dtype == np.float32
    assert aligned.empty_result((aligned.RESULT_MIN_BYTES // 4,), np.float32).ctypes.data % 64 == 0


def test_line_aligned_empty_is_numpys_own():
    """An empty array has no first element to place: NumPy's own of the shape and dtype asked."""
    a = aligned.line_aligned((0, 8), np.float64)
    assert (a.shape, a.dtype, a.flags.c_contiguous) == ((0, 8), np.float64, True)


def _arrays(x_shape, w_shape, groups=1):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    return (rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32))


#: (path forced, x, w, stride, padding, groups): layers of issue 25's models, one per path, whose y and dx reach
#: aligned.RESULT_MIN_BYTES.
CASES = [
    ("colgemm", (4, 32, 28, 28), (48, 32, 3, 3), 1, 1, 1),
    ("dense", (2, 32, 16, 16), (32, 32, 3, 3), 1, 1, 1),
    ("stem", (2, 3, 64, 64), (16, 3, 7, 7), 2, 3, 1),
    ("depthwise", (2, 32, 32, 32), (32, 1, 3, 3), 1, 1, 32),
    ("pointwise", (2, 32, 16, 16), (48, 32, 1, 1), 1, 0, 1),
    ("grid-forward", (2, 16, 24, 24), (16, 16, 3, 3), 1, 1, 1),
]


@pytest.mark.parametrize("path,x_shape,w_shape,stride,padding,groups", CASES, ids=[c[0] for c in CASES])
def test_results_start_a_line(path, x_shape, w_shape, stride, padding, groups):
    """y and dx of the calls (the forward on the path forced; the backward wherever the path serves it) start a
    64-byte line in a placed block, call after call; both are still the definition's values."""
    x, w = _arrays(x_shape, w_shape)
    for _ in range(3):
        with paths.force(path), xconv.trace() as tr:
            y = xconv.conv_fprop(x, w, stride=stride, padding=padding, groups=groups, backend="numpy")
            dy = np.ones_like(y)
            dx, dw, _ = xconv.convolution_backward(dy, x, w, stride=stride, padding=padding, groups=groups,
                                                   output_mask=(True, True, False), backend="numpy")
        chose = {r.path.split(":")[0] for r in tr.records}
        assert chose & set(paths.GROUPS.get(path, (path,))), (path, chose)
        for a in (y, dx):
            _assert_placed(a, [r.path for r in tr.records])
    ref = xconv.conv_fprop(x, w, stride=stride, padding=padding, groups=groups, backend="numpy-exact")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    rdx, _, _ = xconv.convolution_backward(dy, x, w, stride=stride, padding=padding, groups=groups,
                                           output_mask=(True, False, False), backend="numpy-exact")
    np.testing.assert_allclose(dx, rdx, rtol=1e-4, atol=1e-3)


def _assert_placed(a, why):
    """``a`` starts a line in a block of its own SLACK bytes longer (certain: NumPy's own block is never that)."""
    assert a.ctypes.data % 64 == 0, why
    assert type(a.base) is np.ndarray and a.base.dtype == np.uint8, why
    assert a.base.nbytes == a.nbytes + aligned.SLACK, why


def test_small_call_backward_buffer_is_placed():
    """The small-call C backward's one buffer (dx, then dw, db) is placed: dx starts a line."""
    x, w = _arrays((2, 16, 32, 32), (16, 16, 3, 3))
    dy = np.ones((2, 16, 32, 32), np.float32)
    with paths.force("small-c"), xconv.trace() as tr:
        dx, dw, db = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, True), backend="numpy")
    assert any(r.path.startswith("small-c") for r in tr.records), [r.path for r in tr.records]
    assert dx.ctypes.data % 64 == 0
    rdx, rdw, _ = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False),
                                             backend="numpy-exact")
    np.testing.assert_allclose(dx, rdx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-2)


def test_transposed_bias_is_added_in_its_place():
    """The core adds a transposed call's bias in place on a placed result (legalize._sole: its block's only view),
    so the result keeps its block; a result some other view shares is not written (a new array instead)."""
    from xconv import legalize

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64, 16, 16)).astype(np.float32)
    w = rng.standard_normal((64, 32, 2, 2)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    for _ in range(3):
        y = xconv.conv_fprop(x, w, bias=b, stride=2, transposed=True, backend="numpy")
        _assert_placed(y, "transposed with a bias")
    ref = xconv.conv_fprop(x, w, bias=b, stride=2, transposed=True, backend="numpy-exact")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    placed = aligned.line_aligned((2, 32, 4, 4))
    placed[...] = 1
    assert legalize._add_bias(placed, b) is placed
    other = placed[:1]                                   # a second view: the block is not y's alone
    z = legalize._add_bias(placed, b)
    assert z is not placed and other.base is placed.base
    np.testing.assert_array_equal(placed, np.ones((2, 32, 4, 4), np.float32) + b.reshape(1, -1, 1, 1))
    np.testing.assert_array_equal(z, placed + b.reshape(1, -1, 1, 1))
