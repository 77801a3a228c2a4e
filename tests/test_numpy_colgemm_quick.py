"""xconv_numpy.colgemm_quick: a lane's repeated colgemm forwards run the job template kept by the first call, with
the public call's bits (channel-major and direct routes, one-tap, groups, 1-D/2-D/3-D, bias); calls that are not the
template's (another layout, another worker count, a configuration in chunks) take the full path, with its bits."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import (assert_lane_forwards_replay, count_dispatches, float32_operands, fresh_scratch,
                          lane_conf, validated)
from xconv import lanes
from xconv.params import make_params
from xconv_numpy import blas, colgemm, colgemm_quick, jobs, lane_runner, paths

pytestmark = pytest.mark.skipif(not jobs.sgemm_available(),
                                reason="no compiled loops, or NumPy's BLAS is not an ILP64 OpenBLAS: colgemm builds "
                                       "no job lists")

#: (input, weight, stride, padding, groups): a deep 3x3 (channel-major), a 1x1 stride-2 shortcut and a long 1-D layer
#: (direct), a 1x1 at stride 1 (one tap: the columns are x's rows), groups, a 3-D layer.
CASES = [((8, 128, 4, 4), (128, 128, 3, 3), 1, 1, 1), ((2, 32, 24, 24), (48, 32, 1, 1), 2, 0, 1),
         ((2, 64, 600), (64, 64, 3), 2, 1, 1), ((4, 48, 5, 5), (40, 48, 1, 1), 1, 0, 1),
         ((2, 64, 4, 4), (128, 16, 3, 3), 1, 1, 4), ((1, 32, 2, 4, 4), (64, 32, 3, 3, 3), 1, 1, 1)]


@pytest.fixture
def dispatched(monkeypatch):
    """The calls that reached colgemm.fprop (the full path), counted."""
    lanes.clear()
    yield count_dispatches(monkeypatch, colgemm, "fprop", at=-2)
    lanes.clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0]) - 2}d-{c[1][2:]}-s{c[2]}-g{c[4]}")
def test_repeated_forwards_skip_the_dispatch_with_the_public_calls_bits(case, dispatched):
    xs, ws, s, pad, g = case
    conf = lane_conf(len(xs) - 2, s, pad, g)
    x, w, b = float32_operands(xs, ws)
    p = make_params(xs, ws, stride=s, padding=pad, groups=g)
    assert len(colgemm._forward_chunks(p)[0]) == 1
    assert colgemm._direct(p) == (case in (CASES[1], CASES[2]))
    assert_lane_forwards_replay("colgemm", conf, x, w, b, dispatched)


def test_each_worker_count_keeps_its_template():
    """The column copies' ranges and the threads depend on the workers: a template per count, each with the bits."""
    xs, ws = (8, 128, 4, 4), (128, 128, 3, 3)
    p = make_params(xs, ws, padding=1)
    x, w, b = float32_operands(xs, ws, 1)
    run = colgemm_quick.fprop_runner(p)
    with paths.force("colgemm"):
        want = validated(xconv.conv_fprop, x, w, bias=b, padding=1, backend="numpy")
    stash = []
    for workers in (1, 2, 1, 2):
        fresh_scratch(stash)
        with blas.single_threaded_blas():       # as a lane runs it (lane_runner._pinned): OpenBLAS's threaded
            got = run(x, w, b, workers)        # sgemm may sum in another order (Haswell kernel, Zen 3)
        assert got.tobytes() == want.tobytes()
    assert run(x.astype(np.float64), w, b, 2) is None


def test_no_runner_for_calls_in_chunks_or_off_the_jobs():
    chunked = make_params((2, 256, 14, 14), (256, 256, 3, 3), padding=1)
    assert len(colgemm._forward_chunks(chunked)[0]) > 1
    x, w, b = float32_operands((2, 256, 14, 14), (256, 256, 3, 3))
    assert colgemm_quick.fprop_runner(chunked)(x, w, b, 2) is None
    half = make_params((2, 8, 6, 6), (8, 8, 3, 3), padding=1, dtype="float16")
    assert colgemm_quick.fprop_runner(half)(x, w, b, 2) is None
    unfit = make_params((1, 4, 8, 8), (4, 4, 3, 3), padding=1)          # colgemm's columns do not fit its contract
    assert not colgemm.fits(unfit, False, False, True) and colgemm_quick.fprop_runner(unfit) is colgemm_quick._never
    assert lane_runner._quick_fprop(paths.PATHS["colgemm"], chunked) is None     # no wrapper: the dispatch at once


@pytest.fixture
def dispatched_backward(monkeypatch):
    """The calls that reached colgemm.backward (the full path), counted."""
    lanes.clear()
    yield count_dispatches(monkeypatch, colgemm, "backward")
    lanes.clear()


MASKS = [(True, True, False), (True, False, False), (False, True, False), (True, True, True)]


@pytest.mark.parametrize("case", CASES + [((8, 128, 8, 8), (256, 128, 3, 3), 2, 1, 1)],
                         ids=lambda c: f"{len(c[0]) - 2}d-{c[1][2:]}-s{c[2]}-g{c[4]}")
def test_repeated_backwards_skip_the_dispatch_with_the_public_calls_bits(case, dispatched_backward):
    """Every mask of a one-chunk colgemm backward, repeated with new data and the scratch at new addresses, runs the
    kept templates (dW's, then dx's: colgemm.backward is not reached) with the public call's bits; another layout of
    dy, or a trace open, takes the full path."""
    xs, ws, s, pad, g = case
    conf = lane_conf(len(xs) - 2, s, pad, g)
    p = make_params(xs, ws, stride=s, padding=pad, groups=g)
    chunks, by, _ = colgemm._backward_chunks(p)
    assert by == "samples" and len(chunks) == 1
    x, w, _ = float32_operands(xs, ws)
    rng = np.random.default_rng(5)
    dys = [rng.standard_normal(p.output_shape, dtype=np.float32) for _ in range(3)]
    stash = []
    with paths.force("colgemm"):
        for mask in MASKS:
            bias = [ws[0]] if mask[2] else None
            want = [validated(xconv.convolution_backward, dy, x + np.float32(i), w - np.float32(i), bias_sizes=bias,
                                               output_mask=mask, **conf.kwargs()) for i, dy in enumerate(dys)]
            lanes.backward(conf, dys[0], x, w, bias, mask, conf.kwargs)          # opens the lane (a public call)
            dispatched_backward.clear()
            for i, (dy, wants) in enumerate(zip(dys, want)):
                fresh_scratch(stash)
                got = lanes.backward(conf, dy, x + np.float32(i), w - np.float32(i), bias, mask, conf.kwargs)
                assert [None if a is None else a.tobytes() for a in got] == \
                       [None if a is None else a.tobytes() for a in wants], mask
            assert dispatched_backward == [], mask
        mask = (True, True, False)
        want = validated(xconv.convolution_backward, dys[0], x, w, output_mask=mask, **conf.kwargs())
        dispatched_backward.clear()
        dy2 = np.asfortranarray(dys[0])                # another layout: the full path, its bits
        got = lanes.backward(conf, dy2, x, w, None, mask, conf.kwargs)
        assert [a.tobytes() for a in got[:2]] == [a.tobytes() for a in want[:2]]
        assert dispatched_backward == [xs]
        with xconv.trace() as t:
            lanes.backward(conf, dys[0], x, w, None, mask, conf.kwargs)
        assert t.records[-1].path.startswith("colgemm")


def test_each_worker_count_and_mask_keeps_its_backward_templates():
    """The threads and the column copies' ranges depend on the workers: templates per (workers, mask), each with the
    dispatch's bits; another dtype, or a configuration in chunks, has none."""
    xs, ws = (8, 128, 4, 4), (128, 128, 3, 3)
    p = make_params(xs, ws, padding=1)
    x, w, _ = float32_operands(xs, ws, 1)
    dy = np.random.default_rng(2).standard_normal(p.output_shape, dtype=np.float32)
    run = colgemm_quick.backward_runner(p)
    stash = []
    for need_dx, need_dw in ((True, True), (True, False), (False, True)):
        with paths.force("colgemm"):
            want = validated(xconv.convolution_backward, dy, x, w, padding=1, output_mask=(need_dx, need_dw, False),
                                              backend="numpy")
        for workers in (1, 2, 1, 2):
            fresh_scratch(stash)
            with blas.single_threaded_blas():   # as a lane runs it (see test_each_worker_count_keeps_its_template)
                got = run(dy, x, w, need_dx, need_dw, workers)
            assert [None if a is None else a.tobytes() for a in got] == \
                   [None if a is None else a.tobytes() for a in want[:2]]
    assert run(dy.astype(np.float64), x, w, True, True, 2) is None
    chunked = make_params((2, 256, 14, 14), (256, 256, 3, 3), padding=1)
    assert colgemm._backward_chunks(chunked)[1] == "channels" or len(colgemm._backward_chunks(chunked)[0]) > 1
    assert colgemm_quick.backward_runner(chunked) is colgemm_quick._never_backward
    half = make_params((2, 8, 6, 6), (8, 8, 3, 3), padding=1, dtype="float16")
    assert colgemm_quick.backward_runner(half) is colgemm_quick._never_backward
