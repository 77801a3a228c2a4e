"""grid.pointwise.fprop: the forward of a 1x1 kernel, stride 1, no padding, as per-sample products on the native
layout, against the float64 oracle (dims, groups, dtypes, layouts, bias, non-finite inputs); bitwise independent
of the worker count."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv.dtypes import DTYPES
from xconv.params import make_params

from test_numpy_fast import check_close  # noqa: E402

from xconv_numpy import paths
from xconv_numpy.grid import pointwise, pointwise_planned
from xconv_numpy.grid.geometry import geom
from xconv_numpy.grid.scratch import Lease

CASES = [   # input, C_out, groups
    ((2, 8, 13), 5, 1),
    ((3, 6, 5, 7), 4, 2),
    ((8, 96, 12, 12), 16, 1),
    ((2, 4, 3, 4, 5), 6, 1),
    ((1, 32, 1, 1), 64, 4),
]


def _run(x, w, b, p, workers=1):
    with Lease(None) as lease:
        return pointwise.fprop(geom(p), x, w, b, workers, lease)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_pointwise_forward_matches_exact(case, dtype):
    xs, co, g = case
    nd = len(xs) - 2
    ws = (co, xs[1] // g) + (1,) * nd
    p = make_params(xs, ws, stride=(1,) * nd, padding=((0, 0),) * nd, dilation=(1,) * nd, groups=g, dtype=dtype)
    assert geom(p).pointwise
    rng = np.random.default_rng(0)
    dt = DTYPES[dtype]
    x, w, b = (rng.standard_normal(s).astype(dt) for s in (xs, ws, (co,)))
    y = _run(x, w, b, p)
    kw = dict(groups=g, backend="numpy-exact")
    ye = xconv.conv_fprop(x, w, bias=b, **kw)
    ya = xconv.conv_fprop(np.abs(x), np.abs(w), bias=np.abs(b), **kw)
    assert y.shape == ye.shape and y.dtype == dt
    check_close(y, ye, ya, dtype, ws[1], "output")


def test_pointwise_forward_layouts_and_workers_keep_the_bits():
    xs, ws = (6, 32, 9, 11), (48, 32, 1, 1)
    p = make_params(xs, ws, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1, dtype="float32")
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    ref = _run(x, w, None, p)
    assert all(np.array_equal(ref, _run(x, w, None, p, k)) for k in (2, 3, 8))
    xf = np.asfortranarray(x)                                   # copied per chunk: the same products
    assert np.array_equal(ref, _run(xf, w, None, p, 2))


def test_pointwise_forward_keeps_non_finite_values_where_the_definition_has_them():
    xs, ws = (2, 4, 3, 3), (3, 4, 1, 1)
    p = make_params(xs, ws, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1, dtype="float32")
    x = np.ones(xs, np.float32)
    x[1, 2, 0, 1] = np.inf
    w = np.ones(ws, np.float32)
    w[1, 2] = 0.0                               # inf * 0: NaN in output channel 1 at that position only
    y = _run(x, w, None, p)
    ye = xconv.conv_fprop(x, w, backend="numpy-exact")
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ye))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ye))
    assert np.isnan(y[1, 1, 0, 1]) and np.isinf(y[1, 0, 0, 1]) and np.isfinite(y[0]).all()


@pytest.mark.parametrize("case", CASES)
def test_planned_forward_is_the_chunked_forwards_bits(case):
    """fprop_planned (the sgemm jobs from a table kept per configuration) gives fprop's bits, for every worker count,
    with and without bias, on a second call with other arrays (the table's offsets, not the first call's addresses)."""
    xs, co, g = case
    nd = len(xs) - 2
    ws = (co, xs[1] // g) + (1,) * nd
    p = make_params(xs, ws, stride=(1,) * nd, padding=((0, 0),) * nd, dilation=(1,) * nd, groups=g, dtype="float32")
    rng = np.random.default_rng(2)
    for k in (1, 2, 3):
        for bias in (None, rng.standard_normal(co).astype(np.float32)):
            x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
            planned = pointwise_planned.fprop(p, x, w, bias, k)
            if planned is None:              # sgemm jobs refused (a dimension of 1): fprop's own loop serves it
                assert min(xs[0], co // g, xs[1] // g) == 1 or int(np.prod(xs[2:])) == 1
                continue
            assert np.array_equal(planned, _run(x, w, bias, p, k))
            assert np.array_equal(planned, _run(np.asfortranarray(x), w, bias, p, k))   # another layout, same bits


def test_planned_forward_refuses_what_it_cannot_take_as_it_lies():
    xs, ws = (4, 16, 5, 5), (8, 16, 1, 1)
    p = make_params(xs, ws, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1, dtype="float32")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    assert pointwise_planned.fprop(p, np.asfortranarray(x), w, None, 2) is None
    assert pointwise_planned.fprop(p, x, w.astype(np.float64), None, 2) is None
    buf = np.zeros(x.size + w.size, np.float32)                 # w inside x's buffer: numpy.matmul's own case
    xo, wo = buf[:x.size].reshape(xs), buf[x.size - 8:x.size - 8 + w.size].reshape(ws)
    assert pointwise_planned.fprop(p, xo, wo, None, 2) is None
    with paths.force("pointwise"):                          # the path table's pointwise route: the planned forward
        y = xconv.conv_fprop(x, w)                              # (the cost model may pick small-cols here, whose
    assert np.array_equal(y, _run(x, w, None, p, 2))            # product's bits depend on the BLAS kernel)
