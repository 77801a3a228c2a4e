"""Finite differences of conv_fprop (float64) against convolution_backward: an independent truth.

L(x, w, b) = <conv_fprop(x, w, b), dy> is linear in each argument, so a central difference
along a random direction equals the directional derivative up to rounding.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import xconv
from core_helpers import conv_configs


def _loss(x, w, b, dy, kw):
    return float(np.sum(xconv.conv_fprop(x, w, bias=b, **kw) * dy))


@settings(max_examples=60, deadline=None)
@given(cfg=conv_configs(), seed=st.integers(0, 2**31 - 1))
def test_backward_matches_finite_differences(cfg, seed):
    rng = np.random.default_rng(seed)
    kw = cfg["kwargs"]
    p = cfg["params"]
    x = rng.standard_normal(cfg["input_shape"])
    w = rng.standard_normal(cfg["weight_shape"])
    b = rng.standard_normal(p.bias_size)
    dy = rng.standard_normal(cfg["output_shape"])
    dx, dw, db = xconv.convolution_backward(dy, x, w, **kw)
    h = 1e-3
    for grad, which in ((dx, 0), (dw, 1), (db, 2)):
        v = rng.standard_normal(grad.shape)
        args_plus = [x, w, b]
        args_minus = [x, w, b]
        args_plus[which] = args_plus[which] + h * v
        args_minus[which] = args_minus[which] - h * v
        fd = (_loss(*args_plus, dy, kw) - _loss(*args_minus, dy, kw)) / (2 * h)
        analytic = float(np.sum(grad * v))
        scale = float(np.sum(np.abs(grad * v))) + float(np.sum(np.abs(dy))) * 1e-3 + 1e-12
        assert abs(fd - analytic) <= 1e-7 * scale, (which, fd, analytic, kw)
