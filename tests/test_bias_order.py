"""The bias gradient's two routes give the same bits (backends/xconv_numpy/bias.py, issue 24).

``bias.grad_bias`` (NumPy: a float64 copy of grad_y summed by ``np.sum``) defines grad_bias's order; the compiled
sum (``csrc/bias_sum.c``, ``bias.compiled_grad_bias``) reads grad_y in place and must reproduce it bit for bit:
NumPy's pairwise summation of each row as this machine's NumPy runs it (checked against ``row.sum()`` for every
row length 1..20000, with signed zeros, infinities, NaNs of both signs, huge and subnormal values; a NaN result
is the canonical NaN on both routes), for any
dtype, layout and output dtype; where C cannot read grad_y (byte-swapped, unaligned) the NumPy route serves.
Each build the CPU runs (baseline, AVX2, AVX-512) is checked in its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xconv_numpy import bias, native

pytestmark = pytest.mark.skipif(not bias._compiled_on(), reason="the compiled loops are not built here "
                                                                  "(or XCONV_NUMPY_C=0)")

#: values a gradient may hold that stress an order: signed zeros, infinities, NaNs of both signs, the largest
#: and smallest magnitudes of each dtype
SPECIALS = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, -np.nan, 1e308, -1e308, 5e-324, 1e-310, 3.4e38,
                     -3.4e38, 1e-45, 6.5e4, -6.5e4, 6e-8, 1.0, -1.0])
DTYPES = ["float16", "float32", "float64"]
try:
    import ml_dtypes
    DTYPES.append("bfloat16")
except ImportError:                                  # not installed: bfloat16 is not a dtype xconv can take here
    ml_dtypes = None


def _dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _values(rng, n, dtype, special_rate):
    """n values of wide magnitudes in dtype, a share of them special."""
    a = rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))
    k = rng.random(n) < special_rate
    a[k] = rng.choice(SPECIALS, int(k.sum()))
    with np.errstate(all="ignore"):
        return a.astype(_dtype(dtype))


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def test_every_row_length_to_20000_sums_as_numpys_row_sum():
    """The compiled sum of one float64 row of each length 1..20000 is ``row.sum()``'s bits: NumPy's pairwise
    order, its +0.0 start, no split at the ufunc buffer size (8192)."""
    rng = np.random.default_rng(24)
    base = [_values(rng, 20000, "float64", rate) for rate in (0.0, 0.0005, 0.05)]
    differ = []
    with np.errstate(all="ignore"):
        for n in range(1, 20001):
            row = base[n % 3][-n:]
            got = bias.compiled_grad_bias(row.reshape(1, 1, n), np.float64)
            want = row.sum()
            want = np.float64(np.nan) if np.isnan(want) else want      # the canonical NaN (bias.py, step 3)
            if got is None or _bits(got) != _bits(want):
                differ.append(n)
    assert not differ, differ[:20]


@st.composite
def _cases(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    N, C = draw(st.integers(1, 9)), draw(st.integers(1, 5))
    long_rows = draw(st.booleans())
    if long_rows:                                    # a row longer than NumPy's buffer (8192 elements) and 128
        P = draw(st.integers(129, 24000))
        N, C = min(N, 2), min(C, 2)
        spatial = {1: (P,), 2: (max(1, P // 97), 97), 3: (max(1, P // 600), 20, 30)}[nd]
    else:
        spatial = tuple(draw(st.integers(1, 9)) for _ in range(nd))
    layout = draw(st.sampled_from(["C", "F", "channels-last", "sliced", "reversed", "broadcast", "byteswapped",
                                   "unaligned", "read-only"]))
    return dict(shape=(N, C) + spatial, dtype=draw(st.sampled_from(DTYPES)), layout=layout,
                special=draw(st.sampled_from([0.0, 0.01, 0.2])), seed=draw(st.integers(0, 2**32 - 1)),
                out=draw(st.sampled_from(["same", "float32", "float64"])))


def _laid_out(a, layout, rng):
    """``a``'s values in one of the layouts a user may hold."""
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "channels-last":
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)
    if layout == "sliced":                           # every other channel and last-dim element of a bigger array
        big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big = np.concatenate([big, big], axis=1)
        big[:, ::2, ..., ::2] = a
        return big[:, ::2, ..., ::2]
    if layout == "reversed":
        return np.ascontiguousarray(a[::-1, :, ..., ::-1])[::-1, :, ..., ::-1]
    if layout == "broadcast":                        # one sample's values seen N times (stride 0)
        return np.broadcast_to(a[:1], a.shape)
    if layout == "byteswapped":
        return a.astype(a.dtype.newbyteorder())
    if layout == "unaligned":
        raw = np.empty(a.nbytes + 1, np.uint8)[1:].view(a.dtype).reshape(a.shape)
        raw[...] = a
        return raw
    if layout == "read-only":
        a = a.copy()
        a.flags.writeable = False
        return a
    return np.ascontiguousarray(a)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_cases())
def test_compiled_sum_has_numpy_routes_bits(case):
    """Over drawn shapes (1-D/2-D/3-D, N up to 9, rows from 1 to over 20000 elements), dtypes, layouts and
    special values: bias_sum's bits are grad_bias's; the compiled route serves every layout C reads (any strides,
    read-only, broadcast) and refuses byte-swapped and unaligned grad_y."""
    rng = np.random.default_rng(case["seed"])
    n = int(np.prod(case["shape"]))
    a = _values(rng, n, case["dtype"], case["special"]).reshape(case["shape"])
    dy = _laid_out(a, case["layout"], rng)
    seen = np.broadcast_to(a[:1], a.shape) if case["layout"] == "broadcast" else a
    assert np.array_equal(dy.astype(np.float64), seen.astype(np.float64), equal_nan=True)
    out = _dtype(case["dtype"]) if case["out"] == "same" else np.dtype(case["out"])
    with np.errstate(all="ignore"):
        want = bias.grad_bias(dy, out)
        got = bias.compiled_grad_bias(dy, out)
    if case["layout"] in ("byteswapped", "unaligned"):
        assert got is None
        return
    assert got is not None
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    assert _bits(got) == _bits(want), (case, got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_sum_of_a_call_and_its_scratch(dtype, monkeypatch):
    """bias_sum (the numpy backend's path) gives grad_bias's bits in the call's dtype by the compiled route, and
    reports that route's scratch (no heap for float32/float64; the C float64 sums for the 2-byte dtypes); with
    the compiled part off (XCONV_NUMPY_C=0) the NumPy route serves and reports its rows and float64 copy
    (scratch_bytes answers by the route the settings give; bias_sum notes its route's bytes in the trace)."""
    p = SimpleNamespace(dtype=dtype)
    rng = np.random.default_rng(1)
    dy = _values(rng, 2 * 3 * 5 * 7, dtype, 0.0).reshape(2, 3, 5, 7)
    with np.errstate(all="ignore"):
        want = bias.grad_bias(dy, _dtype(dtype))
        got = bias.bias_sum(dy, p)
    assert _bits(got) == _bits(want) and got.dtype == _dtype(dtype)
    assert bias.scratch_bytes(dy) == (0 if dy.itemsize > 2 else 8 * 3)
    monkeypatch.setenv("XCONV_NUMPY_C", "0")
    assert bias.compiled_grad_bias(dy, _dtype(dtype)) is None
    with np.errstate(all="ignore"):
        assert _bits(bias.bias_sum(dy, p)) == _bits(want)
    copy = 0 if dtype == "float64" else 8 * dy.size          # a C-contiguous float64 grad_y is summed in place
    assert bias.scratch_bytes(dy) == bias.numpy_scratch_bytes(dy) == 8 * 2 * 3 + copy
    other = dy.copy()                                         # not the array bias_sum last summed: asks the settings
    assert bias.scratch_bytes(other) == 8 * 2 * 3 + copy
    monkeypatch.delenv("XCONV_NUMPY_C")
    assert bias.scratch_bytes(other) == (0 if dy.itemsize > 2 else 8 * 3)


_ISA_CHECK = r"""
import numpy as np, sys
from xconv_numpy import bias, native
assert native.isa(native.library()) == sys.argv[1], native.isa(native.library())
rng = np.random.default_rng(5)
with np.errstate(all="ignore"):
    for n in list(range(1, 300)) + [1000, 8191, 8192, 8193, 20001]:
        for dt in (np.float16, np.float32, np.float64):
            a = rng.standard_normal(3 * 2 * n) * np.exp(rng.uniform(-30, 30, 3 * 2 * n))
            a[rng.random(a.size) < 0.01] = np.nan
            a[rng.random(a.size) < 0.01] = -0.0
            a = a.astype(dt).reshape(3, 2, n)
            for dy in (a, a[:, :, ::-1], np.asfortranarray(a)):
                assert bias.compiled_grad_bias(dy, dt).tobytes() == bias.grad_bias(dy, dt).tobytes(), (n, dt)
print("ok")
"""


@pytest.mark.parametrize("isa", native.ISAS)
def test_each_build_sums_in_numpys_order(isa):
    """Every instruction-set build this CPU runs (chosen by XCONV_NUMPY_ISA in a fresh process) gives NumPy's
    bits: the vector lanes of the contiguous case keep each accumulator's order on every ISA."""
    lib = native.library()
    if native.library_path(isa) is None or native.ISAS.index(isa) > int(lib.xconv_cpu_level()):
        pytest.skip(f"the {isa} build is not present or this CPU does not run it")
    env = dict(os.environ, XCONV_NUMPY_ISA=isa)
    run = subprocess.run([sys.executable, "-c", _ISA_CHECK, isa], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_a_bias_only_call_records_its_routes_scratch(compiled, monkeypatch):
    """The trace record of a grad_bias-only call holds the bytes of the route bias_sum took."""
    import xconv

    monkeypatch.setenv("XCONV_NUMPY_C", compiled)
    rng = np.random.default_rng(2)
    dy = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    x = rng.standard_normal((2, 4, 5, 7)).astype(np.float32)
    w = rng.standard_normal((3, 4, 1, 1)).astype(np.float32)
    with xconv.trace() as t:
        xconv.convolution_backward(dy, x, w, output_mask=(False, False, True), backend="numpy")
    want = 0 if compiled == "1" else bias.numpy_scratch_bytes(dy)
    assert t.records[0].workspace_bytes == want == bias.scratch_bytes(dy), t.records[0]
