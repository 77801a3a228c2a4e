"""xconv_numpy.stem_quick: a lane's repeated stem forwards run one job template with the public call's bits (2-D and
3-D, strides, bias); calls that are not the template's (another layout, another worker count first, a non-finite
weight, float64) take the full path, with its bits and its non-finite detour."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import assert_lane_forwards_replay, count_dispatches, float32_operands, lane_conf, validated
from xconv import lanes
from xconv.params import make_params
from xconv_numpy import paths, stem, stem_quick

pytestmark = pytest.mark.skipif(not stem.serves(make_params((2, 3, 32, 32), (16, 3, 3, 3), stride=2, padding=1)),
                                reason=f"the stem loops need their compiled loops (AVX-512 or AVX2 build); "
                                       f"this process runs {stem.built_for()}")

#: (input, weight, stride, padding): ResNet's 7x7 stride 2 stem, MobileNet's 3x3 stride 2, a 3x3 stride 1 at 40 wide
#: rows (a second vector of 8), a 3-D stem, 1 input channel at stride 3.
CASES = [((4, 3, 32, 32), (64, 3, 7, 7), 2, 3), ((3, 3, 36, 36), (16, 3, 3, 3), 2, 1),
         ((2, 3, 9, 40), (24, 3, 3, 3), 1, 1), ((2, 3, 4, 18, 18), (32, 3, 3, 3, 3), 1, 1),
         ((2, 1, 20, 50), (8, 1, 5, 5), 3, 2)]


@pytest.fixture
def dispatched(monkeypatch):
    """The calls that reached stem.fprop (the full path), counted."""
    lanes.clear()
    yield count_dispatches(monkeypatch, stem, "fprop")
    lanes.clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0]) - 2}d-{c[1]}-s{c[2]}")
def test_repeated_forwards_skip_the_dispatch_with_the_public_calls_bits(case, dispatched):
    xs, ws, s, pad = case
    conf = lane_conf(len(xs) - 2, s, pad)
    x, w, b = float32_operands(xs, ws)
    assert stem.serves(make_params(xs, ws, stride=s, padding=pad))
    assert_lane_forwards_replay("stem", conf, x, w, b, dispatched, new_weights=True)


def test_each_worker_count_keeps_its_template_and_a_non_finite_weight_detours():
    """The rows' ranges depend on the workers: a template per count, each with the bits. A weight holding an inf or
    a NaN gives None (the stem loops skip tap rows that read padding, where the definition has 0 * inf), and the
    lane's dispatch the columns' result, NaNs where the definition has them."""
    xs, ws = (4, 3, 32, 32), (32, 3, 7, 7)
    p = make_params(xs, ws, stride=2, padding=3)
    x, w, b = float32_operands(xs, ws, 1)
    run = stem_quick.fprop_runner(p)
    with paths.force("stem"):
        want = validated(xconv.conv_fprop, x, w, bias=b, stride=2, padding=3, backend="numpy")
        plain = validated(xconv.conv_fprop, x, w, stride=2, padding=3, backend="numpy")
    assert plain.tobytes() != want.tobytes()
    for workers in (1, 2, 1, 2):
        assert run(x, w, b, workers).tobytes() == want.tobytes()
        assert run(x, w, None, workers).tobytes() == plain.tobytes()
    assert run(x.astype(np.float64), w, b, 2) is None                   # not the template's dtype
    assert run(np.asfortranarray(x), w, b, 2) is None                    # not C-contiguous
    assert run(np.concatenate([x, x])[:2], w, b, 2) is None              # not the configuration's shape
    for bad in (np.inf, np.nan):
        w2 = w.copy()
        w2[5, 1, 0, 0] = bad
        assert run(x, w2, b, 2) is None
        conf = lane_conf(2, 2, 3)
        lanes.clear()
        with paths.force("stem"):
            lanes.fprop(conf, x, w, b, conf.kwargs)                       # opens the lane (a public call)
            got = lanes.fprop(conf, x, w2, b, conf.kwargs)                # the lane's runner: None, then the dispatch
        exact = xconv.conv_fprop(x, w2, bias=b, stride=2, padding=3, backend="numpy-exact")
        assert np.isnan(exact[:, 5, 0, 0]).all()                          # the corner's tap reads the padding
        np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    lanes.clear()


def test_no_runner_off_the_stem_loops_or_in_another_dtype():
    assert stem_quick.fprop_runner(make_params((2, 16, 32, 32), (16, 16, 3, 3), padding=1)) is None   # 16 channels
    assert stem_quick.fprop_runner(make_params((2, 3, 32, 32), (16, 3, 3, 3), padding=1, dtype="float16")) is None
