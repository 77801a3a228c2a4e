"""Tests of the fake CANN emulator in tests/fake_cann (C, loaded with ctypes).

The three libraries are built once per session into a tmp dir and loaded
RTLD_GLOBAL in the order ascendcl, nnopbase, opapi.  A process has one
emulator state, so every test starts from fakecann_reset() +
fakecann_reset_runtime() and the `env` fixture checks for leaks at the end.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_bool, c_char_p, c_int, c_int8, c_int32, c_int64, c_size_t
from ctypes import c_uint32, c_uint64, c_void_p
from pathlib import Path

import pytest

from core_helpers import TORCH_MISSING, fake_cann_build

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
F = torch.nn.functional


ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
NULLPTR = 161001
INVALID = 161002

H2D, D2H, D2D, H2H = 1, 2, 3, 0
KIND_TENSOR, KIND_INT, KIND_BOOL, KIND_EXEC, KIND_MEM, KIND_STREAM = range(6)

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 27}
FMT = {1: 2, 3: 47, 4: 0, 5: 30}  # ND for 1-D bias, NCL, NCHW, NCDHW
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}

BUILD = fake_cann_build()
P = c_void_p
I64P = POINTER(c_int64)

SIGS = {
    "ascendcl": {
        "aclInit": (c_int, [c_char_p]),
        "aclFinalize": (c_int, []),
        "aclrtSetDevice": (c_int, [c_int32]),
        "aclrtResetDevice": (c_int, [c_int32]),
        "aclrtGetDevice": (c_int, [POINTER(c_int32)]),
        "aclrtGetDeviceCount": (c_int, [POINTER(c_uint32)]),
        "aclrtCreateStream": (c_int, [POINTER(c_void_p)]),
        "aclrtDestroyStream": (c_int, [P]),
        "aclrtSynchronizeStream": (c_int, [P]),
        "aclrtMalloc": (c_int, [POINTER(c_void_p), c_size_t, c_int]),
        "aclrtFree": (c_int, [P]),
        "aclrtMemcpy": (c_int, [P, c_size_t, P, c_size_t, c_int]),
        "aclrtMemset": (c_int, [P, c_size_t, c_int32, c_size_t]),
        "aclrtCtxSetSysParamOpt": (c_int, [c_int, c_int64]),
        "aclrtCtxGetSysParamOpt": (c_int, [c_int, I64P]),
        "aclrtSetSysParamOpt": (c_int, [c_int, c_int64]),
        "aclrtGetSysParamOpt": (c_int, [c_int, I64P]),
        "aclGetRecentErrMsg": (c_char_p, []),
        "aclrtGetSocName": (c_char_p, []),
        **BUILD.CONTROL_SIGNATURES,
    },
    "nnopbase": {
        "aclCreateTensor": (P, [I64P, c_uint64, c_int, I64P, c_int64, c_int, I64P, c_uint64, P]),
        "aclDestroyTensor": (c_int, [P]),
        "aclCreateIntArray": (P, [I64P, c_uint64]),
        "aclDestroyIntArray": (c_int, [P]),
        "aclCreateBoolArray": (P, [POINTER(c_bool), c_uint64]),
        "aclDestroyBoolArray": (c_int, [P]),
    },
    "opapi": {
        "aclnnConvolutionBackwardGetWorkspaceSize": (
            c_int,
            [P, P, P, P, P, P, P, c_bool, P, c_int, P, c_int8, P, P, P, POINTER(c_uint64), POINTER(c_void_p)],
        ),
        "aclnnConvolutionBackward": (c_int, [P, c_uint64, P, P]),
        "aclnnConvolutionGetWorkspaceSize": (
            c_int,
            [P, P, P, P, P, P, c_bool, P, c_int64, P, c_int8, POINTER(c_uint64), POINTER(c_void_p)],
        ),
        "aclnnConvolution": (c_int, [P, c_uint64, P, P]),
    },
}


class Api:
    """Attributes are the declared functions of the three libraries."""

    def __init__(self, lib_dir: Path):
        self.libs = {}
        for name in ("ascendcl", "nnopbase", "opapi"):
            lib = ctypes.CDLL(str(lib_dir / f"lib{name}.so"), mode=ctypes.RTLD_GLOBAL)
            self.libs[name] = lib
            for fn, (res, args) in SIGS[name].items():
                f = getattr(lib, fn)
                f.restype = res
                f.argtypes = args
                setattr(self, fn, f)

    def errmsg(self) -> str | None:
        m = self.aclGetRecentErrMsg()
        return None if m is None else m.decode()


@pytest.fixture(scope="session")
def api(tmp_path_factory):
    lib_dir = BUILD.build(tmp_path_factory.mktemp("fake_cann"))
    return Api(lib_dir)


def i64(vals):
    vals = list(vals)
    return (c_int64 * max(len(vals), 1))(*vals)


class Session:
    """Device buffers + acl objects of one test; close() releases everything."""

    def __init__(self, api: Api, stream):
        self.api = api
        self.stream = stream
        self.mem: list[int] = []
        self.tensors: list[int] = []
        self.int_arrays: list[int] = []
        self.bool_arrays: list[int] = []
        self.info: dict[int, tuple] = {}

    # memory
    def malloc(self, nbytes: int) -> int:
        p = c_void_p()
        assert self.api.aclrtMalloc(byref(p), max(nbytes, 1), 0) == 0
        self.mem.append(p.value)
        return p.value

    def free(self, ptr: int) -> None:
        self.mem.remove(ptr)
        assert self.api.aclrtFree(ptr) == 0

    # objects
    def create(self, ptr, shape, strides, offset, dtype, storage_numel, fmt=None):
        fmt = FMT[len(shape)] if fmt is None else fmt
        h = self.api.aclCreateTensor(
            i64(shape), len(shape), DT[dtype], i64(strides), offset, fmt, i64([storage_numel]), 1, ptr
        )
        assert h, self.api.errmsg()
        self.tensors.append(h)
        self.info[h] = (ptr, tuple(shape), tuple(strides), offset, dtype, storage_numel)
        return h

    def upload_storage(self, base: torch.Tensor) -> int:
        base = base.contiguous()
        nbytes = base.numel() * base.element_size()
        ptr = self.malloc(nbytes)
        assert self.api.aclrtMemcpy(ptr, nbytes, base.data_ptr(), nbytes, H2D) == 0
        return ptr

    def make(self, t: torch.Tensor, fmt=None) -> int:
        t = t.contiguous()
        return self.create(self.upload_storage(t), t.shape, t.stride(), 0, t.dtype, t.numel(), fmt)

    def make_view(self, base: torch.Tensor, view: torch.Tensor) -> int:
        """aclTensor over the whole storage of `base` with the geometry of `view`."""
        assert base.is_contiguous() and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        ptr = self.upload_storage(base)
        return self.create(ptr, view.shape, view.stride(), view.storage_offset(), base.dtype, base.numel())

    def empty(self, shape, dtype, fmt=None) -> int:
        n = 1
        for s in shape:
            n *= s
        ptr = self.malloc(n * torch.empty((), dtype=dtype).element_size())
        strides = torch.empty(shape, dtype=dtype).stride() if shape else ()
        return self.create(ptr, shape, strides, 0, dtype, n, fmt)

    def read_storage(self, h) -> torch.Tensor:
        ptr, _, _, _, dtype, n = self.info[h]
        out = torch.empty(n, dtype=dtype)
        nbytes = n * out.element_size()
        assert self.api.aclrtMemcpy(out.data_ptr(), nbytes, ptr, nbytes, D2H) == 0
        return out

    def read(self, h) -> torch.Tensor:
        _, shape, strides, offset, _, _ = self.info[h]
        return self.read_storage(h).as_strided(shape, strides, offset).clone()

    def ints(self, vals) -> int:
        vals = list(vals)
        h = self.api.aclCreateIntArray(i64(vals), len(vals))
        assert h
        self.int_arrays.append(h)
        return h

    def bools(self, vals) -> int:
        vals = [bool(v) for v in vals]
        h = self.api.aclCreateBoolArray((c_bool * max(len(vals), 1))(*vals), len(vals))
        assert h
        self.bool_arrays.append(h)
        return h

    def destroy_tensor(self, h) -> None:
        self.tensors.remove(h)
        assert self.api.aclDestroyTensor(h) == 0

    def close(self) -> None:
        for h in self.tensors:
            assert self.api.aclDestroyTensor(h) == 0
        for h in self.int_arrays:
            assert self.api.aclDestroyIntArray(h) == 0
        for h in self.bool_arrays:
            assert self.api.aclDestroyBoolArray(h) == 0
        for p in self.mem:
            assert self.api.aclrtFree(p) == 0
        self.tensors, self.int_arrays, self.bool_arrays, self.mem = [], [], [], []

    # two-phase helpers
    def run(self, phase2, ws_size, executor, workspace="alloc", stream="default") -> int:
        ws = self.malloc(ws_size) if workspace == "alloc" and ws_size else workspace
        if workspace == "alloc" and not ws_size:
            ws = None
        return phase2(ws, ws_size, executor, self.stream if stream == "default" else stream)


@pytest.fixture
def env(api):
    api.fakecann_reset()
    api.fakecann_reset_runtime()
    assert api.aclInit(None) == ACL_SUCCESS
    assert api.aclrtSetDevice(0) == ACL_SUCCESS
    stream = c_void_p()
    assert api.aclrtCreateStream(byref(stream)) == ACL_SUCCESS
    s = Session(api, stream.value)
    yield s
    s.close()
    assert api.aclrtDestroyStream(stream) == ACL_SUCCESS
    api.aclrtResetDevice(0)
    api.aclFinalize()
    api.aclGetRecentErrMsg()
    api.fakecann_reset()
    assert api.fakecann_live_objects() == 0


# --------------------------------------------------------------- reference
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def ref_conv(x, w, b, stride, padding, dilation, transposed, opad, groups):
    nsp = x.dim() - 2
    if nsp == 2 and len(padding) == 4:
        pads = [(padding[0], padding[1]), (padding[2], padding[3])]
    else:
        pads = [(p, p) for p in padding]
    if not transposed:
        flat = []
        for pre, post in reversed(pads):
            flat += [pre, post]
        y = CONV[nsp](F.pad(x, flat), w, None, stride, 0, dilation, groups)
    else:
        y = CONVT[nsp](x, w, None, stride, 0, 0, groups, dilation)
        flat = []
        for j in reversed(range(nsp)):
            flat += [0, opad[j]]
        y = F.pad(y, flat)
        for j, (pre, post) in enumerate(pads):
            y = y.narrow(2 + j, pre, y.shape[2 + j] - pre - post)
    if b is not None:
        y = y + b.view(1, -1, *([1] * nsp))
    return y


def ref_backward(go, x, w, p):
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    y = ref_conv(x64, w64, None, **p)
    y.backward(go.double())
    gb = go.double().sum(dim=[0] + list(range(2, go.dim())))
    return x64.grad, w64.grad, gb


def assert_close(out, ref, dtype, ulps=2.0):
    ref = ref.to(dtype).double()
    scale = max(ref.abs().max().item(), 1.0)
    eps = EPS[dtype] * ulps
    torch.testing.assert_close(out.double(), ref, rtol=eps, atol=eps * scale)


def params(stride, padding, dilation, transposed=False, opad=None, groups=1):
    return dict(
        stride=list(stride),
        padding=list(padding),
        dilation=list(dilation),
        transposed=transposed,
        opad=list(opad) if opad is not None else [0] * len(stride),
        groups=groups,
    )


CASES = {
    # name: (x shape, w shape, params)
    "1d_groups_stride_dil": ((2, 4, 11), (6, 2, 3), params([2], [1], [2], groups=2)),
    "2d_asym_pad4": ((2, 3, 7, 8), (4, 3, 3, 2), params([2, 1], [1, 0, 2, 1], [1, 2])),
    "3d": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), params([1, 2, 1], [1, 0, 1], [2, 1, 1])),
    "2d_transposed_opad_groups": ((2, 4, 5, 4), (4, 3, 3, 3), params([2, 3], [1, 0], [1, 1], True, [1, 2], 2)),
    "1d_transposed_dil": ((2, 2, 6), (2, 3, 3), params([3], [2], [2], True, [1])),
    "2d_transposed_asym_pad4": ((1, 2, 4, 5), (2, 2, 2, 3), params([2, 2], [0, 1, 2, 0], [1, 1], True, [1, 0])),
}


def rand(shape, dtype, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def prepare_bwd(s, go, x, w, p, mask=(1, 1, 1), cube=0, bias_sizes="auto", gb="auto", **over):
    """Run phase 1 of aclnnConvolutionBackward; returns (rc, ws, executor, (gi, gw, gb))."""
    api = s.api
    tgo = over.get("gradOutput", s.make(go) if go is not None else None)
    tx = over.get("input", s.make(x))
    tw = over.get("weight", s.make(w))
    gi = over.get("gradInput", s.empty(tuple(x.shape), x.dtype))
    gw = over.get("gradWeight", s.empty(tuple(w.shape), w.dtype))
    cout = w.shape[1] * p["groups"] if p["transposed"] else w.shape[0]
    if gb == "auto":
        gb = s.empty((cout,), x.dtype)
    if bias_sizes == "auto":
        bias_sizes = s.ints([cout])
    ws = c_uint64(0)
    ex = c_void_p(None)
    rc = api.aclnnConvolutionBackwardGetWorkspaceSize(
        tgo,
        tx,
        tw,
        bias_sizes,
        over.get("stride", s.ints(p["stride"])),
        over.get("padding", s.ints(p["padding"])),
        over.get("dilation", s.ints(p["dilation"])),
        p["transposed"],
        over.get("outputPadding", s.ints(p["opad"])),
        over.get("groups", p["groups"]),
        over.get("outputMask", s.bools(mask)),
        cube,
        gi,
        gw,
        gb,
        byref(ws),
        byref(ex),
    )
    return rc, ws.value, ex.value, (gi, gw, gb)


def run_bwd(s, go, x, w, p, **kw):
    rc, ws, ex, outs = prepare_bwd(s, go, x, w, p, **kw)
    assert rc == 0, (rc, s.api.errmsg())
    assert ws > 0
    rc = s.run(s.api.aclnnConvolutionBackward, ws, ex)
    assert rc == 0, (rc, s.api.errmsg())
    return outs


def run_fwd(s, x, w, b, p, cube=0, out_shape=None, expect=0):
    api = s.api
    tx, tw = s.make(x), s.make(w)
    tb = s.make(b) if b is not None else None
    ty = s.empty(out_shape, x.dtype)
    ws = c_uint64(0)
    ex = c_void_p(None)
    rc = api.aclnnConvolutionGetWorkspaceSize(
        tx,
        tw,
        tb,
        s.ints(p["stride"]),
        s.ints(p["padding"]),
        s.ints(p["dilation"]),
        p["transposed"],
        s.ints(p["opad"]),
        p["groups"],
        ty,
        cube,
        byref(ws),
        byref(ex),
    )
    if expect:
        assert rc == expect, (rc, api.errmsg())
        return None
    assert rc == 0, (rc, api.errmsg())
    assert s.run(api.aclnnConvolution, ws.value, ex.value) == 0, api.errmsg()
    return s.read(ty)


def out_shape(x, w, p):
    with torch.no_grad():
        return tuple(ref_conv(x.double(), w.double(), None, **p).shape)


# ------------------------------------------------------------------- tests
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_torch(env, case, dtype):
    env.api.fakecann_set_soc_name(b"Ascend950PR_9599")  # FLOAT + KEEP_DTYPE forward: refused on A2/A3
    xs, wsh, p = CASES[case]
    gen = torch.Generator().manual_seed(1)
    x, w = rand(xs, dtype, gen), rand(wsh, dtype, gen)
    cout = wsh[1] * p["groups"] if p["transposed"] else wsh[0]
    b = rand((cout,), dtype, gen) if "1d" in case or "3d" in case else None
    ref = ref_conv(x.double(), w.double(), None if b is None else b.double(), **p)
    y = run_fwd(env, x, w, b, p, out_shape=tuple(ref.shape))
    assert_close(y, ref, dtype)
    assert env.api.fakecann_call_op(0) == 2


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_backward_matches_torch(env, api, case, dtype):
    xs, wsh, p = CASES[case]
    if case == "1d_transposed_dil":
        # outputPadding >= stride (but < dilation) is rejected on Atlas A2/A3
        api.fakecann_set_soc_name(b"Ascend950PR")
    gen = torch.Generator().manual_seed(2)
    x, w = rand(xs, dtype, gen), rand(wsh, dtype, gen)
    go = rand(out_shape(x, w, p), dtype, gen)
    gi, gw, gb = run_bwd(env, go, x, w, p)
    rgi, rgw, rgb = ref_backward(go, x, w, p)
    assert_close(env.read(gi), rgi, dtype)
    assert_close(env.read(gw), rgw, dtype)
    assert_close(env.read(gb), rgb, dtype)
    assert api.fakecann_call_count() == 1
    assert api.fakecann_call_op(0) == 1
    assert api.fakecann_call_mask(0) == 7
    assert api.fakecann_call_transposed(0) == int(p["transposed"])
    assert api.fakecann_call_groups(0) == p["groups"]
    assert api.fakecann_call_stream(0) == env.stream


def test_backward_against_aten_convolution_backward(env):
    gen = torch.Generator().manual_seed(3)
    x, w = rand((2, 4, 6, 7), torch.float32, gen), rand((6, 2, 3, 2), torch.float32, gen)
    p = params([1, 2], [1, 1], [2, 1], groups=2)
    go = rand(out_shape(x, w, p), torch.float32, gen)
    gi, gw, gb = run_bwd(env, go, x, w, p)
    rgi, rgw, rgb = torch.ops.aten.convolution_backward(
        go.double(), x.double(), w.double(), [6], [1, 2], [1, 1], [2, 1], False, [0, 0], 2, [True, True, True]
    )
    assert_close(env.read(gi), rgi, torch.float32)
    assert_close(env.read(gw), rgw, torch.float32)
    assert_close(env.read(gb), rgb, torch.float32)


@pytest.mark.parametrize("mask", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)])
def test_partial_masks_leave_other_outputs_untouched(env, mask):
    gen = torch.Generator().manual_seed(4)
    x, w = rand((2, 3, 6, 5), torch.float32, gen), rand((4, 3, 2, 2), torch.float32, gen)
    p = params([1, 1], [0, 0], [1, 1])
    go = rand(out_shape(x, w, p), torch.float32, gen)
    gi, gw, gb = run_bwd(env, go, x, w, p, mask=mask)
    refs = ref_backward(go, x, w, p)
    for on, h, ref in zip(mask, (gi, gw, gb), refs):
        got = env.read(h)
        if on:
            assert_close(got, ref, torch.float32)
        else:  # fresh device memory is 0xFF bytes (NaN): must not have been written
            assert torch.isnan(got).all()
    assert env.api.fakecann_call_mask(0) == mask[0] | mask[1] << 1 | mask[2] << 2


def test_null_grad_bias_and_bias_sizes_allowed_when_mask2_false(env):
    gen = torch.Generator().manual_seed(5)
    x, w = rand((1, 2, 5), torch.float32, gen), rand((3, 2, 2), torch.float32, gen)
    p = params([1], [0], [1])
    go = rand(out_shape(x, w, p), torch.float32, gen)
    gi, gw, _ = run_bwd(env, go, x, w, p, mask=(1, 1, 0), bias_sizes=None, gb=None)
    rgi, rgw, _ = ref_backward(go, x, w, p)
    assert_close(env.read(gi), rgi, torch.float32)
    assert_close(env.read(gw), rgw, torch.float32)


def test_noncontiguous_views_with_offset(env, api):
    env.api.fakecann_set_soc_name(b"Ascend950PR_9599")  # FLOAT + KEEP_DTYPE forward: refused on A2/A3
    gen = torch.Generator().manual_seed(6)
    dtype = torch.float32
    p = params([1, 2], [1, 0], [1, 1])
    # input: a strided slice (offset != 0) of a bigger storage
    xbase = rand((3, 3, 9, 12), dtype, gen)
    xview = xbase[1:, :, 1::2, 2:]
    # weight: permuted storage (non-row-major strides)
    wbase = rand((3, 2, 3, 4), dtype, gen)
    wview = wbase.permute(3, 0, 1, 2)  # shape (4, 3, 2, 3)
    x, w = xview.contiguous(), wview.contiguous()
    osh = out_shape(x, w, p)
    # gradOutput: channels-last-like strides
    gobase = rand((osh[0], osh[2], osh[3], osh[1]), dtype, gen)
    goview = gobase.permute(0, 3, 1, 2)
    go = goview.contiguous()
    tx, tw, tgo = env.make_view(xbase, xview), env.make_view(wbase, wview), env.make_view(gobase, goview)
    # gradInput: written through a strided view with offset inside a bigger buffer
    gibig = env.empty((2 * x.numel() + 7,), dtype)
    giptr = env.info[gibig][0]
    gistrides = (x.shape[1] * x.shape[2] * x.shape[3] * 2, x.shape[2] * x.shape[3] * 2, x.shape[3] * 2, 2)
    gi = env.create(giptr, tuple(x.shape), gistrides, 5, dtype, 2 * x.numel() + 7)
    outs = run_bwd(env, go, x, w, p, gradOutput=tgo, input=tx, weight=tw, gradInput=gi)
    rgi, rgw, rgb = ref_backward(go, x, w, p)
    assert_close(env.read(gi), rgi, dtype)
    assert_close(env.read(outs[1]), rgw, dtype)
    assert_close(env.read(outs[2]), rgb, dtype)
    storage = env.read_storage(gi)
    touched = torch.zeros(storage.numel(), dtype=torch.bool)
    touched.as_strided(tuple(x.shape), gistrides, 5).fill_(True)
    assert torch.isnan(storage[~touched]).all()
    # forward through the same strided input
    y = run_fwd(env, x, w, None, p, out_shape=osh)
    assert_close(y, ref_conv(x.double(), w.double(), None, **p), dtype)

    # strict mode: non-contiguous outputs are rejected (as the op doc says)
    api.fakecann_set_strict_outputs(1)
    gi2 = env.create(giptr, tuple(x.shape), gistrides, 5, dtype, 2 * x.numel() + 7)
    rc, *_ = prepare_bwd(env, go, x, w, p, gradInput=gi2)
    assert rc == INVALID
    assert "gradInput" in api.errmsg()


def test_view_outside_storage_rejected(env, api):
    x = torch.ones(1, 1, 4, 4)
    w = torch.ones(1, 1, 2, 2)
    p = params([1, 1], [0, 0], [1, 1])
    go = torch.ones(out_shape(x, w, p))
    ptr = env.upload_storage(x)
    bad = env.create(ptr, (1, 1, 4, 4), (16, 16, 4, 1), 1, torch.float32, 16)  # offset 1 -> reaches 16
    rc, *_ = prepare_bwd(env, go, x, w, p, input=bad)
    assert rc == INVALID
    assert "input" in api.errmsg()


def test_host_pointer_rejected(env, api):
    x = torch.ones(1, 1, 4, 4)
    w = torch.ones(1, 1, 2, 2)
    p = params([1, 1], [0, 0], [1, 1])
    go = torch.ones(out_shape(x, w, p))
    host = env.create(x.data_ptr(), (1, 1, 4, 4), (16, 16, 4, 1), 0, torch.float32, 16)
    rc, *_ = prepare_bwd(env, go, x, w, p, input=host)
    assert rc == INVALID
    assert "device memory" in api.errmsg()


# ----------------------------------------------------------------- errors
def _basic():
    x = torch.ones(1, 2, 5, 5)
    w = torch.ones(4, 2, 3, 3)
    p = params([1, 1], [1, 1], [1, 1])
    go = torch.ones(out_shape(x, w, p))
    return go, x, w, p


@pytest.mark.parametrize(
    "what",
    ["gradOutput", "input", "weight", "stride", "padding", "dilation", "outputPadding", "outputMask",
     "gradInput", "gradWeight"],
)
def test_null_required_pointer_is_161001(env, api, what):
    go, x, w, p = _basic()
    rc, _, ex, _ = prepare_bwd(env, go, x, w, p, mask=(0, 0, 1), **{what: None})
    assert rc == NULLPTR
    msg = api.errmsg()
    assert what in msg and "nullptr" in msg
    assert api.errmsg() is None  # cleared
    assert api.fakecann_live_count(KIND_EXEC) == 0


def test_null_grad_bias_with_mask2_is_161001(env, api):
    go, x, w, p = _basic()
    assert prepare_bwd(env, go, x, w, p, gb=None)[0] == NULLPTR
    assert "gradBias" in api.errmsg()
    assert prepare_bwd(env, go, x, w, p, bias_sizes=None)[0] == NULLPTR
    assert "biasSizes" in api.errmsg()


def test_null_workspace_size_or_executor_pointer(env, api):
    go, x, w, p = _basic()
    s = env
    args = [s.make(go), s.make(x), s.make(w), s.ints([4]), s.ints([1, 1]), s.ints([1, 1]), s.ints([1, 1]),
            False, s.ints([0, 0]), 1, s.bools([1, 1, 1]), 0, s.empty((1, 2, 5, 5), torch.float32),
            s.empty((4, 2, 3, 3), torch.float32), s.empty((4,), torch.float32)]
    ex = c_void_p()
    assert api.aclnnConvolutionBackwardGetWorkspaceSize(*args, None, byref(ex)) == NULLPTR
    assert "workspaceSize" in api.errmsg()
    ws = c_uint64()
    assert api.aclnnConvolutionBackwardGetWorkspaceSize(*args, byref(ws), None) == NULLPTR
    assert "executor" in api.errmsg()


def _bad_cases():
    go, x, w, p = _basic()
    return {
        "gradOutput_shape": (dict(go=torch.ones(1, 4, 4, 5)), "gradOutput"),
        "mask_len": (dict(mask_vals=[1, 1]), "outputMask"),
        "cube_math": (dict(cube=4), "cubeMathType"),
        "cube_math_neg": (dict(cube=-1), "cubeMathType"),
        "stride0": (dict(stride=[0, 1]), "stride"),
        "stride_len": (dict(stride=[1]), "stride"),
        "pad_neg": (dict(padding=[1, -1]), "padding"),
        "pad_len3": (dict(padding=[1, 1, 1]), "padding"),
        "dil0": (dict(dilation=[1, 0]), "dilation"),
        "groups_nodiv": (dict(groups=3), "groups"),
        "groups_channels": (dict(groups=2), "groups"),
        "groups0": (dict(groups=0), "groups"),
        "opad_nontransposed": (dict(opad=[1, 0]), "outputPadding"),
        "bias_sizes_value": (dict(bias_sizes=[5]), "biasSizes"),
        "bias_sizes_len": (dict(bias_sizes=[4, 1]), "biasSizes"),
        "weight_dtype": (dict(w=w.half()), "weight"),
        "go_dtype": (dict(go=go.bfloat16()), "gradOutput"),
        "int_dtype": (dict(x=x.double(), w=w.double(), go=go.double()), "input"),
        "input_format": (dict(x_fmt=2), "format"),
        "weight_format": (dict(w_fmt=1), "format"),
        "grad_input_shape": (dict(gi_shape=(1, 2, 5, 4)), "gradInput"),
        "grad_weight_dtype": (dict(gw_dtype=torch.float16), "gradWeight"),
        "grad_bias_shape": (dict(gb_shape=(3,)), "gradBias"),
        "grad_bias_format": (dict(gb_fmt=0), "gradBias"),
        "rank_mismatch": (dict(x=torch.ones(1, 2, 5)), "input"),
        "kernel_too_big": (dict(w=torch.ones(4, 2, 9, 3), go=torch.ones(1, 4, 1, 5)), "kernel"),
    }


@pytest.mark.parametrize("name", list(_bad_cases()))
def test_invalid_params_are_161002(env, api, name):
    go, x, w, p = _basic()
    over, needle = _bad_cases()[name]
    go = over.get("go", go)
    x = over.get("x", x)
    w = over.get("w", w)
    for k in ("stride", "padding", "dilation", "groups"):
        if k in over:
            p = dict(p, **{k: over[k]})
    if "opad" in over:
        p = dict(p, opad=over["opad"])
    s = env
    kw = {}
    if "mask_vals" in over:
        kw["outputMask"] = s.bools(over["mask_vals"])
    if "bias_sizes" in over:
        kw["bias_sizes"] = s.ints(over["bias_sizes"])

    def mk(t, fmt=None):
        if t.dtype == torch.float64:  # unsupported dtype: create as ACL_DOUBLE
            ptr = s.upload_storage(t)
            h = api.aclCreateTensor(i64(t.shape), t.dim(), 11, i64(t.stride()), 0, FMT[t.dim()],
                                    i64([t.numel()]), 1, ptr)
            s.tensors.append(h)
            return h
        return s.make(t, fmt)

    kw["gradOutput"] = mk(go)
    kw["input"] = mk(x, over.get("x_fmt"))
    kw["weight"] = mk(w, over.get("w_fmt"))
    if "gi_shape" in over:
        kw["gradInput"] = s.empty(over["gi_shape"], torch.float32)
    if "gw_dtype" in over:
        kw["gradWeight"] = s.empty(tuple(w.shape), over["gw_dtype"])
    if "gb_shape" in over:
        kw["gb"] = s.empty(over["gb_shape"], torch.float32)
    if "gb_fmt" in over:
        kw["gb"] = s.empty((4,), torch.float32, fmt=over["gb_fmt"])
    x_for_shape = x if x.dtype != torch.float64 else x.float()
    w_for_shape = w if w.dtype != torch.float64 else w.float()
    rc, _, ex, _ = prepare_bwd(s, None, x_for_shape, w_for_shape, p, cube=over.get("cube", 0), **kw)
    assert rc == INVALID, name
    msg = api.errmsg()
    assert msg and needle in msg, msg
    assert api.fakecann_live_count(KIND_EXEC) == 0


def test_forward_errors(env, api):
    env.api.fakecann_set_soc_name(b"Ascend950PR_9599")  # FLOAT + KEEP_DTYPE forward: refused on A2/A3
    x = torch.ones(1, 2, 5, 5)
    w = torch.ones(4, 2, 3, 3)
    p = params([1, 1], [1, 1], [1, 1])
    run_fwd(env, x, w, None, p, out_shape=(1, 4, 5, 4), expect=INVALID)
    assert "output" in api.errmsg()
    run_fwd(env, x, w, torch.ones(3), p, out_shape=(1, 4, 5, 5), expect=INVALID)
    assert "bias" in api.errmsg()
    ws, ex = c_uint64(), c_void_p()
    rc = api.aclnnConvolutionGetWorkspaceSize(None, env.make(w), None, env.ints([1, 1]), env.ints([1, 1]),
                                              env.ints([1, 1]), False, env.ints([0, 0]), 1,
                                              env.empty((1, 4, 5, 5), torch.float32), 0, byref(ws), byref(ex))
    assert rc == NULLPTR and "input" in api.errmsg()


# ------------------------------------------------------- product constraints
@pytest.mark.parametrize("soc", ["Ascend910A", "Ascend910ProB", "Ascend310P3"])
def test_older_series_constraints(env, api, soc):
    api.fakecann_set_soc_name(soc.encode())
    gen = torch.Generator().manual_seed(7)
    # 3-D backward rejected
    x3, w3 = rand((1, 1, 3, 3, 3), torch.float16, gen), rand((1, 1, 2, 2, 2), torch.float16, gen)
    p3 = params([1, 1, 1], [0, 0, 0], [1, 1, 1])
    assert prepare_bwd(env, rand(out_shape(x3, w3, p3), torch.float16, gen), x3, w3, p3)[0] == INVALID
    assert "3-D" in api.errmsg()
    x, w = rand((1, 2, 5, 5), torch.float32, gen), rand((3, 2, 2, 2), torch.float32, gen)
    p = params([1, 1], [0, 0], [1, 1])
    go = rand(out_shape(x, w, p), torch.float32, gen)
    # bfloat16 rejected
    assert prepare_bwd(env, go.bfloat16(), x.bfloat16(), w.bfloat16(), p, cube=1)[0] == INVALID
    assert "BFLOAT16" in api.errmsg()
    # float32 with KEEP_DTYPE / USE_HF32 rejected
    for cube in (0, 3):
        assert prepare_bwd(env, go, x, w, p, cube=cube)[0] == INVALID
        assert "cubeMathType" in api.errmsg()
    run_fwd(env, x, w, None, p, cube=0, out_shape=tuple(go.shape), expect=INVALID)
    api.aclGetRecentErrMsg()
    # float32 with ALLOW_FP32_DOWN_PRECISION computes in fp16
    gi, gw, gb = run_bwd(env, go, x, w, p, cube=1)
    rgi, rgw, rgb = ref_backward(go.half(), x.half(), w.half(), p)
    assert_close(env.read(gi), rgi, torch.float32, ulps=8)
    assert_close(env.read(gw), rgw, torch.float32, ulps=8)
    assert_close(env.read(gb), go.double().sum(dim=(0, 2, 3)), torch.float32, ulps=8)
    assert api.fakecann_call_cube_math(0) == 1


def _hf32(t):
    b = t.float().contiguous().view(torch.int32)
    lsb = (b >> 12) & 1
    return ((b + 0x7FF + lsb) & ~0xFFF).view(torch.float32)


@pytest.mark.parametrize("soc", ["Ascend910B2", "Ascend910_9391"])
def test_a2_a3_limits(env, api, soc):
    api.fakecann_set_soc_name(soc.encode())
    f = torch.float16
    # kernel L > 255 (1-D)
    x, w = torch.ones(1, 1, 300, dtype=f), torch.ones(1, 1, 256, dtype=f)
    p = params([1], [0], [1])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=f), x, w, p)[0] == INVALID
    assert "kernel" in api.errmsg()
    # padding > 255
    x, w = torch.ones(1, 1, 4, dtype=f), torch.ones(1, 1, 2, dtype=f)
    p = params([1], [256], [1])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=f), x, w, p)[0] == INVALID
    assert "padding" in api.errmsg()
    # dilation > 255
    x, w = torch.ones(1, 1, 300, dtype=f), torch.ones(1, 1, 2, dtype=f)
    p = params([1], [0], [256])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=f), x, w, p)[0] == INVALID
    assert "dilation" in api.errmsg()
    # 3-D strideH > 63
    x, w = torch.ones(1, 1, 2, 70, 2, dtype=f), torch.ones(1, 1, 1, 1, 1, dtype=f)
    p = params([1, 64, 1], [0, 0, 0], [1, 1, 1])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=f), x, w, p)[0] == INVALID
    assert "stride" in api.errmsg()
    # transposed: outputPadding must be < stride
    x, w = torch.ones(1, 1, 4, dtype=f), torch.ones(1, 1, 3, dtype=f)
    p = params([1], [0], [2], True, [1])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=f), x, w, p)[0] == INVALID
    assert "outputPadding" in api.errmsg()
    # bf16 + USE_FP16 rejected
    x, w = torch.ones(1, 1, 4, dtype=torch.bfloat16), torch.ones(1, 1, 2, dtype=torch.bfloat16)
    p = params([1], [0], [1])
    assert prepare_bwd(env, torch.ones(out_shape(x, w, p), dtype=torch.bfloat16), x, w, p, cube=2)[0] == INVALID
    assert "USE_FP16" in api.errmsg()
    # float32 + ALLOW_FP32_DOWN_PRECISION -> HF32 inputs
    gen = torch.Generator().manual_seed(8)
    x, w = rand((2, 3, 6, 6), torch.float32, gen), rand((4, 3, 3, 3), torch.float32, gen)
    p = params([1, 1], [1, 1], [1, 1])
    go = rand(out_shape(x, w, p), torch.float32, gen)
    gi, gw, _ = run_bwd(env, go, x, w, p, cube=1)
    rgi, rgw, _ = ref_backward(_hf32(go), _hf32(x), _hf32(w), p)
    assert_close(env.read(gi), rgi, torch.float32, ulps=8)
    assert_close(env.read(gw), rgw, torch.float32, ulps=8)
    exact = ref_backward(go, x, w, p)[0]
    assert (env.read(gi).double() - exact).abs().max() > 1e-6  # really reduced precision


# ---------------------------------------------------------- executor life
def test_executor_consumed_and_workspace_checks(env, api):
    env.api.fakecann_set_soc_name(b"Ascend950PR_9599")  # FLOAT + KEEP_DTYPE forward: refused on A2/A3
    go, x, w, p = _basic()
    s = env
    assert api.fakecann_live_count(KIND_EXEC) == 0
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert rc == 0 and ws > 0 and api.fakecann_live_count(KIND_EXEC) == 1
    assert s.run(api.aclnnConvolutionBackward, ws, ex) == 0
    assert api.fakecann_live_count(KIND_EXEC) == 0
    # reusing a consumed executor
    assert s.run(api.aclnnConvolutionBackward, ws, ex) == INVALID
    assert "executor" in api.errmsg()
    assert api.fakecann_misuse_count() == 1
    # NULL executor
    assert api.aclnnConvolutionBackward(None, 0, None, None) == NULLPTR
    api.aclGetRecentErrMsg()
    # workspace too small: fails and still consumes
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert s.run(api.aclnnConvolutionBackward, ws - 1, ex, workspace=s.malloc(ws)) == INVALID
    assert "workspaceSize" in api.errmsg()
    assert api.fakecann_live_count(KIND_EXEC) == 0
    # NULL workspace
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert s.run(api.aclnnConvolutionBackward, ws, ex, workspace=None) == INVALID
    assert "workspace" in api.errmsg()
    # host workspace
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    buf = ctypes.create_string_buffer(ws)
    assert s.run(api.aclnnConvolutionBackward, ws, ex, workspace=ctypes.addressof(buf)) == INVALID
    api.aclGetRecentErrMsg()
    # unknown stream
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert s.run(api.aclnnConvolutionBackward, ws, ex, stream=ctypes.addressof(buf)) == INVALID
    assert "stream" in api.errmsg()
    # NULL stream (default stream) is fine
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert s.run(api.aclnnConvolutionBackward, ws, ex, stream=None) == 0
    # executor of the wrong op
    xs, wsh = (1, 2, 5, 5), (4, 2, 3, 3)
    tx, tw, ty = s.make(x), s.make(w), s.empty((1, 4, 5, 5), torch.float32)
    wsz, fex = c_uint64(), c_void_p()
    assert api.aclnnConvolutionGetWorkspaceSize(tx, tw, None, s.ints([1, 1]), s.ints([1, 1]), s.ints([1, 1]),
                                                False, s.ints([0, 0]), 1, ty, 0, byref(wsz), byref(fex)) == 0
    assert s.run(api.aclnnConvolutionBackward, wsz.value, fex.value) == INVALID
    assert api.fakecann_live_count(KIND_EXEC) == 0
    # configurable workspace size, 0 allowed with NULL workspace
    api.fakecann_set_workspace_size(0)
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p)
    assert rc == 0 and ws == 0
    assert api.aclnnConvolutionBackward(None, 0, ex, s.stream) == 0
    assert api.fakecann_prepare_count() == 8


def test_tensor_destroyed_or_memory_freed_between_phases(env, api):
    go, x, w, p = _basic()
    s = env
    tgo = s.make(go)
    rc, ws, ex, _ = prepare_bwd(s, None, x, w, p, gradOutput=tgo)
    assert rc == 0
    s.destroy_tensor(tgo)
    assert s.run(api.aclnnConvolutionBackward, ws, ex) == INVALID
    assert "destroyed" in api.errmsg()
    assert api.fakecann_live_count(KIND_EXEC) == 0
    tx = s.make(x)
    rc, ws, ex, _ = prepare_bwd(s, go, x, w, p, input=tx)
    s.free(s.info[tx][0])
    assert s.run(api.aclnnConvolutionBackward, ws, ex) == INVALID
    assert "device memory" in api.errmsg()
    assert api.fakecann_live_count(KIND_EXEC) == 0


def test_injected_failure_consumes_executor(env, api):
    go, x, w, p = _basic()
    rc, ws, ex, _ = prepare_bwd(env, go, x, w, p)
    api.fakecann_fail_next(b"aclnnConvolutionBackward", 561103, 1)
    assert env.run(api.aclnnConvolutionBackward, ws, ex) == 561103
    assert "injected" in api.errmsg()
    assert api.fakecann_live_count(KIND_EXEC) == 0
    api.fakecann_fail_next(b"aclrtMalloc", 207001, 1)
    p_ = c_void_p()
    assert api.aclrtMalloc(byref(p_), 16, 0) == 207001
    api.fakecann_fail_next(b"aclCreateIntArray", 1, 1)
    assert api.aclCreateIntArray(i64([1]), 1) is None
    api.aclGetRecentErrMsg()


def test_deterministic_option_is_process_level(env, api):
    """aclnn reads the process-level ACL_OPT_DETERMINISTIC at phase 1 (ops-nn: aclrtGetSysParamOpt);
    aclrtCtxSetSysParamOpt writes it too (CANN runtime rtCtxSetSysParamOpt); aclrtSetSysParamOpt
    writes only it, needs no context, and it outlives the contexts."""
    go, x, w, p = _basic()
    v = c_int64(-1)
    assert api.aclrtGetSysParamOpt(0, byref(v)) == 0 and v.value == 0      # default 0, never NOT_SET
    assert api.aclrtCtxSetSysParamOpt(0, 1) == 0
    assert api.aclrtGetSysParamOpt(0, byref(v)) == 0 and v.value == 1      # the context call wrote it
    assert api.aclrtSetSysParamOpt(0, 0) == 0                              # process level only
    assert api.aclrtCtxGetSysParamOpt(0, byref(v)) == 0 and v.value == 1
    run_bwd(env, go, x, w, p, cube=0)
    assert api.fakecann_call_deterministic(0) == 0                         # phase 1 read the process slot
    # set between phase 1 and phase 2: phase 1's reading counts
    assert api.aclrtSetSysParamOpt(0, 1) == 0
    rc, ws, ex, outs = prepare_bwd(env, go, x, w, p)
    assert rc == 0
    assert api.aclrtSetSysParamOpt(0, 0) == 0
    assert env.run(api.aclnnConvolutionBackward, ws, ex) == 0
    assert api.fakecann_call_deterministic(1) == 1
    assert api.aclrtSetSysParamOpt(0, 2) == ACL_ERROR_INVALID_PARAM and api.aclrtSetSysParamOpt(-1, 0) != 0
    assert api.aclrtGetSysParamOpt(0, None) == ACL_ERROR_INVALID_PARAM
    api.aclGetRecentErrMsg()
    # no context needed; another thread sees the same process value
    res = {}

    def worker():
        res["set"] = api.aclrtSetSysParamOpt(0, 1)
        got = c_int64(-1)
        res["get"] = (api.aclrtGetSysParamOpt(0, byref(got)), got.value)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert res == {"set": 0, "get": (0, 1)} and api.fakecann_get_process_deterministic() == 1
    assert api.aclrtSetSysParamOpt(0, 0) == 0 and api.aclrtCtxSetSysParamOpt(0, 0) == 0
    api.fakecann_reset()


def test_deterministic_flag_record(env, api):
    go, x, w, p = _basic()
    v = c_int64(-1)
    assert api.aclrtCtxGetSysParamOpt(0, byref(v)) == 0 and v.value == 0
    run_bwd(env, go, x, w, p, cube=1)
    assert api.aclrtCtxSetSysParamOpt(0, 1) == 0
    assert api.aclrtCtxGetSysParamOpt(0, byref(v)) == 0 and v.value == 1
    run_bwd(env, go, x, w, p, cube=3)
    run_fwd(env, x, w, None, p, cube=2, out_shape=tuple(go.shape))
    assert api.aclrtCtxSetSysParamOpt(0, 0) == 0
    run_bwd(env, go, x, w, p, cube=0)
    assert api.aclrtCtxSetSysParamOpt(0, 2) == ACL_ERROR_INVALID_PARAM
    api.aclGetRecentErrMsg()
    assert api.fakecann_call_count() == 4
    assert [api.fakecann_call_deterministic(i) for i in range(4)] == [0, 1, 1, 0]
    assert [api.fakecann_call_cube_math(i) for i in range(4)] == [1, 3, 2, 0]
    assert [api.fakecann_call_op(i) for i in range(4)] == [1, 1, 2, 1]
    assert api.fakecann_call_deterministic(4) == -1
    api.fakecann_reset()
    assert api.fakecann_call_count() == 0


# ------------------------------------------------------------------ runtime
def test_runtime_init_and_device(api):
    api.fakecann_reset()
    api.fakecann_reset_runtime()
    assert api.aclrtGetSocName() is None  # before aclInit
    assert api.aclrtSetDevice(0) == ACL_ERROR_UNINITIALIZE
    api.fakecann_set_fail_init(500000)
    assert api.aclInit(None) == 500000
    api.fakecann_set_fail_init(0)
    assert api.aclInit(b"/nonexistent/acl.json") == 100003
    assert api.aclInit(None) == 0
    assert api.aclInit(None) == ACL_ERROR_REPEAT_INITIALIZE
    assert api.aclrtGetSocName() == b"Ascend910B2"
    api.fakecann_set_soc_name(b"Ascend910_9391")
    assert api.aclrtGetSocName() == b"Ascend910_9391"
    n = c_uint32()
    assert api.aclrtGetDeviceCount(byref(n)) == 0 and n.value == 1
    assert api.aclrtSetDevice(1) == ACL_ERROR_RT_INVALID_DEVICEID
    api.fakecann_set_device_count(0)
    assert api.aclrtSetDevice(0) == ACL_ERROR_RT_INVALID_DEVICEID
    api.fakecann_set_device_count(2)
    assert api.aclrtSetDevice(1) == 0
    d = c_int32(-1)
    assert api.aclrtGetDevice(byref(d)) == 0 and d.value == 1
    assert api.aclrtResetDevice(1) == 0
    assert api.fakecann_current_device() == -1
    assert api.aclFinalize() == 0
    assert api.aclFinalize() == 100037
    api.aclGetRecentErrMsg()
    api.fakecann_reset()
    assert api.fakecann_live_objects() == 0


def test_no_context_is_107002(api):
    api.fakecann_reset()
    api.fakecann_reset_runtime()
    assert api.aclInit(None) == 0
    assert api.aclrtSetDevice(0) == 0
    p = c_void_p()
    assert api.aclrtMalloc(byref(p), 64, 0) == 0
    buf = ctypes.create_string_buffer(64)
    # another thread has no context
    res = {}

    def worker():
        q = c_void_p()
        res["malloc"] = api.aclrtMalloc(byref(q), 64, 0)
        res["memcpy"] = api.aclrtMemcpy(p, 64, buf, 64, H2D)
        res["msg"] = api.errmsg()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert res["malloc"] == ACL_ERROR_RT_CONTEXT_NULL and res["memcpy"] == ACL_ERROR_RT_CONTEXT_NULL
    assert "aclrtSetDevice" in res["msg"]
    assert api.errmsg() is None  # messages are per thread
    assert api.aclrtMemcpy(p, 64, buf, 64, H2D) == 0
    assert api.aclrtResetDevice(0) == 0
    s = c_void_p()
    assert api.aclrtMalloc(byref(s), 64, 0) == ACL_ERROR_RT_CONTEXT_NULL
    assert api.aclrtCreateStream(byref(s)) == ACL_ERROR_RT_CONTEXT_NULL
    assert api.aclrtMemcpy(p, 64, buf, 64, H2D) == ACL_ERROR_RT_CONTEXT_NULL
    assert api.aclrtCtxSetSysParamOpt(0, 1) == ACL_ERROR_RT_CONTEXT_NULL
    assert "aclrtSetDevice" in api.errmsg()
    # the device's only reference was reset: its memory died with the context (freeing needs one too)
    assert api.aclrtFree(p) == ACL_ERROR_RT_CONTEXT_NULL and "aclrtSetDevice" in api.errmsg()
    assert api.fakecann_reclaimed_count() == 1 and api.fakecann_live_count(KIND_MEM) == 0
    assert api.aclFinalize() == 0
    assert api.fakecann_live_objects() == 0


def test_phase2_without_context(env, api):
    go, x, w, p = _basic()
    rc, ws, ex, _ = prepare_bwd(env, go, x, w, p)
    wsp = env.malloc(ws)
    res = {}

    def worker():   # a thread with no current context
        res["rc"] = api.aclnnConvolutionBackward(wsp, ws, ex, None)
        api.aclGetRecentErrMsg()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert res["rc"] == ACL_ERROR_RT_CONTEXT_NULL
    assert api.fakecann_live_count(KIND_EXEC) == 0
    api.aclGetRecentErrMsg()


def test_memory_api(env, api):
    p = env.malloc(32)
    host = ctypes.create_string_buffer(b"x" * 64, 64)
    assert api.aclrtMemcpy(p, 16, host, 32, H2D) == ACL_ERROR_INVALID_PARAM  # count > destMax
    assert "destMax" in api.errmsg()
    assert api.aclrtMemcpy(p, 64, host, 64, H2D) == ACL_ERROR_INVALID_PARAM  # past the allocation
    assert api.aclrtMemcpy(host, 32, p, 32, H2D) == ACL_ERROR_INVALID_PARAM  # wrong kind
    assert api.aclrtMemcpy(p, 32, host, 32, 4) == ACL_ERROR_INVALID_PARAM  # bad kind
    assert api.aclrtMemcpy(None, 32, host, 32, H2D) == ACL_ERROR_INVALID_PARAM
    api.aclGetRecentErrMsg()
    assert api.aclrtMemcpy(p, 32, host, 32, H2D) == 0
    q = env.malloc(32)
    assert api.aclrtMemcpy(q, 32, p, 32, D2D) == 0
    assert api.aclrtMemset(q, 32, 0, 16) == 0
    out = ctypes.create_string_buffer(32)
    assert api.aclrtMemcpy(out, 32, q, 32, D2H) == 0
    assert out.raw == b"\0" * 16 + b"x" * 16
    assert api.aclrtMemcpy(out, 32, host, 32, H2H) == 0
    assert api.fakecann_live_device_bytes() == 64 and api.fakecann_live_count(KIND_MEM) == 2
    # free of unknown pointers
    assert api.aclrtFree(ctypes.addressof(host)) == ACL_ERROR_INVALID_PARAM
    assert api.aclrtFree(p + 8) == ACL_ERROR_INVALID_PARAM
    assert api.aclrtFree(None) == ACL_ERROR_INVALID_PARAM
    assert api.fakecann_misuse_count() == 2
    z = c_void_p()
    assert api.aclrtMalloc(byref(z), 0, 0) == ACL_ERROR_INVALID_PARAM
    api.aclGetRecentErrMsg()


def test_objects_and_leak_counting(env, api):
    base = api.fakecann_live_objects()
    h = api.aclCreateTensor(i64([2, 3]), 2, 0, i64([3, 1]), 0, 2, i64([6]), 1, None)
    a = api.aclCreateIntArray(i64([1, 2]), 2)
    b = api.aclCreateBoolArray((c_bool * 3)(True, False, True), 3)
    e = api.aclCreateIntArray(None, 0)
    assert h and a and b and e
    assert api.fakecann_live_count(KIND_TENSOR) == 1
    assert api.fakecann_live_count(KIND_INT) == 2 and api.fakecann_live_count(KIND_BOOL) == 1
    assert api.fakecann_live_count(KIND_STREAM) == 1  # env's stream
    assert api.fakecann_live_objects() == base + 4
    assert api.aclDestroyTensor(h) == 0
    assert api.aclDestroyTensor(h) == INVALID  # double destroy detected
    assert api.aclDestroyIntArray(a) == 0 and api.aclDestroyIntArray(e) == 0
    assert api.aclDestroyBoolArray(b) == 0
    assert api.aclDestroyTensor(None) == 0
    assert api.fakecann_misuse_count() == 1
    assert api.fakecann_live_objects() == base
    # bad creations return NULL with a message
    assert api.aclCreateTensor(i64([-1]), 1, 0, i64([1]), 0, 2, i64([1]), 1, None) is None
    assert "negative" in api.errmsg()
    assert api.aclCreateTensor(None, 2, 0, None, 0, 2, None, 0, None) is None
    assert api.aclCreateIntArray(None, 3) is None
    api.aclGetRecentErrMsg()
    assert api.fakecann_live_objects() == base


def test_error_message_queue(env, api):
    assert api.aclGetRecentErrMsg() is None
    p = c_void_p()
    api.aclrtMalloc(byref(p), 0, 0)
    api.aclrtFree(None)
    msg = api.errmsg()
    assert "aclrtMalloc" in msg and "aclrtFree" in msg and "\n" in msg
    assert api.aclGetRecentErrMsg() is None


def test_a2a3_forward_refuses_float_keep_dtype(env, api):
    """aclnnConvolution.md: on Atlas A2/A3 a FLOAT input with cubeMathType 0 is not supported (the backward
    op accepts it); 1/2/3 run."""
    go, x, w, p = _basic()
    out = tuple(go.shape)
    api.aclGetRecentErrMsg()
    run_fwd(env, x, w, None, p, cube=0, out_shape=out, expect=161002)
    assert "cubeMathType 0 (KEEP_DTYPE) is not supported on Ascend910B2" in env.api.errmsg()
    for cube in (1, 2, 3):
        run_fwd(env, x, w, None, p, cube=cube, out_shape=out)
    run_bwd(env, go, x, w, p, cube=0)
