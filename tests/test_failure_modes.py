"""Every way a call can fail is an XconvError: backend exceptions wrapped in the core, bad arguments blamed by
name, absurd sizes refused before allocating, NaN/Inf propagated as the reference defines, pathological
shapes run in memory proportional to their work (issue 13's reproducers, one test each)."""

from __future__ import annotations

import ctypes
import tracemalloc

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, assert_same_non_finite, registered
from xconv.errors import BackendFailedError, BackendOutOfMemoryError, DTypeError, ResourceError
from xconv_numpy import paths, reference
from xconv_numpy.grid import scratch

f = np.float32
CB = xconv.convolution_backward


def ones(*shape):
    return np.ones(shape, f)


# ---------------------------------------------------------------------------------------------
# One place in the core wraps whatever a backend raises


def _typing_error():
    """A JIT compiler's typing error as an outside plugin might raise it (numba's own class where numba happens to
    be installed; xconv no longer depends on it)."""
    try:
        from numba.core.errors import TypingError
        return TypingError("Cannot unify array(float32, 4d, C, readonly) and array(float32, 4d, C)")
    except ImportError:
        return type("TypingError", (Exception,), {})("typing failed")


RAISED = {
    "TypingError": _typing_error,
    "ArgumentError": lambda: ctypes.ArgumentError("argument 3: OverflowError: int too long to convert"),
    "OSError": lambda: OSError(12, "cannot allocate memory for static TLS block"),
    "MemoryError": lambda: MemoryError("65.5 TiB"),
    "KeyError": lambda: KeyError("plan"),
}


class Raising:
    """An outside plugin's backend (not a Backend subclass) whose every primitive raises ``exc``."""

    capabilities = xconv.Capabilities(transposed=True)
    array_families = ("numpy",)
    priority = -100

    def __init__(self, exc):
        self.name = "raising"
        self.exc = exc

    def availability(self):
        return True, ""

    def _raise(self, *args):
        raise self.exc

    fprop = dgrad = wgrad = bgrad = backward = _raise


CALLS = {
    "fprop": lambda: xconv.conv_fprop(ones(1, 2, 5, 5), ones(3, 2, 3, 3), backend="raising"),
    "dgrad": lambda: xconv.conv_dgrad(ones(1, 3, 3, 3), ones(3, 2, 3, 3), (1, 2, 5, 5), backend="raising"),
    "wgrad": lambda: xconv.conv_wgrad(ones(1, 2, 5, 5), ones(1, 3, 3, 3), (3, 2, 3, 3), backend="raising"),
    "backward": lambda: CB(ones(1, 3, 3, 3), ones(1, 2, 5, 5), ones(3, 2, 3, 3), backend="raising"),
}


@pytest.mark.parametrize("kind", sorted(RAISED))
@pytest.mark.parametrize("op", sorted(CALLS))
def test_backend_exceptions_surface_as_xconv_errors_naming_backend_and_operation(kind, op):
    exc = RAISED[kind]()
    with registered(Raising(exc)):
        with pytest.raises(BackendFailedError) as info:
            CALLS[op]()
    err = info.value
    assert isinstance(err, xconv.XconvError)
    assert err.backend == "raising" and err.operation == op
    assert err.__cause__ is exc and err.cause is exc
    assert "raising" in str(err) and op in str(err) and type(exc).__name__ in str(err)
    assert isinstance(err, MemoryError) == (kind == "MemoryError")
    if kind == "MemoryError":
        assert isinstance(err, BackendOutOfMemoryError)


def test_xconv_errors_from_a_backend_pass_unchanged():
    exc = xconv.UnsupportedError("backend 'raising' cannot run this")
    with registered(Raising(exc)):
        with pytest.raises(xconv.UnsupportedError) as info:
            CALLS["fprop"]()
    assert info.value is exc


def test_interrupts_are_not_wrapped():
    with registered(Raising(KeyboardInterrupt())):
        with pytest.raises(KeyboardInterrupt):
            CALLS["backward"]()


def test_a_failing_capabilities_query_is_wrapped():
    class Narrowing(SpyBackend):
        def capabilities_for(self, p, op):
            raise ValueError("no such config")

    with registered(Narrowing("narrowing")):
        with pytest.raises(BackendFailedError, match="narrowing.*capabilities_for"):
            xconv.conv_fprop(ones(1, 2, 5, 5), ones(3, 2, 3, 3), backend="narrowing")


# ---------------------------------------------------------------------------------------------
# Validation: NumPy 2 scalars, int64 ranges, types, and blaming the argument the user got wrong


def test_numpy_bool_and_int_scalars_are_accepted():
    dy, x, w = ones(1, 1, 3, 3), ones(1, 2, 4, 4), ones(1, 2, 2, 2)
    want = CB(dy, x, w)
    got = CB(dy, x, w, output_mask=(np.True_,) * 3, transposed=np.False_, deterministic=np.True_,
             stride=np.int64(1), padding=(np.int32(0), np.int64(0)), groups=np.int64(1))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    got = CB(dy, x, w, output_mask=np.array([True, False, True]), bias_sizes=np.array([1]))
    assert got[1] is None
    np.testing.assert_array_equal(got[0], want[0])
    dx = xconv.conv_dgrad(ones(2, 4, 6, 6), ones(4, 4, 3, 3), tuple(np.array([2, 4, 8, 8])))
    assert dx.shape == (2, 4, 8, 8)
    assert xconv.output_shape(np.array([1, 1, 8]), (np.int64(1), 1, 3)) == (1, 1, 6)
    assert xconv.output_shape((1, 1, 8, 8), (1, 1, 3, 3), stride=np.array([2, 1]), padding=np.array([[1, 0], [0, 2]]),
                              dilation=np.int32(1)) == (1, 1, 4, 8)
    with pytest.raises(xconv.ShapeError, match="stride"):
        xconv.output_shape((1, 1, 8, 8), (1, 1, 3, 3), stride=np.array([2.0, 1.0]))


def _raises(exc_type, argument, call, *fragments):
    with pytest.raises(exc_type) as info:
        call()
    text = str(info.value)
    assert text.startswith(argument), text
    for frag in fragments:
        assert frag in text, text
    return info.value


@pytest.mark.parametrize("kwargs, argument", [
    (dict(stride=2**70), "stride"),
    (dict(padding=2**70, stride=2**72), "stride"),
    (dict(padding=2**70), "padding"),
    (dict(dilation=-2**64), "dilation"),
    (dict(groups=2**64), "groups"),
    (dict(stride=2**64 + 1), "stride"),                    # ctypes would wrap it to 1 on the Ascend shim
])
def test_ints_beyond_int64_are_refused_by_name(kwargs, argument):
    _raises(xconv.ShapeError, argument, lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), **kwargs),
            "signed 64-bit")


def test_the_ascend_shim_never_sees_an_out_of_range_stride():
    spy = SpyBackend("spy")
    with registered(spy):
        with pytest.raises(xconv.ShapeError, match="stride"):
            xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), stride=2**64 + 1, backend="spy")
    assert spy.calls == []
    for call in (lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), stride=2**64 + 1, backend="ascend"),
                 lambda: CB(ones(1, 2, 2, 2), ones(1, 2, 4, 4), ones(2, 2, 3, 3), stride=(1, 2**64 + 1),
                            backend="ascend")):
        _raises(xconv.ShapeError, "stride", call, "signed 64-bit", str(2**64 + 1))


@pytest.mark.parametrize("input_shape, weight_shape, argument", [  # output_shape names the tensors
    ("abcd", "abcd", "input"),
    ((1, 1, 4.5), (1, 1, 2), "input"),
    ((1, 1, 8), (1, 1, "2"), "weight"),
    ((1, 1, 8), (1, 1, True), "weight"),
    ((1, 1, 2**64), (1, 1, 2), "input"),
])
def test_output_shape_refuses_non_integer_shapes(input_shape, weight_shape, argument):
    _raises(xconv.ShapeError, argument, lambda: xconv.output_shape(input_shape, weight_shape))


def test_dims_whose_product_overflows_int64_are_refused_before_allocating():
    with pytest.raises(ResourceError, match="64-bit") as info:
        xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), padding=2**40, backend="numpy-exact")
    assert info.value.needed > 2**63


@pytest.mark.parametrize("call, argument, fragments", [
    (lambda: xconv.conv_dgrad(ones(2, 4, 6, 6), ones(4, 4, 3, 3), (2, -4, 8, 8)), "input_shape", ["dim 1"]),
    (lambda: xconv.conv_dgrad(ones(2, 4, 6, 6), ones(4, 4, 3, 3), (2, 4, 9, 8)), "input_shape",
     ["dim 2 (H)", "grad_output's shape"]),
    (lambda: xconv.conv_dgrad(ones(2, 4, 6, 6), ones(4, 4, 3, 3), (3, 4, 8, 8)), "input_shape", ["dim 0 (N)"]),
    (lambda: xconv.conv_dgrad(ones(2, 4, 6, 6), ones(4, 4, 3, 3), "grad_output"), "input_shape",
     ["sequence of ints"]),
    (lambda: xconv.conv_wgrad(ones(2, 4, 8, 8), ones(2, 4, 6, 6), (4, 4, 3)), "weight_shape", ["rank"]),
    (lambda: xconv.conv_wgrad(ones(2, 4, 8, 8), ones(2, 4, 6, 6), (5, 4, 3, 3)), "weight_shape", ["dim 1"]),
    (lambda: xconv.conv_fprop(ones(2, 8, 8), ones(4, 2, 3, 3)), "input", ["lacks its batch dimension"]),
    (lambda: CB(ones(4, 6, 6), ones(2, 8, 8), ones(4, 2, 3, 3)), "input", ["lacks its batch dimension"]),
    (lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), backend=3), "backend", ["given int 3"]),
])
def test_the_argument_the_user_got_wrong_is_named(call, argument, fragments):
    _raises(xconv.ShapeError, argument, call, *fragments)


def test_a_tensor_name_is_not_a_shape():
    dy, w = ones(1, 2, 3, 3), ones(2, 2, 1, 1)
    assert xconv.conv_dgrad(dy, w, [1, np.int64(2), 3, 3]).shape == (1, 2, 3, 3)
    for name in ("grad_output", "input"):
        _raises(xconv.ShapeError, "input_shape", lambda: xconv.conv_dgrad(dy, w, name), "ints")


def test_dtype_mistakes_are_type_errors_and_shape_mistakes_value_errors():
    err = _raises(TypeError, "input", lambda: xconv.conv_fprop(ones(1, 2, 4, 4).astype(np.int32), ones(2, 2, 3, 3)))
    assert isinstance(err, DTypeError) and isinstance(err, xconv.XconvError)
    err = _raises(TypeError, "weight", lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3).astype(np.float64)))
    assert isinstance(err, xconv.XconvError)
    err = _raises(ValueError, "weight", lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 3, 3, 3)))
    assert isinstance(err, xconv.ShapeError) and not isinstance(err, TypeError)


def test_torch_tensors_with_conj_or_neg_bits_are_resolved_or_refused_by_name():
    torch = pytest.importorskip("torch")
    c = torch.ones(1, 2, 4, 4, dtype=torch.complex64).conj()
    assert c.is_conj()
    _raises(TypeError, "input", lambda: xconv.conv_fprop(c, torch.ones(2, 2, 3, 3, dtype=torch.complex64)),
            "dtype")
    x = torch.arange(32, dtype=torch.float32).reshape(1, 2, 4, 4)
    neg = torch._neg_view(x)
    assert neg.is_neg()
    w = torch.ones(2, 2, 3, 3)
    got = xconv.conv_fprop(neg, w)
    want = torch.nn.functional.conv2d(-x, w)
    torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------
# Resource guards: refused with the bytes needed, before allocating


@pytest.mark.parametrize("call, needed", [
    (lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), stride=10**6, transposed=True),
     2 * 3000003**2 * 4),
    (lambda: xconv.conv_fprop(ones(1, 2, 4, 4), ones(2, 2, 3, 3), padding=10**5), 2 * 200002**2 * 4),
    (lambda: xconv.conv_fprop(np.broadcast_to(f(1), (1, 10**6, 4, 4)), np.broadcast_to(f(1), (10**6, 1, 3, 3)),
                              groups=10**6, stride=1000, transposed=True, backend="numpy-exact"),
     10**6 * 3003**2 * 4),
])
def test_outputs_that_do_not_fit_are_refused_with_the_bytes_needed(call, needed):
    tracemalloc.start()
    try:
        with pytest.raises(ResourceError) as info:
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, MemoryError)
    assert info.value.needed >= needed and f"{info.value.needed:,}" in str(info.value)
    assert peak < 64 << 20, f"allocated {peak} bytes before refusing"


def test_the_memory_limit_is_overridable(monkeypatch):
    x, w = ones(1, 2, 16, 16), ones(4, 2, 3, 3)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1K")
    with pytest.raises(ResourceError, match="1,024 bytes"):
        xconv.conv_fprop(x, w)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1M")
    assert xconv.conv_fprop(x, w).shape == (1, 4, 14, 14)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1GiB")
    assert xconv.conv_fprop(x, w).shape == (1, 4, 14, 14)
    for bad in ("lots", "-5", "inf", "1X"):
        monkeypatch.setenv("XCONV_MEMORY_LIMIT", bad)
        with pytest.raises(xconv.ConfigError, match="XCONV_MEMORY_LIMIT"):
            xconv.conv_fprop(x, w)


# ---------------------------------------------------------------------------------------------
# NaN and Inf: every NumPy path agrees with numpy-exact (the definition)

PATHS = {  # name: (x shape, w shape, kwargs, forced path and strategy A knobs)
    "blas-a": ((2, 3, 6, 6), (4, 3, 3, 3), dict(padding=1), ("grid-a", {})),
    "blas-b": ((2, 3, 6, 6), (4, 3, 3, 3), dict(padding=1, stride=2), ("grid-b", {})),
    "blas-flat": ((1, 2, 7, 5), (3, 2, 2, 3), dict(padding=(1, 2)), ("grid-a", dict(compact_inner=False))),
    "pointwise": ((2, 4, 5, 5), (3, 4, 1, 1), {}, (None, {})),
    "compiled": ((1, 16, 6, 6), (16, 16, 3, 3), dict(padding=1), (None, {})),
    "dense": ((2, 16, 6, 6), (16, 16, 3, 3), dict(padding=1), ("dense", {})),         # forward: the dual's loops
    "pointwise-forced": ((2, 4, 5, 5), (3, 4, 1, 1), {}, ("pointwise", {})),
    "depthwise": ((2, 3, 6, 6), (3, 1, 3, 3), dict(padding=1, groups=3), (None, {})),
    "columns": ((1, 2, 10, 10), (3, 2, 5, 5), dict(stride=5), (None, {})),
    "stem": ((2, 3, 9, 9), (5, 3, 3, 3), dict(stride=2, padding=1), ("stem", {})),     # forward; backward elsewhere
    "transposed": ((1, 3, 4, 4), (3, 2, 3, 3), dict(stride=2, padding=1, transposed=True), (None, {})),
}


def _poisoned(shape, where, value, rng):
    a = rng.uniform(0.5, 1.5, shape).astype(f)
    if where is not None:
        a[tuple(min(i, s - 1) for i, s in zip(where, shape))] = value
    return a


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("tensor", ["dy", "x", "w"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_values_propagate_as_the_reference_says(path, tensor, value):
    xs, ws, kw, (forced, knobs) = PATHS[path]
    rng = np.random.default_rng(1)
    out = xconv.output_shape(xs, ws, **kw)
    corner = (0, 0, 0, 0)
    x = _poisoned(xs, corner if tensor == "x" else None, value, rng)
    w = _poisoned(ws, corner if tensor == "w" else None, value, rng)
    dy = _poisoned(out, (0, 0, 1, 1) if tensor == "dy" else None, value, rng)
    with paths.force(*[forced] if forced else []), paths.tune(**knobs):
        got = CB(dy, x, w, backend="numpy", **kw)
    want = CB(dy.astype(np.float64), x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", **kw)
    assert_same_non_finite(got, want, rtol=1e-5)
    with paths.force(*[forced] if forced else []), paths.tune(**knobs):
        y = xconv.conv_fprop(x, w, backend="numpy", **kw)
    ye = xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="numpy-exact", **kw)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ye))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ye))


def test_one_infinity_does_not_poison_unrelated_gradients():
    """The issue's reproducer, against PyTorch: grad_weight [[inf, 9], [9, 9]]; an infinite weight leaves the
    grad_input positions it never reaches finite."""
    torch = pytest.importorskip("torch")
    x = ones(1, 2, 4, 4)
    x[0, 0, 0, 0] = np.inf
    dw = CB(ones(1, 1, 3, 3), x, ones(1, 2, 2, 2))[1]
    np.testing.assert_array_equal(dw[0, 0], [[np.inf, 9], [9, 9]])
    w = ones(1, 2, 2, 2)
    w[0, 0, 1, 1] = np.inf
    dx = CB(ones(1, 1, 3, 3), ones(1, 2, 4, 4), w)[0]
    tw = torch.tensor(w)
    tx = torch.ones(1, 2, 4, 4, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw).backward(torch.ones(1, 1, 3, 3))
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    assert np.isfinite(dx[0, 0, 0]).all() and np.isfinite(dx[0, 1]).all()


# ---------------------------------------------------------------------------------------------
# Pathological shapes: memory proportional to the work (time: benchmarks/, never asserted here)


def _peak(call):
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_huge_stride_depthwise_uses_memory_of_its_size():
    (dx, dw, db), peak = _peak(lambda: CB(ones(1, 1, 1, 1), ones(1, 1, 8, 8), ones(1, 1, 3, 3), stride=10**4))
    assert peak < 1 << 20, peak                              # was 950 MB for a 64-element input
    want = np.zeros((1, 1, 8, 8), f)
    want[0, 0, :3, :3] = 1
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(dw, np.ones((1, 1, 3, 3), f))
    np.testing.assert_array_equal(db, [1])


def test_wgrad_with_padding_far_beyond_the_input():
    """padding 1999, stride 10**4, kernel 2000**2 on a 1x1 input: one window, which holds x at its last tap."""
    dw, peak = _peak(lambda: xconv.conv_wgrad(ones(1, 2, 1, 1), ones(1, 1, 1, 1), (1, 2, 2000, 2000), padding=1999,
                                              stride=10**4))
    want = np.zeros((1, 2, 2000, 2000), f)
    want[:, :, 1999, 1999] = 1
    np.testing.assert_array_equal(dw, want)
    assert peak < 10 * want.nbytes, peak


@pytest.mark.parametrize("k", [16, 64])
def test_patch_embedding_against_torch_and_the_arena_stays_small(k):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 128, 128)).astype(f)
    w = rng.standard_normal((8, 3, k, k)).astype(f)
    y = xconv.conv_fprop(x, w, stride=k)
    dy = rng.standard_normal(y.shape).astype(f)
    dx, dw, db = CB(dy, x, w, stride=k)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, stride=k)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-2)
    assert sum(len(v) for v in scratch.ARENA.free.values()) < 200


def test_a_kernel_of_ten_billion_taps_is_refused_not_planned(monkeypatch):
    """(1, 1, 10**5, 10**5) broadcast kernel and input: 40 GB of columns, refused at once (it hung planning taps)."""
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "16G")              # the same on a machine with more memory
    big = np.broadcast_to(f(1), (1, 1, 10**5, 10**5))
    with pytest.raises(ResourceError, match="bytes"):
        xconv.conv_fprop(big, big)
    with pytest.raises(ResourceError, match="bytes"):
        CB(ones(1, 1, 1, 1), big, big, output_mask=(True, False, False))


def test_large_kernels_on_few_outputs_run_on_columns():
    x = np.random.default_rng(0).standard_normal((1, 1, 300, 300)).astype(f)
    w = np.ones((1, 1, 300, 300), f)
    y = xconv.conv_fprop(x, w)
    np.testing.assert_allclose(y.ravel(), [x.astype(np.float64).sum()], rtol=1e-4)
    dx = xconv.conv_dgrad(np.full((1, 1, 1, 1), 2, f), w, x.shape)
    np.testing.assert_array_equal(dx, np.full(x.shape, 2, f))


def test_the_arena_takes_and_gives_without_scanning_every_buffer():
    arena = scratch.Arena()
    bufs = [arena.take(n) for n in range(1, 4097)]
    arena.give(bufs)
    assert len(arena.free) == 1                               # all 4 KiB: one size class
    assert arena.total <= scratch.ARENA_BYTES
    big = arena.take(40 << 20)
    assert big.nbytes - (40 << 20) <= (40 << 20) // 8       # at most 1/8 wasted
    arena.give([big, arena.take(40 << 20)])
    assert arena.total <= scratch.ARENA_BYTES


@pytest.mark.parametrize("xs, ws, kw", [
    ((3, 4, 9, 7), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),   # per tap
    ((2, 4, 5, 6), (6, 2, 3, 3), dict(stride=2, padding=4, dilation=3, groups=2)),   # per output position
])
def test_the_reference_im2col_is_chunked_and_agrees_with_torch(monkeypatch, xs, ws, kw):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(reference, "CHUNK_BYTES", 256)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    y = xconv.conv_fprop(x, w, backend="numpy-exact", **kw)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = CB(dy, x, w, backend="numpy-exact", **kw)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, **kw)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "numpy-exact"])
def test_dilation_and_padding_far_beyond_the_input(backend):
    """dilation 10**9, padding (10**9, 0): a 4x4 output whose only tap inside x is the last one, which reads
    x[i] (x_pad[i + 10**9] with pre 10**9): the 1x1 convolution with w[..., 1, 1]. The grid once asked for
    exabytes here."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 4, 4)).astype(f)
    w = rng.standard_normal((4, 1, 2, 2)).astype(f)
    dy = rng.standard_normal((2, 4, 4, 4)).astype(f)
    kw = dict(dilation=10**9, padding=((10**9, 0), (10**9, 0)), groups=2)
    (y, (dx, dw, db)), peak = _peak(lambda: (xconv.conv_fprop(x, w, backend=backend, **kw),
                                             CB(dy, x, w, backend=backend, **kw)))
    assert peak < 1 << 20, peak
    tx, tw1 = torch.tensor(x, requires_grad=True), torch.tensor(w[:, :, 1:, 1:], requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw1, groups=2)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-6, atol=1e-6)
    want_dw = np.zeros_like(w)
    want_dw[:, :, 1:, 1:] = tw1.grad.numpy()
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-5)


def test_numpy_exact_memory_stays_proportional_to_its_tensors():
    """16 MB of inputs once asked the unchunked im2col for 967 GiB: chunked, the peak stays near the tensors."""
    x = np.ones((1, 64, 256, 256), f)
    w = np.ones((64, 64, 7, 7), f)
    y, peak = _peak(lambda: xconv.conv_fprop(x[:, :, :64, :64], w, padding=3, backend="numpy-exact"))
    assert y.shape == (1, 64, 64, 64)
    assert peak < 160 << 20, peak
