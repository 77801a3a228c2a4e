"""The per-configuration plan cache (xconv.plan_cache): a repeated call gets the same result without
re-validation, and every argument validation reads is still checked on every call."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import xconv
from xconv import plan_cache
from xconv.errors import DTypeError, ResourceError, ShapeError, UnknownBackendError, XconvError

from core_helpers import SpyBackend, registered

KW = dict(stride=1, padding=1)



def _data(seed=0, shape=(2, 4, 6, 6), wshape=(5, 4, 3, 3), dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(wshape).astype(dtype)
    dy = rng.standard_normal((shape[0], wshape[0]) + shape[2:]).astype(dtype)
    return x, w, dy


def _bytes(results):
    return [None if r is None else r.tobytes() for r in results]


def test_hit_gives_the_bits_of_a_validated_call():
    x, w, dy = _data()
    first = xconv.convolution_backward(dy, x, w, **KW)
    assert plan_cache.size() == 1
    again = xconv.convolution_backward(dy, x, w, **KW)
    assert plan_cache.size() == 1                      # the same configuration: one plan
    assert _bytes(first) == _bytes(again)
    y1 = xconv.conv_fprop(x, w, bias=dy[0, :, 0, 0], **KW)
    y2 = xconv.conv_fprop(x, w, bias=dy[0, :, 0, 0], **KW)
    assert y1.tobytes() == y2.tobytes()
    plan_cache.clear()
    assert _bytes(xconv.convolution_backward(dy, x, w, **KW)) == _bytes(first)   # validated afresh: same bits
    want = xconv.convolution_backward(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                      backend="numpy-exact", **KW)
    for got, ref in zip(first, want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, error, name", [
    (dict(stride=True), ShapeError, "stride"),               # a bool where 1 passed
    (dict(stride=1.0), ShapeError, "stride"),                 # a float of the same value
    (dict(stride=(1, 1, 1)), ShapeError, "stride"),
    (dict(padding=-1), ShapeError, "padding"),
    (dict(groups=3), ShapeError, "groups"),
    (dict(groups=True), ShapeError, "groups"),
    (dict(dilation=0), ShapeError, "dilation"),
    (dict(deterministic=1), ShapeError, "deterministic"),
    (dict(math="fast"), ShapeError, "math"),
    (dict(output_mask=(True, True)), ShapeError, "output_mask"),
    (dict(backend="no-such-backend"), UnknownBackendError, "no-such-backend"),
])
def test_bad_arguments_refused_after_a_good_call(bad, error, name):
    x, w, dy = _data()
    xconv.convolution_backward(dy, x, w, **KW)
    xconv.convolution_backward(dy, x, w, **KW)            # a hit
    with pytest.raises(error, match=name):
        xconv.convolution_backward(dy, x, w, **dict(KW, **bad))
    xconv.convolution_backward(dy, x, w, **KW)            # and the good call still runs


def test_bad_tensors_refused_after_a_good_call():
    x, w, dy = _data()
    xconv.convolution_backward(dy, x, w, **KW)
    with pytest.raises(DTypeError, match="grad_output"):
        xconv.convolution_backward(dy.astype(np.float64), x, w, **KW)
    with pytest.raises(ShapeError, match="grad_output"):
        xconv.convolution_backward(dy[:, :, :5], x, w, **KW)
    with pytest.raises(ShapeError, match="bias"):
        xconv.conv_fprop(x, w, bias=np.zeros(4, np.float32), **KW)
    xconv.conv_fprop(x, w, bias=np.zeros(5, np.float32), **KW)
    with pytest.raises(ShapeError, match="bias"):
        xconv.conv_fprop(x, w, bias=np.zeros(4, np.float32), **KW)
    with pytest.raises(ShapeError, match="input_shape"):
        xconv.conv_dgrad(dy, w, (2, 4, 7, 6), **KW)
    xconv.conv_dgrad(dy, w, (2, 4, 6, 6), **KW)
    with pytest.raises(ShapeError, match="input_shape"):
        xconv.conv_dgrad(dy, w, (2, 4, 7, 6), **KW)
    with pytest.raises(ShapeError, match="masked"):             # host_ready still runs on a hit
        xconv.conv_dgrad(np.ma.masked_array(dy), w, (2, 4, 6, 6), **KW)


def test_equal_values_of_other_types_are_other_plans():
    """(1, 1) and [1, 1] and np.int64(1) validate alike: each gets a plan of its own, with the same result."""
    x, w, dy = _data()
    ref = _bytes(xconv.convolution_backward(dy, x, w, stride=1, padding=1))
    for stride in ((1, 1), [1, 1], np.int64(1)):
        assert _bytes(xconv.convolution_backward(dy, x, w, stride=stride, padding=1)) == ref
    assert plan_cache.size() == 4
    # a parameter the cache cannot key (an array) is validated in full every time, and works
    assert _bytes(xconv.convolution_backward(dy, x, w, stride=1, padding=np.array([1, 1]))) == ref
    assert plan_cache.size() == 4


def test_backend_environment_variable_is_honoured(monkeypatch):
    x, w, dy = _data()
    spy = SpyBackend("spy-plan")
    with registered(spy):
        xconv.convolution_backward(dy, x, w, **KW)
        assert spy.calls == []
        monkeypatch.setenv("XCONV_BACKEND", "spy-plan")
        xconv.convolution_backward(dy, x, w, **KW)
        assert [c[0] for c in spy.calls] == ["dgrad", "wgrad", "bgrad"]
        monkeypatch.setenv("XCONV_BACKEND", "no-such-backend")
        with pytest.raises(UnknownBackendError):
            xconv.convolution_backward(dy, x, w, **KW)
        monkeypatch.delenv("XCONV_BACKEND")
        spy.calls.clear()
        xconv.convolution_backward(dy, x, w, **KW)
        assert spy.calls == []


def test_registry_changes_are_honoured():
    """A backend registered after a call, taking the same arrays at a higher priority, gets the next call."""
    x, w, dy = _data()
    xconv.convolution_backward(dy, x, w, **KW)
    spy = SpyBackend("spy-priority")
    spy.priority = 100
    with registered(spy):
        xconv.convolution_backward(dy, x, w, **KW)
        assert len(spy.calls) == 3
    spy.calls.clear()
    xconv.convolution_backward(dy, x, w, **KW)
    assert spy.calls == []


def test_backend_object_and_its_capabilities_rechecked():
    x, w, dy = _data()
    spy = SpyBackend("spy-object")
    xconv.convolution_backward(dy, x, w, backend=spy, **KW)
    spy.capabilities = spy.capabilities.__class__(dtypes=("float64",))   # now refuses float32
    with pytest.raises(XconvError, match="float32"):
        xconv.convolution_backward(dy, x, w, backend=spy, **KW)


def test_memory_limit_is_honoured(monkeypatch):
    x, w, dy = _data()
    xconv.convolution_backward(dy, x, w, **KW)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1K")
    with pytest.raises(ResourceError):
        xconv.convolution_backward(dy, x, w, **KW)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1G")
    xconv.convolution_backward(dy, x, w, **KW)
    xconv.convolution_backward(dy, x, w, **KW)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1K")
    with pytest.raises(ResourceError):
        xconv.convolution_backward(dy, x, w, **KW)


def test_bounded(monkeypatch):
    monkeypatch.setattr(plan_cache, "MAX_PLANS", 8)
    x = np.ones((1, 1, 12, 12), np.float32)
    w = np.ones((1, 1, 1, 1), np.float32)
    for n in range(1, 12):
        xconv.conv_fprop(x[:, :, :n, :n], w)
        assert plan_cache.size() <= 8


def test_threads_share_plans():
    x, w, dy = _data()
    ref = _bytes(xconv.convolution_backward(dy, x, w, **KW))
    plan_cache.clear()
    out, errors = [], []

    def work():
        try:
            for _ in range(20):
                out.append(_bytes(xconv.convolution_backward(dy, x, w, **KW)))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(out) == 80 and all(o == ref for o in out)


def test_a_backend_that_becomes_unavailable_is_selected_anew():
    x, w, dy = _data()
    spy = SpyBackend("spy-flaky")
    spy.priority = 100
    state = {"up": True}
    spy.availability = lambda: (state["up"], "" if state["up"] else "unplugged")
    with registered(spy):
        xconv.convolution_backward(dy, x, w, **KW)
        assert len(spy.calls) == 3
        state["up"] = False
        ref = _bytes(xconv.convolution_backward(dy, x, w, backend="numpy", **KW))
        assert _bytes(xconv.convolution_backward(dy, x, w, **KW)) == ref      # the next by priority: numpy
        assert len(spy.calls) == 3
        with pytest.raises(XconvError, match="unplugged"):
            xconv.convolution_backward(dy, x, w, backend="spy-flaky", **KW)


# ---------------------------------------------------------------------------------------------
# The plan's runner: a repeated call of NumPy arrays runs the backend's runner (plan_cache.runner), not the primitive

RUNNER_CASES = [                                        # (x shape, w shape, conv keywords): the NumPy backend's paths
    ((1, 4, 8, 8), (4, 4, 3, 3), dict(padding=1)),                       # small calls
    ((16, 8, 8, 8), (16, 8, 3, 3), dict(padding=1, stride=2)),           # small calls, strided (columns)
    ((2, 32, 10, 10), (32, 32, 3, 3), dict(padding=1)),                  # the dense loops
    ((2, 32, 12, 12), (64, 32, 3, 3), dict(padding=1, stride=2)),        # strided
    ((2, 16, 9, 9), (16, 1, 3, 3), dict(padding=1, groups=16)),          # depthwise
    ((4, 32, 7, 7), (48, 32, 1, 1), dict()),                             # pointwise
    ((3, 8, 40), (16, 8, 5), dict(padding=2, dilation=2)),               # 1-D
]


@pytest.fixture
def primitive(monkeypatch):
    """The NumPy backend's primitives called, in order."""
    from xconv_numpy.backend import NumpyBackend

    calls = []
    real_f, real_b = NumpyBackend.fprop, NumpyBackend.backward
    monkeypatch.setattr(NumpyBackend, "fprop", lambda *a: calls.append("fprop") or real_f(*a))
    monkeypatch.setattr(NumpyBackend, "backward", lambda *a: calls.append("backward") or real_b(*a))
    return calls


def _torch_conv(x, w, kw):
    torch = pytest.importorskip("torch")
    f = torch.nn.functional.conv1d if x.ndim == 3 else torch.nn.functional.conv2d
    return f(torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(np.ascontiguousarray(w)),
             **kw).numpy()


@pytest.mark.parametrize("xs, ws, kw", RUNNER_CASES)
def test_a_repeated_call_runs_by_the_plans_runner_with_the_primitives_bits(xs, ws, kw, primitive):
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    y0 = xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw)
    assert primitive == ["fprop"]
    np.testing.assert_allclose(y0, _torch_conv(x, w, kw) + b.reshape((-1,) + (1,) * (x.ndim - 2)), rtol=1e-4,
                               atol=1e-4)
    for _ in range(3):
        assert xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw).tobytes() == y0.tobytes()
    x2 = x * 3                                          # new values, same configuration: the runner, new results
    y2 = xconv.conv_fprop(x2, w, bias=b, backend="numpy", **kw)
    assert primitive == ["fprop"]
    np.testing.assert_allclose(y2, _torch_conv(x2, w, kw) + b.reshape((-1,) + (1,) * (x.ndim - 2)), rtol=1e-4,
                               atol=1e-3)
    dy = rng.standard_normal(y0.shape, dtype=np.float32)
    for mask in [(True, True, True), (False, True, False), (True, False, False)]:
        primitive.clear()
        first = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw)
        again = [xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy", **kw) for _ in range(2)]
        assert primitive == ["backward"]
        for got in again:
            assert _bytes(got) == _bytes(first)


def test_arrays_users_hold_repeat_with_the_bits_of_a_plain_array(primitive):
    """Read-only, memory-mapped, broadcast, byte-swapped, transposed-view and unaligned inputs: the first call and
    the repeated ones (by the runner) give the plain contiguous array's bits."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 8, 6, 6), dtype=np.float32), rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    want = xconv.conv_fprop(x, w, backend="numpy", padding=1).tobytes()
    ro = x.copy()
    ro.flags.writeable = False
    swapped = x.astype(">f4")
    view = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)       # strided: w, h swapped
    raw = np.zeros(x.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(x.shape)
    unaligned[...] = x
    one = x[:1]
    broadcast_want = xconv.conv_fprop(np.concatenate([one, one]), w, backend="numpy", padding=1).tobytes()
    broadcast = np.broadcast_to(one, x.shape)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        mm = np.lib.format.open_memmap(f"{d}/x.npy", mode="w+", dtype=np.float32, shape=x.shape)
        mm[...] = x
        for arr, expected in [(ro, want), (swapped, want), (view, want), (unaligned, want), (mm, want),
                              (broadcast, broadcast_want)]:
            for _ in range(3):
                assert xconv.conv_fprop(arr, w, backend="numpy", padding=1).tobytes() == expected
        del mm


def test_an_open_trace_and_forced_paths_go_through_the_primitive(primitive):
    from xconv_numpy import paths

    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 32, 8, 8), dtype=np.float32), rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    y = [xconv.conv_fprop(x, w, backend="numpy", padding=1) for _ in range(2)]
    assert primitive == ["fprop"]
    with xconv.trace() as t:
        traced = xconv.conv_fprop(x, w, backend="numpy", padding=1)
    assert primitive == ["fprop", "fprop"] and len(t.records) == 1 and t.records[0].path
    assert traced.tobytes() == y[0].tobytes()
    with paths.force("columns"):
        forced = xconv.conv_fprop(x, w, backend="numpy", padding=1)
        with xconv.trace() as t:
            xconv.conv_fprop(x, w, backend="numpy", padding=1)
    assert primitive == ["fprop"] * 4 and "columns" in t.records[0].path
    np.testing.assert_allclose(forced, y[0], rtol=1e-5, atol=1e-4)


def test_a_plans_runner_is_made_once_and_kept_on_the_plan():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 32, 8, 8), dtype=np.float32), rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    for _ in range(3):
        xconv.conv_fprop(x, w, backend="numpy", padding=1)
    (plan,) = plan_cache._plans.values()
    assert list(plan.runners) == [("fprop", None)] and callable(plan.runners[("fprop", None)])
    kept = plan.runners[("fprop", None)]
    xconv.conv_fprop(x, w, backend="numpy", padding=1)
    assert plan.runners[("fprop", None)] is kept


@pytest.mark.parametrize("xs, ws, kw", RUNNER_CASES[:2] + RUNNER_CASES[-1:])
def test_a_repeated_float16_call_that_overflows_warns_as_the_first(xs, ws, kw):
    """float16 sums past its range: inf, silently (the primitives run under errstate), on the first call and on the
    repeated ones by the plan's runner, even with warnings as errors."""
    import warnings

    x, w = np.full(xs, 100, np.float16), np.full(ws, 100, np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ys = [xconv.conv_fprop(x, w, backend="numpy", **kw) for _ in range(3)]
        dy = np.full(ys[0].shape, 100, np.float16)
        gs = [xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), backend="numpy", **kw)
              for _ in range(3)]
    assert np.isinf(ys[0]).any() and all(y.tobytes() == ys[0].tobytes() for y in ys)
    assert np.isinf(gs[0][1]).any() and all(_bytes(g) == _bytes(gs[0]) for g in gs)
