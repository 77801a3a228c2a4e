"""Shared helpers for the core tests: random data and a spy backend that records its calls."""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np
import pytest

import xconv
from xconv_numpy import NumpyBackend

#: Why a test that needs PyTorch is skipped, and how to get the CPU build (README).
TORCH_MISSING = ("PyTorch is not installed (CPU build: pip install torch==2.13.0 "
                 "--index-url https://download.pytorch.org/whl/cpu)")


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


class SpyBackend(NumpyBackend):
    """The exact NumPy reference under another name, recording every primitive call and its params.

    ``capabilities`` may be narrowed to exercise the core's legalization.
    """

    def __init__(self, name="spy", capabilities=None):
        super().__init__(exact=True)
        self.name = name
        if capabilities is not None:
            self.capabilities = capabilities
        self.calls = []

    def fprop(self, x, w, bias, p):
        self.calls.append(("fprop", p, (x, w)))
        return super().fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        self.calls.append(("dgrad", p, (dy, w)))
        return super().dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        self.calls.append(("wgrad", p, (x, dy)))
        return super().wgrad(x, dy, p)

    def bgrad(self, dy, p):
        self.calls.append(("bgrad", p, (dy,)))
        return super().bgrad(dy, p)


def assert_same_non_finite(got, want, rtol: float, atol: float = 1e-4) -> None:
    """Each pair of results has NaN, +Inf and -Inf at the same positions, and its finite values close."""
    for g, e in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(e))
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(e))
        fin = np.isfinite(e)
        np.testing.assert_allclose(g[fin], e[fin], rtol=rtol, atol=atol)


def traced_memory(fn):
    """(fn(), bytes held after it minus before, its peak minus before), as tracemalloc sees them (started for the
    call alone: numpy reports its allocations there)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, current - base, peak - base


def load_avx2_build(monkeypatch):
    """Run the rest of the test on the NumPy backend's AVX2 build: XCONV_NUMPY_ISA=avx2 and that build as the loaded
    library (monkeypatch undoes both); returns it."""
    from xconv_numpy import native

    monkeypatch.setenv("XCONV_NUMPY_ISA", "avx2")
    lib = native.load()
    assert native.isa(lib) == "avx2"
    monkeypatch.setattr(native.LIBRARY, "_value", lib)
    return lib


def count_dispatches(monkeypatch, owner, name: str, at: int = 3) -> list:
    """The input shapes of the calls of ``owner.name`` (a path's full route, its ConvParams the argument ``at``), for
    the test's duration: a lane's kept template leaves it empty."""
    seen = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a: seen.append(a[at].input_shape) or real(*a))
    return seen


def count_calls(monkeypatch, owner, *names: str) -> list:
    """Wrap each ``owner.name`` (for the test's duration) so that each call of any appends to the returned list."""
    calls = []

    def wrap(real):
        def wrapper(*args, **kwargs):
            calls.append(args)
            return real(*args, **kwargs)
        return wrapper

    for name in names:
        monkeypatch.setattr(owner, name, wrap(getattr(owner, name)))
    return calls


def fake_cann_build():
    """tests/fake_cann/build.py as a module: ``build(dir)`` and ``CONTROL_SIGNATURES`` of the CANN emulator."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fake_cann_build",
                                                  Path(__file__).resolve().parent / "fake_cann" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def registered(backend):
    """Context manager registering ``backend`` for the duration of a test."""
    @contextlib.contextmanager
    def scope():
        xconv.register_backend(backend, replace=True)
        try:
            yield backend
        finally:
            xconv.unregister_backend(backend.name)

    return scope()


@pytest.fixture
def register():
    """A fixture: ``register(backend)`` registers it (replacing one of that name) until the test ends; its name."""
    with contextlib.ExitStack() as stack:
        yield lambda backend: stack.enter_context(registered(backend)).name


# ---------------------------------------------------------------------------------------------
# A hypothesis strategy over the whole parameter space

from hypothesis import assume, strategies as st  # noqa: E402

from xconv.params import make_params  # noqa: E402


@st.composite
def conv_configs(draw, max_spatial=7, dims=(1, 2, 3), transposed=None):
    """A valid convolution: dict(input_shape, weight_shape, output_shape, kwargs)."""
    nd = draw(st.sampled_from(dims))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    c_in = groups * draw(st.integers(1, 3))
    c_out = groups * draw(st.integers(1, 3))
    is_t = draw(st.booleans()) if transposed is None else transposed
    n = draw(st.integers(1, 2))
    small = max_spatial if nd < 3 else min(max_spatial, 5)
    spatial = tuple(draw(st.integers(1, small)) for _ in range(nd))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    kind = draw(st.sampled_from(["int", "per_dim", "pairs", "valid", "same", "same_lower"] if not is_t
                                else ["int", "per_dim", "pairs", "valid"]))
    if kind == "int":
        padding = draw(st.integers(0, 3))
    elif kind == "per_dim":
        padding = tuple(draw(st.integers(0, 3)) for _ in range(nd))
    elif kind == "pairs":
        padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    else:
        padding = kind
    output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)) if is_t else 0
    weight = ((c_in, c_out // groups) if is_t else (c_out, c_in // groups)) + kernel
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, transposed=is_t,
                  output_padding=output_padding)
    try:
        p = make_params((n, c_in) + spatial, weight, **kwargs)
    except xconv.ShapeError:
        assume(False)
    return dict(input_shape=p.input_shape, weight_shape=weight, output_shape=p.output_shape, kwargs=kwargs,
                params=p)


def torch_reference(cfg, x, w, dy, bias=None):
    """(y, dx, dw, db) from PyTorch autograd, with asymmetric padding done by explicit pad/crop."""
    import torch
    import torch.nn.functional as F

    p = cfg["params"]
    nd = p.nd
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    tb = torch.zeros(p.bias_size, dtype=tx.dtype, requires_grad=True) if bias is None else \
        torch.tensor(bias, requires_grad=True)
    if not p.transposed:
        flat = [v for pre, post in reversed(p.padding) for v in (pre, post)]
        y = getattr(F, f"conv{nd}d")(F.pad(tx, flat), tw, tb, stride=p.stride, dilation=p.dilation,
                                     groups=p.groups)
    else:
        full = getattr(F, f"conv_transpose{nd}d")(tx, tw, tb, stride=p.stride, dilation=p.dilation,
                                                  groups=p.groups, output_padding=p.output_padding)
        y = full[(slice(None), slice(None)) + tuple(slice(pre, pre + o) for (pre, _), o in
                                                     zip(p.padding, p.output_shape[2:]))]
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()


def lane_conf(nd: int, stride=1, padding=0, groups: int = 1, dilation=1):
    """The ``torch_ops.Conf`` of a NumPy-backend lane (direct, keep_dtype): ``stride``, ``padding`` (symmetric) and
    ``dilation`` an int for every spatial dim or one per dim."""
    from xconv import torch_ops

    def per_dim(v):
        return tuple(v) if isinstance(v, tuple) else (v,) * nd
    return torch_ops.Conf(per_dim(stride), tuple((a, a) for a in per_dim(padding)), per_dim(dilation), groups, False,
                          (0,) * nd, False, "keep_dtype", "numpy")


def float32_operands(xs, ws, seed=0):
    """(x, w, bias) of shapes ``xs``, ``ws`` and (C_out,): standard normal float32 from ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32),
            rng.standard_normal(ws[0], dtype=np.float32))


def fresh_scratch(stash: list) -> None:
    """Keep the NumPy backend arena's free buffers alive in ``stash``: the next call's scratch lies at new addresses
    (a kept job template's offsets must then apply)."""
    from xconv_numpy.grid import scratch
    with scratch.ARENA.lock:
        stash.append(scratch.ARENA.free)
        scratch.ARENA.free, scratch.ARENA.total = {}, 0


def validated(call, *args, **kwargs):
    """``call(*args, **kwargs)`` (a public call) validated anew, so that the backend's dispatch runs it, not the
    runner a repeated call's plan keeps (xconv.plan_cache.runner): a reference for the runners' bits."""
    from xconv import plan_cache

    plan_cache.clear()
    return call(*args, **kwargs)


def assert_lane_forwards_replay(path: str, conf, x, w, b, dispatched: list, new_weights: bool = False) -> None:
    """A lane's repeated forwards on ``path`` (forced: the lanes opened inside keep that choice) run its kept template:
    three inputs of new values (and, with ``new_weights``, weights at a new address), the scratch at new addresses,
    each with and without ``b``, give the validated public calls' bits without reaching the full path (``dispatched``:
    the calls that did, by input shape); an input in another layout takes the full path with its bits, and an open
    trace records the path."""
    from xconv import lanes
    from xconv_numpy import paths

    xs_ = [x + np.float32(i) for i in range(3)]       # new data each call: no result left in a reused buffer
    stash = []
    with paths.force(path):
        want = [[validated(xconv.conv_fprop, xi, w, bias=bb, **conf.kwargs()) for bb in (None, b)] for xi in xs_]
        for bb in (None, b):
            lanes.fprop(conf, x, w, bb, conf.kwargs)   # opens the lane (a public call)
        dispatched.clear()
        for xi, wants in zip(xs_, want):
            fresh_scratch(stash)                   # the scratch at new addresses: the template's offsets apply
            got = [lanes.fprop(conf, xi, w.copy() if new_weights else w, bb, conf.kwargs) for bb in (None, b)]
            assert [a.tobytes() for a in got] == [a.tobytes() for a in wants]
        assert dispatched == []
        x2 = np.asfortranarray(x)                   # another layout: the full path, its bits
        assert lanes.fprop(conf, x2, w, b, conf.kwargs).tobytes() == want[0][1].tobytes()
        assert dispatched == [x.shape]
        with xconv.trace() as t:                    # a trace open: the full path records the call
            xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
        assert t.records[-1].path.startswith(path)
