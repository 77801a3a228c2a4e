"""grid.pointwise_planned.backward: the pointwise backward's sgemm jobs from a table kept per configuration give the
chunked backward's bits (dx; dW summed in its chunks' and slots' order), for every mask, worker count and layout, and
refuse (None) what they cannot take as it lies."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from xconv.params import make_params

from xconv_numpy import paths
from xconv_numpy.grid import pointwise, pointwise_planned
from xconv_numpy.grid.geometry import geom
from xconv_numpy.grid.scratch import Lease

CASES = [   # input, C_out, groups: both dW orientations, groups, 1-D and 3-D, two chunks (N = 64; more: the wrap test)
    ((8, 16, 6, 6), 96, 1),
    ((8, 96, 6, 6), 16, 1),
    ((3, 6, 5, 7), 4, 2),
    ((64, 24, 7), 40, 1),
    ((2, 4, 3, 4, 5), 6, 1),
    ((64, 32, 9, 9), 48, 4),
]
MASKS = [(True, True), (True, False), (False, True)]


def _params(case):
    xs, co, g = case
    nd = len(xs) - 2
    ws = (co, xs[1] // g) + (1,) * nd
    return make_params(xs, ws, stride=(1,) * nd, padding=((0, 0),) * nd, dilation=(1,) * nd, groups=g,
                       dtype="float32"), ws


def _chunked(p, dy, x, w, mask, workers):
    with Lease(None) as lease:
        return pointwise.backward(geom(p), dy, x, w, *mask, False, workers, lease)[:2]


def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


@pytest.mark.parametrize("case", CASES)
def test_planned_backward_is_the_chunked_backwards_bits(case):
    p, ws = _params(case)
    assert len(pointwise.backward_chunks(geom(p))[0]) > 1 or case[0][0] < 64      # N = 64: several chunks, as meant
    rng = np.random.default_rng(4)
    x = rng.standard_normal(p.input_shape).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    for mask in MASKS:
        for workers in (1, 2, 3):
            planned = pointwise_planned.backward(p, dy, x, w, *mask, workers)
            assert planned is not None
            want = _chunked(p, dy, x, w, mask, workers)
            assert all(_same(a, b) for a, b in zip(planned, want)), (mask, workers)
            again = pointwise_planned.backward(p, dy.copy(), x.copy(), w.copy(), *mask, workers)  # other arrays
            assert all(_same(a, b) for a, b in zip(again, want))
        other = _chunked(p, np.asfortranarray(dy), np.asfortranarray(x), w, mask, 2)   # copied chunks: same bits
        assert all(_same(a, b) for a, b in zip(planned, other))


def test_planned_backward_matches_the_oracle_and_the_public_call():
    p, ws = _params(((8, 16, 6, 6), 96, 1))
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(p.input_shape).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    dx, dw = pointwise_planned.backward(p, dy, x, w, True, True, 2)
    ex, ew, _ = xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), backend="numpy-exact")
    np.testing.assert_allclose(dx, ex, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, ew, rtol=1e-5, atol=1e-3)
    with paths.force("pointwise"), xconv.trace() as tr:
        gx, gw, _ = xconv.convolution_backward(dy, x, w, output_mask=(True, True, False))
        lx, _, _ = xconv.convolution_backward(dy, np.asfortranarray(x), w, output_mask=(True, False, False))
        _, lw, _ = xconv.convolution_backward(np.asfortranarray(dy), x, w, output_mask=(False, True, False))
    assert all(r.path.startswith("pointwise") for r in tr.records)
    assert np.array_equal(gx, dx) and np.array_equal(gw, dw)
    assert np.array_equal(lx, dx) and np.array_equal(lw, dw)        # other layouts, other masks: the same bits


def test_planned_backward_refuses_what_it_cannot_take_as_it_lies():
    p, ws = _params(((4, 16, 5, 5), 8, 1))
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal(p.input_shape).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    assert pointwise_planned.backward(p, np.asfortranarray(dy), x, w, True, True, 2) is None
    assert pointwise_planned.backward(p, dy, x.astype(np.float64), w, False, True, 2) is None
    assert pointwise_planned.backward(p, dy, x.astype(np.float64), w, True, False, 2) is not None   # x not read
    limited = make_params(p.input_shape, ws, stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1), groups=1,
                          dtype="float32", workspace_limit=1 << 20)
    assert pointwise_planned.backward(limited, dy, x, w, True, True, 2) is None       # the chunks keep to a limit
    big = make_params((2, 512, 1, 2), (512, 512, 1, 1), stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1),
                      groups=1, dtype="float32")                                       # dW per sample: 2 x 2^18 > 2^20?
    xb = np.ones(big.input_shape, np.float32)
    wb = np.ones(big.weight_shape, np.float32)
    got = pointwise_planned.backward(big, np.ones(big.output_shape, np.float32), xb, wb, False, True, 2)
    assert got is not None                                  # 2^19 elements: within PER_SAMPLE_ELEMENTS
    huge = make_params((8, 512, 1, 2), (512, 512, 1, 1), stride=(1, 1), padding=((0, 0),) * 2, dilation=(1, 1),
                       groups=1, dtype="float32")           # 8 x 2^18 = 2^21 elements, past both bounds
    xh = np.ones(huge.input_shape, np.float32)
    assert pointwise_planned.backward(huge, np.ones(huge.output_shape, np.float32), xh, wb, False, True, 2) is None


def test_tables_past_max_jobs_are_not_kept():
    """A call whose job table would pass MAX_JOBS (samples x groups) is left to the chunked path (None), so the tables
    kept per configuration stay small."""
    p, ws = _params(((64, 40, 3, 3), 40, 8))                 # 64 samples x 8 groups: 512 jobs per output
    rng = np.random.default_rng(12)
    x, w = rng.standard_normal(p.input_shape).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    assert p.input_shape[0] * p.groups > pointwise_planned.MAX_JOBS
    assert pointwise_planned.backward(p, dy, x, w, True, True, 2) is None
    assert pointwise_planned.fprop(p, x, w, None, 2) is None
    with paths.force("pointwise"):
        gx, gw, _ = xconv.convolution_backward(dy, x, w, groups=8, output_mask=(True, True, False))
    ex, ew, _ = xconv.convolution_backward(dy, x, w, groups=8, output_mask=(True, True, False), backend="numpy-exact")
    np.testing.assert_allclose(gx, ex, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw, ew, rtol=1e-4, atol=1e-3)


def test_dw_sums_wrap_around_the_slots_as_the_chunked_path_does():
    """Many chunks over fewer slots (chunk i added to slot i % slots, later chunks through scratch): the planned dW
    sums in the same order (a tight chunk budget makes the chunks; the bits are compared with the chunked path's)."""
    from xconv_numpy import tuning

    p, ws = _params(((40, 24, 5, 5), 32, 1))
    rng = np.random.default_rng(13)
    x, w = rng.standard_normal(p.input_shape).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    with tuning.tuned(chunk_bytes=(1, 4000)):
        chunks, slots, _, _ = pointwise.backward_chunks(geom(p))
        assert len(chunks) > 2 * slots > 2                     # several rounds of every slot
        got = pointwise_planned.backward(p, dy, x, w, False, True, 2)
        want = _chunked(p, dy, x, w, (False, True), 2)
    assert got is not None and np.array_equal(got[1], want[1])
    with tuning.tuned(chunk_bytes=(1, 4000 * 64)):             # other chunks: other sums (the test can fail)
        assert len(pointwise.backward_chunks(geom(p))[0]) < len(chunks)
        other = _chunked(p, dy, x, w, (False, True), 2)
    assert not np.array_equal(other[1], want[1])
