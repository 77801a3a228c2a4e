"""xconv_numpy.depthwise_quick: a lane's repeated depthwise calls on the loops across channels run the job templates
kept by the first call, with the public call's bits (forward with and without bias, input and weight gradients, 1-D
and 2-D, strides, dilation, one and two workers, arrays of another layout copied first); calls that are not the
template's (another dtype or shape, a weight that is not finite) take the dispatch, with its bits."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import float32_operands, lane_conf, validated
from xconv import lanes
from xconv.params import make_params
from xconv_numpy import depthwise, depthwise_cv, depthwise_quick, paths

#: (input, weight, stride, padding, dilation): MobileNetV2's small planes, a strided one, a dilated one, 1-D.
CASES = [((8, 96, 12, 12), (96, 1, 3, 3), 1, 1, 1), ((4, 32, 16, 16), (32, 1, 3, 3), 2, 1, 1),
         ((2, 48, 9, 9), (48, 1, 3, 3), 1, 2, 2), ((3, 32, 16), (32, 1, 5), 1, 2, 1)]

pytestmark = pytest.mark.skipif(not depthwise_cv.serves(make_params(*CASES[0][:2], padding=1, groups=96)),
                                reason="no compiled loops across channels in this build")


@pytest.fixture
def dispatched(monkeypatch):
    """The calls that reached depthwise.fprop / depthwise.backward (the dispatch), counted."""
    lanes.clear()
    seen = []
    real_f, real_b = depthwise.fprop, depthwise.backward
    monkeypatch.setattr(depthwise, "fprop", lambda *a: seen.append("fprop") or real_f(*a))
    monkeypatch.setattr(depthwise, "backward", lambda *a: seen.append("backward") or real_b(*a))
    yield seen
    lanes.clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0]) - 2}d-k{c[1][2:]}-s{c[2]}-d{c[4]}")
def test_repeated_calls_skip_the_dispatch_with_the_public_calls_bits(case, dispatched):
    xs, ws, s, pad, dil = case
    g = xs[1]
    conf = lane_conf(len(xs) - 2, s, pad, g, dil)
    x, w, b = float32_operands(xs, ws)
    p = make_params(xs, ws, stride=s, padding=pad, dilation=dil, groups=g)
    assert depthwise_quick.fprop_runner(p) is not None and depthwise_quick.backward_runner(p) is not None
    dy = np.random.default_rng(1).standard_normal(p.output_shape, dtype=np.float32)
    xs_ = [x + np.float32(i) for i in range(3)]           # new data each call: no result left in a reused buffer
    masks = [(True, True, False), (True, False, False), (False, True, True)]
    want_f = [[validated(xconv.conv_fprop, xi, w, bias=bb, **conf.kwargs()) for bb in (None, b)] for xi in xs_]
    want_b = [[validated(xconv.convolution_backward, dy + i, xi, w, output_mask=m, bias_sizes=[g] if m[2] else None,
                                          **conf.kwargs()) for m in masks] for i, xi in enumerate(xs_)]
    for bb in (None, b):
        lanes.fprop(conf, x, w, bb, conf.kwargs)          # opens the lanes (public calls)
    for m in masks:
        lanes.backward(conf, dy, x, w, [g] if m[2] else None, m, conf.kwargs)
    dispatched.clear()
    for i, xi in enumerate(xs_):
        got = [lanes.fprop(conf, xi, w, bb, conf.kwargs) for bb in (None, b)]
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want_f[i]]
        for m, wants in zip(masks, want_b[i]):
            grads = lanes.backward(conf, dy + i, xi, w, [g] if m[2] else None, m, conf.kwargs)
            assert [None if a is None else a.tobytes() for a in grads] == \
                   [None if a is None else a.tobytes() for a in wants]
    x2 = np.asfortranarray(x)                             # another layout: copied to C order first, as the dispatch
    assert lanes.fprop(conf, x2, w, b, conf.kwargs).tobytes() == want_f[0][1].tobytes()
    grads = lanes.backward(conf, np.asfortranarray(dy), x2, w, None, masks[0], conf.kwargs)
    assert [a.tobytes() for a in grads[:2]] == [a.tobytes() for a in want_b[0][0][:2]]
    assert dispatched == []


@pytest.mark.parametrize("workers", [1, 2])
def test_each_worker_count_keeps_its_own_template_with_the_same_bits(workers):
    xs, ws, s, pad, dil = CASES[0]
    x, w, b = float32_operands(xs, ws)
    p = make_params(xs, ws, stride=s, padding=pad, dilation=dil, groups=xs[1])
    dy = np.random.default_rng(1).standard_normal(p.output_shape, dtype=np.float32)
    fprop, backward = depthwise_quick.fprop_runner(p), depthwise_quick.backward_runner(p)
    y = depthwise_cv.fprop(x, w, b, p, workers)
    dx, dw = depthwise_cv.backward(dy, x, w, p, True, True, workers)
    for _ in range(2):                                    # the first call makes the template, the second runs it
        assert fprop(x, w, b, workers).tobytes() == y.tobytes()
        got = backward(dy, x, w, True, True, workers)
        assert got[0].tobytes() == dx.tobytes() and got[1].tobytes() == dw.tobytes()
    exact = validated(xconv.conv_fprop, x.astype(np.float64), w.astype(np.float64), bias=b.astype(np.float64), stride=s,
                             padding=pad, groups=xs[1], backend="numpy-exact")
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)


def test_a_weight_that_is_not_finite_or_an_array_of_another_dtype_is_not_the_templates():
    xs, ws, s, pad, dil = CASES[0]
    x, w, b = float32_operands(xs, ws)
    p = make_params(xs, ws, stride=s, padding=pad, dilation=dil, groups=xs[1])
    fprop, backward = depthwise_quick.fprop_runner(p), depthwise_quick.backward_runner(p)
    bad = w.copy()
    bad[3, 0, 0, 0] = np.inf                              # the plane loops take it (a padding term is inf * 0)
    assert fprop(x, bad, None, 2) is None
    assert fprop(x.astype(np.float64), w, None, 2) is None
    assert fprop(x.astype(">f4"), w, None, 2) is None                  # byte-swapped: the dispatch converts it
    dy = np.zeros(p.output_shape, np.float32)
    assert backward(dy[:1], x, w, True, True, 2) is None                # another shape
    got = backward(dy[:, :, ::-1], x, w, True, True, 2)                 # a reversed view: copied, then the template
    want = depthwise_cv.backward(np.ascontiguousarray(dy[:, :, ::-1]), x, w, p, True, True, 2)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    with paths.force("depthwise"):                      # the public call with the bad weight: the exact path's NaNs
        y = xconv.conv_fprop(x, bad, stride=s, padding=pad, groups=xs[1], backend="numpy")
    exact = validated(xconv.conv_fprop, x.astype(np.float64), bad.astype(np.float64), stride=s, padding=pad, groups=xs[1],
                             backend="numpy-exact")
    assert np.isnan(y[:, 3, 0, 0]).all() and (np.isnan(y) == np.isnan(exact)).all()
    assert np.isfinite(np.delete(y, 3, axis=1)).all()


def test_configurations_off_the_loops_across_channels_have_no_runner():
    wide = make_params((2, 16, 64, 64), (16, 1, 3, 3), padding=1, groups=16)       # planes past MAX_WIDTH
    f64 = make_params((2, 16, 8, 8), (16, 1, 3, 3), padding=1, groups=16, dtype="float64")
    assert depthwise_quick.fprop_runner(wide) is None and depthwise_quick.backward_runner(wide) is None
    assert depthwise_quick.fprop_runner(f64) is None
