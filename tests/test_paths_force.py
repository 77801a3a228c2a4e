"""paths.force and paths.tune, the public ways to pick a NumPy path and set how it runs: what they accept, what
they refuse, how nested blocks combine, and that a forced path that cannot compute a call is passed over."""

import numpy as np
import pytest

import xconv
from xconv.params import make_params
from xconv_numpy import paths, tuning


def _arrays(xs=(2, 3, 7, 7), ws=(4, 3, 3, 3), **kw):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    return x, w, rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)


def _paths_run(fn):
    with xconv.trace() as t:
        fn()
    return [part.split(":")[0] for r in t.records for part in r.path.split(" + ")]


def test_a_forced_path_that_cannot_compute_the_call_is_passed_over():
    """colgemm's columns must fit its memory contract: where they do not, forcing it is no crash, another path
    runs (the trace says which)."""
    x, w, dy = _arrays(padding=1)
    with paths.force("colgemm"):
        ran = _paths_run(lambda: (xconv.conv_fprop(x, w, padding=1),
                                  xconv.convolution_backward(dy, x, w, padding=1)))
    assert ran and all(name in paths.PATHS for name in ran)
    with paths.force("small-c"):                        # stride 2: the C grid loops serve stride 1 only
        x2, w2, dy2 = _arrays(stride=2, padding=1)
        ran = _paths_run(lambda: xconv.convolution_backward(dy2, x2, w2, stride=2, padding=1))
    assert "small-c" not in ran and ran[-1] == "bias-sum"


def test_bias_sum_and_unknown_names_are_refused_by_name():
    with pytest.raises(ValueError, match=r"grad_bias always runs bias-sum"):
        with paths.force("bias-sum"):
            pass
    with pytest.raises(ValueError, match=r"unknown path\(s\) \['grid-c'\].*groups: \['small-paths'\]"):
        with paths.force("grid-c"):
            pass


def test_off_takes_a_name_or_a_list():
    x, w, dy = _arrays(padding=1)
    for off in ("small-paths", ["small-paths"]):
        with paths.force(off=off):
            ran = _paths_run(lambda: xconv.convolution_backward(dy, x, w, padding=1))
        assert not set(ran) & set(paths.GROUPS["small-paths"]), ran


def test_nested_blocks_combine():
    """The inner block's names first, then the outer's; ``off`` gathers both; without_cost_model survives an inner
    force."""
    x, w, dy = _arrays(padding=1)
    with paths.force(off=["small-paths"]), paths.force("dense"):      # dense cannot (3 channels): still no small
        ran = _paths_run(lambda: xconv.convolution_backward(dy, x, w, padding=1))
    assert not set(ran) & set(paths.GROUPS["small-paths"]), ran
    with paths.force("grid-b"), paths.force("dense"):                 # dense cannot: the outer grid-b can
        ran = _paths_run(lambda: xconv.convolution_backward(dy, x, w, padding=1))
    assert ran == ["grid-b", "bias-sum"], ran
    with paths.without_cost_model(), paths.force(off=["pointwise"]):
        with xconv.trace() as t:
            xconv.convolution_backward(dy, x, w, padding=1)
    assert "cost model" not in t.records[0].path, t.records[0].path
    assert paths._state() == ((), ())


@pytest.mark.parametrize("knobs", [dict(chunk_bytes=-5), dict(chunk_bytes=(10, 1)), dict(implicit_outer="yes"),
                                   dict(parallel_min_work=-1), dict(depthwise_small_work=1.5)])
def test_tune_refuses_values_of_the_wrong_kind(knobs):
    (name,) = knobs
    with pytest.raises(ValueError, match=f"tuning knob {name}: expected"):
        with paths.tune(**knobs):
            pass
    assert tuning.get(name) == tuning.KNOBS[name][0]


def test_tune_applies_to_calls_in_the_block_and_then_not():
    """chunk_bytes (1, 200): the grid's chunks hold a few lines (less scratch), so grad_weight sums other partials:
    the same values within float32 rounding, and the default's bits again after the block."""
    x, w, dy = _arrays((2, 8, 12, 12), (8, 8, 3, 3), padding=1)
    with paths.force("grid-a"), xconv.trace() as t:
        base = xconv.convolution_backward(dy, x, w, padding=1)
        with paths.tune(chunk_bytes=(1, 200)):
            tuned = xconv.convolution_backward(dy, x, w, padding=1)
        again = xconv.convolution_backward(dy, x, w, padding=1)
    used = [r.workspace_bytes for r in t.records]
    assert used[1] < used[0] == used[2], used                  # smaller chunks: less scratch
    assert all(a.tobytes() == b.tobytes() for a, b in zip(base, again))
    for a, b in zip(base, tuned):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("forced, xs, ws, kw", [("pointwise", (4, 32, 9, 9), (16, 32, 1, 1), {}),
                                                ("grid-a", (3, 8, 11, 10), (8, 8, 3, 3), dict(padding=1)),
                                                ("colgemm", (4, 64, 6, 6), (64, 64, 3, 3), dict(padding=1))])
def test_calls_below_parallel_min_work_run_alone_with_the_same_bits(forced, xs, ws, kw):
    """fast._share: below the knob a call runs on the calling thread alone; its bits are those of the pool's run."""
    x, w, dy = _arrays(xs, ws, **kw)
    runs = []
    for knob in (None, 0):
        with paths.force(forced), paths.tune(**({} if knob is None else {"parallel_min_work": knob})):
            runs.append((xconv.conv_fprop(x, w, **kw), *xconv.convolution_backward(dy, x, w, **kw)))
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


def test_a_lane_runner_declines_exactly_where_this_threads_forcing_state_differs():
    """A lane's runner (backend.lane) holds the forcing state it was made under and declines (NotImplemented: the lane
    then calls the primitive, which chooses again) wherever this thread's state differs; a block open in another
    thread changes nothing here, and :func:`paths.unforced` reads the count of open blocks, not a stale one."""
    import threading

    from xconv_numpy import lane_runner

    p = make_params((2, 16, 6, 6), (16, 16, 3, 3), padding=1)
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 6, 6), (16, 16, 3, 3)))
    plain = lane_runner.runner(p, "fprop")
    assert paths._open_blocks[0] == 0 and paths.unforced()
    assert plain(x, w, None) is not NotImplemented
    with paths.force("columns"):
        assert not paths.unforced()
        assert plain(x, w, None) is NotImplemented
        forced = lane_runner.runner(p, "fprop")
        assert forced(x, w, None) is not NotImplemented
    assert paths._open_blocks[0] == 0 and forced(x, w, None) is NotImplemented
    with paths.without_cost_model():
        assert plain(x, w, None) is NotImplemented
    inside, leave = threading.Event(), threading.Event()

    def other():
        with paths.force("columns"):
            inside.set()
            leave.wait(10)
    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(10)
        assert paths._open_blocks[0] == 1 and paths.unforced()      # the other thread's block, not this thread's
        assert plain(x, w, None) is not NotImplemented
        assert forced(x, w, None) is NotImplemented
    finally:
        leave.set()
        t.join()
    assert paths._open_blocks[0] == 0
