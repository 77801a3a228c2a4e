"""The cost model's picks (paths.cost_pick, cost.py): a function of the configuration; each output's bits independent
of the mask and of the BLAS thread count; results within float32 rounding of the exact backend."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl

import xconv
from xconv.params import make_params
from xconv_numpy import colgemm, cost, paths, small

ROOT = Path(__file__).resolve().parent.parent

#: Shapes of real models whose outputs the cost model sends to each of its paths (on a build with the loops).
CASES = [
    ((8, 256, 2, 2), (256, 256, 3, 3), dict(padding=1)),              # deep stage: colgemm
    ((8, 3, 64, 64), (64, 3, 7, 7), dict(stride=2, padding=3)),       # 3-channel stem: colgemm in chunks
    ((8, 160, 3, 3), (960, 160, 1, 1), {}),                           # expansion 1x1 at 3x3: colgemm
    ((4, 32, 32, 32), (32, 32, 3, 3), dict(padding=1)),               # dense loops; grid loops in sample blocks
    ((2, 64, 4, 4), (128, 64, 1, 1), dict(stride=2)),                 # strided 1x1 shortcut
    ((2, 32, 8, 8), (16, 32, 2, 2), dict(stride=2)),                  # a ConvTranspose 2x2 s2's direct conv
    ((2, 16, 120), (32, 16, 3), dict(stride=2)),                      # 1-D
    ((1, 8, 4, 10, 10), (16, 8, 3, 3, 3), dict(padding=1)),           # 3-D
    ((16, 16, 8, 8), (32, 4, 3, 3), dict(padding=1, groups=4)),       # digits' grouped layer
]
MASKS = [(True, True, True), (True, True, False), (False, True, True), (True, False, False), (False, True, False),
         (True, False, True)]


def _arrays(i, xs, ws, kw):
    rng = np.random.default_rng(100 + i)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw), dtype=np.float32)
    return x, w, dy


def _digests() -> dict:
    out = {}
    for i, (xs, ws, kw) in enumerate(CASES):
        x, w, dy = _arrays(i, xs, ws, kw)
        for mask in MASKS:
            for name, r in zip(("dx", "dw", "db"), xconv.convolution_backward(dy, x, w, output_mask=mask,
                                                                             backend="numpy", **kw)):
                if r is not None:
                    out.setdefault(f"{i}/{name}", set()).add(hashlib.sha256(r.tobytes()).hexdigest())
        out[f"{i}/y"] = {hashlib.sha256(xconv.conv_fprop(x, w, backend="numpy", **kw).tobytes()).hexdigest()}
    return {k: sorted(v) for k, v in out.items()}


def test_each_output_has_the_same_bits_whatever_the_mask():
    mixed = {k: v for k, v in _digests().items() if len(v) > 1}
    assert not mixed, f"outputs whose bits depend on the mask: {sorted(mixed)}"


def test_bits_do_not_depend_on_the_blas_thread_count():
    script = "import json, test_numpy_cost as t; print(json.dumps(t._digests()))"
    runs = []
    for threads in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env,
                             cwd=str(ROOT / "tests"))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_results_match_the_exact_backend(i):
    xs, ws, kw = CASES[i]
    x, w, dy = _arrays(i, xs, ws, kw)
    got = xconv.convolution_backward(dy, x, w, backend="numpy", **kw) + (xconv.conv_fprop(x, w, backend="numpy",
                                                                                          **kw),)
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      backend="numpy-exact", **kw) + (
        xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", **kw),)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5 * np.abs(e).max())


def test_the_pick_is_a_function_of_the_configuration():
    """Same configuration, same pick, whatever was asked before; every pick is a path of the table."""
    ps = [make_params(xs, ws, **kw) for xs, ws, kw in CASES]
    first = [[paths.cost_pick(p, o) for o in ("y", "dx", "dw")] for p in ps]
    again = [[paths.cost_pick(p, o) for o in ("y", "dx", "dw")] for p in reversed(ps)][::-1]
    assert first == again
    assert {n for row in first for n in row} <= set(paths.PATHS) | {None}


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled column loops are not built here")
def test_deep_stage_and_expansion_take_colgemm_and_the_trace_says_why():
    for xs, ws, kw in (CASES[0], CASES[2]):
        x, w, dy = _arrays(0, xs, ws, kw)
        with xconv.trace() as t:
            xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), backend="numpy", **kw)
        assert "colgemm columns" in t.records[-1].path and "cost model" in t.records[-1].path, t.records[-1].path


def test_colgemm_chunks_are_fixed_by_the_configuration_and_bounded():
    """Chunks of samples: the same for every mask (so dW's partial sums are), the columns of one chunk within the
    bytes of the call's operands."""
    p = make_params((8, 3, 64, 64), (64, 3, 7, 7), stride=2, padding=3)
    chunks = colgemm.sample_chunks(p, True, True)
    assert len(chunks) > 1 and chunks[0][0] == 0 and chunks[-1][1] == 8
    n = max(b - a for a, b in chunks)
    assert colgemm.cols_bytes(colgemm._sub(p, 0, n), True, True) <= colgemm._io_bytes(p, True, True, False)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_colgemm_sample_chunks_land_in_their_samples(dtype):
    """A call in chunks of samples (the forward's; a grouped backward's) writes each chunk's y or dx straight into its
    samples of the result: every sample within float32 rounding of the exact backend's."""
    xs, ws, kw = (8, 64, 40, 40), (64, 16, 3, 3), dict(padding=1, groups=4)
    p = make_params(xs, ws, **kw)
    assert len(colgemm._forward_chunks(p)[0]) > 1
    assert colgemm._backward_chunks(p)[1] == "samples" and len(colgemm._backward_chunks(p)[0]) > 1
    x, w, dy = (a.astype(dtype) for a in _arrays(4, xs, ws, kw))
    with paths.force("colgemm"), xconv.trace() as t:
        y = xconv.conv_fprop(x, w, backend="numpy", **kw)
        dx = xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy", **kw)[0]
    on = t.records if dtype == "float32" else t.records[1:]     # float16: the forward's columns are not a candidate
    assert all("colgemm" in r.path for r in on), [r.path for r in t.records]
    exact_y = xconv.conv_fprop(x, w, backend="numpy-exact", **kw)
    exact_dx = xconv.convolution_backward(dy, x, w, output_mask=(True, False, False), backend="numpy-exact", **kw)[0]
    tol = 1e-4 if dtype == "float32" else 2e-2
    for got, want in ((y, exact_y), (dx, exact_dx)):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("xs,ws,mask", [((4, 64, 40, 40), (1, 64, 1, 1), None), ((4, 64, 40, 40), (1, 64, 1, 1), (0, 1)),
                                         ((4, 1, 64, 64), (64, 1, 1, 1), None), ((4, 1, 64, 64), (64, 1, 1, 1), (1, 1))])
def test_colgemm_scratch_stays_within_the_calls_bytes_where_sgemm_refuses(xs, ws, mask):
    """A product sgemm does not take (a dimension of 1: one output channel, one input channel of a 1x1) runs on the
    NumPy route; the columns taken for the jobs are let go first, so the call's extra memory stays near its operands'
    bytes (it had held both columns: 2.1x)."""
    from core_helpers import traced_memory
    from xconv_numpy import fast
    x, w, dy = _arrays(6, xs, ws, {})
    if mask is None:
        def call():
            return (xconv.conv_fprop(x, w, backend="numpy"),)
    else:
        def call():
            return xconv.convolution_backward(dy, x, w, output_mask=(bool(mask[0]), bool(mask[1]), False),
                                              backend="numpy")
    with paths.force("colgemm"), xconv.trace() as t:
        call()
        fast.release_memory()
        results, _, peak = traced_memory(call)
    assert all(r.path.startswith("colgemm") for r in t.records), [r.path for r in t.records]
    extra = peak - sum(a.nbytes for a in results if a is not None)
    assert extra < 1.3 * (x.nbytes + w.nbytes + dy.nbytes), extra


#: colgemm backward calls whose columns do not fit all samples at once: one chunk of x's channels (ResNet-18 at 224
#: pixels, 256x256 3x3 at 14x14), several (5x5 at 16x16: 8 chunks of 8 channels).
CHANNEL_CASES = [((2, 256, 14, 14), (256, 256, 3, 3), dict(padding=1)),
                 ((8, 64, 16, 16), (64, 64, 5, 5), dict(padding=2)),
                 ((3, 48, 9, 11), (40, 48, 3, 5), dict(stride=(1, 2), padding=(1, 2), dilation=(2, 1)))]


def test_colgemm_backward_chunks_x_channels_where_the_samples_do_not_fit():
    """Chunks of x's channels (every dW element one product's sum over all samples, no partial sums) where the
    samples would need several chunks; fixed by the configuration, the columns of one chunk with dy's channel-major
    copy within the call's bytes; a single chunk of all samples is kept as it was."""
    for xs, ws, kw in CHANNEL_CASES:
        p = make_params(xs, ws, **kw)
        chunks, by, scratch = colgemm._backward_chunks(p)
        assert len(colgemm.sample_chunks(p, True, True)) > 1 and by == "channels"
        assert chunks[0][0] == 0 and chunks[-1][1] == xs[1] and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert max(scratch.values()) <= colgemm._io_bytes(p, True, True, False)
    assert len(colgemm._backward_chunks(make_params(*CHANNEL_CASES[1][:2], **CHANNEL_CASES[1][2]))[0]) == 8
    p = make_params((8, 256, 4, 4), (256, 256, 3, 3), padding=1)
    assert colgemm._backward_chunks(p)[:2] == (((0, 8),), "samples")
    assert colgemm.channel_chunks(make_params((2, 64, 4, 4), (64, 16, 3, 3), padding=1, groups=4)) == []


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled column loops are not built here")
@pytest.mark.parametrize("i", range(len(CHANNEL_CASES)))
def test_colgemm_by_channels_matches_the_exact_backend_whatever_the_mask_workers_and_layout(i):
    xs, ws, kw = CHANNEL_CASES[i]
    x, w, dy = _arrays(i, xs, ws, kw)
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      output_mask=(True, True, False), backend="numpy-exact", **kw)
    for dtype in ("float32", "float64"):
        a, b, d = (v.astype(dtype) for v in (x, w, dy))
        got = {}
        for mask in ((True, True, False), (True, False, False), (False, True, False)):
            for workers in (1, 2):                  # the workers are NumPy's BLAS thread count
                with threadpoolctl.threadpool_limits(workers, user_api="blas"), paths.force("colgemm"), \
                        paths.tune(parallel_min_work=0, team_min_work=0), xconv.trace() as t:
                    out = xconv.convolution_backward(d, a, b, output_mask=mask, backend="numpy", **kw)
                assert "colgemm" in t.records[-1].path, t.records[-1].path
                for name, r in zip(("dx", "dw"), out):
                    if r is not None:
                        got.setdefault(name, []).append(r)
        # other layouts of the same values: x channels-last (a strided view), dy read-only, w Fortran-ordered
        xl = np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)
        dr = d.copy()
        dr.flags.writeable = False
        with paths.force("colgemm"):
            out = xconv.convolution_backward(dr, xl, np.asfortranarray(b), output_mask=(True, True, False),
                                             backend="numpy", **kw)
        got["dx"].append(out[0])
        got["dw"].append(out[1])
        for name, e in zip(("dx", "dw"), want):
            rs = got[name]
            assert all(np.array_equal(rs[0], r) for r in rs[1:]), f"{name}: bits depend on the mask, workers or layout"
            tol = 2e-5 if dtype == "float32" else 1e-12
            np.testing.assert_allclose(rs[0], e, rtol=tol, atol=tol * np.abs(e).max())


def test_estimates_are_positive_and_rank_thin_products_slower():
    p_thin = make_params((8, 512, 2, 2), (512, 512, 3, 3), padding=1)
    p_wide = make_params((2, 64, 16, 16), (64, 8, 3, 3), padding=1, groups=8)
    for p in (p_thin, p_wide):
        for o in ("y", "dx", "dw"):
            assert all(f(p, o) > 0 for f in cost.ESTIMATES.values())
    # the dense loops at 2x2 outputs run at a fraction of their rate: the model must prefer the BLAS products there
    assert cost.colgemm(p_thin, "dw") < cost.loops(p_thin, "dw")


@pytest.mark.parametrize("xs, ws, stride, groups, want", [
    ((8, 64, 56, 56), (64, 64, 3, 3), 1, 1, "grid-a"),          # large stride-1 planes: the grid strategies
    ((8, 256, 28, 28), (256, 32, 3, 3), 1, 8, "grid-a"),
    ((2, 32, 8, 28, 28), (32, 32, 3, 3, 3), 1, 1, "grid-a"),
    ((4, 16, 64, 64), (64, 16, 3, 3), 1, 1, "grid-b"),          # Cog > 2 Cg: strategy B
    ((8, 16, 24, 24), (16, 16, 3, 3), 1, 1, None),              # below GRID_MACS: the model decides
    ((8, 256, 28, 28), (128, 256, 1, 1), 1, 1, None),           # a 1x1: the pointwise path stays
    ((8, 256, 28, 28), (256, 256, 3, 3), 2, 1, None),           # stride 2
    ((8, 128, 8, 8), (128, 128, 3, 3), 1, 1, None),             # 64 positions per sample
    ((2, 3, 8, 56, 56), (32, 3, 3, 3, 3), 1, 1, None),          # a stem (3 channels): the model, the stem loops
])
def test_builds_without_dense_loops_run_large_stride_1_backward_calls_on_the_grid(xs, ws, stride, groups, want,
                                                                                  monkeypatch):
    """Where the build has no dense loops (AVX2, baseline), large stride-1 backward calls take the grid strategies
    (paths.GRID_MACS, GRID_POSITIONS); other calls, and every call of a build with the loops, keep their rules."""
    from xconv.params import make_params
    from xconv_numpy import dense, paths

    p = make_params(xs, ws, stride=stride, padding=1 if ws[-1] == 3 else 0, groups=groups)
    picked = {o: paths.choose(p, "backward", o)[0].name for o in ("grad_input", "grad_weight")}
    if dense.available():                                        # the AVX-512 build: the loops or the model
        assert not set(picked.values()) & {"grid-a", "grid-b"}
    monkeypatch.setattr(dense, "DENSE_ISAS", ())                 # a build without the loops (part of the cache key)
    without = {o: paths.choose(p, "backward", o)[0].name for o in ("grad_input", "grad_weight")}
    if want is None:
        assert not set(without.values()) & {"grid-a", "grid-b"}
    else:
        assert set(without.values()) == {want}


# --- rates per kind of CPU (cost.RATES, XCONV_NUMPY_CPU) ---

SPEECH = ((4, 512, 399), (512, 512, 3), dict(stride=2))      # the speech encoder's 4th layer: dense on Zen 4's rates


def test_the_detected_kind_follows_the_vendor_and_the_build(monkeypatch):
    monkeypatch.delenv("XCONV_NUMPY_CPU", raising=False)
    lib = cost.native.library()
    build = cost.native.isa(lib) if lib is not None else None
    for vendor in ("GenuineIntel", "AuthenticAMD", ""):
        monkeypatch.setattr(cost, "_vendor", lambda v=vendor: v)
        want = ("intel-avx512" if vendor == "GenuineIntel" and build == "avx512"
                else "avx2" if build == "avx2" else "zen4")
        assert cost.detected_cpu() == want and cost.cpu_kind() == want and cost.rates() is cost.RATES[want]
    monkeypatch.setenv("XCONV_NUMPY_CPU", "Intel-AVX512")
    assert cost.cpu_kind() == "intel-avx512"


def test_the_vendor_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\nprocessor\t: 1\n"
                    "vendor_id\t: GenuineIntel\n")
    assert cost._vendor(str(info)) == "GenuineIntel"
    info2 = tmp_path / "cpuinfo2"
    info2.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")            # no vendor line (an ARM kernel's)
    assert cost._vendor(str(info2)) == "" and cost._vendor(str(tmp_path / "missing")) == ""


@pytest.mark.skipif(not (small.compiled_available() and cost.dense_loops.available()
                         and cost.native.isa(cost.native.library()) == "avx512"),
                    reason="the dense loops' strided forward needs the AVX-512 build of the compiled loops")
def test_the_kind_named_decides_the_pick_and_each_kind_keeps_its_own(monkeypatch):
    xs, ws, kw = SPEECH
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    runs = {}
    for kind in ("zen4", "intel-avx512", "zen4", "intel-avx512"):
        monkeypatch.setenv("XCONV_NUMPY_CPU", kind)
        with xconv.trace() as t:
            y = xconv.conv_fprop(x, w, backend="numpy", deterministic=True, **kw)
        runs.setdefault(kind, []).append((t.records[-1].path.split(":")[0], y.tobytes()))
    assert {p for p, _ in runs["zen4"]} == {"dense"} and {p for p, _ in runs["intel-avx512"]} == {"colgemm"}
    for kind, done in runs.items():                      # each kind: the same path and bits every time
        assert done[0] == done[1], kind
    exact = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", **kw)
    for kind, done in runs.items():
        got = np.frombuffer(done[0][1], np.float32).reshape(exact.shape)
        np.testing.assert_allclose(got, exact, rtol=2e-5, atol=2e-5 * np.abs(exact).max())


@pytest.mark.skipif(not (small.compiled_available() and cost.dense_loops.available()),
                    reason="the dense loops (a candidate of every call below) need the compiled loops")
def test_the_avx2_kind_sends_stride_one_stems_to_the_stem_loops():
    """The avx2 kind weighs the small loops in sample blocks at Rates.stem_grid (2.0) times their estimate where the
    stem loops serve the forward (Zen 3, two threads, ms, small-c-blocks / stem: the 3-D net's 2x3x8x56x56 -> 32
    3x3x3 2.60 / 2.29, the U-Net's 4x3x64x64 -> 32 3x3 0.71 / 0.60): those stems go to the stem loops there; Zen 4's
    rates keep the small loops; a call the stem loops do not serve (rows under 16) keeps its estimate."""
    three_d = make_params((2, 3, 8, 56, 56), (32, 3, 3, 3, 3), padding=1)
    unet = make_params((4, 3, 64, 64), (32, 3, 3, 3), padding=1)
    short = make_params((8, 3, 12, 12), (32, 3, 3, 3), padding=1)
    if not cost.stem_loops.serves(unet):
        pytest.skip("the stem loops are not built for this machine's instruction set")
    with cost.choosing("avx2"):
        assert [paths.cost_pick(p, "y") for p in (three_d, unet)] == ["stem", "stem"]
        avx2 = cost.grid(unet, "y"), cost.grid(short, "y")
    with cost.choosing("zen4"):
        assert [paths.cost_pick(p, "y") for p in (three_d, unet)] == ["small-c-blocks"] * 2
        zen4 = cost.grid(unet, "y"), cost.grid(short, "y")
    assert avx2[0] - cost.CALL == pytest.approx(2.0 * (zen4[0] - cost.CALL)) and avx2[1] == zen4[1]
    with cost.choosing("avx2"):
        dx = cost.grid(unet, "dx")
    with cost.choosing("zen4"):
        assert cost.grid(unet, "dx") == dx                      # the forward's alone


def test_the_avx2_kind_sends_wide_weights_and_long_strided_forwards_to_colgemm():
    """The avx2 kind (the AVX2 build's 8-float blocks, fitted on an AMD EPYC Zen 3, two threads; ms, dense loops or blas-
    grid / colgemm): a group's weights of 2^19 elements or more cost the loops' gradients 1.5x in 2-D and 3-D too
    (ResNet's 8x256x4x4 256 3x3 backward 7.3 / 4.4; 2x256x14x14 backward 14.5 / 9.7; the 3-D 2x128x2x7x7 -> 256
    backward 9.7 / 6.2), not their forward where the AVX2 build's rows run taps at a time (dense.taps_at_a_time:
    8x256x4x4 1.11 / 1.34; an AVX-512 build's forward takes the kind's 1.0 too), 128x128x3x3x3 (442k) nothing, and
    colgemm's forward takes any number of output positions in up to CORES sample chunks (the speech encoder's 3-tap
    stride-2 forwards on the grid engine 12.3-81 / 11.4-80.7). Zen 4's rates keep the loops and the grid engine there.
    (Where the loops' strided forward is a candidate for the speech layer, on the AVX-512 build, its pick is asserted
    only where the loops cannot take it.)"""
    wide = make_params((8, 256, 4, 4), (256, 256, 3, 3), padding=1)
    speech = make_params((4, 512, 3199), (512, 512, 3), stride=2)
    three_d = make_params((2, 128, 4, 14, 14), (128, 128, 3, 3, 3), padding=1)
    strided_loops = cost.dense_loops.serves_fprop(speech)
    with cost.choosing("avx2"):
        assert [paths.cost_pick(wide, o) for o in ("y", "dx", "dw")] == ["dense", "colgemm", "colgemm"]
        assert "colgemm" in paths._candidates(speech, "y")
        assert strided_loops or paths.cost_pick(speech, "y") == "colgemm"
        assert [paths.cost_pick(three_d, o) for o in ("y", "dx", "dw")] == ["dense"] * 3
        assert cost.big_weights(three_d, cost.rates()) == 1.0 and cost.big_weights(wide, cost.rates()) == 1.5
        if cost.native.isa(cost.native.library()) == "avx2":           # 256 channels: taps at a time
            assert cost.big_weights(wide, cost.rates(), forward=True) == 1.0
    with cost.choosing("zen4"):
        assert [paths.cost_pick(wide, o) for o in ("y", "dx", "dw")] == ["dense"] * 3
        assert "colgemm" not in paths._candidates(speech, "y")       # 6396 output positions: past 4096
        assert strided_loops or paths.cost_pick(speech, "y") == "grid-forward"


@pytest.mark.parametrize("kind", sorted(cost.RATES))
def test_each_kinds_picks_keep_each_outputs_bits_whatever_the_mask(kind, monkeypatch):
    monkeypatch.setenv("XCONV_NUMPY_CPU", kind)
    mixed = {k: v for k, v in _digests().items() if len(v) > 1}
    assert not mixed, f"{kind}: outputs whose bits depend on the mask: {sorted(mixed)}"


def test_backends_names_the_kind_in_use(monkeypatch):
    from xconv_numpy import status
    monkeypatch.setenv("XCONV_NUMPY_CPU", "zen4")
    assert "cost model: zen4 rates (XCONV_NUMPY_CPU)" in status.describe()
    monkeypatch.delenv("XCONV_NUMPY_CPU")
    assert f"cost model: {cost.detected_cpu()} rates (detected)" in status.describe()


def test_one_choice_reads_the_kind_its_key_holds(monkeypatch):
    """Within a path choice every estimate uses the kind in the choice's cache key (cost.choosing), whatever the
    environment says meanwhile; outside, the environment's."""
    monkeypatch.setenv("XCONV_NUMPY_CPU", "zen4")
    with cost.choosing("intel-avx512"):
        assert cost.cpu_kind() == "intel-avx512" and cost.rates() is cost.RATES["intel-avx512"]
        with cost.choosing(None):
            assert cost.cpu_kind() == cost.detected_cpu()
        assert cost.cpu_kind() == "intel-avx512"
    assert cost.cpu_kind() == "zen4"
    seen = []
    real = cost.rates

    def rates():                    # the environment changes after the choice's first estimate (another thread's)
        seen.append(cost.cpu_kind())
        os.environ["XCONV_NUMPY_CPU"] = "zen4"
        return real()

    monkeypatch.setattr(cost, "rates", rates)
    paths._choose.cache_clear()
    p = make_params(*SPEECH[:2], **SPEECH[2])
    monkeypatch.setenv("XCONV_NUMPY_CPU", "intel-avx512")
    paths.choose(p, "fprop", "output")
    assert len(seen) > 1 and set(seen) == {"intel-avx512"}


def test_the_big_weights_factor_rises_with_the_weights_and_steps_where_a_sample_leaves_l2():
    """cost.big_weights, worked by hand on intel-avx512's rates (2^19 elements, two octaves, 1.8, 1 MB): 1 below
    2^19; 1 + 0.8 * log2(W / 2^19) / 2 between; 1.8 from 2^21; 1.8 from 2^19 wherever a sample's x or dy exceeds 1 MB;
    and a step without a ramp (zen4): at 2^19 elements for 1-D kernels, at 2^20 for 2-D and 3-D ones."""
    r = cost.RATES["intel-avx512"]
    small_w = make_params((2, 128, 14, 14), (128, 128, 3, 3), padding=1)             # 147456 elements
    mid = make_params((2, 256, 14, 14), (256, 256, 3, 3), padding=1)                 # 589824 = 2^19 * 1.125
    big = make_params((2, 512, 7, 7), (512, 512, 3, 3), padding=1)                   # 2359296 > 2^21
    long_rows = make_params((4, 512, 3199), (512, 512, 3), stride=2)                 # 786432; x 6.5 MB per sample
    assert cost.big_weights(small_w, r) == 1.0
    assert cost.big_weights(mid, r) == pytest.approx(1 + 0.8 * np.log2(1.125) / 2)
    assert cost.big_weights(big, r) == pytest.approx(1.8)
    assert cost.big_weights(long_rows, r) == pytest.approx(1.8)
    z = cost.RATES["zen4"]
    assert cost.big_weights(small_w, z) == 1.0 and cost.big_weights(mid, z) == 1.0     # 2-D: below 2^20
    assert cost.big_weights(big, z) == 1.5 and cost.big_weights(long_rows, z) == 1.5   # 2^21.2; 1-D from 2^19
    wide = make_params((2, 256, 14, 14), (512, 256, 3, 3), stride=2, padding=1)      # 1179648 = 2^20 * 1.125
    one_d = make_params((4, 512, 99), (512, 512, 2), stride=2)                        # 524288 = 2^19, 1-D
    cube = make_params((2, 128, 2, 7, 7), (256, 128, 3, 3, 3), padding=1)            # 884736 < 2^20, 3-D
    assert cost.big_weights(wide, z) == 1.5 and cost.big_weights(one_d, z) == 1.5
    assert cost.big_weights(cube, z) == 1.0


@pytest.mark.skipif(not (small.compiled_available() and cost.dense_loops.available()),
                    reason="the dense loops are a candidate only where the compiled loops hold them")
def test_intel_rates_pick_the_loops_for_256_channel_3x3s_and_colgemm_for_512():
    """The picks the big-weights ramp moved (measured, two threads: 2x256x14x14 -> 256 loops 2.01 ms, colgemm 2.45;
    2x512x7x7 -> 512 loops 3.44, colgemm 2.32), for every output."""
    mid = make_params((2, 256, 14, 14), (256, 256, 3, 3), padding=1)
    big = make_params((2, 512, 7, 7), (512, 512, 3, 3), padding=1)
    with cost.choosing("intel-avx512"):
        assert [paths.cost_pick(mid, o) for o in ("y", "dx", "dw")] == ["dense"] * 3
        assert [paths.cost_pick(big, o) for o in ("y", "dx", "dw")] == ["colgemm"] * 3


@pytest.mark.skipif(not small.compiled_available(),
                    reason="colgemm is a candidate only where the compiled copies are built")
def test_small_cols_is_weighed_with_its_python_steps_so_resnet_shortcuts_take_colgemm():
    """cost.small_cols = cost.small + SMALL_COLS_CALL on zen4 (intel-avx512: unmeasured, no surcharge): ResNet-18's
    strided 1x1 shortcut at 8x64x16x16 -> 128 (past SMALL_MACS: weighed) goes to colgemm for every output, which the
    surcharge decides (measured inside training steps, two threads: 0.16-0.19 ms forward against small-cols'
    0.28-0.32); a call within SMALL_MACS stays on the small path, unweighed."""
    p = make_params((8, 64, 16, 16), (128, 64, 1, 1), stride=2)
    assert cost.RATES["zen4"].small_cols_call == cost.SMALL_COLS_CALL
    assert cost.RATES["intel-avx512"].small_cols_call == 0
    with cost.choosing("zen4"):
        for o in ("y", "dx", "dw"):
            assert cost.small_cols(p, o) == pytest.approx(cost.small(p, o) + cost.SMALL_COLS_CALL)
            assert cost.small(p, o) < cost.colgemm(p, o) < cost.small_cols(p, o)
            assert paths.cost_pick(p, o) == "colgemm"
        tiny = make_params((1, 16, 4, 4), (16, 16, 1, 1), stride=2)
        assert cost.macs(tiny) <= cost.SMALL_MACS and paths.cost_pick(tiny, "y") == "small-cols"


@pytest.mark.skipif(not (small.compiled_available() and cost.dense_loops.available()),
                    reason="the dense loops are a candidate only where the compiled loops hold them")
def test_dx_and_dw_take_one_path_where_the_two_together_cost_less_than_apart(monkeypatch):
    """cost.backward_pair (zen4 rates): ResNet-18's 8x256x4x4 256 3x3 costs the dense loops cheapest for dx and colgemm
    for dw, each alone, but one path for both (one call: its fixed cost, and colgemm's copy of dy, shared) below the
    two apart plus SPLIT_CALL, so both outputs take that path, whatever the mask (measured, two threads: 1.82-2.1 ms
    either path for both, 2.43-2.48 apart); the ResNet stem keeps the stem loops' weight gradient (a first layer's
    only gradient) beside colgemm's dx; intel-avx512 (no split_call) keeps each output's own cheapest."""
    p = make_params((8, 256, 4, 4), (256, 256, 3, 3), padding=1)
    stem_call = make_params((8, 3, 64, 64), (64, 3, 7, 7), stride=2, padding=3)
    cands = ["colgemm", "dense"]
    with cost.choosing("zen4"):
        assert cost.cheapest(p, "dx", cands) == "dense" and cost.cheapest(p, "dw", cands) == "colgemm"
        apart = cost.dense(p, "dx") + cost.colgemm(p, "dw")
        one = min(cands, key=lambda name: cost.together(p, name))
        assert one == "dense"                    # its dx skipping the padding's columns (colgemm measured the same)
        assert apart < cost.together(p, one) < apart + cost.SPLIT_CALL         # SPLIT_CALL decides
        assert cost.backward_pair(p, cands, cands) == (one, one)
        if cost.stem_loops.serves(stem_call):
            assert paths.cost_pick(stem_call, "dw") == "stem"
    with cost.choosing("intel-avx512"):
        a, b = cost.cheapest(p, "dx", cands), cost.cheapest(p, "dw", cands)
        assert cost.backward_pair(p, cands, cands) == (a, b)
    monkeypatch.setenv("XCONV_NUMPY_CPU", "zen4")        # the table's choice reads the setting (cached per kind)
    assert paths.cost_pick(p, "dx") == paths.cost_pick(p, "dw") == one
    for mask in ((True, False, False), (False, True, False), (True, True, True)):
        plan = paths.backward_plan(p, mask)
        assert {run[0].name for run in plan[0]} == {one}, (mask, plan)


def test_the_stride_1_forward_weighs_big_weights_by_its_own_factor_on_the_avx512_build(monkeypatch):
    """zen4: the dense forward's big-weights factor is loop_big_weights_fwd (1.2) on the AVX-512 build, the loops'
    1.5 elsewhere and for the gradients; with the weights' copy each call (cost.WEIGHT_COPY: cold in a model) ResNet-18
    224's 2x512x7x7 -> 512 3x3 forward takes colgemm on both builds (ms: cold 3.24 against the loops' 3.69 on
    AVX-512; warm 4.0 against 6.2 on AVX2), and its backward too (6.5-7.2 against the loops' 8.1-8.9)."""
    from xconv_numpy import native
    if native.library() is None:
        pytest.skip(f"the compiled loops are not loaded here: {native.load_error()}")
    p = make_params((2, 512, 7, 7), (512, 512, 3, 3), padding=1)
    r = cost.RATES["zen4"]
    assert r.loop_big_weights_fwd < r.loop_big_weights
    with cost.choosing("zen4"):
        for isa, fwd in (("avx512", r.loop_big_weights_fwd), ("avx2", r.loop_big_weights)):
            monkeypatch.setattr(native, "isa", lambda lib, isa=isa: isa)
            assert cost.big_weights(p, r, forward=True) == fwd
            assert cost.big_weights(p, r) == r.loop_big_weights                 # the gradients' factor
            assert cost.cheapest(p, "y", ["colgemm", "dense"]) == "colgemm"
            assert cost.backward_pair(p, ["colgemm", "dense"], ["colgemm", "dense"]) == ("colgemm", "colgemm")
    with cost.choosing("intel-avx512"):                 # a kind without the forward's own factor: unchanged
        assert cost.big_weights(p, cost.RATES["intel-avx512"], forward=True) == \
            cost.big_weights(p, cost.RATES["intel-avx512"])


@pytest.mark.parametrize("xs, ws, kw, cold", [
    ((2, 512, 7, 7), (512, 512, 3, 3), dict(padding=1), "colgemm"),        # cold, ms: 3.24 against the loops' 3.69
    ((8, 512, 4, 4), (256, 512, 3, 3), dict(padding=1), "colgemm"),        # 2.27 against 2.38
    ((2, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), "dense"),        # 3.06 against colgemm's 4.13
    ((8, 256, 4, 4), (256, 256, 3, 3), dict(padding=1), "dense"),          # 1.11 against 1.20
])
def test_the_dense_forward_pays_its_copy_of_the_weights(xs, ws, kw, cold, monkeypatch):
    """The dense forward's estimate counts its tap-major copy of the weights each call (cost.WEIGHT_COPY per element,
    over the cores), which a model pays with the weights cold: zen4 on the AVX-512 build picks what ran faster with a
    64 MB sweep before each call (Zen 4, two threads, median of 30)."""
    from xconv_numpy import native
    if native.library() is None:
        pytest.skip(f"the compiled loops are not loaded here: {native.load_error()}")
    monkeypatch.setattr(native, "isa", lambda lib: "avx512")
    p = make_params(xs, ws, **kw)
    with cost.choosing("zen4"):
        without = cost.dense(p, "y")
        monkeypatch.setattr(cost, "WEIGHT_COPY", 0.0)
        assert without - cost.dense(p, "y") == pytest.approx(2 * cost.COPY * math.prod(ws) / cost.CORES)
        monkeypatch.undo()
        monkeypatch.setattr(native, "isa", lambda lib: "avx512")
        assert cost.cheapest(p, "y", ["colgemm", "dense"]) == cold


@pytest.mark.skipif(not small.compiled_available(),
                    reason="colgemm is a candidate only where the compiled copies are built")
@pytest.mark.parametrize("xs, co, want", [
    ((8, 480, 3, 3), 80, "pointwise"),         # MobileNetV2's projection at 3x3: 96 us against colgemm's 177
    ((32, 64, 8, 8), 64, "pointwise"),         # 130 against colgemm's 443
    ((8, 128, 64, 64), 8, "pointwise"),        # 1.46 ms against the grid engine's 2.26
    ((2, 256, 56, 56), 64, "pointwise"),       # ResNet-50's bottleneck 1x1: 1.39 against the grid engine's 2.41
    ((8, 160, 3, 3), 1280, "colgemm"),         # 323 us against pointwise's 408: colgemm keeps it
])
def test_1x1_forwards_take_the_per_sample_products_where_they_ran_faster(xs, co, want):
    """zen4's pointwise_fwd (0.8: measured/estimated median 0.79 over 29 1x1 stride-1 forwards, two threads): the
    forward's products weighed at their measured rate pick what ran faster (Zen 4, min of 9 alternating)."""
    p = make_params(xs, (co, xs[1], 1, 1))
    with cost.choosing("zen4"):
        assert paths.cost_pick(p, "y") == want
    N = xs[0]
    with cost.choosing("intel-avx512"):                 # unmeasured there: the estimate fitted before, N * g / CORES
        fitted = cost.CALL + N * cost._blas(co, xs[2] * xs[3], xs[1]) / cost.CORES
        assert cost.pointwise(p, "y") == pytest.approx(fitted)


@pytest.mark.skipif(not colgemm.jobs.sgemm_available(), reason="the pointwise table needs NumPy's ILP64 sgemm")
def test_the_pointwise_forward_runs_one_job_per_sample_and_group_on_the_cores():
    """One sgemm job per sample and group (grid/pointwise_planned.py): one sample keeps one core busy, so its forward
    costs what two samples' do; the backward's estimate is the one fitted before (N * g / CORES)."""
    one, two = (make_params((n, 256, 56, 56), (64, 256, 1, 1)) for n in (1, 2))
    with cost.choosing("zen4"):
        assert cost.pointwise(one, "y") == pytest.approx(cost.pointwise(two, "y"))
        assert cost.pointwise(one, "dx") - cost.CALL == pytest.approx((cost.pointwise(two, "dx") - cost.CALL) / 2)


@pytest.mark.skipif(not (small.compiled_available() and colgemm.jobs.sgemm_available()),
                    reason="the small path's columns are built with the loops; the pointwise table needs ILP64 sgemm")
@pytest.mark.parametrize("xs, co, want", [((1, 4, 8, 8), 4, "pointwise"), ((32, 16, 4, 4), 32, "pointwise"),
                                          ((16, 32, 2, 2), 64, "pointwise"), ((2, 3, 56, 56), 16, "pointwise"),
                                          ((8, 256, 1, 1), 64, "small-cols"), ((4, 32, 8, 8), 1, "small-cols")])
def test_small_1x1_forwards_take_the_pointwise_products_and_their_backward_the_small_path(xs, co, want):
    """Within SMALL_MACS a call goes to the small path by size, except a float32 1x1 forward (stride 1, no padding)
    whose sgemm table builds, which that table ran in 14-47% less time (paths._pointwise_forward); a product with a
    dimension of 1 (one position, one output channel: the table is refused), float64 and the backward keep the small
    path. The trace says which ran and reports the scratch (none for the pointwise products)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal((co, xs[1], 1, 1), dtype=np.float32)
    assert cost.macs(make_params(xs, w.shape)) <= cost.SMALL_MACS
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, backend="numpy")
        y64 = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy")
        xconv.convolution_backward(y, x, w, backend="numpy")
    fwd, fwd64, bwd = (r.path.split(":")[0] for r in t.records)
    assert (fwd, fwd64) == (want, "small-cols") and bwd.startswith("small-"), (fwd, fwd64, bwd)
    assert t.records[0].workspace_bytes == 0 or want != "pointwise"
    np.testing.assert_allclose(y, y64, rtol=1e-5, atol=1e-5 * np.abs(y64).max())
