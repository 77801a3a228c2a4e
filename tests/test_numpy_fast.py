"""The NumPy fast path ("numpy") against the float64 oracle ("numpy-exact").

Error bound per element: |fast - exact| <= 8 * u_c * K * exact_abs + 2 * u_out * exact_abs + tiny,
with u_c the unit roundoff of the compute dtype (float32 for float16/bfloat16/float32), K the
length of the element's reduction, u_out that of the result dtype (the final rounding), and
exact_abs the exact result computed on |inputs|. No timing assertions here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import xconv
from xconv.dtypes import DTYPES, UNIT_ROUNDOFF

xconv_numpy = pytest.importorskip("xconv_numpy")
from core_helpers import traced_memory  # noqa: E402
from xconv_numpy import fast, paths  # noqa: E402
from xconv_numpy.grid import scratch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")


# ---------------------------------------------------------------------------------------------
# Helpers


def relayout(a: np.ndarray, kind: str) -> np.ndarray:
    """The same values as ``a`` in another memory layout: contiguous, transposed storage, negative strides, sliced."""
    if kind == "contiguous" or a.ndim == 0:
        return a
    if kind == "transposed":
        perm = tuple(reversed(range(a.ndim)))
        return np.ascontiguousarray(a.transpose(perm)).transpose(perm)
    if kind == "negative":
        axes = tuple(range(0, a.ndim, 2))
        return np.flip(np.ascontiguousarray(np.flip(a, axes)), axes)
    if kind == "sliced":
        big = np.zeros(tuple(2 * n + 1 for n in a.shape), a.dtype)
        view = big[(slice(1, None, 2),) * a.ndim]
        view[...] = a
        return view
    raise ValueError(kind)


def conv_kwargs(c: dict) -> dict:
    return {k: c[k] for k in ("stride", "padding", "dilation", "groups", "transposed", "output_padding")}


def reduction_lengths(c: dict, x_shape, w_shape, y_shape) -> tuple[int, int, int]:
    """Terms summed per element of (dx, dw, db) (the direct convolution's view when transposed)."""
    g = c["groups"]
    k = math.prod(w_shape[2:])
    if c["transposed"]:
        # direct convolution: input = y (C_out channels), output = x; weight (C_in, C_out/g, *k)
        return w_shape[1] * k, x_shape[0] * math.prod(x_shape[2:]), y_shape[0] * math.prod(y_shape[2:])
    return w_shape[0] // g * k, y_shape[0] * math.prod(y_shape[2:]), y_shape[0] * math.prod(y_shape[2:])


def check_close(fast_r, exact_r, exact_abs, dtype: str, K: int, what: str):
    assert fast_r.dtype == exact_r.dtype == DTYPES[dtype], what
    assert fast_r.shape == exact_r.shape, what
    assert fast_r.flags.c_contiguous, what
    f = fast_r.astype(np.float64)
    e = exact_r.astype(np.float64)
    a = exact_abs.astype(np.float64)
    u_c = UNIT_ROUNDOFF["float64" if dtype == "float64" else "float32"]
    u_out = UNIT_ROUNDOFF[dtype]
    tiny = 4 * float(np.finfo(DTYPES[dtype]).smallest_subnormal)
    bound = 8 * u_c * max(K, 1) * a + 2 * u_out * a + tiny
    bad = ~(np.abs(f - e) <= bound)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} elements out of bound; first at {i}: fast {f[i]!r}, "
                             f"exact {e[i]!r}, bound {bound[i]!r}")


def compare(c: dict, x, w, dy, mask, layout="contiguous"):
    """Run fast and exact backward (and fprop) on the same data and check every result."""
    kw = conv_kwargs(c)
    dtype = c["dtype"]
    xs, ws, dys = (relayout(a, layout) for a in (x, w, dy))
    fast_r = xconv.convolution_backward(dys, xs, ws, output_mask=mask, backend="numpy", **kw)
    exact_r = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy-exact", **kw)
    abs_r = xconv.convolution_backward(np.abs(dy), np.abs(x), np.abs(w), output_mask=mask, backend="numpy-exact",
                                       **kw)
    ks = reduction_lengths(c, x.shape, w.shape, dy.shape)
    for bit, f, e, a, K, what in zip(mask, fast_r, exact_r, abs_r, ks, ("grad_input", "grad_weight", "grad_bias")):
        if not bit:
            assert f is None and e is None
            continue
        check_close(f, e, a, dtype, K, what)
    # forward (the transposed convolution's backward runs it): reduction over C_in/g * k
    yf = xconv.conv_fprop(xs, ws, backend="numpy", **kw)
    ye = xconv.conv_fprop(x, w, backend="numpy-exact", **kw)
    ya = xconv.conv_fprop(np.abs(x), np.abs(w), backend="numpy-exact", **kw)
    kf = (w.shape[0] // c["groups"] if c["transposed"] else w.shape[1]) * math.prod(w.shape[2:])
    check_close(yf, ye, ya, dtype, kf, "output")


def random_arrays(rng, c: dict):
    dt = DTYPES[c["dtype"]]
    x = rng.standard_normal(c["input"]).astype(dt)
    w = rng.standard_normal(c["weight"]).astype(dt)
    y_shape = xconv.output_shape(c["input"], c["weight"], **{k: v for k, v in conv_kwargs(c).items()})
    dy = rng.standard_normal(y_shape).astype(dt)
    return x, w, dy


# ---------------------------------------------------------------------------------------------
# Hypothesis: the whole parameter space, small shapes


@st.composite
def convolutions(draw):
    nd = draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    depthwise = draw(st.integers(0, 3)) == 0
    groups = draw(st.integers(1, 4))
    if depthwise:
        cg, cog = 1, draw(st.integers(1, 2))
    else:
        cg, cog = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    max_side = {1: 12, 2: 7, 3: 5}[nd]
    kernel = [draw(st.integers(1, 4)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilation = [draw(st.integers(1, 3)) for _ in range(nd)]
    padding = [(draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd)]
    n = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    if transposed:
        spatial = [draw(st.integers(1, max_side)) for _ in range(nd)]
        output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
        c_in, c_out = groups * cog, groups * cg   # the direct convolution's roles swap
        weight = [c_in, c_out // groups, *kernel]
        for i in range(nd):  # keep the transposed output non-empty
            span = (spatial[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
            pre, post = padding[i]
            while pre + post > span - 1:
                pre, post = max(pre - 1, 0), max(post - 1, 0) if pre == 0 else post
            padding[i] = (pre, post)
    else:
        spatial = []
        for i in range(nd):
            need = dilation[i] * (kernel[i] - 1) + 1 - sum(padding[i])
            spatial.append(draw(st.integers(max(1, need), max(max_side, need))))
        output_padding = [0] * nd
        c_in, c_out = groups * cg, groups * cog
        weight = [c_out, cg, *kernel]
    mask = draw(st.sampled_from([(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)
                                 if a or b or c]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "negative", "sliced"]))
    return dict(input=[n, c_in, *spatial], weight=weight, stride=stride, padding=padding, dilation=dilation,
                groups=groups, transposed=transposed, output_padding=output_padding, dtype=dtype), mask, layout


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1))
def test_fast_matches_exact(conv, seed):
    c, mask, layout = conv
    x, w, dy = random_arrays(np.random.default_rng(seed), c)
    compare(c, x, w, dy, mask, layout)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1))
@example(conv=({"input": [3, 4, 5, 5, 1], "weight": [4, 4, 4, 4, 2], "stride": [2, 3, 2],     # a phase reads
                "padding": [(0, 3), (0, 1), (0, 3)], "dilation": [2, 1, 3], "groups": 1,     # no input: its dW
                "transposed": False, "output_padding": [0, 0, 0], "dtype": "float16"},       # part was scratch
               (False, True, True), "transposed"), seed=1295)
def test_scratch_contents_never_reach_results(conv, seed, monkeypatch):   # the same patch for every example
    """Scratch from the arena arrives filled with 3e38 (float32's near-largest value): results must not
    depend on what scratch held before, and no overflow may come from leftover values."""
    compare_on_poisoned_scratch(monkeypatch, conv, seed)


def poison_scratch(monkeypatch):
    """From now on (this test), the arena's scratch is handed out filled with 3e38 (float32's near-largest value)."""
    real_take = scratch.Arena.take

    def poisoned(self, nbytes):
        buf = real_take(self, nbytes)
        buf[:buf.nbytes // 4 * 4].view(np.float32).fill(3e38)
        return buf

    monkeypatch.setattr(scratch.Arena, "take", poisoned)


def compare_on_poisoned_scratch(monkeypatch, conv, seed):
    """compare() with the arena's scratch filled with 3e38 (float32's near-largest value) when handed out,
    and any RuntimeWarning (an overflow from a leftover value) an error."""
    poison_scratch(monkeypatch)
    c, mask, layout = conv
    x, w, dy = random_arrays(np.random.default_rng(seed), c)
    with warnings.catch_warnings(), paths.force(off=["small-paths"]):   # the grid (scratch from the arena)
        warnings.simplefilter("error", RuntimeWarning)
        compare(c, x, w, dy, mask, layout)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), seed=st.integers(0, 2**32 - 1), budget=st.sampled_from([1, 200, 3000, 40000, None]),
       strategy=st.sampled_from([None, "a", "b", "a-implicit", "a-compact"]))
def test_chunked_matches_exact(conv, seed, budget, strategy):
    """Both backward strategies (and strategy "a" with implicit first-dim taps, or compact lines), and tiny working-set budgets that force line-range chunks inside a
    sample (halos between chunks) and many chunks per call (ordered accumulation across chunks)."""
    c, mask, layout = conv
    x, w, dy = random_arrays(np.random.default_rng(seed), c)
    forced = {None: (), "a": ("grid-a",), "b": ("grid-b",), "a-implicit": ("grid-a",), "a-compact": ("grid-a",)}
    knobs = dict(implicit_outer=True if strategy == "a-implicit" else None,
                 compact_inner=True if strategy == "a-compact" else False if strategy == "a" else None)
    if budget is not None:
        knobs["chunk_bytes"] = (1, budget)
    with paths.force(*forced[strategy], off=["small-paths"]), paths.tune(**knobs):     # the grid, its knobs
        compare(c, x, w, dy, mask, layout)


# ---------------------------------------------------------------------------------------------
# Named shapes: the benchmark suite at batch 1, odd and degenerate shapes


def _suite_cases():
    suite = json.loads((ROOT / "benchmarks" / "suite.json").read_text())["cases"]
    out = []
    for case in suite:
        nd = len(case["stride"])
        out.append(pytest.param(dict(input=[1] + case["input"][1:], weight=case["weight"], stride=case["stride"],
                                     padding=case["padding"], dilation=case["dilation"], groups=case["groups"],
                                     transposed=False, output_padding=[0] * nd, dtype="float32"),
                                id=case["name"]))
    return out


@pytest.mark.parametrize("c", _suite_cases())
def test_suite_shapes(c):
    x, w, dy = random_arrays(np.random.default_rng(0), c)
    compare(c, x, w, dy, (True, True, True))


ODD = {
    "c1_long_reduction_1d": dict(input=[3, 1, 700], weight=[1, 1, 9], stride=[1], padding=[4], dilation=[1]),
    "kernel_is_input": dict(input=[2, 3, 5, 4], weight=[4, 3, 5, 4], stride=[1, 1], padding=[0, 0],
                            dilation=[1, 1]),
    "one_by_one_spatial": dict(input=[4, 5, 1, 1], weight=[3, 5, 1, 1], stride=[2, 2], padding=[0, 0],
                               dilation=[1, 1]),
    "stride_beyond_kernel": dict(input=[2, 2, 11, 9], weight=[3, 2, 2, 1], stride=[4, 3], padding=[1, 0],
                                 dilation=[1, 1]),
    "padding_only_windows": dict(input=[1, 2, 2, 2], weight=[2, 2, 3, 3], stride=[1, 1], padding=[[4, 3], [3, 4]],
                                 dilation=[2, 1]),
    "huge_dilation": dict(input=[2, 2, 30], weight=[2, 2, 3], stride=[2], padding=[[0, 1]], dilation=[13]),
    "prime_sizes_3d": dict(input=[1, 3, 7, 5, 3], weight=[5, 3, 2, 3, 1], stride=[2, 1, 3], padding=[1, 0, 2],
                           dilation=[3, 1, 1]),
    "depthwise_multiplier": dict(input=[2, 3, 9, 9], weight=[6, 1, 3, 3], stride=[2, 2], padding=[1, 1],
                                 dilation=[1, 1], groups=3),
    "wide_in_narrow_out": dict(input=[2, 40, 6, 6], weight=[2, 40, 3, 3], stride=[1, 1], padding=[1, 1],
                               dilation=[1, 1]),
    "narrow_in_wide_out": dict(input=[2, 1, 6, 6], weight=[40, 1, 3, 3], stride=[2, 1], padding=[2, 1],
                               dilation=[1, 2]),
    "pointwise_grouped": dict(input=[3, 6, 5, 7], weight=[4, 3, 1, 1], stride=[1, 1], padding=[0, 0],
                              dilation=[2, 1], groups=2),
    "pointwise_3d": dict(input=[2, 4, 3, 2, 5], weight=[3, 4, 1, 1, 1], stride=[1, 1, 1], padding=[0, 0, 0],
                         dilation=[1, 1, 1]),
}


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("name", list(ODD))
def test_odd_shapes(name, dtype):
    c = dict(dict(groups=1), transposed=False, output_padding=[0] * (len(ODD[name]["input"]) - 2), dtype=dtype)
    c.update(ODD[name])
    x, w, dy = random_arrays(np.random.default_rng(1), c)
    for mask, layout in (((True, True, True), "negative"), ((True, False, False), "contiguous"),
                         ((False, True, False), "sliced"), ((False, False, True), "transposed")):
        compare(c, x, w, dy, mask, layout)


def test_empty_batch_and_channels():
    for shape in ([0, 4, 5, 5], [2, 0, 5, 5]):
        x = np.ones(shape, np.float32)
        w = np.ones([3, shape[1], 3, 3], np.float32)
        dy = np.ones([shape[0], 3, 3, 3], np.float32)
        dx, dw, db = xconv.convolution_backward(dy, x, w, backend="numpy")
        assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (3,)
        assert not dx.any() and not dw.any()


def test_mask_skips_work(monkeypatch):
    """A False bit computes nothing for that gradient: the fast path is told exactly what to compute."""
    calls = []
    real = fast.backward

    def spy(dy, x, w, p, mask):
        calls.append(mask)
        return real(dy, x, w, p, mask)

    monkeypatch.setattr(fast, "backward", spy)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 8, 8), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    dy = rng.standard_normal((2, 4, 8, 8), dtype=np.float32)
    dx, dw, db = xconv.convolution_backward(dy, x, w, padding=1, output_mask=(False, True, False), backend="numpy")
    assert dx is None and db is None and dw.shape == w.shape
    assert calls == [(False, True, False)]


# ---------------------------------------------------------------------------------------------
# Determinism


def _digest_run(n_threads_env=None) -> str:
    """Hash of the fast path's results on a fixed problem set, computed in this process."""
    rng = np.random.default_rng(7)
    h = hashlib.sha256()
    problems = [
        ((4, 16, 20, 20), (16, 16, 3, 3), dict(padding=1)),
        ((4, 16, 20, 20), (32, 16, 3, 3), dict(padding=1, stride=2)),
        ((3, 3, 40, 40), (16, 3, 7, 7), dict(padding=3, stride=2)),
        ((2, 24, 20, 20), (24, 1, 3, 3), dict(padding=1, groups=24)),
        ((2, 1, 5000), (1, 1, 5), dict(padding=2)),
        ((2, 32, 10, 10), (32, 8, 3, 3), dict(padding=1, groups=4)),
    ]
    for xs, ws, kw in problems:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        y = xconv.conv_fprop(x, w, backend="numpy", **kw)
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        for r in (y,) + tuple(xconv.convolution_backward(dy, x, w, backend="numpy", **kw)):
            h.update(r.tobytes())
    return h.hexdigest()


DIGEST_SCRIPT = "import sys; sys.path[:0] = {paths!r}; import test_numpy_fast as t; print(t._digest_run())"


def test_deterministic_run_to_run():
    assert _digest_run() == _digest_run()


def test_deterministic_across_processes():
    here = _digest_run()
    paths = [str(ROOT / "tests"), str(ROOT / "backends"), str(ROOT)]
    out = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT.format(paths=paths)], capture_output=True, text=True,
                         check=True, env=dict(os.environ), cwd=str(ROOT))
    assert out.stdout.strip().splitlines()[-1] == here


# ---------------------------------------------------------------------------------------------
# Memory


@pytest.mark.parametrize("dtype,case", [
    ("float32", ((64, 16, 24, 24), (16, 16, 3, 3), dict(padding=1))),
    ("float16", ((64, 16, 24, 24), (16, 16, 3, 3), dict(padding=1))),
    ("float32", ((64, 3, 48, 48), (16, 3, 7, 7), dict(padding=3, stride=2))),
    ("float32", ((64, 32, 16, 16), (32, 1, 3, 3), dict(padding=1, groups=32))),
    ("float16", ((64, 32, 16, 16), (32, 1, 3, 3), dict(padding=1, groups=32))),
    ("float32", ((64, 32, 16, 16), (32, 32, 3, 3), dict(padding=1))),            # the compiled direct loops
    ("bfloat16", ((32, 16, 8, 8, 8), (32, 16, 3, 3, 3), dict(padding=1))),
    ("bfloat16", ((256, 8, 20), (16, 1, 5), dict(padding=2, groups=8))),
    ("bfloat16", ((32, 8, 12, 12, 12), (8, 8, 3, 3, 3), dict(padding=1))),
])
def test_extra_memory_bounded(dtype, case):
    """Extra memory of one backward (tracemalloc peak beyond its results) < 2x the bytes of inputs + outputs."""
    xs, ws, kw = case
    dt = DTYPES[dtype]
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs).astype(dt)
    w = rng.standard_normal(ws).astype(dt)
    y_shape = xconv.output_shape(xs, ws, **kw)
    dy = rng.standard_normal(y_shape).astype(dt)
    io = 2 * x.nbytes + 2 * w.nbytes + dy.nbytes + ws[0] * dt.itemsize
    # one-time costs (importing Numba, loading compiled loops) are not the call's: warm up on one sample
    xconv.convolution_backward(dy[:1], x[:1], w, backend="numpy", **kw)
    fast.release_memory()  # scratch kept from earlier calls would hide this call's allocations
    result, held, peak = traced_memory(lambda: xconv.convolution_backward(dy, x, w, backend="numpy", **kw))
    kept = sum(r.nbytes for r in result)
    assert held >= kept  # tracemalloc saw the results: numpy reports its allocations
    extra = peak - kept
    assert extra < 2 * io, f"extra {extra} bytes >= 2 x {io}"
