"""xconv_numpy.dense_quick: a lane's repeated dense calls run the job template kept by the first, with the public
call's bits; every call that is not the template's (another layout, non-finite weights, another worker count or
budget) falls back to the full decisions, with their bits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import threadpoolctl

import xconv
from xconv import lanes, plan_cache, torch_ops
from xconv.params import make_params
from xconv_numpy import dense, dense_quick, paths, tuning

pytestmark = pytest.mark.skipif(not dense.available(), reason=f"compiled loops unavailable: {dense.build_error()}")

MASKS = [m for m in itertools.product((True, False), repeat=3) if any(m)]
#: (input, weight, stride, padding, dilation, groups): 2-D, 3-D, 1-D, groups, dilation, a strided backward
CASES = [((2, 32, 9, 9), (48, 32, 3, 3), 1, 1, 1, 1), ((2, 16, 3, 6, 6), (32, 16, 3, 3, 3), 1, 1, 1, 1),
         ((3, 32, 20), (16, 32, 5), 1, 2, 1, 1), ((2, 64, 7, 7), (64, 32, 3, 3), 1, 1, 1, 2),
         ((2, 32, 12, 12), (32, 32, 3, 3), 1, 0, 2, 1), ((2, 32, 12, 12), (32, 32, 3, 3), 2, 1, 1, 1)]


def _conf(nd, stride, padding, dilation, groups):
    return torch_ops.Conf((stride,) * nd, ((padding, padding),) * nd, (dilation,) * nd, groups, False, (0,) * nd,
                          False, "keep_dtype", "numpy")


def _data(xs, ws, stride, padding, dilation, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    ys = xconv.output_shape(xs, ws, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return x, w, b, rng.standard_normal(ys, dtype=np.float32)


@pytest.fixture
def quick_runs(monkeypatch):
    """The calls a quick runner served (its result not None), by (need_dx, need_dw, flip)."""
    lanes.clear()
    served = []
    real = dense_quick.runner

    def counted(p, need_dx, need_dw, flip=False):
        run = real(p, need_dx, need_dw, flip)
        if run is None:
            return None

        def counting(*args):
            out = run(*args)
            if out is not None:
                served.append((need_dx, need_dw, flip))
            return out
        return counting
    monkeypatch.setattr(dense_quick, "runner", counted)
    yield served
    lanes.clear()


def _bits(results):
    return [None if r is None else (r.dtype.str, r.shape, r.tobytes()) for r in results]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-s{c[2]}")
def test_repeated_calls_have_the_public_calls_bits(case, quick_runs):
    """Forward (with and without bias) and every mask, the dense loops forced (lanes opened inside paths.force keep
    that choice): the public call's bits on every repeated call, the template runners serving them."""
    with paths.force("dense"):
        _repeat_and_compare(case, quick_runs)


def _repeat_and_compare(case, quick_runs):
    xs, ws, stride, padding, dilation, groups = case
    conf = _conf(len(xs) - 2, stride, padding, dilation, groups)
    x, w, b, dy = _data(*case)
    want_y = [xconv.conv_fprop(x, w, bias=bias, **conf.kwargs()) for bias in (None, b)]
    want_g = {m: xconv.convolution_backward(dy, x, w, bias_sizes=[ws[0]], output_mask=m, **conf.kwargs())
              for m in MASKS}
    for _ in range(3):
        for bias, want in zip((None, b), want_y):
            assert lanes.fprop(conf, x, w, bias, conf.kwargs).tobytes() == want.tobytes()
        for m in MASKS:
            got = lanes.backward(conf, dy, x, w, [ws[0]], m, conf.kwargs)
            assert _bits(got) == _bits(want_g[m]), m
    backward_runs = {(gx, gw) for gx, gw, flip in quick_runs if not flip}
    # every mask's dense run; dx at stride 2 has a job list per phase (its weights copied before, not among its jobs)
    assert backward_runs == ({(True, True), (True, False), (False, True)} if stride == 1 else {(False, True)})
    assert ((True, False, True) in quick_runs) == (stride == 1)                    # the stride-1 forward


def test_calls_that_are_not_the_templates_take_the_full_path(quick_runs):
    """Fortran-ordered weights, a non-contiguous dy, weights holding a NaN or an infinity: the runner declines and the
    call runs as the public call does, with its bits (NaN where the definition has them)."""
    case = CASES[0]
    conf = _conf(2, *case[2:])
    x, w, b, dy = _data(*case)
    for _ in range(2):                                   # the lanes and their templates
        lanes.fprop(conf, x, w, b, conf.kwargs)
        lanes.backward(conf, dy, x, w, [case[1][0]], (True, True, True), conf.kwargs)
    served = len(quick_runs)
    bad_inf, bad_nan = w.copy(), w.copy()
    bad_inf[3, 5, 0, 2], bad_nan[7, 1, 1, 1] = np.inf, np.nan
    dy_strided = np.repeat(dy, 2, axis=-1)[..., ::2]
    for wv, dyv in ((np.asfortranarray(w), dy), (w, dy_strided), (bad_inf, dy), (bad_nan, dy)):
        plan_cache.clear()                               # want: validated calls, the dispatch (not a plan's runner)
        want_y = xconv.conv_fprop(x, wv, bias=b, **conf.kwargs())
        plan_cache.clear()
        want_g = xconv.convolution_backward(dyv, x, wv, bias_sizes=[case[1][0]], output_mask=(True, True, True),
                                            **conf.kwargs())
        assert lanes.fprop(conf, x, wv, b, conf.kwargs).tobytes() == want_y.tobytes()
        got = lanes.backward(conf, dyv, x, wv, [case[1][0]], (True, True, True), conf.kwargs)
        assert _bits(got) == _bits(want_g)
    assert np.isnan(want_y).any() and not np.isnan(xconv.conv_fprop(x, w, **conf.kwargs())).any()
    assert len(quick_runs) == served + 1     # only the non-contiguous dy's forward (x, w as the template's) was served


def test_another_worker_count_or_budget_runs_its_own_template(quick_runs):
    """The templates are kept per worker count and working-set budget: a call with another worker count (BLAS
    threads) makes its own first, by the full path; a budget that splits the samples into blocks (the chunk_bytes
    knob) has no template, so the runner declines every call and the full path runs them. Each with the public call's
    bits in the same setting (the worker count changes no bit; the budget sets dW's blocks of samples, so the knob
    may)."""
    case = ((4, 32, 10, 10), (32, 32, 3, 3), 1, 1, 1, 1)
    conf = _conf(2, *case[2:])
    x, w, b, dy = _data(*case)
    for threads, knobs in ((1, {}), (2, {}), (2, {"chunk_bytes": (4096, 8192)}), (1, {})):
        with threadpoolctl.threadpool_limits(threads), tuning.tuned(**knobs):
            want_y = xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
            want_g = xconv.convolution_backward(dy, x, w, bias_sizes=[32], output_mask=(True, True, True),
                                                **conf.kwargs())
            for _ in range(2):
                assert lanes.fprop(conf, x, w, b, conf.kwargs).tobytes() == want_y.tobytes()
                got = lanes.backward(conf, dy, x, w, [32], (True, True, True), conf.kwargs)
                assert _bits(got) == _bits(want_g)
    assert len(quick_runs) >= 2 * 3           # the second call of each unblocked setting, forward and backward


def test_no_runner_under_a_workspace_limit_or_outside_float32():
    limited = make_params((2, 32, 8, 8), (32, 32, 3, 3), padding=1, workspace_limit=1 << 30)
    assert dense_quick.runner(limited, True, True) is None
    half = make_params((2, 32, 8, 8), (32, 32, 3, 3), padding=1, dtype="float16")
    assert dense_quick.runner(half, True, True) is None
    plain = make_params((2, 32, 8, 8), (32, 32, 3, 3), padding=1)
    assert dense_quick.runner(plain, True, False) is not None and dense_quick.runner(plain, False, False) is None


@pytest.mark.parametrize("groups", [1, 2])
def test_repeated_pointwise_calls_skip_the_dispatch_with_its_bits(groups, monkeypatch):
    """A 1x1 layer's repeated calls run the pointwise sgemm jobs from the lane's runner (not through the path
    dispatch, which calls pointwise_planned.fprop / .backward per call): the public call's bits, every mask."""
    from xconv_numpy import jobs
    from xconv_numpy.grid import pointwise_planned
    if not jobs.sgemm_available():
        pytest.skip("NumPy's ILP64 cblas_sgemm not found: the pointwise path runs its chunks")
    lanes.clear()
    with paths.force("pointwise"):                     # lanes opened inside keep that choice
        conf = _conf(2, 1, 0, 1, groups)
        x, w, b, dy = _data((8, 32, 6, 6), (48, 32 // groups, 1, 1), 1, 0, 1, groups)
        want_y = xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
        want_g = {m: xconv.convolution_backward(dy, x, w, bias_sizes=[48], output_mask=m, **conf.kwargs())
                  for m in MASKS}
        lanes.fprop(conf, x, w, b, conf.kwargs)
        for m in MASKS:
            lanes.backward(conf, dy, x, w, [48], m, conf.kwargs)
        dispatched = []
        for name in ("fprop", "backward"):
            real = getattr(pointwise_planned, name)
            monkeypatch.setattr(pointwise_planned, name,
                                lambda *a, _real=real, _n=name: dispatched.append(_n) or _real(*a))
        for _ in range(2):
            assert lanes.fprop(conf, x, w, b, conf.kwargs).tobytes() == want_y.tobytes()
            for m in MASKS:
                assert _bits(lanes.backward(conf, dy, x, w, [48], m, conf.kwargs)) == _bits(want_g[m]), m
        assert dispatched == []
        with xconv.trace() as t:
            xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
        assert t.records[-1].path.startswith("pointwise") and dispatched == ["fprop"]
    lanes.clear()


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: f"{c[0]}")
def test_the_runner_hands_the_kept_template_its_own_key_and_bases(case, monkeypatch):
    """The runner writes dense._kept_template's lookup in line (its key, its bases in order): each repeated call runs
    the very template the dispatch kept, with bases of the same kinds in the same places as the dispatch's
    (a template given another array in a place would read or write the wrong memory)."""
    from xconv_numpy import jobs

    runs = []
    real = jobs._execute_template
    kinds = lambda bases: [None if b is None else (type(b).__name__, getattr(b, "shape", None)) for b in bases]

    def checked(t, bases, *args):                # compared before the template runs: a wrong base would corrupt memory
        runs.append((t, bases))
        if len(runs) == 2:
            assert runs[1][0] is runs[0][0] and kinds(runs[1][1]) == kinds(runs[0][1])
        return real(t, bases, *args)
    monkeypatch.setattr(jobs, "_execute_template", checked)
    xs, ws, stride, padding, dilation, groups = case
    conf = _conf(len(xs) - 2, stride, padding, dilation, groups)
    x, w, _, dy = _data(*case)
    lanes.clear()
    with paths.force("dense"):
        for call in [lambda: lanes.fprop(conf, x, w, None, conf.kwargs)] + [
                lambda m=m: lanes.backward(conf, dy, x, w, None, m, conf.kwargs) for m in MASKS if not m[2]]:
            runs.clear()
            call()                                   # the public call: the dispatch (its template kept)
            call()                                   # the lane's: the runner
            assert len(runs) == 2
    lanes.clear()
