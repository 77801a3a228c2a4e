"""The core legalizes what a backend lacks; a narrowed backend must give the reference's results.

The spy backend below runs only 2-D, symmetric padding, direct convolution, contiguous arrays,
and asserts that it is never handed anything else.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import xconv
from core_helpers import SpyBackend, conv_configs, registered

NARROW = xconv.Capabilities(spatial_dims=frozenset({2, 3}), asymmetric_padding=frozenset(), transposed=False,
                            strided=False)


class Narrow(SpyBackend):
    def __init__(self):
        super().__init__("narrow", NARROW)

    def _check(self, p, arrays):
        assert p.nd in (2, 3) and p.symmetric and not p.transposed, p
        for a in arrays:
            assert a.flags.c_contiguous

    def fprop(self, x, w, bias, p):
        self._check(p, (x, w))
        assert x.shape == p.input_shape and w.shape == p.weight_shape
        return super().fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        self._check(p, (dy, w))
        assert dy.shape == p.output_shape
        return super().dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        self._check(p, (x, dy))
        assert x.shape == p.input_shape and dy.shape == p.output_shape
        return super().wgrad(x, dy, p)


@pytest.fixture(scope="module")
def narrow():
    with registered(Narrow()) as backend:
        yield backend


def _noncontiguous(a, rng):
    """The same values as ``a`` in a non-contiguous (reversed-stride, padded) view."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a[..., ::-1]
    return big[..., ::2][..., ::-1]


@settings(max_examples=80, deadline=None)
@given(cfg=conv_configs(), seed=st.integers(0, 2**31 - 1),
       mask=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_narrow_backend_matches_reference(narrow, cfg, seed, mask):
    rng = np.random.default_rng(seed)
    kw = cfg["kwargs"]
    x, w = rng.standard_normal(cfg["input_shape"]), rng.standard_normal(cfg["weight_shape"])
    dy = rng.standard_normal(cfg["output_shape"])
    bias = rng.standard_normal(cfg["params"].bias_size)
    xs, dys = _noncontiguous(x, rng), _noncontiguous(dy, rng)
    assert x.shape[-1] == 1 or not xs.flags.c_contiguous
    want = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="numpy-exact", **kw)
    got = xconv.convolution_backward(dys, xs, w, output_mask=mask, backend="narrow", **kw)
    for g, t in zip(got, want):
        assert (g is None) == (t is None)
        if g is not None:
            assert g.shape == t.shape and g.flags.c_contiguous
            np.testing.assert_allclose(g, t, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(xconv.conv_fprop(xs, w, bias=bias, backend="narrow", **kw),
                               xconv.conv_fprop(x, w, bias=bias, backend="numpy-exact", **kw), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        xconv.conv_dgrad(dys, w, cfg["input_shape"], backend="narrow", **kw),
        xconv.conv_dgrad(dy, w, cfg["input_shape"], backend="numpy-exact", **kw), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        xconv.conv_wgrad(xs, dys, cfg["weight_shape"], backend="narrow", **kw),
        xconv.conv_wgrad(x, dy, cfg["weight_shape"], backend="numpy-exact", **kw), rtol=1e-12, atol=1e-12)


def test_transposed_runs_as_direct_primitives(narrow):
    narrow.calls.clear()
    x, w = np.ones((1, 2, 4, 4)), np.ones((2, 3, 3, 3))
    dz = np.ones(xconv.output_shape(x.shape, w.shape, stride=2, transposed=True))
    xconv.convolution_backward(dz, x, w, stride=2, transposed=True, backend="narrow")
    # grad_input of a transposed conv is a direct fprop of grad_output; grad_weight a direct wgrad with roles swapped
    assert [c[0] for c in narrow.calls] == ["fprop", "wgrad", "bgrad"]
    fprop_params = narrow.calls[0][1]
    assert fprop_params.input_shape == dz.shape and fprop_params.output_shape == x.shape


def test_1d_lifted_to_2d_and_asymmetric_padding_made_explicit(narrow):
    narrow.calls.clear()
    x, w = np.ones((1, 2, 9)), np.ones((4, 2, 3))
    y = xconv.conv_fprop(x, w, padding=((2, 0),), backend="narrow")
    (op, p, (xx, _)), = narrow.calls
    assert p.input_shape == (1, 2, 1, 11) and p.padding == ((0, 0), (0, 0)) and xx.shape == (1, 2, 1, 11)
    assert y.shape == (1, 4, 9)
    np.testing.assert_array_equal(y[0, 0], [2, 4, 6, 6, 6, 6, 6, 6, 6])


def test_unsupported_rank_and_dtype_refused_before_work():
    only2d = SpyBackend("only2d", xconv.Capabilities(spatial_dims=frozenset({2}), dtypes=frozenset({"float32"})))
    with registered(only2d):
        with pytest.raises(xconv.UnsupportedError, match="3-D"):
            xconv.conv_fprop(np.ones((1, 1, 2, 2, 2), np.float32), np.ones((1, 1, 1, 1, 1), np.float32),
                             backend="only2d")
        with pytest.raises(xconv.UnsupportedError, match="float64"):
            xconv.conv_fprop(np.ones((1, 1, 2, 2)), np.ones((1, 1, 1, 1)), backend="only2d")
        with pytest.raises(xconv.ShapeError, match="bias_sizes"):  # invalid arguments are reported first
            xconv.convolution_backward(np.ones((1, 1, 2, 2, 2)), np.ones((1, 1, 2, 2, 2)), np.ones((1, 1, 1, 1, 1)),
                                       bias_sizes=[2], backend="only2d")
        assert only2d.calls == []


def test_deterministic_refused_when_backend_cannot_promise_it():
    nondet = SpyBackend("nondet", xconv.Capabilities(deterministic=False))
    with registered(nondet):
        x, w = np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1))
        xconv.conv_fprop(x, w, backend="nondet")
        with pytest.raises(xconv.UnsupportedError, match="deterministic"):
            xconv.conv_fprop(x, w, backend="nondet", deterministic=True)
        assert len(nondet.calls) == 1


def test_backend_returning_wrong_shape_is_reported():
    class Broken(SpyBackend):
        def fprop(self, x, w, bias, p):
            return np.zeros((1,))

    with registered(Broken("broken")):
        with pytest.raises(xconv.XconvError, match="returned fprop output of shape"):
            xconv.conv_fprop(np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1)), backend="broken")


class TransposedSymmetricOnly(SpyBackend):
    """Runs transposed convolution natively (through the reference), but only with symmetric padding."""

    def __init__(self):
        super().__init__("tsym", xconv.Capabilities(transposed=True, asymmetric_padding=frozenset()))
        self.reference = xconv.get_backend("numpy-exact")

    def _run(self, op, p, *args):
        assert p.symmetric, p
        self.calls.append((op, p, args))
        if p.transposed:
            from xconv import legalize
            return getattr(legalize, op)(self.reference, *args, p)
        return getattr(self.reference, op)(*args, p)

    def fprop(self, x, w, bias, p):
        return self._run("fprop", p, x, w, bias)

    def dgrad(self, dy, w, p):
        return self._run("dgrad", p, dy, w)

    def wgrad(self, x, dy, p):
        return self._run("wgrad", p, x, dy)


@settings(max_examples=60, deadline=None)
@given(cfg=conv_configs(transposed=True), seed=st.integers(0, 2**31 - 1))
def test_transposed_asymmetric_padding_legalized_for_native_transposed_backend(cfg, seed):
    rng = np.random.default_rng(seed)
    kw = cfg["kwargs"]
    x, w = rng.standard_normal(cfg["input_shape"]), rng.standard_normal(cfg["weight_shape"])
    dy = rng.standard_normal(cfg["output_shape"])
    bias = rng.standard_normal(cfg["params"].bias_size)
    with registered(TransposedSymmetricOnly()) as backend:
        got = xconv.convolution_backward(dy, x, w, backend="tsym", **kw)
        y = xconv.conv_fprop(x, w, bias=bias, backend="tsym", **kw)
        assert all(c[1].transposed for c in backend.calls if c[0] != "bgrad")  # ran natively, not mapped
    want = xconv.convolution_backward(dy, x, w, backend="numpy-exact", **kw)
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, bias=bias, backend="numpy-exact", **kw),
                               rtol=1e-12, atol=1e-12)


def test_capabilities_for_narrows_one_configuration():
    class NoTransposedWithOutputPadding(TransposedSymmetricOnly):
        def capabilities_for(self, p, op):
            if p.transposed and any(p.output_padding):
                import dataclasses
                return dataclasses.replace(self.capabilities, transposed=False)
            return self.capabilities

    x, w = np.ones((1, 2, 4)), np.ones((2, 3, 3))
    with registered(NoTransposedWithOutputPadding()) as backend:
        xconv.conv_fprop(x, w, stride=2, transposed=True, backend="tsym")
        assert backend.calls[-1][1].transposed
        y = xconv.conv_fprop(x, w, stride=2, output_padding=1, transposed=True, backend="tsym")
        assert backend.calls[-1][0] == "dgrad" and not backend.calls[-1][1].transposed
    np.testing.assert_array_equal(y, xconv.conv_fprop(x, w, stride=2, output_padding=1, transposed=True))


def test_a_repeated_call_is_legalized_as_the_backend_declares_now():
    """legalize.direct keeps its answer per backend and params object only while the backend's capabilities are the
    same object and it has no capabilities_for of its own: capabilities replaced between two identical calls, or a
    capabilities_for that answers differently, change how the next call is legalized."""
    x = np.arange(2 * 3 * 6 * 12, dtype=np.float64).reshape(2, 3, 6, 12)[..., ::2]       # strided
    w = np.ones((4, 3, 3, 3))
    with registered(SpyBackend("flip", xconv.Capabilities())) as backend:
        for _ in range(2):
            xconv.conv_fprop(x, w, padding=1, backend="flip")
            assert not backend.calls[-1][2][0].flags.c_contiguous            # taken as it is, strided
        backend.capabilities = xconv.Capabilities(strided=False)
        y = xconv.conv_fprop(x, w, padding=1, backend="flip")
        assert backend.calls[-1][2][0].flags.c_contiguous                   # copied now
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=1, backend="numpy-exact"), rtol=1e-12)

    class Asked(SpyBackend):
        contiguous_only = False
        asked = 0

        def capabilities_for(self, p, op):
            self.asked += 1
            return xconv.Capabilities(strided=not self.contiguous_only)

    class Plain:                         # no Backend subclass, optional members left out: the registry completes it
        name, array_families, capabilities = "plain-asked", ("numpy",), xconv.Capabilities()
        contiguous_only, asked, seen = False, 0, []

        def __init__(self):
            self.inner = SpyBackend("inner", xconv.Capabilities())

        def capabilities_for(self, p, op):
            self.asked += 1
            return xconv.Capabilities(strided=not self.contiguous_only)

        def fprop(self, x, w, bias, p):
            self.seen.append(x.flags.c_contiguous)
            return self.inner.fprop(x, w, bias, p)

        def dgrad(self, dy, w, p):
            return self.inner.dgrad(dy, w, p)

        def wgrad(self, x, dy, p):
            return self.inner.wgrad(x, dy, p)

        def bgrad(self, dy, p):
            return self.inner.bgrad(dy, p)

    on_instance = SpyBackend("asked-instance", xconv.Capabilities())
    on_instance.contiguous_only, on_instance.asked = False, 0

    def narrow_instance(p, op):
        on_instance.asked += 1
        return xconv.Capabilities(strided=not on_instance.contiguous_only)

    on_instance.capabilities_for = narrow_instance
    plain = Plain()
    for backend, name, contiguous in ((Asked("asked", xconv.Capabilities()), "asked", None),
                                      (plain, "plain-asked", plain.seen), (on_instance, "asked-instance", None)):
        with registered(backend):
            def last():
                return contiguous[-1] if contiguous is not None else backend.calls[-1][2][0].flags.c_contiguous
            xconv.conv_fprop(x, w, padding=1, backend=name)
            xconv.conv_fprop(x, w, padding=1, backend=name)
            assert backend.asked == 2 and not last(), name        # asked once per call
            backend.contiguous_only = True
            xconv.conv_fprop(x, w, padding=1, backend=name)
            assert last(), name


def test_a_transposed_forwards_bias_is_added_in_place_only_to_the_primitives_own_new_array():
    """legalize._add_bias adds the bias into the dgrad's new NumPy array (the bits of ``y + b``), and never into an
    array that holds an input's or the bias's memory (a backend handing back a view or the input itself), nor across
    dtypes (float32 y, float64 bias: the sum is cast back as before)."""
    from xconv import legalize

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    w = rng.standard_normal((8, 4, 2, 2)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    y = xconv.conv_fprop(x, w, bias=b, stride=2, transposed=True, backend="numpy")
    plain = xconv.conv_fprop(x, w, stride=2, transposed=True, backend="numpy")
    assert y.tobytes() == (plain + b.reshape(1, -1, 1, 1)).tobytes()

    fresh = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    want = fresh + b.reshape(1, -1, 1, 1)
    kept = fresh.copy()
    assert legalize._add_bias(kept, b, (x, w)) is kept and kept.tobytes() == want.tobytes()   # in place
    before = fresh.copy()
    got = legalize._add_bias(fresh, b, (fresh, w))                 # y is an input: a new array, the input kept
    assert got is not fresh and fresh.tobytes() == before.tobytes() and got.tobytes() == want.tobytes()
    view = fresh[:, :, :2]                                         # not its own memory
    got = legalize._add_bias(view, b)
    assert got is not view and fresh.tobytes() == before.tobytes()
    b64 = b.astype(np.float64)
    got = legalize._add_bias(fresh.copy(), b64)
    assert got.dtype == np.float32 and got.tobytes() == (fresh + b64.reshape(1, -1, 1, 1)).astype(np.float32).tobytes()
