"""Small convolutions worked out by hand: the reference must reproduce them exactly."""

from __future__ import annotations

import numpy as np
import pytest

import xconv

BACKENDS = ["numpy", "numpy-exact"]


def a(*values, shape):
    return np.array(values, dtype=np.float64).reshape(shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_1d_valid(backend):
    # y[i] = sum_j x[i + j] w[j] with x = 1 2 3 4, w = 1 0 -1: y = (1-3, 2-4)
    x, w = a(1, 2, 3, 4, shape=(1, 1, 4)), a(1, 0, -1, shape=(1, 1, 3))
    np.testing.assert_array_equal(xconv.conv_fprop(x, w, backend=backend), a(-2, -2, shape=(1, 1, 2)))
    dy = a(1, 1, shape=(1, 1, 2))
    dx, dw, db = xconv.convolution_backward(dy, x, w, backend=backend)
    # dx[i] = sum_o dy[o] w[i - o] = (1, 0+1, -1+0, -1); dw[j] = sum_o dy[o] x[o + j] = (3, 5, 7)
    np.testing.assert_array_equal(dx, a(1, 1, -1, -1, shape=(1, 1, 4)))
    np.testing.assert_array_equal(dw, a(3, 5, 7, shape=(1, 1, 3)))
    np.testing.assert_array_equal(db, a(2, shape=(1,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_2d_stride2_padding1(backend):
    # x = 1..9 in 3x3, zero-padded to 5x5; 2x2 kernel 1 2 / 3 4; stride 2 -> 2x2 output
    x = a(*range(1, 10), shape=(1, 1, 3, 3))
    w = a(1, 2, 3, 4, shape=(1, 1, 2, 2))
    y = xconv.conv_fprop(x, w, stride=2, padding=1, backend=backend)
    # windows: [0 0; 0 1] -> 4; [0 0; 2 3] -> 6+12; [0 4; 0 7] -> 8+28; [5 6; 8 9] -> 5+12+24+36
    np.testing.assert_array_equal(y, a(4, 18, 36, 77, shape=(1, 1, 2, 2)))
    dy = a(1, 0, 0, 0, shape=(1, 1, 2, 2))
    dx, dw, db = xconv.convolution_backward(dy, x, w, stride=2, padding=1, backend=backend)
    # only y[0,0] has gradient; it saw x[0,0] through w[1,1] = 4
    np.testing.assert_array_equal(dx, a(4, 0, 0, 0, 0, 0, 0, 0, 0, shape=(1, 1, 3, 3)))
    np.testing.assert_array_equal(dw, a(0, 0, 0, 1, shape=(1, 1, 2, 2)))
    np.testing.assert_array_equal(db, a(1, shape=(1,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_1d_transposed(backend):
    # transposed stride 2, kernel 1 1 1: each input scatters to 3 outputs, 2 apart
    x, w = a(1, 2, shape=(1, 1, 2)), a(1, 1, 1, shape=(1, 1, 3))
    np.testing.assert_array_equal(xconv.conv_fprop(x, w, stride=2, transposed=True, backend=backend),
                                  a(1, 1, 3, 2, 2, shape=(1, 1, 5)))
    np.testing.assert_array_equal(
        xconv.conv_fprop(x, w, stride=2, transposed=True, output_padding=1, backend=backend),
        a(1, 1, 3, 2, 2, 0, shape=(1, 1, 6)))
    np.testing.assert_array_equal(xconv.conv_fprop(x, w, stride=2, padding=1, transposed=True, backend=backend),
                                  a(1, 3, 2, shape=(1, 1, 3)))
    np.testing.assert_array_equal(
        xconv.conv_fprop(x, w, stride=2, padding=((2, 0),), transposed=True, backend=backend),
        a(3, 2, 2, shape=(1, 1, 3)))
    dz = a(1, 2, 3, 4, 5, shape=(1, 1, 5))
    dx, dw, db = xconv.convolution_backward(dz, x, w, stride=2, transposed=True, backend=backend)
    # dx[i] = sum_j dz[2i + j]: (1+2+3, 3+4+5); dw[j] = sum_i x[i] dz[2i + j] = (1+6, 2+8, 3+10)
    np.testing.assert_array_equal(dx, a(6, 12, shape=(1, 1, 2)))
    np.testing.assert_array_equal(dw, a(7, 10, 13, shape=(1, 1, 3)))
    np.testing.assert_array_equal(db, a(15, shape=(1,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_depthwise_and_bias(backend):
    # two channels, each convolved with its own kernel; bias added per channel
    x = a(1, 2, 3, 10, 20, 30, shape=(1, 2, 3))
    w = a(1, 1, 2, -1, shape=(2, 1, 2))
    y = xconv.conv_fprop(x, w, groups=2, bias=a(100, 0, shape=(2,)), backend=backend)
    np.testing.assert_array_equal(y, a(103, 105, 0, 10, shape=(1, 2, 2)))


@pytest.mark.parametrize("size, lower, expected", [
    (5, False, ((1, 1),)), (6, False, ((0, 1),)), (6, True, ((1, 0),)), (7, False, ((1, 1),)), (8, False, ((0, 1),)),
])
def test_same_padding_splits(size, lower, expected):
    # kernel 3, stride 2: output ceil(size / 2); total padding (out-1)*2 + 3 - size, extra at the end (or start)
    from xconv.params import make_params
    p = make_params((1, 1, size), (1, 1, 3), stride=2, padding="same_lower" if lower else "same")
    assert p.padding == expected
    assert p.output_shape[2] == -(-size // 2)


def test_output_shape_formulas():
    assert xconv.output_shape((2, 3, 10, 11), (5, 3, 3, 2), stride=(2, 3), padding=((1, 2), (0, 1)),
                              dilation=(2, 1)) == (2, 5, (10 + 3 - 4 - 1) // 2 + 1, (11 + 1 - 1 - 1) // 3 + 1)
    assert xconv.output_shape((2, 4, 5), (4, 3, 3), stride=2, padding=1, dilation=2, groups=1, transposed=True,
                              output_padding=1) == (2, 3, (5 - 1) * 2 - 2 + 2 * 2 + 1 + 1)
    assert xconv.output_shape((1, 4, 7, 7, 7), (8, 2, 1, 1, 1), groups=2, padding="valid") == (1, 8, 7, 7, 7)
