"""xconv_numpy.dense_strided_quick: a lane's repeated strided dense forwards run one job template (the weights' copy,
x's phase copies, the row sums) with the public call's bits (1-D and 2-D, groups, unequal strides, bias); calls that
are not the template's (another layout, another worker count first, a non-finite weight, a workspace limit) take the
full path, with its bits and its non-finite detour."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import (assert_lane_forwards_replay, count_dispatches, float32_operands, fresh_scratch,
                          lane_conf, validated)
from xconv import lanes
from xconv.params import make_params
from xconv_numpy import dense, dense_strided, dense_strided_quick, paths

pytestmark = pytest.mark.skipif(not (dense.available() and dense_strided.computes(
    make_params((2, 32, 8, 8), (32, 32, 3, 3), stride=2, padding=1)) and dense.computes_fprop(
    make_params((2, 32, 8, 8), (32, 32, 3, 3), stride=2, padding=1))),
    reason="the dense loops' strided forward needs their compiled loops (AVX-512 build; AVX2: forced only)")

#: (input, weight, stride, padding, groups): ResNet's 64 -> 128 3x3 s2, a 1-D encoder layer, groups with odd sizes,
#: unequal strides and paddings, a 1-D stride 3.
CASES = [((8, 64, 16, 16), (128, 64, 3, 3), 2, 1, 1), ((2, 64, 99), (64, 64, 3), 2, 0, 1),
         ((2, 32, 15, 17), (64, 16, 3, 3), 2, 1, 2), ((3, 32, 9, 20), (32, 32, 5, 3), (2, 3), (2, 1), 1),
         ((2, 32, 30), (16, 32, 4), 3, 1, 1)]


@pytest.fixture
def dispatched(monkeypatch):
    """The calls that reached dense_strided.fprop (the full path), counted."""
    lanes.clear()
    yield count_dispatches(monkeypatch, dense_strided, "fprop")
    lanes.clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0]) - 2}d-{c[1][2:]}-s{c[2]}-g{c[4]}")
def test_repeated_forwards_skip_the_dispatch_with_the_public_calls_bits(case, dispatched):
    xs, ws, s, pad, g = case
    nd = len(xs) - 2
    conf = lane_conf(nd, s, pad, g)
    x, w, b = float32_operands(xs, ws)
    assert_lane_forwards_replay("dense", conf, x, w, b, dispatched, new_weights=True)      # w at a new address too


def test_each_worker_count_keeps_its_template_and_a_non_finite_weight_detours():
    """The copies' and sums' ranges depend on the workers: a template per count, each with the bits. A weight holding
    an inf or a NaN (flagged by the template's own copy) gives None, and the lane's dispatch the columns' result."""
    xs, ws = (4, 64, 12, 12), (64, 64, 3, 3)
    p = make_params(xs, ws, stride=2, padding=1)
    x, w, b = float32_operands(xs, ws, 1)
    run = dense_strided_quick.fprop_runner(p)
    with paths.force("dense"):
        want = validated(xconv.conv_fprop, x, w, bias=b, stride=2, padding=1, backend="numpy")
    stash = []
    for workers in (1, 2, 1, 2):
        fresh_scratch(stash)
        assert run(x, w, b, workers).tobytes() == want.tobytes()
    assert run(x.astype(np.float64), w, b, 2) is None                   # not the template's dtype
    assert run(np.concatenate([x, x])[:2], w, b, 2) is None                # not the configuration's shape
    for bad in (np.inf, np.nan):
        w2 = w.copy()
        w2[5, 7, 1, 2] = bad
        assert run(x, w2, b, 2) is None
        conf = lane_conf(2, 2, 1)
        lanes.clear()
        with paths.force("dense"):
            lanes.fprop(conf, x, w, b, conf.kwargs)                       # opens the lane (a public call)
            got = lanes.fprop(conf, x, w2, b, conf.kwargs)                # the lane's runner: None, then the dispatch
            ref = validated(xconv.conv_fprop, x, w2, bias=b, stride=2, padding=1, backend="numpy")
        assert np.array_equal(got, ref, equal_nan=True) and not np.isfinite(got).all()
    lanes.clear()


def test_no_runner_under_a_workspace_limit_or_off_the_strided_loops():
    assert dense_strided_quick.fprop_runner(
        make_params((2, 64, 16, 16), (128, 64, 3, 3), stride=2, padding=1, workspace_limit=1 << 20)) is None
    assert dense_strided_quick.fprop_runner(make_params((2, 64, 16, 16), (128, 64, 3, 3), padding=1)) is None
    assert dense_strided_quick.fprop_runner(make_params((2, 64, 16, 16), (120, 64, 3, 3), stride=2)) is None
