"""GPU tests of the cuDNN backend: real cuDNN graphs on CuPy arrays, cross-checked against the NumPy oracle.

Skipped, with the availability reason (CuPy missing, no CUDA device, cuDNN runtime or frontend
missing or too old), wherever the backend cannot run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import xconv
from xconv import UnsupportedError
from xconv.dtypes import DTYPES
from xconv.params import make_params
from xconv_cudnn import CudnnBackend, driver
from xconv_cudnn.cache import PlanCache

_STATUS = driver.availability()
pytestmark = pytest.mark.skipif(not _STATUS.available, reason=f"cuDNN backend unavailable: {_STATUS.reason}")

# Cases: (name, input shape, weight shape, conv kwargs). Transposed, groups, depthwise, dilation,
# asymmetric padding, strides, 1-D (lifted by the core), 2-D and 3-D.
CASES = [
    ("plain3x3", (2, 8, 12, 12), (16, 8, 3, 3), dict(padding=1)),
    ("stride2", (2, 8, 13, 11), (12, 8, 3, 3), dict(stride=2, padding=1)),
    ("dilated", (2, 8, 14, 14), (8, 8, 3, 3), dict(dilation=2, padding=2)),
    ("asym_pad", (2, 4, 9, 10), (6, 4, 3, 2), dict(padding=((1, 2), (0, 1)), stride=(2, 1))),
    ("groups", (2, 12, 10, 10), (18, 3, 3, 3), dict(groups=4, padding=1)),
    ("depthwise", (2, 16, 11, 11), (16, 1, 3, 3), dict(groups=16, padding=1, stride=2)),
    ("pointwise", (3, 16, 7, 7), (32, 16, 1, 1), dict()),
    ("conv1d", (2, 8, 33), (8, 8, 5), dict(padding=2)),
    ("conv1d_asym", (2, 4, 20), (6, 4, 4), dict(padding=((3, 0),), stride=2)),
    ("conv3d", (1, 4, 6, 7, 8), (8, 4, 3, 3, 3), dict(padding=1)),
    ("conv3d_strided", (2, 4, 7, 6, 5), (4, 2, 2, 3, 3), dict(groups=2, stride=(2, 1, 2), padding=((1, 0), 1, 1))),
    ("transposed", (2, 8, 6, 6), (8, 4, 3, 3), dict(transposed=True, stride=2, padding=1, output_padding=1)),
    ("transposed_groups", (2, 8, 5, 7), (8, 3, 3, 2), dict(transposed=True, groups=2, stride=(2, 3), dilation=(2, 1))),
    ("transposed_1d", (2, 4, 9), (4, 6, 3), dict(transposed=True, stride=3, padding=((1, 0),))),
]
# (dtype, math, tolerance relative to max |reference| + 1): the error scale of each precision.
PRECISIONS = [
    ("float32", "keep_dtype", 2e-5),
    ("float32", "allow_tf32", 3e-3),
    ("float16", "keep_dtype", 1e-2),
    ("float64", "keep_dtype", 1e-11),
]


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.fixture
def backend():
    return CudnnBackend(cache=PlanCache(4096))


def _channels_last(cp, a):
    order = (0,) + tuple(range(2, a.ndim)) + (1,)
    inverse = tuple(int(i) for i in np.argsort(order))
    return cp.ascontiguousarray(a.transpose(order)).transpose(inverse)


def _close(got, want, tol, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x {scale:.3g}"


def _inputs(case, dtype, seed=0):
    _, in_shape, w_shape, conv = case
    rng = np.random.default_rng(seed)
    out_shape = xconv.output_shape(in_shape, w_shape, **conv)
    make = lambda shape: rng.standard_normal(shape).astype(DTYPES[dtype])  # noqa: E731
    return make(in_shape), make(w_shape), make(out_shape), make((out_shape[1],))


def test_availability_reports_versions():
    assert _STATUS.cudnn_version >= driver.MIN_CUDNN and _STATUS.frontend_version and _STATUS.devices
    info = xconv.get_backend("cudnn").info()
    assert info.available and "cuDNN" in info.version and info.devices


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype, math, tol", PRECISIONS, ids=[f"{d}-{m}" for d, m, _ in PRECISIONS])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_backward_and_fprop_match_the_oracle(cp, backend, case, dtype, math, tol, layout):
    x, w, dy, bias = _inputs(case, dtype)
    conv = dict(case[3], math=math)
    want = xconv.convolution_backward(dy, x, w, bias_sizes=[dy.shape[1]], backend="numpy-exact", **conv)
    want_y = xconv.conv_fprop(x, w, bias=bias, backend="numpy-exact", **conv)
    gx, gw, gdy, gb = (cp.asarray(a) for a in (x, w, dy, bias))
    if layout == "channels_last":
        gx, gdy = _channels_last(cp, gx), _channels_last(cp, gdy)
    try:
        for mask in itertools.product([True, False], repeat=3):
            got = xconv.convolution_backward(gdy, gx, gw, bias_sizes=[dy.shape[1]], output_mask=mask,
                                             backend=backend, **conv)
            for name, g, r, bit in zip(("grad_input", "grad_weight", "grad_bias"), got, want, mask):
                assert (g is None) == (not bit), name
                if g is not None:
                    assert isinstance(g, cp.ndarray) and g.dtype == DTYPES[dtype] and g.flags.c_contiguous
                    _close(cp.asnumpy(g), r, tol, f"{name} mask={mask}")
        y = xconv.conv_fprop(gx, gw, bias=gb, backend=backend, **conv)
        _close(cp.asnumpy(y), want_y, tol, "output")
    except UnsupportedError as exc:
        if dtype == "float64":
            assert "float64" in str(exc) or "cudnn" in str(exc)
            pytest.skip(f"cuDNN refused float64 here: {exc}")
        raise


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5], CASES[11]], ids=lambda c: c[0])
def test_deterministic_is_refused_or_bitwise_identical(cp, backend, case):
    x, w, dy, _ = _inputs(case, "float32", seed=1)
    gx, gw, gdy = (cp.asarray(a) for a in (x, w, dy))
    try:
        runs = [xconv.convolution_backward(gdy, gx, gw, deterministic=True, backend=backend, **case[3])
                for _ in range(3)]
    except UnsupportedError as exc:
        assert "deterministic" in str(exc) and "cudnn" in str(exc)
        return
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert cp.asnumpy(a).tobytes() == cp.asnumpy(b).tobytes()


def test_plan_cache_hits(cp, backend):
    x, w, dy, _ = _inputs(CASES[0], "float32")
    gx, gw, gdy = (cp.asarray(a) for a in (x, w, dy))
    xconv.convolution_backward(gdy, gx, gw, backend=backend, **CASES[0][3])
    stats = backend.cache.stats()
    graphs = {id(e.graph) for e in backend.cache._entries.values()}
    for _ in range(5):
        xconv.convolution_backward(gdy, gx, gw, backend=backend, **CASES[0][3])
    after = backend.cache.stats()
    assert after["misses"] == stats["misses"] and after["hits"] >= stats["hits"] + 10
    assert {id(e.graph) for e in backend.cache._entries.values()} == graphs


def test_runs_on_cupy_current_stream(cp, backend):
    x, w, dy, _ = _inputs(CASES[1], "float32", seed=2)
    want = xconv.convolution_backward(dy, x, w, backend="numpy-exact", **CASES[1][3])
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        gx, gw, gdy = (cp.asarray(a) for a in (x, w, dy))
        got = xconv.convolution_backward(gdy, gx, gw, backend=backend, **CASES[1][3])
        device = gx.device.id
    rt = backend.runtime()
    assert rt._local.handles[device][1] == stream.ptr       # the handle was bound to this stream
    stream.synchronize()
    for g, r in zip(got, want):
        _close(cp.asnumpy(g), r, 2e-5, "on a side stream")
    xconv.convolution_backward(gdy, gx, gw, backend=backend, **CASES[1][3])   # back on the default stream
    assert rt._local.handles[device][1] == cp.cuda.get_current_stream().ptr


def test_autotune_mode(cp, monkeypatch):
    monkeypatch.setenv("XCONV_CUDNN_BENCHMARK", "1")
    backend = CudnnBackend(cache=PlanCache(64))
    x, w, dy, _ = _inputs(CASES[0], "float32", seed=3)
    gx, gw, gdy = (cp.asarray(a) for a in (x, w, dy))
    got = xconv.convolution_backward(gdy, gx, gw, backend=backend, **CASES[0][3])
    want = xconv.convolution_backward(dy, x, w, backend="numpy-exact", **CASES[0][3])
    for g, r in zip(got, want):
        _close(cp.asnumpy(g), r, 2e-5, "autotuned")
    plans = [e for e in backend.cache._entries.values() if e.kind == "plan"]
    assert plans and all(k[-1] is True for k in backend.cache.keys())
    assert any(e.timings for e in plans)


def test_bfloat16_primitives_on_bit_patterns(cp, backend):
    """CuPy has no bfloat16; the backend takes bf16 as int16 bit patterns with params.dtype == 'bfloat16'."""
    import ml_dtypes

    p = make_params((2, 8, 10, 10), (8, 4, 3, 3), groups=2, padding=1, dtype="bfloat16")
    rng = np.random.default_rng(4)
    bf = lambda shape: rng.standard_normal(shape).astype(ml_dtypes.bfloat16)  # noqa: E731
    x, w, dy = bf(p.input_shape), bf(p.weight_shape), bf(p.output_shape)
    bits = lambda a: cp.asarray(a.view(np.int16))  # noqa: E731
    back = lambda a: cp.asnumpy(a).view(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
    oracle = xconv.get_backend("numpy-exact")
    _close(back(backend.dgrad(bits(dy), bits(w), p)), oracle.dgrad(dy, w, p).astype(np.float64), 2e-2, "dgrad")
    _close(back(backend.wgrad(bits(x), bits(dy), p)), oracle.wgrad(x, dy, p).astype(np.float64), 2e-2, "wgrad")
    _close(back(backend.bgrad(bits(dy), p)), oracle.bgrad(dy, p).astype(np.float64), 2e-2, "bgrad")
    _close(back(backend.fprop(bits(x), bits(w), None, p)), oracle.fprop(x, w, None, p).astype(np.float64), 2e-2,
           "fprop")


def test_float64_is_computed_or_refused_precisely(cp, backend):
    x, w, dy, _ = _inputs(CASES[0], "float64", seed=5)
    try:
        got = xconv.conv_dgrad(cp.asarray(dy), cp.asarray(w), x.shape, backend=backend, **CASES[0][3])
    except UnsupportedError as exc:
        assert "float64" in str(exc)
        return
    want = xconv.conv_dgrad(dy, w, x.shape, backend="numpy-exact", **CASES[0][3])
    _close(cp.asnumpy(got), want, 1e-11, "float64 dgrad")


def test_empty_and_misaligned_operands(cp, backend):
    x, w, dy, _ = _inputs(CASES[0], "float32", seed=6)
    raw = cp.asarray(np.concatenate([[0.0], x.ravel()]).astype(np.float32))
    gx = raw[1:].reshape(x.shape)                          # 4 bytes off the pool's alignment
    assert gx.data.ptr % 16
    got = xconv.conv_fprop(gx, cp.asarray(w), backend=backend, **CASES[0][3])
    _close(cp.asnumpy(got), xconv.conv_fprop(x, w, backend="numpy-exact", **CASES[0][3]), 2e-5, "misaligned")
    empty = xconv.convolution_backward(cp.zeros((0,) + dy.shape[1:], cp.float32), cp.zeros((0,) + x.shape[1:],
                                       cp.float32), cp.asarray(w), backend=backend, **CASES[0][3])
    assert empty[0].shape == (0,) + x.shape[1:] and float(empty[2].sum()) == 0.0
