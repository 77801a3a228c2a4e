"""The NumPy backend's compiled direct loops (xconv_numpy.dense, csrc/direct_conv.c) against the
float64 oracle and PyTorch.

They serve stride-1 convolutions whose channels per group are multiples of 16, which the small
channel counts of test_numpy_fast.py never reach: here hypothesis draws such convolutions over
the rest of the parameter space (1-3 dims, kernels, dilation, asymmetric padding, groups, dtypes,
masks, layouts, transposed ones through the core's mapping); plus proof that the loops ran, the
fallback to the BLAS path, bitwise independence from the worker count, and a failed build.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from threadpoolctl import threadpool_limits

import xconv
from xconv import plan_cache
from xconv.params import make_params

from core_helpers import count_calls, load_avx2_build  # noqa: E402
from test_numpy_fast import compare, compare_on_poisoned_scratch, random_arrays  # noqa: E402

from xconv_numpy import dense, dense_plan, native, paths
from xconv_numpy.grid.scratch import Lease  # noqa: E402
from xconv_numpy.jobs import Jobs  # noqa: E402
from xconv_numpy.workers import even_ranges  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not dense.available(),
                                reason=f"compiled loops unavailable: {dense.build_error()}")


@st.composite
def convolutions(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 2))
    cg, cog = draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32]))
    kernel = [draw(st.integers(1, 3 if nd == 3 else 4)) for _ in range(nd)]
    stride = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(nd)]
    if all(k == 1 for k in kernel):
        kernel[-1] = 2
    dilation = [draw(st.integers(1, 3)) for _ in range(nd)]
    padding = [(draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd)]
    max_side = {1: 20, 2: 7, 3: 4}[nd]
    spatial = []
    for i in range(nd):
        need = dilation[i] * (kernel[i] - 1) + 1 - sum(padding[i])
        spatial.append(draw(st.integers(max(1, need), max(max_side, need))))
    transposed = draw(st.integers(0, 4)) == 0
    c_in, c_out = groups * cg, groups * cog
    weight = [c_in, cog, *kernel] if transposed else [c_out, cg, *kernel]
    if transposed:
        padding = [(0, 0)] * nd
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16"]))
    mask = draw(st.sampled_from([(True, True, True), (True, False, False), (False, True, False), (False, True, True)]))
    layout = draw(st.sampled_from(["contiguous", "contiguous", "transposed", "sliced"]))
    if transposed:
        stride = [1] * nd
    return dict(input=[draw(st.integers(1, 3)), c_in, *spatial], weight=weight, stride=stride, padding=padding,
                dilation=dilation, groups=groups, transposed=transposed, output_padding=[0] * nd,
                dtype=dtype), mask, layout


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1))
@example(conv=({"input": [1, 16, 1, 2], "weight": [16, 16, 1, 2], "stride": [1, 1],     # fewer x positions (2)
                "padding": [(0, 2), (0, 0)], "dilation": [1, 1], "groups": 1,         # than copy tasks (3):
                "transposed": False, "output_padding": [0, 0], "dtype": "float32"},   # an empty task range
               (True, True, True), "contiguous"), seed=0)
def test_compiled_matches_exact(conv, seed, monkeypatch):   # one patch for all examples: strides too
    """Scratch (kept between calls) arrives filled with 3e38: the grids' padding must be zeroed, every
    result element written."""
    with paths.force("dense"):
        compare_on_poisoned_scratch(monkeypatch, conv, seed)


def test_compiled_loops_run_for_what_they_compute(monkeypatch):
    """Eligible convolutions go to the loops; XCONV_NUMPY_C=0, float64, 8 channels or 1x1 do not; by default
    strides only up to 2 and with 32k input channels per group."""
    calls = count_calls(monkeypatch, dense, "backward")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 9, 9)).astype(np.float32)
    w = rng.standard_normal((16, 32, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
    with paths.without_cost_model():                 # the rule "dense C loops serve" (the cost model may pick others)
        a = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy")
    assert len(calls) == 1
    monkeypatch.setenv("XCONV_NUMPY_C", "0")
    with paths.without_cost_model():
        b = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy")
    assert len(calls) == 1
    for u, v in zip(a, b):       # two float32 computations of the same sums
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv("XCONV_NUMPY_C")
    assert dense.computes(make_params(x.shape, w.shape, padding=1))
    assert dense.computes(make_params(x.shape, w.shape, padding=1, stride=2))
    assert dense.serves(make_params(x.shape, w.shape, padding=1, stride=2))       # 32 channels, stride 2
    assert not dense.serves(make_params(x.shape, w.shape, padding=1, stride=3))   # stride 3: BLAS by default
    assert dense.serves(make_params((2, 16, 9, 9), (16, 16, 3, 3), padding=1, stride=2))       # 16 channels too
    assert not dense.computes(make_params(x.shape, w.shape, padding=1, dtype="float64"))
    assert not dense.computes(make_params((2, 8, 9, 9), (16, 8, 3, 3), padding=1))
    assert not dense.computes(make_params(x.shape, (16, 32, 1, 1)))


def test_compiled_bitwise_independent_of_workers(monkeypatch):
    rng = np.random.default_rng(5)
    p = make_params((3, 32, 11, 13), (64, 16, 3, 2), padding=((1, 2), (0, 1)), dilation=(2, 3), groups=2)
    x = rng.standard_normal(p.input_shape).astype(np.float32)
    w = rng.standard_normal(p.weight_shape).astype(np.float32)
    dy = rng.standard_normal(p.output_shape).astype(np.float32)
    runs = {}
    for workers, budget in ((1, 1 << 30), (2, 1 << 30), (3, 1), (1, 1)):      # budget 1: 1-sample blocks
        with Lease() as lease:
            runs[(workers, budget)] = dense.backward(dy, x, w, p, True, True, True, workers, budget, lease)
    first = runs[(1, 1 << 30)]
    for dx, _, db in runs.values():
        assert dx.tobytes() == first[0].tobytes()
        assert db.tobytes() == first[2].tobytes()
    # the weight gradient adds its blocks of samples in order: the same blocks, the same bits
    assert runs[(2, 1 << 30)][1].tobytes() == first[1].tobytes()
    assert runs[(3, 1)][1].tobytes() == runs[(1, 1)][1].tobytes()
    # one block of 3 samples or three of one: the same sums, grouped differently
    np.testing.assert_allclose(runs[(1, 1)][1], first[1], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(runs[(1, 1)][2], first[2], rtol=1e-6, atol=1e-5)


def test_compiled_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 16, 6, 10, 12)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3, 3)).astype(np.float32)
    kw = dict(stride=1, padding=1, dilation=(1, 2, 1), groups=1)
    y = xconv.conv_fprop(x, w, backend="numpy", **kw)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    tx, tw = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w))
    torch.nn.functional.conv3d(tx, tw, None, **kw).backward(torch.from_numpy(dy.astype(np.float64)))
    dx, dw, _ = xconv.convolution_backward(dy, x, w, backend="numpy", **kw)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_missing_build_falls_back_to_numpy_paths(tmp_path):
    """Installed without a compiler (no library in the package directory): both compiled parts say why they are
    off, ``xconv backends`` says so, and depthwise, dense and 1-D calls give the exact path's results from the
    NumPy paths. In a fresh process (the library is loaded once per process)."""
    script = (
        "import sys; sys.path[:0] = {paths!r}\n"
        "from pathlib import Path\n"
        "from xconv_numpy import native\n"
        "native._DIR = Path({empty!r})\n"
        "import numpy as np, xconv\n"
        "from xconv_numpy import dense, depthwise\n"
        "assert not dense.available() and not depthwise.available()\n"
        "print(dense.build_error())\n"
        "print(xconv.get_backend('numpy').version())\n"
        "rng = np.random.default_rng(0)\n"
        "for xs, ws, kw in [((2, 16, 6, 6), (16, 16, 3, 3), dict(padding=1)),\n"
        "                   ((2, 4, 7, 7), (8, 1, 3, 3), dict(padding=1, groups=4, stride=2)),\n"
        "                   ((2, 3, 20), (6, 1, 5), dict(padding=2, groups=3))]:\n"
        "    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)\n"
        "    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)\n"
        "    got = xconv.convolution_backward(dy, x, w, backend='numpy', **kw)\n"
        "    want = xconv.convolution_backward(dy, x, w, backend='numpy-exact', **kw)\n"
        "    for g, e in zip(got, want):\n"
        "        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)\n"
        "print('fallback ok')\n"
    ).format(paths=[str(ROOT / "backends"), str(ROOT)], empty=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    assert "the compiled loops were not built at install" in out.stdout
    assert "compiled loops: none, NumPy paths only" in out.stdout
    assert "fallback ok" in out.stdout


def test_builds_load_from_the_package_by_absolute_path_and_never_through_a_link(tmp_path, monkeypatch):
    """The library is code: it is opened only from the package's own directory, as a regular file (a link
    planted there is refused), and the build chosen is one the CPU runs."""
    from xconv_numpy import native

    lib = native.load()
    assert native.isa(lib) in native.ISAS
    assert native.ISAS.index(native.isa(lib)) <= lib.xconv_cpu_level()
    path = native.library_path(native.isa(lib))
    assert path.is_absolute() and path.parent == Path(dense.__file__).resolve().parent
    (tmp_path / "_kernels_baseline.so").symlink_to(path)
    monkeypatch.setattr(native, "_DIR", tmp_path)
    monkeypatch.setattr(native.importlib.machinery, "EXTENSION_SUFFIXES", [".so"])
    with pytest.raises(OSError, match="not a regular file"):
        native.load()


@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_every_build_the_cpu_runs_matches_the_exact_path(isa, monkeypatch):
    """The lower instruction-set builds (XCONV_NUMPY_ISA) compute the same convolutions within tolerance: the
    depthwise loops, and the dense loops when called (the backend routes dense shapes to BLAS on the baseline
    build; the AVX2 build has its own blocks of 8-float vectors)."""
    from xconv_numpy import native

    if native.library_path(isa) is None:
        pytest.skip(f"no {isa} build on this platform")
    monkeypatch.setenv("XCONV_NUMPY_ISA", isa)
    lib = native.load()
    if native.isa(lib) != isa:
        pytest.skip(f"this CPU does not run the {isa} build")
    monkeypatch.setattr(native.LIBRARY, "_value", lib)            # the one loaded library, this build
    dense_case = dict(input=[2, 32, 7, 6], weight=[32, 32, 3, 3], stride=[1, 1], padding=[(1, 1), (1, 1)],
                 dilation=[1, 1], groups=1, transposed=False, output_padding=[0, 0], dtype="float32")
    assert dense.available() == (isa == "avx2") and (isa == "avx2" or isa in dense.build_error())
    monkeypatch.setattr(dense, "DENSE_ISAS", (isa,))
    calls = count_calls(monkeypatch, dense, "backward")
    for c in (dense_case, dict(input=[2, 4, 9, 8], weight=[8, 1, 3, 3], stride=[2, 1], padding=[(1, 1), (1, 1)],
                          dilation=[1, 1], groups=4, transposed=False, output_padding=[0, 0], dtype="float64")):
        x, w, dy = random_arrays(np.random.default_rng(3), c)
        compare(c, x, w, dy, (True, True, True))
    assert len(calls) == 1


def test_the_avx2_builds_dense_loops_give_the_avx512_builds_bits(monkeypatch):
    """Each output element is one sum in one order whatever the vector width of the blocks (csrc/direct_conv.c): the
    AVX2 build's 8-float blocks give the AVX-512 build's bits, forward and every gradient, 1-D to 3-D."""
    from xconv_numpy import native

    if native.library() is None or native.isa(native.library()) != "avx512" or native.library_path("avx2") is None:
        pytest.skip("needs the AVX-512 build loaded and the AVX2 build installed (an AVX-512 CPU)")
    cases = [((2, 32, 9), (16, 32, 3), dict(padding=1)),
             ((3, 32, 8, 8), (48, 32, 3, 3), dict(padding=1)),
             ((2, 32, 7, 6), (16, 32, 3, 3), dict(stride=2, padding=1)),
             ((2, 32, 9, 9), (32, 16, 3, 3), dict(padding=2, dilation=2, groups=2)),
             ((2, 16, 4, 5, 5), (16, 16, 3, 3, 3), dict(padding=1)),
             ((8, 64, 2, 2), (64, 64, 3, 3), dict(padding=1)),
             ((2, 32, 19), (32, 32, 3), dict(stride=2)),                      # the strided forward, 1-D
             ((2, 16, 11, 10), (32, 16, 3, 3), dict(stride=(2, 3), padding=2)),
             ((2, 64, 5, 61), (32, 64, 3, 3), dict(padding=1)),                # long rows, 64 channels summed
             ((2, 32, 203), (512, 32, 3), dict(padding=1))]                    # dx summed over 512 channels
    rng = np.random.default_rng(11)
    data = []
    for xs, ws, kw in cases:
        x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
        dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(np.float32)
        data.append((x, w, dy, kw))

    def outputs():
        with paths.force("dense"), xconv.trace() as tr:
            outs = [[xconv.conv_fprop(x, w, **kw), *xconv.convolution_backward(dy, x, w, **kw)[:2]]
                    for x, w, dy, kw in data]
        assert sum(r.path.startswith("dense") for r in tr.records) >= len(data)     # the backward calls at least
        return outs

    wide = outputs()
    load_avx2_build(monkeypatch)
    assert dense.available()
    narrow = outputs()
    for a, b in zip(wide, narrow):
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compiled_layouts_and_dtypes(dtype):
    c = dict(input=[2, 32, 8, 9], weight=[32, 16, 3, 3], stride=[1, 1], padding=[(1, 1), (2, 0)],
             dilation=[1, 2], groups=2, transposed=False, output_padding=[0, 0], dtype=dtype)
    x, w, dy = random_arrays(np.random.default_rng(9), c)
    for layout in ("transposed", "negative", "sliced"):
        compare(c, x, w, dy, (True, True, True), layout)


def test_cached_plan_serves_new_data_and_every_mask(monkeypatch):
    """The data-independent plan is cached per (params, mask, budget): a second call with other data, and
    calls with other masks of the same shapes, still match the exact path (nothing of one call's data or
    grids leaks into the next)."""
    calls = count_calls(monkeypatch, dense, "backward")
    c = dict(input=[3, 32, 9, 10], weight=[32, 16, 3, 2], stride=[1, 1], padding=[(1, 0), (2, 1)],
             dilation=[1, 2], groups=2, transposed=False, output_padding=[0, 0], dtype="float32")
    rng = np.random.default_rng(21)
    for mask in ((True, True, True), (True, True, True), (False, True, False), (True, False, True)):
        x, w, dy = random_arrays(rng, c)
        plan_cache.clear()          # validated calls: the dispatch runs (a repeated one runs the plan's runner)
        compare(c, x, w, dy, mask)
    assert len(calls) >= 4
    assert dense_plan.plan.cache_info().hits >= 1


@pytest.mark.parametrize("stride, groups", [(1, 1), (2, 2)])
def test_kept_job_templates_give_the_block_paths_bits(stride, groups, monkeypatch):
    """A call of one block with C-contiguous float32 arrays runs the jobs kept on its plan (dense._run_planned: the
    addresses held as offsets from the call's arrays); later calls with other arrays, other masks and the forward
    give the bits of the same jobs built per sample (arrays whose samples are contiguous but not the whole batch:
    dense._block_jobs, no template), and the templates are made once per mask."""
    rng = np.random.default_rng(5)
    x_shape, w_shape = (3, 64, 9, 8), (64, 64 // groups, 3, 3)
    kw = dict(stride=stride, padding=1, groups=groups)
    dense_plan.plan.cache_clear()
    built_jobs = count_calls(monkeypatch, dense, "_block_jobs")
    with paths.force("dense"):
        for round_ in range(2):                      # the second round from the kept templates, new arrays
            x = rng.standard_normal(x_shape).astype(np.float32)
            w = rng.standard_normal(w_shape).astype(np.float32)
            dy = rng.standard_normal(xconv.output_shape(x_shape, w_shape, **kw)).astype(np.float32)
            apart = [np.repeat(a, 2, axis=0)[::2] for a in (x, dy)]    # the same values, the batch strided
            assert not apart[0].flags.c_contiguous and apart[0][0].flags.c_contiguous
            for mask in ((True, True, True), (True, False, False), (False, True, True)):
                before = len(built_jobs)
                kept = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw)
                assert len(built_jobs) == before + (round_ == 0)        # jobs built on the first call only
                built = xconv.convolution_backward(apart[1], apart[0], w, output_mask=mask, backend="numpy", **kw)
                for a, b in zip(kept, built):
                    assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes())
            if stride == 1:
                fwd = [xconv.conv_fprop(a, w, backend="numpy", **kw) for a in (x, np.asfortranarray(x))]
                assert fwd[0].tobytes() == fwd[1].tobytes()
                np.testing.assert_allclose(fwd[0], xconv.conv_fprop(x, w, backend="numpy-exact", **kw),
                                           rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("groups, cin, cout", [(1, 64, 32), (2, 64, 64), (1, 32, 32)])
def test_a_kept_template_copies_the_weights_and_the_weight_gradient_in_its_one_region(groups, cin, cout,
                                                                                       monkeypatch):
    """A one-block call runs its weights' tap-major copy (first) and the weight gradient's taps-last copy (after the
    dw jobs) in the same job list as its sums: one region per call, forward or backward, whatever the mask; and the
    bits are those of the separate copies (a Fortran-ordered w is not read in place: tap_major's NumPy copy, then
    the sums' region)."""
    from xconv_numpy import jobs

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, cin, 7, 9)).astype(np.float32)
    w = rng.standard_normal((cout, cin // groups, 3, 3)).astype(np.float32)
    kw = dict(padding=1, groups=groups)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, **kw)).astype(np.float32)
    regions = count_calls(monkeypatch, jobs, "_execute")        # a region: a job list's (Jobs.run) or a template's
    templates = count_calls(monkeypatch, jobs, "_execute_template")
    regions = _Joined(regions, templates)
    wf = np.asfortranarray(w)
    with paths.force("dense"):
        for round_ in range(2):                      # the template's first call, then a kept one
            before = len(regions)
            y = xconv.conv_fprop(x, w, backend="numpy", **kw)
            assert len(regions) == before + 1
            assert y.tobytes() == xconv.conv_fprop(x, wf, backend="numpy", **kw).tobytes()
            for mask in ((True, True, False), (True, False, False), (False, True, True)):
                before = len(regions)
                one = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw)
                assert len(regions) == before + 1
                apart = xconv.convolution_backward(dy, x, wf, output_mask=mask, backend="numpy", **kw)
                for a, b in zip(one, apart):
                    assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes())
    exact = xconv.convolution_backward(dy, x, w, backend="numpy-exact", **kw)
    for got, want in zip(xconv.convolution_backward(dy, x, w, backend="numpy", **kw), exact):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_concurrent_calls_match_sequential_ones(monkeypatch):
    """Calls from several user threads at once share the worker pool and the scratch arena: each gives the
    bits it gives alone, and none waits forever on another call's tasks."""
    import threading

    with paths.tune(parallel_min_work=0):   # these small calls would otherwise not use the pool

        rng = np.random.default_rng(8)
        shapes = [((3, 32, 10, 9), (32, 16, 3, 3), 2), ((2, 16, 12, 12), (32, 16, 3, 3), 1),
                  ((4, 64, 7, 7), (64, 32, 3, 3), 2), ((1, 32, 15, 4), (16, 32, 3, 2), 1)]
        jobs = []
        for xs, ws, groups in shapes:
            x = rng.standard_normal(xs).astype(np.float32)
            w = rng.standard_normal(ws).astype(np.float32)
            dy = rng.standard_normal(xconv.output_shape(xs, ws, padding=1, groups=groups)).astype(np.float32)
            jobs.append((dy, x, w, groups))

        def call(job):
            dy, x, w, groups = job
            return xconv.convolution_backward(dy, x, w, padding=1, groups=groups, backend="numpy")

        alone = [call(job) for job in jobs]
        together = [None] * (2 * len(jobs))

        def worker(i):
            together[i] = call(jobs[i % len(jobs)])

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(together))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a concurrent call did not finish"
        for i, got in enumerate(together):
            for a, b in zip(got, alone[i % len(jobs)]):
                assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation", [
    ((2, 32, 4, 4), (3, 3), 1, 1, 1),                         # every row at an edge skips a tap row
    ((2, 16, 3, 5, 6), (3, 3, 3), 1, 1, 1),                    # 3-D: the hull of two leading dims' taps
    ((2, 32, 7, 6), (3, 3), 2, ((2, 1), (1, 1)), 1),           # stride 2: phases of tap subsets
    ((1, 32, 9, 9), (5, 3), 1, ((4, 2), (1, 1)), (2, 1)),      # dilated, rows reading no dy at all
    ((2, 16, 2, 2), (7, 7), 1, 3, 1),
])
def test_skipped_padding_taps_change_no_bit(shape, kernel, stride, padding, dilation, monkeypatch):
    """The input-gradient loops skip, per row, the taps that read only dy's zero rows (dense_plan.row_taps): the same
    bits as every tap run (the fallback range (0, T) on every row), forward and backward, and near the float64
    oracle."""
    rng = np.random.default_rng(11)
    co = 32
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((co, shape[1]) + kernel).astype(np.float32)
    kw = dict(stride=stride, padding=padding, dilation=dilation)
    dy = rng.standard_normal(xconv.conv_fprop(x, w, backend="numpy-exact", **kw).shape).astype(np.float32)

    def run():
        dense_plan.plan.cache_clear()
        with paths.force("dense"):
            out = [xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy", **kw)[0]]
            if stride == 1:
                out.append(xconv.conv_fprop(x, w, backend="numpy", **kw))
        return out

    skipping = run()
    monkeypatch.setattr(dense_plan, "row_taps", lambda idx, lo, lead, *a: np.tile(
        np.array([[0, len(idx)]], np.int64), (int(np.prod(lead)), 1)))
    every = run()
    monkeypatch.undo()
    dense_plan.plan.cache_clear()
    assert [a.tobytes() for a in skipping] == [b.tobytes() for b in every]
    exact = xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy-exact", **kw)[0]
    np.testing.assert_allclose(skipping[0], exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", [(3, 2), (3, 3), (1, 1), (2, 5), (3, 3, 3)])   # K 6, 9, 1; 10 and 27: past 8, 16
@pytest.mark.parametrize("groups, a, b, flip", [(1, 32, 16, True), (2, 16, 48, True), (1, 32, 16, False),
                                               (3, 16, 32, False)])
def test_weights_in_the_loops_layout_are_numpys_transposes(groups, a, b, flip, kernel):
    """dense.tap_major and dense._taps_last (one C copy each) hold exactly NumPy's transposes (without flip, a
    16-channel block's K < 16 taps are one zero-filled tile)."""
    K = math.prod(kernel)
    w = np.random.default_rng(2).standard_normal((groups * a, b) + kernel).astype(np.float32)
    t = w.reshape(groups, a, b, K)
    want = t[..., ::-1].transpose(0, 3, 2, 1) if flip else t.transpose(0, 3, 1, 2)
    for workers in (1, 2):
        assert dense.tap_major(w, groups, flip, workers).tobytes() == np.ascontiguousarray(want).tobytes()
        back = dense._taps_last(np.ascontiguousarray(t.transpose(0, 3, 1, 2)), workers)
        assert back.tobytes() == w.tobytes()
    assert dense.tap_major(w[:, ::-1], groups, flip, 1) is None           # not contiguous: NumPy's copy instead


@pytest.mark.parametrize("padded", [False, True])
def test_the_loops_weight_copies_start_a_cache_line(padded):
    """dense.tap_major's copy (the dx loops' weights) starts on a 64-byte boundary, where NumPy's np.empty of the same
    size need not (glibc's large blocks start 16 bytes past one): every 16-float block of a row then spans one line."""
    w = np.random.default_rng(4).standard_normal((128, 128, 3, 3)).astype(np.float32)
    for flip in (False, True):
        copy = dense.tap_major(w, 1, flip, 1, padded)
        assert copy.ctypes.data % 64 == 0
        if padded:                                       # rows of whole lines: every row's blocks start one too
            assert copy.strides[2] % 64 == 0


def test_weight_rows_are_padded_to_an_odd_number_of_cache_lines():
    """dense.padded_row: n channels rounded up to an odd number of 16-float lines (never fewer than n)."""
    assert [dense.padded_row(n) for n in (16, 32, 48, 64, 128, 256, 272, 512)] == [16, 48, 48, 80, 144, 272, 272, 528]


def _dense_matches_exact_on_any_workers(x, w, dy):
    """The dense loops' forward and input gradient (padding 1, forced) match the exact path's, and their bits do not
    depend on the workers."""
    def both():
        return (xconv.conv_fprop(x, w, padding=1, backend="numpy"),
                xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, False, False), backend="numpy")[0])
    with paths.force("dense"):
        with xconv.trace() as t:
            y, dx = both()
        assert all(r.path.startswith("dense") for r in t.records)
        with paths.tune(parallel_min_work=0, team_min_work=0):
            y1, dx1 = both()
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=1, backend="numpy-exact"), rtol=1e-4, atol=1e-4)
    exact = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, False, False), backend="numpy-exact")
    np.testing.assert_allclose(dx, exact[0], rtol=1e-4, atol=1e-4)
    assert y1.tobytes() == y.tobytes() and dx1.tobytes() == dx.tobytes()


@pytest.mark.parametrize("width", [5, 6, 7, 11])
def test_rows_of_five_to_fourteen_positions_run_in_one_block_with_the_exact_paths_values(width):
    """Rows of 5-14 positions run in one register block (dx_5x2 .. dx_14x2), with weights of 256 x 256 taps in padded
    rows: the forward and the input gradient match the exact path, and the bits do not depend on the workers."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((2, 256, 4, width)).astype(np.float32)
    w = (rng.standard_normal((256, 256, 3, 3)) / 48).astype(np.float32)
    dy = rng.standard_normal((2, 256, 4, width)).astype(np.float32)
    _dense_matches_exact_on_any_workers(x, w, dy)


@pytest.mark.parametrize("xs, ws", [((2, 64, 5, 61), (64, 64, 3, 3)), ((1, 128, 3, 4, 9), (128, 128, 3, 3, 3)),
                                     ((1, 384, 70), (384, 384, 3))])
def test_rows_a_few_taps_at_a_time_match_the_exact_path_whatever_the_workers(xs, ws):
    """Rows whose weights pass 32 KiB (the AVX2 build: a few taps at a time over up to 10 blocks of a row, their sums
    kept between, csrc/direct_conv.c's dx_row_taps; here 9 taps of 64 channels over rows of 61, 27 of 128, one tap of
    384 at a time): the forward and the input gradient match the exact path, and the bits do not depend on the
    workers."""
    rng = np.random.default_rng(len(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / math.sqrt(math.prod(ws[1:]))).astype(np.float32)
    dy = rng.standard_normal(xs[:1] + ws[:1] + xs[2:]).astype(np.float32)
    if native.isa(native.library()) == "avx2":              # this shape's rows run that way on the AVX2 build
        assert dense_plan.taps_rows(math.prod(ws[2:]), ws[1]) and dense_plan.taps_rows(math.prod(ws[2:]), ws[0])
    _dense_matches_exact_on_any_workers(x, w, dy)


def test_big_weights_split_in_channel_units_with_the_same_bits_on_any_workers():
    """Weights past 1 MB with C % 32 == 0 (the rows run channel block by channel block): the input gradient's items
    come in 32-channel units (dense_plan.dx_units), the forward (stride 1 and 2) and dx match the exact path and
    their bits do not depend on the workers (1 to 3 threads, units split between them)."""
    assert [dense_plan.dx_units(9, c, c) for c in (64, 256, 272, 512)] == [1, 8, 1, 16]
    assert dense_plan.dx_units(27, 128, 128) == 4 and dense_plan.dx_units(1, 512, 512) == 1
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 256, 6, 6)).astype(np.float32)
    w = (rng.standard_normal((256, 256, 3, 3)) / 48).astype(np.float32)
    dy = rng.standard_normal((2, 256, 6, 6)).astype(np.float32)
    runs = []
    for threads in (1, 2, 3):
        with paths.force("dense"), paths.tune(parallel_min_work=0, team_min_work=0), xconv.trace() as t, \
                threadpool_limits(threads):
            runs.append([xconv.conv_fprop(x, w, padding=1, backend="numpy"),
                         xconv.conv_fprop(x, w, padding=1, stride=2, backend="numpy"),
                         xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, False, False),
                                                    backend="numpy")[0]])
        assert all(r.path.startswith("dense") for r in t.records)
    assert all(a.tobytes() == b.tobytes() for run in runs[1:] for a, b in zip(runs[0], run))
    exact = [xconv.conv_fprop(x, w, padding=1, backend="numpy-exact"),
             xconv.conv_fprop(x, w, padding=1, stride=2, backend="numpy-exact"),
             xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, False, False), backend="numpy-exact")[0]]
    for got, want in zip(runs[0], exact):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

def test_the_weight_copies_run_on_the_workers_they_are_given(monkeypatch):
    """dense.tap_major and dense._taps_last run their copy regions on at most ``workers`` threads, whatever the row
    length the template was made for (a key once ended with the row length, read as the thread count: 32 threads)."""
    from xconv_numpy import jobs

    seen = []
    real, real_template = jobs._execute, jobs._execute_template
    monkeypatch.setattr(jobs, "_execute", lambda table, threads, scratch: seen.append(threads) or real(table, threads,
                                                                                                      scratch))
    monkeypatch.setattr(jobs, "_execute_template", lambda template, bases, threads, scratch: seen.append(threads)
                        or real_template(template, bases, threads, scratch))
    w = np.random.default_rng(1).standard_normal((32, 64, 2, 2)).astype(np.float32)
    for padded in (False, True):
        for flip in (False, True):
            got = dense.tap_major(w, 1, flip, 2, padded)
            want = w.reshape(1, 32, 64, 4)
            want = want[..., ::-1].transpose(0, 3, 2, 1) if flip else want.transpose(0, 3, 1, 2)
            assert got.shape == want.shape and np.array_equal(got, want)
    dense._taps_last(np.ascontiguousarray(w.reshape(1, 32, 64, 4).transpose(0, 3, 1, 2)), 2)
    assert seen and max(seen) <= 2


@pytest.mark.parametrize("op, x_shape", [("backward", (1, 128, 14, 14)), ("fprop", (1, 128, 28, 28))])
def test_a_workspace_limit_counts_what_it_counted_before(op, x_shape):
    """The weights' copy in the call's own job list is not scratch (as the separate copy was not), and under a
    workspace limit the x grids keep C floats per position (not the padded grid_row): a 128-channel call fits 1 MiB,
    as it did before either change."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((128, 128, 3, 3)).astype(np.float32)
    kw = dict(padding=1, workspace_limit=1 << 20, backend="numpy")
    with paths.force("dense"), xconv.trace() as t:
        if op == "fprop":
            got = xconv.conv_fprop(x, w, **kw)
            want = xconv.conv_fprop(x, w, padding=1, backend="numpy")
        else:
            dy = rng.standard_normal(x_shape).astype(np.float32)
            got = xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), **kw)
            want = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, False), backend="numpy")
    assert t.records[0].path.startswith("dense") and t.records[0].workspace_bytes <= 1 << 20
    for a, b in zip(np.atleast_1d(got) if op == "fprop" else got, np.atleast_1d(want) if op == "fprop" else want):
        assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes())


class _Joined:
    """The calls of two count_calls lists, counted together (len)."""

    def __init__(self, *lists):
        self.lists = lists

    def __len__(self):
        return sum(map(len, self.lists))


@pytest.mark.parametrize("x_shape, kernel, stride, padding, dilation", [
    ((2, 32, 19), (3,), (1,), ((2, 1),), (2,)),                       # 1-D: one row
    ((1, 16, 6, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((1, 16, 9, 8), (3, 2), (2, 2), ((1, 0), (2, 1)), (1, 2)),        # strided: a margin, rows of padding
    ((1, 16, 3, 4, 5), (2, 3, 3), (1, 1, 1), ((1, 1), (0, 2), (1, 1)), (1, 1, 1)),
    ((1, 16, 4, 140), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),      # rows of 142: a padded row pitch
])
def test_dy_grid_holds_rows_interleaved_by_the_c_copy_and_by_numpy(x_shape, kernel, stride, padding, dilation):
    """The dense loops' dy grid (dense_plan.plan): per sample M zeros, then per grid row every channel's Y[-1]
    positions, dy[co, o] at M + row(o) * rp + co * ldy + o[-1]; everything else zero. The C copy job
    (xconv_dy_to_grid, in its copy parts) and the NumPy copy of another dtype (dense._dy_to_grid) both write exactly
    that, over scratch full of NaNs, with the same db partial sums."""
    p = make_params((*x_shape[:2], *x_shape[2:]), (32, x_shape[1], *kernel), stride=stride, padding=padding,
                    dilation=dilation, dtype="float32")
    f = dense_plan.plan(p, True, True, 1 << 30)
    O, Y = f.O, f.Y
    rng = np.random.default_rng(len(x_shape) + sum(kernel))
    dy = (rng.integers(-40, 40, (f.Co,) + O) / 4).astype(np.float32)     # exact in float16 too
    want = np.zeros(f.dy_sample, np.float32)
    rows = np.arange(math.prod(Y[:-1])).reshape(Y[:-1])       # the grid's rows, C order over its leading dims
    for co in range(f.Co):
        for o in np.ndindex(*O):
            want[f.M + rows[o[:-1]] * f.rp + co * f.ldy + o[-1]] = dy[(co,) + o]
    db_want = dy.reshape(f.Co, -1).sum(axis=1, dtype=np.float64)
    by_c = np.full(f.dy_sample, np.nan, np.float32)
    sums = np.full((f.copy_parts, f.Co), np.nan)
    job_rows = [[native.address(dy), f.Co, math.prod(O), native.address(f.dy_rows), len(f.dy_rows), Y[-1], O[-1], f.M,
                 f.dy_sample, r0, r1, native.address(by_c), native.address(sums[part])]
                for part, (r0, r1) in enumerate(even_ranges(len(f.dy_rows), f.copy_parts))]
    jobs = Jobs()
    jobs.rows("dy_to_grid", job_rows)
    jobs.run(1)
    by_numpy = np.full(f.dy_sample, np.nan, np.float32)
    db = np.full((f.copy_parts, f.Co), np.nan)
    dense._dy_to_grid(dy.astype(np.float16), by_numpy, f, db)
    assert by_c.tobytes() == want.tobytes()
    assert by_numpy.tobytes() == want.tobytes()
    assert sums.sum(axis=0).tolist() == db_want.tolist() == db.sum(axis=0).tolist()     # sums of quarters: exact
    reach = (kernel[-1] - 1) * dilation[-1] // stride[-1]
    assert f.ldy >= O[-1] + reach                 # a read left of a row's start lands on the zeros of the row before
    if x_shape[-1] == 140:                        # rows of 142 positions: a pitch of 144 (9 lines), unpadded if limited
        assert f.ldy == 144
        limited = make_params(x_shape, (32, 16, 3, 3), padding=padding, workspace_limit=1 << 30, dtype="float32")
        assert dense_plan.plan(limited, True, True, 1 << 30).ldy == 142


def test_a_workspace_limit_fits_rows_of_128_positions_as_before():
    """Under a workspace limit the dy grid's rows are not padded to a pitch (1x16x128x128 3x3 input gradient: 1098816
    bytes fit, as they did with the channel-major grid), and the result is the unlimited call's, bit for bit."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 128, 128)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((1, 16, 128, 128)).astype(np.float32)
    kw = dict(padding=1, output_mask=(True, False, False), backend="numpy")
    with paths.force("dense"), xconv.trace() as t:
        got = xconv.convolution_backward(dy, x, w, workspace_limit=1098816, **kw)[0]
        want = xconv.convolution_backward(dy, x, w, **kw)[0]
    assert all(r.path.startswith("dense") for r in t.records)
    assert got.tobytes() == want.tobytes()


def test_a_call_in_several_sample_blocks_reads_its_arrays_in_place_or_by_numpy_alike():
    """A call whose samples the plan takes in blocks (96 8x8 images: two blocks of 48; 4 64x64 ones under a 1 MB
    workspace limit: four blocks of one, each sample's copies in four parts) builds each block's copy jobs from one
    table per array read in place, and sample by sample where an array is not (a Fortran-ordered x or dy is copied by
    NumPy; samples two apart are read in place one by one): the same grids, so the same bits, and the definition's
    values."""
    from xconv.params import make_params
    from xconv_numpy import dense_plan
    from xconv_numpy.fast import io_bytes
    from xconv_numpy.grid.chunks import budget
    from xconv_numpy.grid.geometry import geom

    def every_other(a):                  # the same values, samples two apart: each one read in place, not the whole
        b = np.repeat(a, 2, axis=0)[::2]
        assert np.array_equal(b, a) and not b.flags.c_contiguous and b[0].flags.c_contiguous
        return b

    rng = np.random.default_rng(5)
    for N, S, limit, parts in ((96, 8, None, 1), (4, 64, 1 << 20, 4)):
        x = rng.standard_normal((N, 16, S, S)).astype(np.float32)
        w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
        dy = rng.standard_normal((N, 32, S, S)).astype(np.float32)
        p = make_params(x.shape, w.shape, padding=1, workspace_limit=limit)
        f = dense_plan.plan(p, True, True, budget(io_bytes(geom(p), 4, True, True), p))
        assert f.nb < N and f.copy_parts == parts
        with paths.force("dense"):
            runs = [xconv.convolution_backward(a, b, w, padding=1, output_mask=(True, True, True), bias_sizes=[32],
                                               workspace_limit=limit, backend="numpy")
                    for a, b in ((dy, x), (dy, np.asfortranarray(x)), (np.asfortranarray(dy), x),
                                 (every_other(dy), every_other(x)))]
        for r in runs[1:]:
            assert [u.tobytes() for u in r] == [u.tobytes() for u in runs[0]]
        exact = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(True, True, True), bias_sizes=[32],
                                           backend="numpy-exact")
        for u, v in zip(runs[0], exact):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=2e-3)
