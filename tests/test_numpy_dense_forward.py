"""dense.fprop: a stride-1 forward through the compiled input-gradient loops (xconv_numpy.dense), against the
float64 oracle, over dims, groups, dilation, asymmetric padding, bias; bitwise independent of the workers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import xconv
from xconv.params import make_params

from test_numpy_fast import check_close  # noqa: E402

from xconv_numpy import dense
from xconv_numpy.grid.scratch import Lease

pytestmark = pytest.mark.skipif(not dense.available(), reason=f"compiled loops unavailable: {dense.build_error()}")

CASES = [   # input, weight, padding per dim, dilation, groups
    ((2, 16, 9), (32, 16, 3), ((1, 1),), (1,), 1),
    ((1, 32, 7, 6), (16, 32, 3, 2), ((1, 1), (0, 1)), (1, 1), 1),
    ((3, 32, 5, 8), (32, 16, 3, 3), ((2, 0), (1, 2)), (1, 1), 2),
    ((2, 16, 9, 9), (16, 16, 3, 3), ((2, 2), (1, 2)), (2, 1), 1),
    ((1, 16, 3, 5, 4), (32, 16, 3, 3, 2), ((1, 1), (1, 1), (0, 1)), (1, 1, 1), 1),
    ((2, 48, 6, 6), (48, 48, 1, 3), ((0, 0), (1, 1)), (1, 1), 1),
]


def _params(xs, ws, pad, dil, g):
    return make_params(xs, ws, stride=(1,) * len(pad), padding=pad, dilation=dil, groups=g, dtype="float32")


@pytest.mark.parametrize("case", CASES)
def test_dense_forward_matches_exact(case):
    xs, ws, pad, dil, g = case
    p = _params(xs, ws, pad, dil, g)
    assert dense.computes_fprop(p)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    with Lease(None) as lease:
        y = dense.fprop(x, w, b, p, 1, 1 << 20, lease)
    kw = dict(stride=(1,) * len(pad), padding=pad, dilation=dil, groups=g, backend="numpy-exact")
    ye = xconv.conv_fprop(x, w, bias=b, **kw)
    ya = xconv.conv_fprop(np.abs(x), np.abs(w), bias=np.abs(b), **kw)
    assert y.shape == ye.shape and y.dtype == np.float32
    check_close(y, ye, ya, "float32", ws[1] * math.prod(ws[2:]), "output")


def test_dense_forward_bitwise_independent_of_workers():
    xs, ws, pad, dil, g = (4, 32, 12, 12), (32, 32, 3, 3), ((1, 1), (1, 1)), (1, 1), 1
    p = _params(xs, ws, pad, dil, g)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    outs = []
    for workers, budget in ((1, 1 << 30), (2, 1 << 30), (4, 1 << 30)):
        with Lease(None) as lease:
            outs.append(dense.fprop(x, w, None, p, workers, budget, lease))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_dense_forward_refuses_what_it_cannot_compute():
    assert not dense.computes_fprop(make_params((1, 16, 8, 8, 8), (16, 16, 3, 3, 3), stride=2, padding=1,
                                                dtype="float32"))           # strided 3-D (dense_strided: 1-D, 2-D)
    assert not dense.computes_fprop(make_params((1, 16, 8, 8), (24, 16, 3, 3), stride=2, padding=1,
                                                dtype="float32"))           # strided, 24 output channels
    assert not dense.computes_fprop(make_params((1, 16, 8, 8), (16, 16, 3, 3), stride=(1, 1), padding=((3, 0),) * 2,
                                                dilation=(1, 1), groups=1, dtype="float32"))      # pad past reach
    assert not dense.computes_fprop(make_params((1, 3, 8, 8), (16, 3, 3, 3), stride=(1, 1), padding=((1, 1),) * 2,
                                                dilation=(1, 1), groups=1, dtype="float32"))      # 3 channels
    assert not dense.computes_fprop(make_params((1, 16, 8, 8), (16, 16, 3, 3), stride=(1, 1), padding=((1, 1),) * 2,
                                                dilation=(1, 1), groups=1, dtype="float64"))
