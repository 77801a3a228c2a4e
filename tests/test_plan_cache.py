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


@pytest.fixture(autouse=True)
def fresh_plans():
    plan_cache.clear()
    yield
    plan_cache.clear()


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
