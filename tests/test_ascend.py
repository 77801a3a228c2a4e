"""The Ascend backend against the CANN emulator (tests/fake_cann), through xconv's public API.

The emulator is built once per session; a module fixture points ``XCONV_ASCEND_LIB_DIR`` at it
before a fresh :class:`~xconv_ascend.driver.Driver` (environment lookup, as the default one)
loads it, and registers the backend under the name "ascend" for this module. Every test checks
that it left no live CANN object behind (the thread's stream excepted) and no misuse (double
destroy/free); the module's end releases the stream and the device and checks for zero.

Scenarios that need a process without the emulator loaded (missing library, missing symbol)
run in a subprocess: a process loads CANN once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import xconv
from core_helpers import conv_configs, fake_cann_build
from xconv.dtypes import DTYPES
from xconv_ascend import DeviceArray, compiler
from xconv_ascend import backend as ascend_backend
from xconv_ascend import driver as ascend_driver
from xconv_ascend.backend import AscendBackend
from xconv_ascend.driver import Driver

HERE = Path(__file__).resolve().parent

BUILD = fake_cann_build()
KIND_EXECUTOR, KIND_DEVICE_MEM, KIND_STREAM = 3, 4, 5
OP_BACKWARD, OP_FORWARD = 1, 2


class FakeCann:
    """The emulator's fakecann_* control API (names without the prefix)."""

    def __init__(self, lib):
        self.raw = {}
        for name, (restype, argtypes) in BUILD.CONTROL_SIGNATURES.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, argtypes
            self.raw[name] = f
            if name != "fakecann_fail_next":
                setattr(self, name[len("fakecann_"):], f)

    def last(self, what: str):
        """Field ``what`` of the latest call record."""
        return getattr(self, f"call_{what}")(self.call_count() - 1)

    def fail_next(self, func: str, code: int, times: int = 1) -> None:
        self.raw["fakecann_fail_next"](func.encode(), code, times)


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory):
    return BUILD.build(tmp_path_factory.mktemp("fake_cann"))


class Env:
    def __init__(self, backend, drv, fc, lib_dir):
        self.backend, self.drv, self.fc, self.lib_dir = backend, drv, fc, lib_dir

    def live(self) -> int:
        return self.fc.live_objects()


@pytest.fixture(scope="module")
def module_env(lib_dir):
    mp = pytest.MonkeyPatch()
    mp.setenv("XCONV_ASCEND_LIB_DIR", str(lib_dir))
    mp.delenv("XCONV_BACKEND", raising=False)
    mp.delenv("XCONV_ASCEND_DEVICE", raising=False)
    drv = Driver()  # environment lookup, like the process's default driver
    mp.setattr(ascend_driver, "_default", drv)  # module-level helpers (zeros, ...) use it too
    backend = AscendBackend(driver=drv)
    original = xconv.get_backend("ascend")
    xconv.register_backend(backend, replace=True)
    try:
        assert backend.availability() == (True, "")
        assert drv.source == "$XCONV_ASCEND_LIB_DIR" and Path(drv.lib_dir) == Path(lib_dir)
        fc = FakeCann(drv.libs["ascendcl"])
        yield Env(backend, drv, fc, lib_dir)
        drv.release_thread()
        fc.reset()
        assert fc.live_objects() == 0 and fc.misuse_count() == 0
    finally:
        xconv.register_backend(original, replace=True)
        mp.undo()


@pytest.fixture
def env(module_env):
    """Per test: emulator defaults, the thread's stream up, and no leak or misuse at the end."""
    e = module_env
    e.fc.reset()
    e.drv.ensure_context()
    base = e.live()
    assert base == 1 and e.fc.live_count(KIND_STREAM) == 1  # only this thread's stream
    yield e
    e.drv.take_message()
    assert e.fc.live_count(KIND_EXECUTOR) == 0
    assert e.live() == base, "live CANN objects leaked"
    assert e.fc.misuse_count() == 0
    assert e.drv.get_deterministic() in (0, None)
    e.fc.reset()


# ---------------------------------------------------------------------------------------------
# Reference and bounds

U = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ATOL = {"float32": 1e-40, "float16": 2.0**-25, "bfloat16": 1e-38}
U_REDUCED = 2.0**-11  # HF32 (11 stored mantissa bits) and FP16 inputs of the cube unit, with slack


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(DTYPES[dtype])


def reference(kind, arrays, kw):
    """numpy-exact in float64 on the (already rounded) inputs: (exact, abs_sum) per output."""
    as64 = [None if a is None else np.asarray(a).astype(np.float64) for a in arrays]
    abs64 = [None if a is None else np.abs(a) for a in as64]
    if kind == "backward":
        mask = (True, True, True)
        ex = xconv.convolution_backward(*as64, backend="numpy-exact", output_mask=mask, **kw)
        ab = xconv.convolution_backward(*abs64, backend="numpy-exact", output_mask=mask, **kw)
        return list(zip(ex, ab))
    x, w, b = as64
    ex = xconv.conv_fprop(x, w, bias=b, backend="numpy-exact", **kw)
    ab = xconv.conv_fprop(abs64[0], abs64[1], bias=abs64[2], backend="numpy-exact", **kw)
    return [(ex, ab)]


def assert_within(got, exact, abs_sum, dtype, u_in=0.0, what=""):
    got = np.asarray(got)
    assert got.dtype == DTYPES[dtype], (what, got.dtype)
    assert got.shape == exact.shape, (what, got.shape, exact.shape)
    err = np.abs(got.astype(np.float64) - exact)
    # one rounding of the exact result, plus one more allowance (the core adds a bias after a mapped transposed
    # fprop), plus the rounding of the cube unit's inputs in reduced-precision modes
    bound = 1.01 * U[dtype] * (np.abs(exact) + abs_sum) + (2.01 * u_in + 1e-13) * abs_sum + ATOL[dtype]
    worst = np.max(err - bound) if err.size else -1
    assert worst <= 0, f"{what}: max excess {worst} (err {err.max()}, dtype {dtype}, u_in {u_in})"


LAYOUTS = ["contiguous", "channels_last", "strided", "reversed"]


def relayout(a: np.ndarray, kind: str) -> np.ndarray:
    """An array equal to ``a`` laid out in memory as ``kind`` says (all but "contiguous" are non-contiguous views)."""
    if kind == "channels_last":
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)
    if kind == "strided":  # every other element of a buffer twice as large in every dim, from offset 1
        big = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
        view = big[tuple(slice(1, None, 2) for _ in a.shape)]
        view[...] = a
        return view
    if kind == "reversed":  # negative strides in the last dim
        return np.flip(np.ascontiguousarray(np.flip(a, -1)), -1)
    return a


def u_in_for(dtype, math_mode):
    return U_REDUCED if dtype == "float32" and math_mode != "keep_dtype" else 0.0


# ---------------------------------------------------------------------------------------------
# Availability


def test_available_with_devices(env):
    row = [r for r in xconv.list_backends() if r.name == "ascend"][0]
    assert row.available and row.reason == ""
    assert row.devices == ("ascend:0 (Ascend910B2, on the CANN emulator)",)
    assert row.array_families == ("numpy", "xconv_ascend")


# ---------------------------------------------------------------------------------------------
# Results against the NumPy reference across the parameter space

MASKS = [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(cfg=conv_configs(max_spatial=6), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       mask=st.sampled_from(MASKS), math_mode=st.sampled_from(["keep_dtype", "allow_tf32", "allow_fp16"]),
       deterministic=st.booleans(), seed=st.integers(0, 2**31 - 1),
       layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 3))
def test_backward_matches_reference(env, cfg, dtype, mask, math_mode, deterministic, seed, layouts):
    env.fc.reset()  # call records per example
    p = cfg["params"]
    rng = np.random.default_rng(seed)
    x, w = rand(rng, cfg["input_shape"], dtype), rand(rng, cfg["weight_shape"], dtype)
    dy = rand(rng, cfg["output_shape"], dtype)
    kw = cfg["kwargs"]
    operands = (relayout(a, k) for a, k in zip((dy, x, w), layouts))
    got = xconv.convolution_backward(*operands, output_mask=mask, math=math_mode, deterministic=deterministic,
                                     bias_sizes=[p.bias_size], backend="ascend", **kw)
    refs = reference("backward", (dy, x, w), kw)
    for bit, g, (exact, abs_sum), name in zip(mask, got, refs, ("grad_input", "grad_weight", "grad_bias")):
        if not bit:
            assert g is None, name
            continue
        u_in = 0.0 if name == "grad_bias" else u_in_for(dtype, math_mode)  # the bias gradient is a plain sum
        assert_within(g, exact, abs_sum, dtype, u_in, name)
    typed = p.replace(dtype=dtype, math=math_mode)
    # mapped onto direct convolutions; asymmetric 1-D/3-D padding of a transposed one stays transposed
    # (symmetric padding, output cropped by the core)
    as_direct = p.transposed and compiler.direct_fallback(typed, "Ascend910B2", compiler.OP_BACKWARD) is not None
    fc = env.fc
    if mask == (False, False, True) and p.input_shape[0] and p.output_shape[1]:
        # grad_bias alone: the 1x1 depthwise direct backward over grad_output
        assert fc.call_count() == 1 and fc.last("mask") == 4 and fc.last("transposed") == 0
        assert fc.last("groups") == p.output_shape[1]
    elif any(mask) and 0 not in (p.input_shape[0], p.input_shape[1], p.output_shape[1]) and not as_direct:
        assert fc.call_count() == 1
        assert fc.last("op") == OP_BACKWARD and fc.last("mask") == mask[0] | mask[1] << 1 | mask[2] << 2
        assert fc.last("transposed") == int(p.transposed) and fc.last("groups") == p.groups
    if fc.call_count():
        assert fc.last("deterministic") == int(deterministic)
        assert fc.last("cube_math") == (compiler.MATH_TO_CUBE[math_mode] if dtype == "float32" else 0)
        assert fc.last("dtype") == compiler.DTYPES[dtype]
    if as_direct and any(mask):
        # the direct fprop of the mapping runs as aclnnConvolutionBackward (transposed, data gradient only)
        # where A2/A3's aclnnConvolution refuses float32 KEEP_DTYPE; every other call is direct
        via_backward = dtype == "float32" and math_mode == "keep_dtype"
        for i in range(env.fc.call_count()):
            if env.fc.call_transposed(i):
                assert via_backward and env.fc.call_op(i) == OP_BACKWARD and env.fc.call_mask(i) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(cfg=conv_configs(max_spatial=6), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       with_bias=st.booleans(), math_mode=st.sampled_from(["keep_dtype", "allow_tf32"]),
       seed=st.integers(0, 2**31 - 1), layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 2))
def test_fprop_matches_reference(env, cfg, dtype, with_bias, math_mode, seed, layouts):
    p = cfg["params"]
    rng = np.random.default_rng(seed)
    x, w = rand(rng, cfg["input_shape"], dtype), rand(rng, cfg["weight_shape"], dtype)
    bias = rand(rng, (p.bias_size,), dtype) if with_bias else None
    y = xconv.conv_fprop(relayout(x, layouts[0]), relayout(w, layouts[1]), bias=bias, math=math_mode,
                         backend="ascend", **cfg["kwargs"])
    ((exact, abs_sum),) = reference("fprop", (x, w, bias), cfg["kwargs"])
    assert_within(y, exact, abs_sum, dtype, u_in_for(dtype, math_mode), "output")


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_dgrad_wgrad_primitives(env, nd, transposed):
    rng = np.random.default_rng(nd)
    kw = dict(stride=2, padding=1, dilation=(1,) * (nd - 1) + (2,), groups=2, transposed=transposed,
              output_padding=1 if transposed else 0)
    x = rand(rng, (2, 4) + (5,) * nd, "float32")
    w = rand(rng, ((4, 3) if transposed else (6, 2)) + (3,) * nd, "float32")
    y = xconv.conv_fprop(x, w, backend="numpy-exact", **kw)
    dy = rand(rng, y.shape, "float32")
    dx = xconv.conv_dgrad(dy, w, x.shape, backend="ascend", **kw)
    dw = xconv.conv_wgrad(x, dy, w.shape, backend="ascend", **kw)
    refs = reference("backward", (dy, x, w), kw)
    assert_within(dx, *refs[0], "float32", what="dgrad")
    assert_within(dw, *refs[1], "float32", what="wgrad")
    assert [env.fc.call_mask(i) for i in range(env.fc.call_count())] == [1, 2]


@pytest.mark.parametrize("mask", MASKS[1:])
def test_each_mask_passes_scratch_outputs_and_null_grad_bias(env, mask, monkeypatch):
    """The portable rule: gradInput/gradWeight always valid tensors, gradBias null only when its bit is off."""
    seen = []
    phase1 = env.drv.fn.aclnnConvolutionBackwardGetWorkspaceSize

    def spy(*args):
        seen.append(args)
        return phase1(*args)
    monkeypatch.setattr(env.drv.fn, "aclnnConvolutionBackwardGetWorkspaceSize", spy)
    env.fc.set_strict_outputs(1)  # outputs must be contiguous
    rng = np.random.default_rng(1)
    x, w, dy = rand(rng, (2, 3, 6, 6), "float32"), rand(rng, (4, 3, 3, 3), "float32"), rand(rng, (2, 4, 4, 4),
                                                                                              "float32")
    got = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="ascend")
    refs = reference("backward", (dy, x, w), {})
    for bit, g, ref in zip(mask, got, refs):
        assert (g is None) == (not bit)
        if bit:
            assert_within(g, *ref, "float32")
    (args,) = seen
    assert args[3] is not None                     # biasSizes always passed
    assert args[12] and args[13]                   # gradInput, gradWeight never null
    assert bool(args[14]) == mask[2]               # gradBias null iff its bit is off
    assert env.fc.last("mask") == mask[0] | mask[1] << 1 | mask[2] << 2


def test_no_mask_bit_does_nothing(env):
    x, w, dy = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 2, 2), np.float32)
    assert xconv.convolution_backward(dy, x, w, output_mask=(False, False, False), backend="ascend") == \
        (None, None, None)
    assert env.fc.prepare_count() == 0


# ---------------------------------------------------------------------------------------------
# Padding forms, strided inputs, device arrays


@pytest.fixture
def spy_calls(monkeypatch):
    """Records (params, op) per backend call, and the int arrays and tensors created."""
    rec = {"params": [], "int_arrays": [], "tensors": []}
    real_begin = AscendBackend._begin
    real_ints, real_tensor = ascend_backend._Call.int_array, ascend_backend._Call.tensor

    def _begin(self, p, op):  # every aclnn call starts here
        rec["params"].append(p)
        return real_begin(self, p, op)

    def int_array(self, values):
        rec["int_arrays"].append(list(values))
        return real_ints(self, values)

    def tensor(self, shape, strides, offset, dtype, fmt, storage, ptr):
        rec["tensors"].append((tuple(shape), tuple(strides), offset, fmt, storage))
        return real_tensor(self, shape, strides, offset, dtype, fmt, storage, ptr)

    monkeypatch.setattr(AscendBackend, "_begin", _begin)
    monkeypatch.setattr(ascend_backend._Call, "int_array", int_array)
    monkeypatch.setattr(ascend_backend._Call, "tensor", tensor)
    return rec


def test_two_d_asymmetric_padding_goes_native_as_four_values(env, spy_calls):
    rng = np.random.default_rng(2)
    x, w = rand(rng, (1, 2, 7, 6), "float32"), rand(rng, (3, 2, 3, 2), "float32")
    kw = dict(padding=((2, 0), (1, 3)), stride=(1, 2))
    y = xconv.conv_fprop(x, w, backend="ascend", math="allow_tf32", **kw)   # aclnnConvolution itself
    dy = rand(rng, y.shape, "float32")
    got = xconv.convolution_backward(dy, x, w, backend="ascend", **kw)
    for g, ref in zip(got, reference("backward", (dy, x, w), kw)):
        assert_within(g, *ref, "float32")
    assert all(p.padding == ((2, 0), (1, 3)) and p.input_shape == x.shape for p in spy_calls["params"])
    assert [2, 0, 1, 3] in spy_calls["int_arrays"]  # aclnn's [top, bottom, left, right]


@pytest.mark.parametrize("nd", [1, 3])
def test_other_asymmetric_padding_is_legalized_by_the_core(env, spy_calls, nd):
    """1-D/3-D (pre, post) padding: the core pads the input explicitly; aclnn sees symmetric padding."""
    rng = np.random.default_rng(nd)
    x, w = rand(rng, (1, 2) + (5,) * nd, "float32"), rand(rng, (2, 2) + (2,) * nd, "float32")
    kw = dict(padding=((1, 0),) * nd)
    y = xconv.conv_fprop(x, w, backend="ascend", **kw)
    dy = rand(rng, y.shape, "float32")
    got = xconv.convolution_backward(dy, x, w, backend="ascend", **kw)
    for g, ref in zip(got, reference("backward", (dy, x, w), kw)):
        assert_within(g, *ref, "float32")
    assert all(p.symmetric for p in spy_calls["params"])
    ((exact, abs_sum),) = reference("fprop", (x, w, None), kw)
    assert_within(y, exact, abs_sum, "float32")


def test_noncontiguous_host_inputs_keep_their_strides(env, spy_calls):
    rng = np.random.default_rng(3)
    big = rand(rng, (2, 8, 9, 12), "float32")
    x = big[:, 1::2, 1:8, ::2]                                   # offset, steps: non-contiguous
    w = rand(rng, (4, 4, 2, 3), "float32").transpose(0, 1, 3, 2)  # (4, 4, 3, 2), transposed last dims
    dy_base = rand(rng, (2, 4, 5, 5), "float32")
    dy = dy_base[:, :, ::-1]                                     # negative stride: copied
    assert not (x.flags.c_contiguous or w.flags.c_contiguous or dy.flags.c_contiguous)
    got = xconv.convolution_backward(dy, x, w, backend="ascend")
    for g, ref in zip(got, reference("backward", (dy, x, w), {})):
        assert_within(g, *ref, "float32")
    shapes = {}
    for t in spy_calls["tensors"]:  # operands come first (gradInput has x's shape)
        shapes.setdefault(t[0], t)
    assert shapes[x.shape][1] == tuple(s // 4 for s in x.strides)      # real element strides, no host copy
    assert shapes[w.shape][1] == tuple(s // 4 for s in w.strides)
    assert shapes[dy.shape][1] == compiler.contiguous_strides(dy.shape)  # negative strides: contiguous copy
    assert shapes[x.shape][3] == compiler.FORMATS[2]


def test_formats_by_rank(env, spy_calls):
    for nd, fmt in ((1, 47), (2, 0), (3, 30)):
        spy_calls["tensors"].clear()
        x, w = np.ones((1, 1) + (3,) * nd, np.float16), np.ones((1, 1) + (2,) * nd, np.float16)
        dy = np.ones((1, 1) + (2,) * nd, np.float16)
        xconv.convolution_backward(dy, x, w, backend="ascend")
        fmts = [t[3] for t in spy_calls["tensors"]]
        assert fmts.count(fmt) == 5 and fmts.count(compiler.ACL_FORMAT_ND) == 1  # 5 conv tensors + gradBias


def test_device_arrays_stay_on_device(env, spy_calls):
    rng = np.random.default_rng(4)
    xh, wh = rand(rng, (2, 4, 7, 7), "bfloat16"), rand(rng, (6, 2, 3, 3), "bfloat16")
    dyh = rand(rng, (2, 6, 5, 5), "bfloat16")
    big = DeviceArray.from_numpy(np.pad(xh, ((0, 0), (0, 0), (1, 0), (2, 0))), env.drv)
    x = big[:, :, 1:, 2:]                                           # a view with an element offset
    w, dy = DeviceArray.from_numpy(wh, env.drv), DeviceArray.from_numpy(dyh, env.drv)
    assert x.offset == 1 * 9 + 2 and not x.is_contiguous
    np.testing.assert_array_equal(x.to_numpy(), xh)
    dx, dw, db = xconv.convolution_backward(dy, x, w, groups=2, backend="ascend")
    assert all(isinstance(r, DeviceArray) for r in (dx, dw, db))
    assert [t for t in spy_calls["tensors"] if t[0] == x.shape][0][2] == x.offset  # offset passed, not copied
    for g, ref in zip((dx, dw, db), reference("backward", (dyh, xh, wh), dict(groups=2))):
        assert_within(g.to_numpy(), *ref, "bfloat16")
    y = xconv.conv_fprop(x, w, groups=2, backend=None)  # DeviceArrays select the ascend backend by family
    assert isinstance(y, DeviceArray) and y.shape == (2, 6, 5, 5)
    ((exact, abs_sum),) = reference("fprop", (xh, wh, None), dict(groups=2))
    assert_within(y.to_numpy(), exact, abs_sum, "bfloat16")
    dx_only = xconv.convolution_backward(dy, x, w, groups=2, output_mask=(True, False, False), backend="ascend")
    assert dx_only[1:] == (None, None)
    for a in (big, w, dy, dx, dw, db, y, dx_only[0]):
        a.free()
    assert x.freed and big.freed
    with pytest.raises(ValueError, match="freed"):
        x.to_numpy()


def test_device_arrays_through_core_legalization(env):
    """1-D asymmetric padding (core pads and crops DeviceArrays) and empty tensors (core makes zeros)."""
    rng = np.random.default_rng(5)
    xh, wh = rand(rng, (2, 3, 9), "float16"), rand(rng, (4, 3, 3), "float16")
    kw = dict(padding=((2, 1),), stride=2)
    with DeviceArray.from_numpy(xh, env.drv) as x, DeviceArray.from_numpy(wh, env.drv) as w:
        y = xconv.conv_fprop(x, w, backend="ascend", **kw)
        dyh = rand(rng, y.shape, "float16")
        with DeviceArray.from_numpy(dyh, env.drv) as dy:
            got = xconv.convolution_backward(dy, x, w, backend="ascend", **kw)
        for g, ref in zip(got, reference("backward", (dyh, xh, wh), kw)):
            assert isinstance(g, DeviceArray)
            assert_within(g.to_numpy(), *ref, "float16")
            g.free()
        y.free()
    with DeviceArray.from_numpy(np.zeros((0, 3, 9), np.float16), env.drv) as e:
        with DeviceArray.from_numpy(wh, env.drv) as w:
            before = env.fc.prepare_count()
            z = xconv.conv_fprop(e, w, backend="ascend")
            assert isinstance(z, DeviceArray) and z.shape == (0, 4, 7) and env.fc.prepare_count() == before


def test_device_array_basics(env):
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        host = np.arange(24, dtype=DTYPES[dtype]).reshape(2, 3, 4)
        with DeviceArray.from_numpy(host, env.drv) as d:
            assert d.shape == host.shape and d.dtype == host.dtype and type(d).__module__.split(".")[0] == \
                "xconv_ascend"
            np.testing.assert_array_equal(d.to_numpy(), host)
            np.testing.assert_array_equal(np.asarray(d[1, :, 1::2]), host[1, :, 1::2])
            np.testing.assert_array_equal(d[:, None, 2].to_numpy(), host[:, None, 2])
            np.testing.assert_array_equal(d.transpose(2, 0, 1).to_numpy(), host.transpose(2, 0, 1))
            d[:, 1:, 0] = np.full((2, 2), 7, host.dtype)
            host[:, 1:, 0] = 7
            np.testing.assert_array_equal(d.to_numpy(), host)
    import xconv_ascend
    z = xconv_ascend.zeros((2, 2), dtype=np.float32)
    np.testing.assert_array_equal(z.to_numpy(), np.zeros((2, 2), np.float32))  # device memory starts as NaN
    z.free()
    z.free()  # idempotent


# ---------------------------------------------------------------------------------------------
# Determinism and math


def test_deterministic_flag_set_for_the_call_and_restored(env):
    drv, fc = env.drv, env.fc
    x, w, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), np.ones((1, 3, 3, 3), np.float32)
    assert drv.get_deterministic() == 0
    xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    assert fc.last("deterministic") == 1 and drv.get_deterministic() == 0 and fc.get_deterministic(0) == 0
    xconv.convolution_backward(dy, x, w, deterministic=False, backend="ascend")
    assert fc.last("deterministic") == 0
    xconv.conv_fprop(x, w, deterministic=True, backend="ascend", math="allow_tf32")
    assert fc.last("op") == OP_FORWARD and fc.last("deterministic") == 1 and drv.get_deterministic() == 0
    xconv.conv_fprop(x, w, deterministic=True, backend="ascend")      # A2/A3: through the backward op
    assert fc.last("op") == OP_BACKWARD and fc.last("deterministic") == 1 and drv.get_deterministic() == 0
    # a value set by the caller survives: set for the call, restored to 1 after, untouched by deterministic=False
    assert drv.set_deterministic(1) == 0
    xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    assert fc.last("deterministic") == 1 and drv.get_deterministic() == 1
    xconv.convolution_backward(dy, x, w, deterministic=False, backend="ascend")
    assert fc.last("deterministic") == 1 and drv.get_deterministic() == 1
    assert drv.set_deterministic(0) == 0
    # restored after a failing call too
    fc.fail_next("aclnnConvolutionBackward", 561103)
    with pytest.raises(xconv.BackendError):
        xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    assert fc.last("deterministic") == 1 and drv.get_deterministic() == 0
    # real CANN answers 107021 (ACL_ERROR_RT_SYSPARAMOPT_NOT_SET) before the context's option was ever set:
    # the context gets the process value back (what aclnn reads), here 1 from the caller's context call
    assert drv.set_deterministic(1) == 0 and drv.get_process_deterministic() == 1
    fc.fail_next("aclrtCtxGetSysParamOpt", 107021)
    xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    assert fc.last("deterministic") == 1 and drv.get_deterministic() == 1 and drv.get_process_deterministic() == 1
    assert drv.set_deterministic(0) == 0 and drv.get_process_deterministic() == 0


def test_deterministic_results_are_bitwise_identical(env):
    rng = np.random.default_rng(6)
    x, w = rand(rng, (2, 4, 6, 6), "float32"), rand(rng, (4, 4, 3, 3), "float32")
    dy = rand(rng, (2, 4, 4, 4), "float32")
    a = xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    b = xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("math_mode", ["keep_dtype", "allow_tf32", "allow_fp16"])
def test_math_to_cube_math_type(env, dtype, math_mode):
    rng = np.random.default_rng(7)
    x, w, dy = rand(rng, (1, 2, 5, 5), dtype), rand(rng, (2, 2, 3, 3), dtype), rand(rng, (1, 2, 3, 3), dtype)
    got = xconv.convolution_backward(dy, x, w, math=math_mode, backend="ascend")
    xconv.conv_fprop(x, w, math=math_mode, backend="ascend")
    want = {"keep_dtype": 0, "allow_tf32": 3, "allow_fp16": 2}[math_mode] if dtype == "float32" else 0
    assert [env.fc.call_cube_math(i) for i in range(2)] == [want, want]
    for g, ref, name in zip(got, reference("backward", (dy, x, w), {}), "iwb"):
        assert_within(g, *ref, dtype, 0 if name == "b" else u_in_for(dtype, math_mode))


# ---------------------------------------------------------------------------------------------
# Errors


def test_bad_arguments_never_reach_the_device(env):
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(xconv.ShapeError, match="grad_output"):
        xconv.convolution_backward(np.ones((1, 3, 4, 3), np.float32), x, w, backend="ascend")
    with pytest.raises(xconv.ShapeError, match="groups"):
        xconv.convolution_backward(np.ones((1, 3, 3, 3), np.float32), x, w, groups=2, backend="ascend")
    with pytest.raises(xconv.UnsupportedError, match="float64"):
        xconv.conv_fprop(x.astype(np.float64), w.astype(np.float64), backend="ascend")
    assert env.fc.prepare_count() == 0 and env.fc.call_count() == 0


def test_vendor_rejection_is_backend_error_with_message(env, monkeypatch):
    """With the capability table out of the way, the library's own check answers: code, name, message, call."""
    monkeypatch.setattr(compiler, "RULES", ())
    env.fc.set_soc_name(b"Ascend910A")
    x, w, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), np.ones((1, 3, 3, 3), np.float32)
    with pytest.raises(xconv.BackendError) as info:
        xconv.convolution_backward(dy, x, w, backend="ascend")
    e = info.value
    assert e.backend == "ascend" and e.status == 161002 and e.status_name == "ACLNN_ERR_PARAM_INVALID"
    assert e.call == "aclnnConvolutionBackwardGetWorkspaceSize" and "cubeMathType 0" in e.vendor_message
    assert "ACLNN_ERR_PARAM_INVALID (161002)" in str(e)
    env.fc.fail_next("aclnnConvolutionGetWorkspaceSize", 161001)
    with pytest.raises(xconv.BackendError) as info:
        xconv.conv_fprop(x, w, backend="ascend", math="allow_fp16")
    assert info.value.status_name == "ACLNN_ERR_PARAM_NULLPTR" and "injected" in info.value.vendor_message


@pytest.mark.parametrize("soc,kw,dtype,rule", [
    ("Ascend910A", {}, "float32", "older-series-float32-keep-dtype"),
    ("Ascend910ProB", dict(math="allow_tf32"), "float32", "older-series-float32-hf32"),
    ("Ascend310P3", {}, "bfloat16", "older-series-no-bfloat16"),
    ("Ascend910B3", dict(dilation=256, padding=255), "float16", "a2a3-backward-dilation-max-255"),
    ("Ascend310B1", {}, "float16", "backward-unsupported-product"),
])
def test_capability_violation_raises_before_any_device_call(env, soc, kw, dtype, rule):
    env.fc.set_soc_name(soc.encode())
    x, w = np.ones((1, 2, 5, 5), DTYPES[dtype]), np.ones((2, 2, 3, 3), DTYPES[dtype])
    p = xconv.params.make_params(x.shape, w.shape, **kw)
    dy = np.ones(p.output_shape, DTYPES[dtype])
    live = env.live()
    with pytest.raises(xconv.UnsupportedError, match=f"rule '{rule}'") as info:
        xconv.convolution_backward(dy, x, w, backend="ascend", **kw)
    assert soc in str(info.value)
    assert env.fc.prepare_count() == 0 and env.live() == live


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_transposed_output_padding_beyond_stride_runs_as_direct_convolutions(env, nd):
    """aclnnConvolutionBackward wants outputPadding < stride; PyTorch allows < dilation: the core's mapping runs it."""
    rng = np.random.default_rng(nd)
    kw = dict(transposed=True, stride=1, dilation=2, output_padding=1, padding=1, groups=2)
    x, w = rand(rng, (2, 4) + (4,) * nd, "float32"), rand(rng, (4, 3) + (3,) * nd, "float32")
    # aclnnConvolution allows outputPadding < dilation (float32 KEEP_DTYPE would be mapped: not on A2/A3's forward op)
    y = xconv.conv_fprop(x, w, backend="ascend", math="allow_tf32", **kw)
    assert env.fc.last("transposed") == 1 and env.fc.last("op") == OP_FORWARD
    dy = rand(rng, y.shape, "float32")
    start = env.fc.call_count()
    got = xconv.convolution_backward(dy, x, w, backend="ascend", **kw)
    for g, ref in zip(got, reference("backward", (dy, x, w), kw)):
        assert_within(g, *ref, "float32")
    calls = range(start, env.fc.call_count())
    # direct calls, but for the mapping's direct fprop, which A2/A3 run through the backward op (transposed,
    # data gradient only: float32 KEEP_DTYPE is refused by their aclnnConvolution)
    assert calls and all(env.fc.call_transposed(i) == 0 or env.fc.call_mask(i) == 1 for i in calls)
    ((exact, abs_sum),) = reference("fprop", (x, w, None), kw)
    assert_within(y, exact, abs_sum, "float32", U_REDUCED)
    db = xconv.convolution_backward(dy, x, w, backend="ascend", output_mask=(False, False, True), **kw)[2]
    assert_within(db, *reference("backward", (dy, x, w), kw)[2], "float32")


def test_older_series(env):
    env.fc.set_soc_name(b"Ascend910A")
    rng = np.random.default_rng(8)
    x, w, dy = rand(rng, (1, 2, 5), "float32"), rand(rng, (3, 2, 3), "float32"), rand(rng, (1, 3, 3), "float32")
    got = xconv.convolution_backward(dy, x, w, math="allow_fp16", backend="ascend")  # computed in float16 there
    for g, ref, name in zip(got, reference("backward", (dy, x, w), {}), "iwb"):
        assert_within(g, *ref, "float32", 0 if name == "b" else 2.0**-11)
    with pytest.raises(xconv.UnsupportedError, match="training-convolution-unsupported"):
        xconv.conv_fprop(x, w, math="allow_fp16", backend="ascend")
    env.fc.set_soc_name(b"Ascend310P3")
    with pytest.raises(xconv.UnsupportedError, match="older-series-backward-no-3d"):
        xconv.convolution_backward(np.ones((1, 1, 1, 1, 1), np.float16), np.ones((1, 1, 3, 3, 3), np.float16),
                                   np.ones((1, 1, 3, 3, 3), np.float16), backend="ascend")
    y = xconv.conv_fprop(x.astype(np.float16), w.astype(np.float16), backend="ascend")
    assert y.dtype == np.float16 and env.fc.last("op") == OP_FORWARD


def test_empty_tensors_never_reach_the_device(env):
    x, w = np.ones((0, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    dx, dw, db = xconv.convolution_backward(np.ones((0, 3, 3, 3), np.float32), x, w, backend="ascend")
    assert dx.shape == x.shape and not dw.any() and not db.any()
    assert env.fc.prepare_count() == 0


@pytest.mark.parametrize("transposed", [False, True])
def test_grad_bias_alone_runs_as_a_1x1_depthwise_backward(env, transposed):
    """grad_bias needs only grad_output: also with C_in = 0 (aclnn rejects a weight dim of 0) and big kernels."""
    rng = np.random.default_rng(10)
    x, w = np.ones((2, 0, 5), np.float32), np.ones((0, 3, 3) if transposed else (3, 0, 3), np.float32)
    p = xconv.params.make_params(x.shape, w.shape, transposed=transposed)
    dy = rand(rng, p.output_shape, "float32")
    dx, dw, db = xconv.convolution_backward(dy, x, w, transposed=transposed, backend="ascend")
    assert dx.shape == x.shape and dw.shape == w.shape
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2)), rtol=1e-6)
    assert env.fc.last("mask") == 4 and env.fc.last("groups") == 3 and env.fc.last("transposed") == 0
    env.fc.set_soc_name(b"Ascend910B2")
    big = rand(rng, (1, 2, 300), "float16")
    kernel = rand(rng, (2, 2, 256), "float16")  # beyond the A2/A3 backward kernel limit, irrelevant to grad_bias
    dy = rand(rng, (1, 2, 45), "float16")
    db = xconv.convolution_backward(dy, big, kernel, output_mask=(False, False, True), backend="ascend")[2]
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2)), rtol=2**-10)
    with pytest.raises(xconv.UnsupportedError, match="a2a3-backward-kernel-hw-max-255"):
        xconv.convolution_backward(dy, big, kernel, output_mask=(False, True, True), backend="ascend")


def test_workspace_allocation_failure_releases_the_executor_without_running(env):
    env.fc.set_workspace_size(1 << 60)
    x, w, dy = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(xconv.BackendError) as info:
        xconv.convolution_backward(dy, x, w, backend="ascend")
    e = info.value
    assert e.call == "aclrtMalloc" and e.status == 207001 and e.status_name == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert "out of memory" in e.vendor_message
    assert env.fc.prepare_count() == 1 and env.fc.call_count() == 0  # phase 1 ran, nothing executed
    assert env.fc.live_count(KIND_EXECUTOR) == 0 and env.drv.take_message() == ""


# ---------------------------------------------------------------------------------------------
# Leaks


def test_zero_live_objects_after_1000_calls_with_failures(env, monkeypatch):
    drv, fc = env.drv, env.fc
    rng = np.random.default_rng(9)
    x, w = rand(rng, (1, 2, 5, 5), "float32"), rand(rng, (4, 2, 3, 3), "float32")
    dy = rand(rng, (1, 4, 3, 3), "float32")
    real_memcpy, real_set = drv.fn.aclrtMemcpy, drv.set_deterministic

    def bwd(**kw):
        return xconv.convolution_backward(dy, x, w, backend="ascend", **kw)

    def fail_download():
        monkeypatch.setattr(drv.fn, "aclrtMemcpy", lambda d, m, s, n, kind: 100000 if kind == 2 else
                            real_memcpy(d, m, s, n, kind))
        try:
            bwd()
        finally:
            monkeypatch.setattr(drv.fn, "aclrtMemcpy", real_memcpy)

    def fail_restore():
        monkeypatch.setattr(drv, "set_deterministic", lambda v: 100000 if v == 0 else real_set(v))
        try:
            bwd(deterministic=True)
        finally:
            monkeypatch.setattr(drv, "set_deterministic", real_set)
            assert real_set(0) == 0

    def huge_workspace():
        fc.set_workspace_size(1 << 60)  # phase 1 succeeds, the workspace cannot be allocated
        try:
            bwd()
        finally:
            fc.set_workspace_size(512)

    def device_call(fail=None):
        with DeviceArray.from_numpy(dy, drv) as d_dy, DeviceArray.from_numpy(x, drv) as d_x, \
                DeviceArray.from_numpy(w, drv) as d_w:
            if fail:
                fc.fail_next(fail, 561103)
            for r in xconv.convolution_backward(d_dy, d_x, d_w, backend="ascend"):
                r.free()

    def inject(func, code, call=bwd, **kw):
        def run():
            fc.fail_next(func, code)
            call(**kw)
        return run

    def rejected():  # the emulator's own check, the table bypassed
        monkeypatch.setattr(compiler, "RULES", ())
        fc.set_soc_name(b"Ascend910A")
        try:
            bwd()
        finally:
            fc.set_soc_name(b"Ascend910B2")
            monkeypatch.undo()

    def unsupported():
        fc.set_soc_name(b"Ascend910A")
        try:
            bwd()
        finally:
            fc.set_soc_name(b"Ascend910B2")

    fprop = lambda: xconv.conv_fprop(x, w, backend="ascend", math="allow_tf32")  # noqa: E731  (aclnnConvolution)
    scenarios = {
        "fprop through the backward op": (lambda: xconv.conv_fprop(x, w, backend="ascend"), None),
        "backward": (bwd, None),
        "backward deterministic": (lambda: bwd(deterministic=True, output_mask=(True, False, True)), None),
        "dgrad": (lambda: xconv.conv_dgrad(dy, w, x.shape, backend="ascend"), None),
        "wgrad": (lambda: xconv.conv_wgrad(x, dy, w.shape, backend="ascend"), None),
        "bgrad": (lambda: bwd(output_mask=(False, False, True)), None),
        "fprop": (fprop, None),
        "device arrays": (device_call, None),
        "phase 1 fails": (inject("aclnnConvolutionBackwardGetWorkspaceSize", 161002), xconv.BackendError),
        "phase 2 fails": (inject("aclnnConvolutionBackward", 561103), xconv.BackendError),
        "workspace allocation fails": (huge_workspace, xconv.BackendError),
        "synchronize fails": (inject("aclrtSynchronizeStream", 507899), xconv.BackendError),
        "aclCreateTensor fails": (inject("aclCreateTensor", 1), xconv.BackendError),
        "aclCreateIntArray fails": (inject("aclCreateIntArray", 1), xconv.BackendError),
        "aclCreateBoolArray fails": (inject("aclCreateBoolArray", 1), xconv.BackendError),
        "upload malloc fails": (inject("aclrtMalloc", 207001), xconv.BackendError),
        "upload memcpy fails": (inject("aclrtMemcpy", 100000), xconv.BackendError),
        "copy back fails": (fail_download, xconv.BackendError),
        "deterministic set fails": (inject("aclrtCtxSetSysParamOpt", 100000, deterministic=True), xconv.BackendError),
        "deterministic restore fails": (fail_restore, xconv.BackendError),
        "fprop phase 1 fails": (inject("aclnnConvolutionGetWorkspaceSize", 161002, call=fprop), xconv.BackendError),
        "fprop phase 2 fails": (inject("aclnnConvolution", 561103, call=fprop), xconv.BackendError),
        "device arrays, phase 2 fails": (lambda: device_call("aclnnConvolutionBackward"), xconv.BackendError),
        "library rejects": (rejected, xconv.BackendError),
        "capability table refuses": (unsupported, xconv.UnsupportedError),
    }
    names = list(scenarios)
    outcomes = {name: 0 for name in names}
    base = env.live()
    for i in range(1000):
        name = names[i % len(names)]
        fn, expected = scenarios[name]
        if expected is None:
            fn()
        else:
            with pytest.raises(expected):
                fn()
        outcomes[name] += 1
        if i % 97 == 0:
            assert env.live() == base, name
    assert sum(outcomes.values()) == 1000 and min(outcomes.values()) >= 1000 // len(names)
    failures = sum(n for name, n in outcomes.items() if scenarios[name][1] is not None)
    assert failures > 600
    assert env.live() == base == 1 and fc.live_count(KIND_DEVICE_MEM) == 0 and fc.live_count(KIND_EXECUTOR) == 0
    assert fc.misuse_count() == 0
    drv.release_thread()
    assert fc.live_objects() == 0
    drv.ensure_context()


# ---------------------------------------------------------------------------------------------
# Runtime lifecycle


def test_each_thread_gets_its_own_context_and_stream(env):
    x, w, dy = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 2, 2), np.float32)
    xconv.convolution_backward(dy, x, w, backend="ascend")
    main_stream = env.fc.last("stream")
    result = {}

    def worker():
        try:
            r = xconv.convolution_backward(dy, x, w, backend="ascend")
            result["stream"] = env.fc.last("stream")
            result["ok"] = np.array_equal(r[1], np.full((1, 1, 3, 3), 4, np.float32))
            result["live"] = env.live()
        finally:
            env.drv.release_thread()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result["ok"] and result["stream"] != main_stream and result["live"] == 2


def test_reinitializes_after_finalize_elsewhere(env):
    """Someone calls aclFinalize (or the emulator's runtime is reset): the next call initializes again."""
    env.drv.release_thread()
    env.fc.reset_runtime()
    assert not env.fc.is_initialized()
    x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    assert xconv.conv_fprop(x, w, backend="ascend").sum() == 36.0
    assert env.fc.is_initialized()


def test_availability_reasons_from_the_runtime(env):
    """aclInit failure and no device, seen by fresh drivers on the same (already loaded) libraries."""
    fc = env.fc
    env.drv.release_thread()
    fc.reset_runtime()
    fc.set_fail_init(500000)
    ok, reason = Driver(lib_dir=env.lib_dir).availability()
    assert not ok and reason.startswith("aclInit failed with status 500000") and "fakecann_set_fail_init" in reason
    fc.set_fail_init(0)
    fc.set_device_count(0)
    ok, reason = Driver(lib_dir=env.lib_dir).availability()
    assert not ok and reason == "no device: aclrtGetDeviceCount reports 0 Ascend devices"
    fc.set_device_count(1)
    ok, reason = Driver(lib_dir=env.lib_dir, environ={"XCONV_ASCEND_DEVICE": "2"}).availability()
    assert not ok and reason == "no device: XCONV_ASCEND_DEVICE=2 but aclrtGetDeviceCount reports 1 device(s)"
    assert Driver(lib_dir=env.lib_dir).availability() == (True, "")  # aclInit again: 100002 is fine
    env.drv.ensure_context()


# ---------------------------------------------------------------------------------------------
# Missing library / missing symbol (fresh processes)

STUB_OPAPI = """
int aclnnConvolutionBackwardGetWorkspaceSize(void) { return 0; }
int aclnnConvolutionBackward(void) { return 0; }
int aclnnConvolutionGetWorkspaceSize(void) { return 0; }
"""

PROBE = """
import numpy as np, xconv
x = np.ones((1, 1, 4, 4), np.float32); w = np.ones((1, 1, 3, 3), np.float32)
try:
    xconv.conv_fprop(x, w, backend="ascend")
    print("NO ERROR")
except xconv.BackendUnavailableError as e:
    print(e.reason)
"""


def _probe(lib_dir) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME",
                                                             "XCONV_BACKEND")}
    env["XCONV_ASCEND_LIB_DIR"] = str(lib_dir)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def broken_dirs(lib_dir, tmp_path):
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler")
    dirs = {}
    for name in ("missing_lib", "missing_symbol", "unloadable"):
        d = tmp_path / name
        d.mkdir()
        for lib in ("libascendcl.so", "libnnopbase.so"):
            shutil.copy2(Path(lib_dir) / lib, d / lib)
        dirs[name] = d
    (tmp_path / "stub.c").write_text(STUB_OPAPI)
    subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-o", str(dirs["missing_symbol"] / "libopapi.so"),
                    str(tmp_path / "stub.c")], check=True)
    (dirs["unloadable"] / "libopapi.so").write_bytes(b"not an ELF file")
    return dirs


def test_missing_library_and_symbol_are_unavailable_with_reason(broken_dirs, lib_dir):
    d = broken_dirs
    assert _probe(d["missing_lib"]) == (f"not found in {d['missing_lib']} ($XCONV_ASCEND_LIB_DIR): libopapi_*.so (or "
                                        "libopapi.so); found libascendcl.so, libnnopbase.so; ASCEND_OPP_PATH unset "
                                        "(aclnn needs it to find its kernels; CANN's set_env.sh sets it)")
    assert _probe(d["missing_symbol"]) == \
        f"symbol aclnnConvolution missing from {d['missing_symbol']}/libopapi.so ($XCONV_ASCEND_LIB_DIR)"
    reason = _probe(d["unloadable"])
    assert reason.startswith(f"cannot load {d['unloadable']}/libopapi.so ($XCONV_ASCEND_LIB_DIR): ")
    assert _probe(lib_dir) == "NO ERROR"


# ---------------------------------------------------------------------------------------------
# The conformance kit on the emulator


def test_conformance_kit_on_the_emulator(lib_dir):
    """``pytest conformance --xconv-backend ascend`` with the emulator: no case fails (float64 is refused)."""
    root = HERE.parent
    if not (root / "conformance" / "conftest.py").exists():
        pytest.skip("the conformance kit is not in this checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME",
                                                             "XCONV_BACKEND", "PYTEST_ADDOPTS")}
    env["XCONV_ASCEND_LIB_DIR"] = str(lib_dir)
    out = subprocess.run([sys.executable, "-m", "pytest", "conformance", "--xconv-backend", "ascend", "-q",
                          "-p", "no:cacheprovider"], cwd=root, capture_output=True, text=True, env=env, timeout=900)
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    row = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("ascend ")]
    assert row and row[-1][2] == "0" and int(row[-1][1]) > 0, tail  # passed > 0, failed == 0


# ---------------------------------------------------------------------------------------------
# ACL_OPT_DETERMINISTIC is one process-level value (read by aclnn at phase 1; the context call writes
# it too; the default context is shared by every thread)


def _det_worker(env, deterministic: bool, rounds: int, out: dict, barrier):
    x, w, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), np.ones((1, 3, 3, 3), np.float32)
    try:
        env.drv.ensure_context()
        out["stream"] = env.drv.stream()
        barrier.wait()
        for _ in range(rounds):
            xconv.convolution_backward(dy, x, w, deterministic=deterministic, backend="ascend")
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        out["error"] = exc
    finally:
        env.drv.release_thread()


def _run_threads(env, flags, rounds=6):
    outs = [{} for _ in flags]
    barrier = threading.Barrier(len(flags))
    threads = [threading.Thread(target=_det_worker, args=(env, flag, rounds, out, barrier))
               for flag, out in zip(flags, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not [o["error"] for o in outs if "error" in o]
    return outs


def _phase1_values_by_stream(fc):
    seen = {}
    for i in range(fc.call_count()):
        seen.setdefault(fc.call_stream(i), []).append(fc.call_deterministic(i))
    return seen


def test_concurrent_deterministic_calls_all_run_deterministic_and_leave_the_option_off(env):
    """Failure mode (a): mixed deterministic=True/False threads on the shared default context. Every
    deterministic call's phase 1 sees 1, and afterwards the option is 0 at both levels."""
    env.fc.set_phase1_delay_us(2000)   # widen the set -> phase 1 -> restore window
    outs = _run_threads(env, [True, True, True, False, False])
    env.fc.set_phase1_delay_us(0)
    seen = _phase1_values_by_stream(env.fc)
    for out, flag in zip(outs, [True, True, True, False, False]):
        if flag:
            assert seen[out["stream"]] == [1] * 6, seen[out["stream"]]
    assert env.fc.get_process_deterministic() == 0 and env.drv.get_process_deterministic() == 0
    assert env.fc.get_deterministic(0) == 0


def test_host_process_setting_survives_xconv_calls(env):
    """Failure mode (b): a host that set determinism process-wide (aclrtSetSysParamOpt) keeps it, whatever
    xconv calls run (deterministic or not, from any thread), and every phase 1 sees it."""
    assert env.drv.set_process_deterministic(1) == 0
    try:
        x, w, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), np.ones((1, 3, 3, 3), np.float32)
        xconv.convolution_backward(dy, x, w, deterministic=True, backend="ascend")
        assert env.fc.get_process_deterministic() == 1
        xconv.convolution_backward(dy, x, w, deterministic=False, backend="ascend")
        assert env.fc.last("deterministic") == 1 and env.fc.get_process_deterministic() == 1
        _run_threads(env, [True, False, True], rounds=3)
        assert env.fc.get_process_deterministic() == 1
        assert all(v == 1 for i in range(env.fc.call_count()) for v in [env.fc.call_deterministic(i)])
    finally:
        assert env.drv.set_process_deterministic(0) == 0
        assert env.drv.set_deterministic(0) == 0


def test_only_deterministic_calls_write_the_option(env):
    """xconv writes ACL_OPT_DETERMINISTIC only for deterministic=True (set both levels, restore both)."""
    x, w, dy = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), np.ones((1, 3, 3, 3), np.float32)
    before = env.fc.process_option_writes()
    xconv.convolution_backward(dy, x, w, deterministic=False, backend="ascend")
    xconv.conv_fprop(x, w, deterministic=False, backend="ascend")
    assert env.fc.process_option_writes() == before
    xconv.conv_fprop(x, w, deterministic=True, backend="ascend", math="allow_tf32")
    assert env.fc.process_option_writes() == before + 4
    assert env.fc.last("deterministic") == 1 and env.fc.get_process_deterministic() == 0


def test_restore_failure_after_phase1_raises_and_releases_the_lock(env):
    """A failing restore is a BackendError (no executor leaks), and the lock is free for the next call."""
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    env.fc.fail_next("aclrtSetSysParamOpt", 100000, 2)   # the set works? no: first set and restore fail
    with pytest.raises(xconv.BackendError):
        xconv.conv_fprop(x, w, deterministic=True, backend="ascend")
    assert ascend_driver.DETERMINISM_LOCK.acquire(timeout=1)
    ascend_driver.DETERMINISM_LOCK.release()
    env.drv.take_message()
    assert env.drv.set_deterministic(0) == 0 and env.drv.set_process_deterministic(0) == 0
    xconv.conv_fprop(x, w, deterministic=True, backend="ascend")
    assert env.fc.last("deterministic") == 1 and env.fc.get_process_deterministic() == 0


# ---------------------------------------------------------------------------------------------
# Lifetimes: finalizers on threads without a context, the last thread's release, threads that end


def test_gc_finalizer_on_a_thread_without_context_frees_the_buffer(env):
    """A DeviceArray dropped on a thread that never ran xconv: its memory is freed, not leaked."""
    import xconv_ascend  # noqa: PLC0415

    base = env.fc.live_count(KIND_DEVICE_MEM)
    box = {"a": xconv_ascend.DeviceArray.from_numpy(np.ones((4, 4), np.float32))}
    assert env.fc.live_count(KIND_DEVICE_MEM) == base + 1

    def drop():
        box.clear()          # the last reference dies here: the finalizer runs on this thread
        import gc  # noqa: PLC0415
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert env.fc.live_count(KIND_DEVICE_MEM) == base
    assert env.fc.live_count(KIND_STREAM) == 1 and env.fc.device_refcount(0) == 1   # nothing left behind
    env.drv.take_message()


def test_release_thread_on_the_last_thread_keeps_live_arrays_valid(env):
    """release_thread() by the last thread using the device does not destroy the shared context while
    DeviceArrays are alive; the device is released once they are freed."""
    import xconv_ascend  # noqa: PLC0415

    a = xconv_ascend.DeviceArray.from_numpy(np.arange(6, dtype=np.float32))
    env.drv.release_thread()
    assert env.fc.reclaimed_count() == 0
    np.testing.assert_array_equal(a.to_numpy(), np.arange(6, dtype=np.float32))
    env.drv.release_thread()
    a.free()
    env.drv.release_thread()
    assert env.fc.reclaimed_count() == 0 and env.fc.misuse_count() == 0
    assert env.fc.device_refcount(0) == 0 and env.fc.live_count(KIND_DEVICE_MEM) == 0
    env.drv.ensure_context()                 # the fixture's thread state back


def test_threads_ending_without_release_thread_leave_no_stream(env):
    """A thread that ran xconv and ended without release_thread() gives its stream and device back."""
    x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    streams_before, refs_before = env.fc.live_count(KIND_STREAM), env.fc.device_refcount(0)

    def worker():
        xconv.conv_fprop(x, w, backend="ascend")

    for _ in range(3):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    import gc  # noqa: PLC0415
    gc.collect()
    assert env.fc.live_count(KIND_STREAM) == streams_before
    assert env.fc.device_refcount(0) == refs_before
    assert env.fc.misuse_count() == 0


# ---------------------------------------------------------------------------------------------
# float32 KEEP_DTYPE forward on Atlas A2/A3 (refused by aclnnConvolution, computed by its backward op)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding=((2, 0), (1, 3)), stride=(1, 2)),
                                dict(groups=2, dilation=2, padding=2), dict(stride=3)])
@pytest.mark.parametrize("on_device", [False, True])
def test_float32_keep_dtype_fprop_runs_through_the_backward_op(env, kw, on_device):
    rng = np.random.default_rng(11)
    x, w, b = rand(rng, (2, 4, 9, 8), "float32"), rand(rng, (6, 4 // kw.get("groups", 1), 3, 3), "float32"), \
        rand(rng, (6,), "float32")
    args = [DeviceArray.from_numpy(a, env.drv) for a in (x, w, b)] if on_device else [x, w, b]
    start = env.fc.call_count()
    y = xconv.conv_fprop(*args[:2], bias=args[2], backend="ascend", **kw)
    if on_device:
        assert isinstance(y, DeviceArray)
        host = y.to_numpy()
        for a in (*args, y):
            a.free()
        y = host
    ((exact, abs_sum),) = reference("fprop", (x, w, b), kw)
    assert_within(y, exact, abs_sum, "float32")            # KEEP_DTYPE: float32 inputs, no reduced precision
    calls = range(start, env.fc.call_count())
    assert [(env.fc.call_op(i), env.fc.call_transposed(i), env.fc.call_mask(i), env.fc.call_cube_math(i))
            for i in calls] == [(OP_BACKWARD, 1, 1, 0)]


def test_effective_math_per_soc(env):
    b = env.backend
    a2 = b.effective_math("float32", "allow_fp16")
    assert a2 == {"soc": "Ascend910B2", "family": "atlas-a2-a3", "cube_math_type": 2, "cube_math_name": "USE_FP16",
                  "computes_in": "float16"}
    assert b.effective_math("float32", "allow_tf32")["computes_in"] == "hfloat32"
    assert b.effective_math("float32", "keep_dtype", "convolution")["computes_in"] == "float32"   # via backward
    assert b.effective_math("bfloat16", "allow_fp16")["computes_in"] == "bfloat16"
    env.fc.set_soc_name(b"Ascend910A")
    try:
        assert b.effective_math("float32", "allow_fp16")["computes_in"] == "float16"
        assert b.effective_math("float32", "keep_dtype")["computes_in"] == "unsupported"
        assert b.effective_math("float32", "allow_tf32")["computes_in"] == "unsupported"
    finally:
        env.fc.set_soc_name(b"Ascend910B2")
    with pytest.raises(ValueError, match="math must be"):
        b.effective_math("float32", "fast")
