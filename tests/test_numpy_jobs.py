"""C job lists (backends/xconv_numpy/jobs.py, csrc/jobs.c): the dense loops and the depthwise loops across channels
run their work as jobs, on torch's OpenMP team or on the Python workers; the bits never depend on which."""

import numpy as np
import pytest

import xconv
from xconv import plan_cache

from xconv.params import make_params
from xconv_numpy import dense, depthwise_cv, jobs, native, omp_team, paths
from xconv_numpy.grid.scratch import Lease

pytestmark = pytest.mark.skipif(native.library() is None or native.isa(native.library()) not in depthwise_cv.ISAS,
                                reason="the channel-vector loops run on the builds of depthwise_cv.ISAS only "
                                       "(this CPU or install has none)")

CASES = [  # (x shape, w shape, stride, padding, groups): dense 3x3, dense strided, depthwise small planes
    ((5, 32, 9, 8), (48, 32, 3, 3), 1, 1, 1),
    ((3, 64, 7, 7), (32, 64, 3, 3), 2, 1, 1),
    ((4, 96, 6, 6), (96, 1, 3, 3), 1, 1, 96),
    ((3, 48, 10, 8), (48, 1, 3, 3), 2, 1, 48),      # planes at most 8 wide: the channel-vector loops on every build
]


def _run(xs, ws, s, pad, g):
    plan_cache.clear()              # validated calls: the dispatch runs (a repeated one runs the plan's runner)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    y = xconv.conv_fprop(x, w, stride=s, padding=pad, groups=g, backend="numpy")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw, _ = xconv.convolution_backward(dy, x, w, stride=s, padding=pad, groups=g, backend="numpy",
                                           output_mask=(True, True, False))
    return y, dx, dw


def _bits(arrays):
    return [a.tobytes() for a in arrays]


@pytest.mark.parametrize("case", CASES)
def test_bits_are_the_same_on_one_thread_the_python_workers_and_the_openmp_team(case, monkeypatch):
    with paths.tune(parallel_min_work=1 << 62, team_min_work=1 << 62):
        one = _bits(_run(*case))
    with paths.tune(parallel_min_work=0, team_min_work=0):
        monkeypatch.setenv("XCONV_NUMPY_OPENMP", "0")           # Python workers, each one C call taking jobs
        assert omp_team.gomp_parallel_address() is None
        python_workers = _bits(_run(*case))
        monkeypatch.delenv("XCONV_NUMPY_OPENMP")
        torch = pytest.importorskip("torch", reason="torch's OpenMP team needs torch in the process")
        torch.set_num_threads(max(2, torch.get_num_threads()))
        if omp_team.gomp_parallel_address() is None:
            pytest.skip("torch's libgomp is not mapped in this process (a torch build without GNU OpenMP)")
        team = _bits(_run(*case))
    assert python_workers == one
    assert team == one


def test_the_depthwise_cases_run_the_channel_vector_loops(monkeypatch):
    calls = []
    real = depthwise_cv._gather
    monkeypatch.setattr(depthwise_cv, "_gather", lambda *a, **k: calls.append(1) or real(*a, **k))   # a spy
    for case in CASES[2:]:
        _run(*case)
    assert len(calls) == 4                                     # per case: the forward and dx


def test_phases_wait_across_many_jobs_and_threads():
    """16 samples in blocks of one: per block copy jobs, then the sums that wait for them; 1 to 4 threads (more
    than the CPUs) give the same bits."""
    rng = np.random.default_rng(1)
    p = make_params((16, 32, 6, 6), (32, 32, 3, 3), padding=((1, 1), (1, 1)))
    x = rng.standard_normal(p.input_shape).astype(np.float32)
    w = rng.standard_normal(p.weight_shape).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    results = []
    for threads in (1, 2, 3, 4):
        for budget in (1 << 30, 1):
            with Lease() as lease:
                results.append(_bits(dense.backward(dy, x, w, p, True, True, True, threads, budget, lease)))
    assert all(r == results[0] for r in results[0::2]) and all(r == results[1] for r in results[1::2])


def test_a_job_with_too_many_arguments_is_refused():
    with pytest.raises(ValueError, match="at most 20 arguments, given 21"):
        jobs.Jobs().add("dx_rows", *range(21))


def test_an_empty_list_runs_nothing():
    assert jobs.Jobs().run(2) == 0


@pytest.mark.parametrize("where", ["w", "dy", "x"])
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_channel_vector_loops_put_nan_and_inf_where_the_exact_path_does(where, value):
    """Padding terms are w * 0 (forward) and dy * 0 (weight gradient): NaN for an infinite or NaN factor on the exact
    path, so a non-finite weight next to padding makes the forward NaN there, and a non-finite dy makes dw NaN."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 32, 5, 6)).astype(np.float32)
    w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 32, 5, 6)).astype(np.float32)
    if where == "w":
        w[3, 0, 0, 0] = value                  # the top-left tap: it meets padding on the first row and column
    else:
        {"dy": dy, "x": x}[where][1, 3, 0, 0] = value       # a corner position
    got, want = [], []
    for backend, out in (("numpy", got), ("numpy-exact", want)):
        out.append(xconv.conv_fprop(x, w, padding=1, groups=32, backend=backend))
        out.extend(xconv.convolution_backward(dy, x, w, padding=1, groups=32, backend=backend,
                                              output_mask=(True, True, False))[:2])
    for g, e in zip(got, want):
        assert np.array_equal(np.isnan(g), np.isnan(e)) and np.array_equal(np.isinf(g), np.isinf(e))
        finite = np.isfinite(e)
        np.testing.assert_allclose(g[finite], e[finite], rtol=1e-4, atol=1e-4)


def _copy_template(n_rows: int, row: int):
    """A template of taps_last copy jobs (dense_weights._taps_last_rows: whole blocks of 16 positions) moving a (4, n_rows, row) float32 array's taps
    last, with its source and destination as bases 0 and 1, and the arrays it was made on."""
    rng = np.random.default_rng(3)
    src = rng.standard_normal((1, 4, n_rows, row)).astype(np.float32)
    dst = np.empty((1, n_rows, row, 4), np.float32)
    rows, _ = dense._taps_last_rows(src, dst, 2)
    made = jobs.Jobs()
    made.rows("taps_last", rows)
    return made.template({0: 0, 3: 1}, (native.address(src), native.address(dst))), src, dst


@pytest.mark.skipif(jobs._template_run() is None, reason="no compiled loops here")
def test_a_template_runs_in_one_c_call_with_the_python_routes_bits(monkeypatch):
    """Template.run's C route (csrc/template_run.c: the table copied and filled from the arrays' buffers, the jobs
    run) writes what the Python route writes, on 1 and 2 threads, with the bases given as arrays, ints or None
    (an unused base), for new arrays at new addresses each call; with no team usable here for two threads it
    declines (-2) and the Python workers run the same jobs."""
    template, src, dst = _copy_template(24, 40)
    want = np.ascontiguousarray(src.transpose(0, 2, 3, 1))
    for threads in (1, 2):
        for as_ints in (False, True):
            s2 = src + np.float32(threads)                # new arrays: the template's offsets from new bases
            d2 = np.full_like(dst, np.nan)
            bases = (native.address(s2), native.address(d2)) if as_ints else (s2, d2)
            template.run(bases, threads)
            np.testing.assert_array_equal(d2, want + np.float32(threads))
    monkeypatch.setattr(omp_team, "team_functions", lambda: (None, None))
    fn = jobs._template_run()
    d3 = np.full_like(dst, np.nan)
    assert fn(template.table, template.flat, template.flat_base, (src, d3), 2, 0, None, None) == -2
    assert np.isnan(d3).all()                                 # declined: nothing ran
    template.run((src, d3), 2)                                # the Python workers
    np.testing.assert_array_equal(d3, want)
    monkeypatch.setattr(jobs, "_template_run", lambda: None)   # the Python route alone, the same bits
    d4 = np.full_like(dst, np.nan)
    template.run((src, d4), 2)
    np.testing.assert_array_equal(d4, want)


@pytest.mark.skipif(jobs._template_run() is None, reason="no compiled loops here")
def test_a_template_refuses_bases_it_cannot_read_before_running_anything():
    """A base that is neither an array (a buffer of one dimension or more), an int nor None (a NumPy integer scalar
    offers a 0-d buffer of its own object: refused, not taken as an address), or a table of another size: a Python
    exception, nothing run, nothing leaked (the C call releases every buffer it took). Any number of bases is taken
    (the dense backward at 64 stride phases hands over 74)."""
    template, src, dst = _copy_template(5, 16)
    out = np.full_like(dst, np.nan)
    with pytest.raises(TypeError):
        template.run((src, "not an array"), 1)
    with pytest.raises(TypeError, match="not a 0-d"):
        template.run((src, np.int64(native.address(out))), 1)
    with pytest.raises(TypeError, match="not a 0-d"):
        template.run((np.array(1.0, np.float32), out), 1)
    fn = jobs._template_run()
    with pytest.raises(ValueError, match="item size"):
        fn(template.table[:, :5].copy(), template.flat, template.flat_base, (src, out), 1, 0, None, None)
    with pytest.raises(IndexError, match="out of the table"):
        fn(template.table, template.flat + 10 ** 6, template.flat_base, (src, out), 1, 0, None, None)
    with pytest.raises(ValueError, match="differ in length"):
        fn(template.table, template.flat, template.flat_base[:-1].copy(), (src, out), 1, 0, None, None)
    assert np.isnan(out).all()
    template.run((src, out) + (None,) * 100, 1)       # bases past the template's are read and not used
    np.testing.assert_array_equal(out, src.transpose(0, 2, 3, 1))


@pytest.mark.skipif(native.library() is None or not dense.available(), reason="the dense loops are not built here")
def test_a_dense_call_of_many_stride_phases_runs_its_template(monkeypatch):
    """The dense backward hands its template 10 bases and one weight copy per stride phase: at stride 8x8 (64 phases,
    the most dense.computes takes) 74 bases, with the bits of the Python route."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 32, 32, 32)).astype(np.float32)
    w = rng.standard_normal((32, 32, 8, 8)).astype(np.float32)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, stride=8)).astype(np.float32)
    with paths.force("dense"), xconv.trace() as t:
        got = xconv.convolution_backward(dy, x, w, stride=8, output_mask=(True, True, False), backend="numpy")
    assert t.records[-1].path.startswith("dense"), t.records[-1].path
    monkeypatch.setattr(jobs, "_template_run", lambda: None)          # the Python route
    with paths.force("dense"):
        want = xconv.convolution_backward(dy, x, w, stride=8, output_mask=(True, True, False), backend="numpy")
    assert [a.tobytes() for a in got[:2]] == [a.tobytes() for a in want[:2]]
