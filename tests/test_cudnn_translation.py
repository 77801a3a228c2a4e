"""CPU tests of the cuDNN backend: translation to cuDNN graph attributes, cache keys, the plan cache,
availability reasons, error mapping, and the whole call path on a recording fake of the cuDNN
frontend that executes graphs with the NumPy reference (so the backend, and the core's
legalization around it, run end to end on the CPU). None of this needs CuPy, cuDNN or a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import xconv
from xconv import ShapeError, UnsupportedError
from xconv.dtypes import DTYPES, accumulation_dtype
from xconv.errors import BackendError, BackendUnavailableError
from xconv.params import make_params
from xconv_cudnn import cache as cache_mod
from xconv_cudnn import compiler, driver
from xconv_cudnn.backend import CUDNN_STATUS, CudnnBackend, is_not_supported, vendor_error
from xconv_cudnn.cache import Entry, PlanCache, autotune, benchmark_enabled
from xconv_cudnn.compiler import (describe_strides, graph_spec, is_packed_nchw, math_policy, operand_layout,
                                  packed_strides, plan_key)
from xconv_numpy import reference

# =============================================================================================
# A recording fake of the cuDNN frontend (`import cudnn`) and a NumPy runtime


class _Enum:
    """Attribute access returns the member's name, like a tiny pybind enum."""

    def __init__(self, *names):
        self._names = set(names)

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(name)
        return name


class FakeNotSupported(Exception):
    pass


class FakeTensor:
    def __init__(self, graph, name, dim=None, stride=None, data_type=None, virtual=False):
        self.graph = graph
        self.name = name
        self.dim = list(dim) if dim is not None else None
        self.stride = list(stride) if stride is not None else None
        self.data_type = data_type
        self.virtual = virtual
        graph.uid_counter += 1
        self.uid = graph.uid_counter * 10 + 1

    def set_output(self, value):
        self.virtual = not value
        return self

    def set_dim(self, dim):
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self.stride = list(stride)
        return self

    def set_data_type(self, dt):
        self.data_type = dt
        return self

    def get_uid(self):
        return self.uid


class FakeGraph:
    def __init__(self, fe, **kwargs):
        self.fe = fe
        self.kwargs = kwargs
        self.calls = []
        self.nodes = []
        self.tensors = []
        self.uid_counter = 0
        self.engines = None
        self.built = False
        fe.graphs.append(self)

    # graph construction ----------------------------------------------------------------------
    def tensor(self, name, dim, stride, data_type):
        self.calls.append(("tensor", name))
        t = FakeTensor(self, name, dim, stride, data_type)
        self.tensors.append(t)
        return t

    def _node(self, kind, inputs, attrs):
        self.calls.append((kind, tuple(sorted(inputs)), tuple(sorted(attrs))))
        out = FakeTensor(self, f"{kind}_out", virtual=True)
        self.nodes.append((kind, inputs, attrs, out))
        return out

    def conv_fprop(self, image, weight, **attrs):
        return self._node("conv_fprop", {"image": image, "weight": weight}, attrs)

    def conv_dgrad(self, loss, filter, **attrs):  # noqa: A002 (the frontend's keyword)
        return self._node("conv_dgrad", {"loss": loss, "filter": filter}, attrs)

    def conv_wgrad(self, image, loss, **attrs):
        return self._node("conv_wgrad", {"image": image, "loss": loss}, attrs)

    def bias(self, input, bias, **attrs):  # noqa: A002
        return self._node("bias", {"input": input, "bias": bias}, attrs)

    def reduction(self, input, mode, **attrs):  # noqa: A002
        return self._node("reduction", {"input": input}, dict(attrs, mode=mode))

    # planning --------------------------------------------------------------------------------
    def validate(self):
        self.calls.append(("validate",))

    def build_operation_graph(self):
        self.calls.append(("build_operation_graph",))

    def create_execution_plans(self, modes):
        self.calls.append(("create_execution_plans", tuple(modes)))
        self.engines = [[set(notes), True] for notes in self.fe.engines_for(self)]

    def deselect_numeric_notes(self, notes):
        self.calls.append(("deselect_numeric_notes", tuple(notes)))
        for engine in self.engines:
            if engine[0] & set(notes):
                engine[1] = False

    def deselect_workspace_greater_than(self, nbytes):
        self.calls.append(("deselect_workspace_greater_than", nbytes))
        for i, engine in enumerate(self.engines):
            if self.fe.engine_workspace(i) > nbytes:
                engine[1] = False

    def check_support(self):
        self.calls.append(("check_support",))
        self.fe.builds += 1
        reason = self.fe.refuse(self)
        if reason:
            raise FakeNotSupported(f"[cudnn_frontend] Error: {reason}; code: CUDNN_STATUS_NOT_SUPPORTED")
        if not any(ok for _, ok in self.engines):
            raise FakeNotSupported("[cudnn_frontend] Error: No valid engine configs returned from heuristics.")

    def build_plans(self, policy):
        self.calls.append(("build_plans", policy))
        self.built = True

    def get_execution_plan_count(self):
        return len(self.engines)

    def get_workspace_size(self):
        """The heuristics' choice (the first engine not deselected); 256 bytes unless ``fe.workspaces`` is set."""
        if self.fe.workspaces is None:
            return 256
        return self.fe.engine_workspace(next(i for i, (_, ok) in enumerate(self.engines) if ok))

    def get_workspace_size_plan_at_index(self, index):
        return self.fe.engine_workspace(index)

    def get_plan_name_at_index(self, index):
        return f"eng{index}_k2={index + 1}"

    # execution -------------------------------------------------------------------------------
    def execute(self, pack, workspace, handle=None):
        self.fe.executions.append((self, None))
        self._run(pack, workspace)

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        if not self.engines[index][1]:
            raise FakeNotSupported("Deselecting execution plan")
        self.fe.executions.append((self, index))
        self.fe.last_plan_time = self.fe.plan_times[index % len(self.fe.plan_times)]
        self._run(pack, workspace)

    def _bound(self, pack, tensor):
        array = self.fe.runtime.arrays[pack[tensor.uid]]
        dims = tuple(tensor.dim)
        if array.shape != dims:
            assert array.size == int(np.prod(dims)), (tensor.name, array.shape, dims)
            assert array.flags.c_contiguous
            array = array.reshape(dims)
        got = tuple(s // array.itemsize for s in array.strides)
        for n, s, want in zip(dims, got, tensor.stride):
            assert n == 1 or s == want, f"{tensor.name}: strides {got} described as {tensor.stride}"
        assert pack[tensor.uid] % 16 == 0, f"{tensor.name} bound at a misaligned address"
        return array

    def _run(self, pack, workspace):
        if self.fe.fail_execute:
            raise RuntimeError(self.fe.fail_execute)
        values = {}
        for t in self.tensors:
            values[t.uid] = self._bound(pack, t)
        for kind, inputs, attrs, out in self.nodes:
            ins = {k: values[v.uid] for k, v in inputs.items()}
            dtype = self.fe.dtype_of(inputs)
            acc = accumulation_dtype(dtype)
            pad = list(zip(attrs.get("pre_padding", ()), attrs.get("post_padding", ())))
            conv = dict(stride=attrs.get("stride"), padding=pad, dilation=attrs.get("dilation"), dtype=dtype)
            if kind == "conv_fprop":
                x, w = ins["image"], ins["weight"]
                p = make_params(x.shape, w.shape, groups=x.shape[1] // w.shape[1], **conv)
                result = reference.fprop(x, w, None, p, acc)
            elif kind == "conv_dgrad":
                dy, w = ins["loss"], ins["filter"]
                p = make_params(tuple(out.dim), w.shape, groups=out.dim[1] // w.shape[1], **conv)
                result = reference.dgrad(dy, w, p, acc)
            elif kind == "conv_wgrad":
                x, dy = ins["image"], ins["loss"]
                p = make_params(x.shape, tuple(out.dim), groups=x.shape[1] // out.dim[1], **conv)
                result = reference.wgrad(x, dy, p, acc)
            elif kind == "bias":
                result = (ins["input"].astype(acc) + ins["bias"].astype(acc)).astype(DTYPES[dtype])
            else:  # reduction to out.dim
                src = ins["input"]
                axes = tuple(i for i, n in enumerate(out.dim) if n == 1 and src.shape[i] != 1)
                result = src.astype(acc).sum(axis=axes, keepdims=True).astype(DTYPES[dtype])
            values[out.uid] = result
            if not out.virtual:
                target = self._bound(pack, out)
                assert tuple(out.dim) == result.shape, (kind, out.dim, result.shape)
                target[...] = result


class FakeFrontend:
    """The parts of ``import cudnn`` the backend uses, recording and executing with NumPy."""

    __version__ = "1.99.0"
    data_type = _Enum("HALF", "BFLOAT16", "FLOAT", "DOUBLE", "NOT_SET")
    heur_mode = _Enum("A", "B", "FALLBACK")
    numerical_note = _Enum("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
                           "NONDETERMINISTIC", "WINOGRAD")
    build_plan_policy = _Enum("HEURISTICS_CHOICE", "ALL")
    reduction_mode = _Enum("ADD")
    cudnnGraphNotSupportedError = FakeNotSupported

    def __init__(self, engines=None, refuse=None, plan_times=(3.0, 1.0, 2.0)):
        self.default_engines = engines or [("TENSOR_CORE",), (), ("NONDETERMINISTIC",)]
        self._refuse = refuse or (lambda graph: "")
        self.plan_times = list(plan_times)
        self.graphs = []
        self.executions = []
        self.builds = 0
        self.stream_sets = []
        self.fail_execute = ""
        self.last_plan_time = 1.0
        self.runtime = None
        self.engine_rule = None
        self.workspaces = None          # per engine index: workspace bytes (default 128 * (index + 1))

    def engine_workspace(self, index):
        return self.workspaces[index] if self.workspaces is not None else 128 * (index + 1)

    def engines_for(self, graph):
        return self.engine_rule(graph) if self.engine_rule else self.default_engines

    def refuse(self, graph):
        return self._refuse(graph)

    def dtype_of(self, inputs):
        name = next(iter(inputs.values())).data_type
        name = name if name in ("HALF", "BFLOAT16", "FLOAT", "DOUBLE") else "FLOAT"
        return {"HALF": "float16", "BFLOAT16": "bfloat16", "FLOAT": "float32", "DOUBLE": "float64"}[name]

    def pygraph(self, **kwargs):
        return FakeGraph(self, **kwargs)

    def create_handle(self):
        return object()

    def set_stream(self, handle, stream):
        self.stream_sets.append((handle, stream))

    def get_last_error_string(self):
        return ""

    def backend_version(self):
        return 91000


class NumpyRuntime:
    """CupyRuntime's interface over NumPy arrays (pointers are real addresses)."""

    def __init__(self, fe):
        self.fe = fe
        fe.runtime = self
        self.arrays = {}

    def device_of(self, a):
        return 0

    def ptr(self, a):
        address = a.__array_interface__["data"][0]
        self.arrays[address] = a
        return address

    def is_c_contiguous(self, a):
        return a.flags.c_contiguous

    def element_strides(self, a):
        return tuple(s // a.itemsize for s in a.strides)

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def copy(self, a):
        return _aligned_copy(a)

    def empty(self, shape, like):
        return np.empty(shape, dtype=like.dtype)

    def on_device(self, device):
        return contextlib.nullcontext()

    def workspace(self, nbytes):
        if nbytes <= 0:
            return None, 0
        buf = np.empty(nbytes, np.uint8)
        return buf, buf.__array_interface__["data"][0]

    def handle(self, device):
        return "handle-0"

    def add_bias(self, y, bias):
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2))
        return y

    def sum_bias(self, dy, dtype):
        acc = accumulation_dtype(dtype)
        return np.ascontiguousarray(dy.astype(acc).sum(axis=(0,) + tuple(range(2, dy.ndim))).astype(dy.dtype))

    def time_calls(self, run, warmup, repeats):
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeats):
            run()
            times.append(self.fe.last_plan_time)
        return times


def _aligned_copy(a):
    """A C-contiguous copy at a 64-byte aligned address."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    offset = (-raw.__array_interface__["data"][0]) % 64
    out = raw[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def fake_backend(**fe_kwargs):
    fe = FakeFrontend(**fe_kwargs)
    backend = CudnnBackend(runtime=NumpyRuntime(fe), cache=PlanCache(64))
    backend.array_families = ("numpy",)  # let the public API route NumPy arrays to it
    return backend, fe


# =============================================================================================
# Layouts and strides


def test_packed_strides_and_orders():
    assert packed_strides((2, 3, 4, 5), range(4)) == (60, 20, 5, 1)
    assert packed_strides((2, 3, 4, 5), (0, 2, 3, 1)) == (60, 1, 15, 3)
    assert compiler.layout_orders(5)["nhwc"] == (0, 2, 3, 4, 1)


def test_describe_strides_nchw_and_channels_last():
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert describe_strides(x.shape, _el(x)) == (60, 20, 5, 1)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert describe_strides(cl.shape, _el(cl)) == (60, 1, 15, 3)
    assert not is_packed_nchw(cl.shape, describe_strides(cl.shape, _el(cl)))
    x3 = np.zeros((2, 3, 4, 5, 6), np.float32)
    cl3 = np.ascontiguousarray(x3.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
    assert describe_strides(cl3.shape, _el(cl3)) == (360, 1, 90, 18, 3)


def test_describe_strides_canonicalizes_unit_dims():
    x = np.zeros((2, 3, 7), np.float32)[:, :, None]          # the core's 1-D lift: stride 0 on H
    assert _el(x)[2] == 0
    assert describe_strides(x.shape, _el(x)) == (21, 7, 7, 1)
    cl = np.ascontiguousarray(np.zeros((2, 3, 7), np.float32).transpose(0, 2, 1)).transpose(0, 2, 1)[:, :, None]
    assert describe_strides(cl.shape, _el(cl)) == (21, 1, 21, 3)   # NHWC with H = 1
    assert describe_strides((1, 1, 1, 1), (0, 0, 0, 0)) == (1, 1, 1, 1)


def test_describe_strides_padded_views_and_refusals():
    big = np.zeros((2, 3, 10, 10), np.float32)
    crop = big[:, :, 1:9, 2:8]
    assert describe_strides(crop.shape, _el(crop)) == (300, 100, 10, 1)
    flipped = big[:, :, ::-1]
    assert describe_strides(flipped.shape, _el(flipped)) is None          # negative stride
    broadcast = np.broadcast_to(np.zeros((1, 3, 1, 10), np.float32), (2, 3, 4, 10))
    assert describe_strides(broadcast.shape, _el(broadcast)) is None      # zero stride on a non-unit dim
    odd = np.zeros((4, 3, 5, 6), np.float32).transpose(1, 0, 2, 3)           # C outermost, N inside
    assert describe_strides(odd.shape, _el(odd)) is None
    assert describe_strides((2, 3), (3, 1, 1)) is None                      # rank mismatch


def _el(a):
    return tuple(s // a.itemsize for s in a.strides)


# =============================================================================================
# Graph specs: dims, strides, padding, groups, outputs


def _p(input_shape=(2, 4, 9, 8), weight_shape=(6, 4, 3, 3), **kw):
    return make_params(input_shape, weight_shape, **kw)


def test_fprop_spec_attributes():
    p = _p(stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2))
    spec = graph_spec("fprop", p)
    assert spec.pre_padding == (1, 0) and spec.post_padding == (2, 1)
    assert spec.stride == (2, 1) and spec.dilation == (1, 2)
    x, w = spec.inputs
    assert (x.name, x.dims, x.strides) == ("x", (2, 4, 9, 8), (288, 72, 8, 1))
    assert (w.name, w.dims, w.strides) == ("w", (6, 4, 3, 3), (36, 9, 3, 1))
    (y,) = spec.outputs
    assert y.dims == p.output_shape and y.strides == packed_strides(p.output_shape, range(4))
    assert spec.io_type == "FLOAT" and spec.compute_type == "FLOAT" and spec.intermediate_type == "FLOAT"
    assert spec.heur_modes == ("A", "FALLBACK") and not spec.autotune


def test_dgrad_and_wgrad_specs_set_output_dims():
    p = _p(stride=2, padding=1)
    dgrad = graph_spec("dgrad", p)
    assert [t.name for t in dgrad.inputs] == ["dy", "w"]
    assert dgrad.inputs[0].dims == p.output_shape
    assert dgrad.outputs[0].name == "dx" and dgrad.outputs[0].dims == p.input_shape
    wgrad = graph_spec("wgrad", p)
    assert [t.name for t in wgrad.inputs] == ["x", "dy"]
    assert wgrad.outputs[0].name == "dw" and wgrad.outputs[0].dims == p.weight_shape


def test_groups_and_depthwise_weight_dims():
    p = _p((2, 8, 6, 6), (12, 2, 3, 3), groups=4, padding=1)
    spec = graph_spec("fprop", p)
    assert spec.inputs[0].dims[1] == 8 and spec.inputs[1].dims == (12, 2, 3, 3)  # cuDNN infers groups = 8 / 2
    dw = graph_spec("wgrad", _p((2, 8, 6, 6), (8, 1, 3, 3), groups=8, padding=1))
    assert dw.outputs[0].dims == (8, 1, 3, 3)


def test_channel_vectors_for_bias():
    p = _p(padding=1)
    spec = graph_spec("fprop_bias", p)
    bias = spec.tensor("bias")
    assert bias.dims == (1, 6, 1, 1) and bias.strides == (6, 1, 1, 1) and bias.shape == (6,)
    fused = graph_spec("wgrad_bgrad", p)
    assert [t.name for t in fused.outputs] == ["dw", "db"] and fused.tensor("db").dims == (1, 6, 1, 1)
    p3 = make_params((1, 2, 4, 4, 4), (5, 2, 1, 1, 1))
    db = graph_spec("bgrad", p3).tensor("db")
    assert db.dims == (1, 5, 1, 1, 1) and db.shape == (5,)


def test_specs_take_operand_strides():
    p = _p(padding=1)
    cl = packed_strides(p.input_shape, (0, 2, 3, 1))
    spec = graph_spec("wgrad", p, {"x": cl})
    assert spec.tensor("x").strides == cl
    assert spec.tensor("dy").strides == packed_strides(p.output_shape, range(4))
    assert spec.tensor("dw").strides == packed_strides(p.weight_shape, range(4))   # outputs: C-contiguous


def test_transposed_params_are_refused_by_the_translation():
    p = make_params((2, 4, 5, 5), (4, 3, 3, 3), transposed=True, stride=2)
    with pytest.raises(ValueError, match="core maps transposed"):
        graph_spec("fprop", p)
    spec = graph_spec("bgrad", p, dy_shape=p.output_shape)            # bgrad reads only dy
    assert spec.tensor("db").shape == (3,)


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown cuDNN graph op"):
        graph_spec("fwd", _p())


# =============================================================================================
# dtype and math mapping


@pytest.mark.parametrize("dtype, io, compute", [("float16", "HALF", "FLOAT"), ("bfloat16", "BFLOAT16", "FLOAT"),
                                                ("float32", "FLOAT", "FLOAT"), ("float64", "DOUBLE", "DOUBLE")])
def test_data_and_compute_types(dtype, io, compute):
    for math in xconv.params.MATH_MODES:
        policy = math_policy(dtype, math)
        assert (policy.io_type, policy.compute_type, policy.intermediate_type) == (io, compute, compute)
    spec = graph_spec("fprop", _p(dtype=dtype))
    assert all(t.data_type == io for t in spec.inputs + spec.outputs)


def test_float32_math_modes():
    keep = math_policy("float32", "keep_dtype")
    assert set(keep.deselect) == {"TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT"}
    assert not keep.tf32
    tf32 = math_policy("float32", "allow_tf32")
    assert "TENSOR_CORE" not in tf32.deselect and "DOWN_CONVERT_INPUTS" in tf32.deselect and tf32.tf32
    assert "FFT" not in tf32.deselect
    fp16 = math_policy("float32", "allow_fp16")
    assert fp16.deselect == ("REDUCED_PRECISION_REDUCTION",) and fp16.tf32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_math_changes_nothing_outside_float32(dtype):
    policies = {math_policy(dtype, m) for m in xconv.params.MATH_MODES}
    assert len(policies) == 1
    (policy,) = policies
    assert {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"} <= set(policy.deselect) and not policy.tf32
    assert "TENSOR_CORE" not in policy.deselect


def test_determinism_deselects_nondeterministic_engines():
    assert "NONDETERMINISTIC" not in graph_spec("wgrad", _p()).deselect_notes
    spec = graph_spec("wgrad", _p(deterministic=True))
    assert spec.deselect_notes[-1] == "NONDETERMINISTIC" and spec.deterministic
    assert "NONDETERMINISTIC" not in spec.without_filters(math=False).deselect_notes
    assert spec.without_filters(determinism=False).deselect_notes == ("NONDETERMINISTIC",)
    assert spec.without_filters().deselect_notes == ()


# =============================================================================================
# Cache keys


def _key(op="wgrad", layouts=("C", "C"), device=0, autotune=False, **kw):
    base = dict(input_shape=(2, 4, 9, 8), weight_shape=(6, 4, 3, 3), stride=1, padding=1, dilation=1, groups=1,
                dtype="float32", math="keep_dtype", deterministic=False)
    base.update(kw)
    shapes = (base.pop("input_shape"), base.pop("weight_shape"))
    return plan_key(op, make_params(*shapes, **base), layouts, device, autotune)


def test_plan_key_equal_for_equal_inputs():
    assert _key() == _key()
    assert hash(_key()) == hash(_key())
    assert _key(layouts=((288, 1, 32, 4), "C")) == _key(layouts=((288, 1, 32, 4), "C"))


@pytest.mark.parametrize("change", [
    dict(input_shape=(3, 4, 9, 8)), dict(input_shape=(2, 4, 9, 9)), dict(weight_shape=(5, 4, 3, 3)),
    dict(weight_shape=(6, 4, 3, 1)), dict(stride=2), dict(stride=(1, 2)), dict(padding=((1, 1), (0, 2))),
    dict(padding=((1, 1), (2, 0))), dict(dilation=2), dict(input_shape=(2, 8, 9, 8), groups=2),
    dict(dtype="float16"), dict(dtype="float64"), dict(math="allow_tf32"), dict(math="allow_fp16"),
    dict(deterministic=True), dict(op="dgrad"), dict(op="wgrad_bgrad"), dict(layouts=((288, 1, 32, 4), "C")),
    dict(layouts=("C", (54, 1, 18, 6))), dict(device=1), dict(autotune=True),
])
def test_plan_key_distinguishes_everything_that_changes_a_plan(change):
    assert _key(**change) != _key()


def test_plan_key_for_bgrad_reads_only_grad_output():
    direct = make_params((2, 4, 5, 5), (3, 4, 3, 3))
    transposed = make_params((2, 4, 3, 3), (4, 3, 3, 3), transposed=True)
    assert transposed.output_shape == direct.output_shape[:2] + (5, 5)
    dy = (2, 3, 5, 5)
    assert plan_key("bgrad", direct, ("C",), 0, False, dy) == plan_key("bgrad", transposed, ("C",), 0, False, dy)
    assert plan_key("bgrad", direct, ("C",), 0, False, dy) != plan_key(
        "bgrad", direct.replace(deterministic=True), ("C",), 0, False, dy)
    assert plan_key("bgrad", direct, ("C",), 0, False, dy) != plan_key("bgrad", direct, ("C",), 0, False, (2, 3, 5, 6))


def test_operand_layout():
    assert operand_layout((2, 3, 4, 5), None) == "C"
    assert operand_layout((2, 3, 4, 5), (60, 20, 5, 1)) == "C"
    assert operand_layout((2, 3, 4, 5), (60, 1, 15, 3)) == (60, 1, 15, 3)


# =============================================================================================
# Plan cache and autotune


def test_lru_bound_and_recency():
    c = PlanCache(maxsize=2)
    c.put("a", Entry("plan"))
    c.put("b", Entry("plan"))
    assert c.get("a") is not None            # a is now most recent
    c.put("c", Entry("plan"))                # evicts b
    assert "b" not in c and "a" in c and "c" in c and len(c) == 2
    assert c.get("b") is None
    assert c.stats() == {"size": 2, "maxsize": 2, "hits": 1, "misses": 1, "evictions": 1}
    c.clear()
    assert len(c) == 0 and c.stats()["hits"] == 0


def test_cache_size_and_benchmark_from_environment():
    assert cache_mod.cache_size_from_env({}) == cache_mod.DEFAULT_CACHE_SIZE
    assert cache_mod.cache_size_from_env({"XCONV_CUDNN_PLAN_CACHE_SIZE": "7"}) == 7
    for bad in ("0", "x", "-3", "1.5"):          # refused by name (xconv.settings), never silently the default
        with pytest.raises(xconv.ConfigError, match=r"XCONV_CUDNN_PLAN_CACHE_SIZE: .*given '"):
            cache_mod.cache_size_from_env({"XCONV_CUDNN_PLAN_CACHE_SIZE": bad})
    assert PlanCache(maxsize=0).maxsize == 1
    for on in ("1", "true", "YES", " on "):
        assert benchmark_enabled({"XCONV_CUDNN_BENCHMARK": on})
    for off in ("", "0", "false", "no"):
        assert not benchmark_enabled({"XCONV_CUDNN_BENCHMARK": off})
    assert not benchmark_enabled({})
    with pytest.raises(xconv.ConfigError, match="XCONV_CUDNN_BENCHMARK: .*given 'maybe'"):
        benchmark_enabled({"XCONV_CUDNN_BENCHMARK": "maybe"})


def test_autotune_picks_the_fastest_runnable_plan():
    times = {0: [3.0, 3.1, 2.9], 1: None, 2: [1.5, 9.0, 1.4], 3: [1.6, 1.6, 1.6]}
    best, timings = autotune(4, lambda i, warmup, repeats: times[i])
    assert best == 2 and dict(timings) == {0: 3.0, 2: 1.5, 3: 1.6}
    with pytest.raises(LookupError):
        autotune(2, lambda i, warmup, repeats: None)


# =============================================================================================
# build_graph against the recording fake


def test_build_graph_call_sequence_and_attributes():
    fe = FakeFrontend()
    p = _p(stride=2, padding=((1, 0), (2, 1)), dilation=(1, 2), deterministic=True)
    spec = graph_spec("dgrad", p)
    built = compiler.build_graph(fe, spec, handle="h")
    g = fe.graphs[-1]
    assert g.kwargs == dict(io_data_type="FLOAT", intermediate_data_type="FLOAT", compute_data_type="FLOAT", handle="h")
    kinds = [c[0] for c in g.calls]
    assert kinds == ["tensor", "tensor", "conv_dgrad", "validate", "build_operation_graph", "create_execution_plans",
                     "deselect_numeric_notes", "check_support", "build_plans"]
    kind, inputs, attrs, out = g.nodes[0]
    assert set(inputs) == {"loss", "filter"}
    assert attrs == dict(pre_padding=[1, 2], post_padding=[0, 1], stride=[2, 2], dilation=[1, 2],
                         compute_data_type="FLOAT", name="dgrad")
    assert out.dim == list(p.input_shape) and out.stride == list(packed_strides(p.input_shape, range(4)))
    assert out.data_type == "FLOAT" and not out.virtual
    assert ("create_execution_plans", ("A", "FALLBACK")) in g.calls
    assert ("deselect_numeric_notes", ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
                                       "NONDETERMINISTIC")) in g.calls
    assert ("build_plans", "HEURISTICS_CHOICE") in g.calls
    assert set(built.uids) == {"dy", "w", "dx"} and built.workspace == 256 and built.plan_count == 1


def test_build_graph_fused_and_autotuned():
    fe = FakeFrontend()
    spec = graph_spec("wgrad_bgrad", _p(dtype="float16", padding=1), autotune=True)
    built = compiler.build_graph(fe, spec, handle=None)
    g = fe.graphs[-1]
    assert [n[0] for n in g.nodes] == ["conv_wgrad", "reduction"]
    assert g.nodes[1][2]["mode"] == "ADD" and g.nodes[1][3].dim == [1, 6, 1, 1]
    assert g.kwargs["io_data_type"] == "HALF" and g.kwargs["compute_data_type"] == "FLOAT"
    assert ("build_plans", "ALL") in g.calls and built.plan_count == 3
    spec = graph_spec("fprop_bias", _p(padding=1))
    compiler.build_graph(fe, spec, handle=None)
    g = fe.graphs[-1]
    assert [n[0] for n in g.nodes] == ["conv_fprop", "bias"]
    assert g.nodes[0][3].virtual and not g.nodes[1][3].virtual


def test_build_graph_without_filters_skips_deselect():
    fe = FakeFrontend()
    compiler.build_graph(fe, graph_spec("fprop", _p(dtype="float32")).without_filters(), handle=None)
    assert not any(c[0] == "deselect_numeric_notes" for c in fe.graphs[-1].calls)


# =============================================================================================
# Vendor errors


def test_vendor_error_parses_cudnn_status():
    exc = RuntimeError("cudnnBackendExecute(...) failed with message: bad, and code: CUDNN_STATUS_EXECUTION_FAILED")
    err = vendor_error(exc, call="dgrad execute")
    assert isinstance(err, BackendError)
    assert (err.status, err.status_name, err.call) == (5000, "CUDNN_STATUS_EXECUTION_FAILED", "dgrad execute")
    assert "failed with message: bad" in err.vendor_message and "cudnn in dgrad execute" in str(err)
    assert CUDNN_STATUS["CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"] == 2008
    assert CUDNN_STATUS["CUDNN_STATUS_NOT_SUPPORTED"] == 3000


def test_vendor_error_without_status_and_with_last_error():
    fe = types.SimpleNamespace(get_last_error_string=lambda: "CUDNN_STATUS_BAD_PARAM; dims mismatch")
    err = vendor_error(ValueError("Invalid variant pack"), fe, call="x")
    assert err.status_name == "CUDNN_STATUS_BAD_PARAM" and err.status == 2000
    assert "dims mismatch" in err.vendor_message
    plain = vendor_error(ValueError("oops"))
    assert plain.status == -1 and plain.status_name == "cudnn_frontend.ValueError"


def test_is_not_supported():
    fe = FakeFrontend()
    assert is_not_supported(FakeNotSupported("x"), fe)
    assert is_not_supported(RuntimeError("... code: CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"), fe)
    assert is_not_supported(NotImplementedError(), fe)
    assert not is_not_supported(RuntimeError("CUDNN_STATUS_EXECUTION_FAILED"), fe)


# =============================================================================================
# Availability


@pytest.fixture
def probes(monkeypatch):
    """Every probe succeeding; tests break one at a time."""
    cupy = types.SimpleNamespace(__version__="14.0.1")
    fe = FakeFrontend()
    state = dict(installed={"cupy", "cudnn"}, cupy=cupy, fe=fe, devices=("cuda:0 (NVIDIA H200)",),
                 runtime=("/site/nvidia/cudnn/lib/libcudnn.so.9", 91000))

    def fake_import(name):
        value = state["cupy" if name == "cupy" else "fe"]
        if isinstance(value, Exception):
            raise value
        return value

    def fake_devices(cp):
        if isinstance(state["devices"], Exception):
            raise state["devices"]
        return state["devices"]

    monkeypatch.setattr(driver, "_installed", lambda name: name in state["installed"])
    monkeypatch.setattr(driver, "_import", fake_import)
    monkeypatch.setattr(driver, "_device_names", fake_devices)
    monkeypatch.setattr(driver, "_load_cudnn_runtime", lambda: state["runtime"])
    driver.reset()
    yield state
    driver.reset()


def test_available_when_everything_is_present(probes):
    status = driver.probe()
    assert status.available and status.reason == ""
    assert status.version_string == "cuDNN 9.10.0, frontend 1.99.0, CuPy 14.0.1"
    backend = CudnnBackend()
    assert backend.availability() == (True, "")
    assert backend.devices() == ("cuda:0 (NVIDIA H200)",)
    assert "cuDNN 9.10.0" in backend.version()


@pytest.mark.parametrize("breakage, reason", [
    (lambda s: s["installed"].discard("cupy"), "CuPy is not installed"),
    (lambda s: s.update(cupy=ImportError("libcuda.so.1: cannot open")), "CuPy failed to import: ImportError"),
    (lambda s: s["cupy"].__setattr__("__version__", "12.3.0"), "CuPy 12.3.0 is too old (need >= 13.0)"),
    (lambda s: s.update(devices=()), "no CUDA device (CuPy sees 0 devices)"),
    (lambda s: s.update(devices=RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")),
     "no CUDA device: RuntimeError: cudaErrorNoDevice"),
    (lambda s: s.update(runtime=None), "cuDNN runtime not found"),
    (lambda s: s.update(runtime=("/usr/lib/libcudnn.so.8", 8906)), "cuDNN runtime 0.89.6"),
    (lambda s: s["installed"].discard("cudnn"), "cuDNN frontend not installed"),
    (lambda s: s.update(fe=OSError("libcudnn.so: cannot open")), "cuDNN frontend failed to import: OSError"),
    (lambda s: s["fe"].__setattr__("__version__", "1.5.2"), "cuDNN frontend 1.5.2 is too old (need >= 1.8)"),
    (lambda s: s.update(fe=types.SimpleNamespace(__version__="1.9.0")), "cuDNN frontend 1.9.0 lacks pygraph"),
])
def test_availability_reasons(probes, breakage, reason):
    breakage(probes)
    status = driver.probe()
    assert not status.available
    assert reason in status.reason
    backend = CudnnBackend()
    assert backend.availability() == (False, status.reason)
    info = backend.info()
    assert not info.available and info.reason == status.reason and info.devices == ()


def test_cudnn_version_text():
    assert driver.format_cudnn_version(90800) == "9.8.0"
    assert driver.format_cudnn_version(91201) == "9.12.1"
    assert driver.parse_version("1.14.0rc1") == (1, 14, 0)
    assert driver.parse_version("14.0.0b2") == (14, 0, 0)


def test_availability_never_raises(monkeypatch):
    monkeypatch.setattr(driver, "probe", lambda: 1 / 0)
    driver.reset()
    try:
        status = driver.availability()
        assert not status.available and "ZeroDivisionError" in status.reason
    finally:
        driver.reset()


def test_runtime_library_candidates_cover_wheels_and_loader_path():
    names = driver._cudnn_library_candidates()
    if sys.platform.startswith("linux"):
        assert names[-2:] == ["libcudnn.so.9", "libcudnn.so"]      # the loader path, after any wheel copies
        assert all("nvidia" in n for n in names[:-2])


def test_unavailable_backend_refuses_calls_with_its_reason(monkeypatch):
    monkeypatch.setattr(driver, "availability", lambda: driver.Availability(False, "CuPy is not installed (x)"))
    backend = CudnnBackend()
    with pytest.raises(BackendUnavailableError, match="CuPy is not installed"):
        backend.runtime()
    x = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(BackendUnavailableError, match="CuPy is not installed"):
        xconv.conv_fprop(x, x, backend=backend)


def test_registered_under_cudnn_for_cupy_arrays():
    backend = xconv.get_backend("cudnn")
    assert isinstance(backend, CudnnBackend)
    assert backend.array_families == ("cupy",) and backend.priority > 0
    caps = backend.capabilities
    assert caps.spatial_dims == {2, 3} and caps.asymmetric_padding == {2, 3} and not caps.transposed
    assert caps.deterministic and caps.strided and caps.math == set(xconv.params.MATH_MODES)


def test_importing_xconv_imports_neither_cupy_nor_cudnn():
    code = ("import sys, xconv\n"
            "b = xconv.get_backend('cudnn')\n"
            "import xconv_cudnn, xconv_cudnn.plugin, xconv_cudnn.backend, xconv_cudnn.compiler, xconv_cudnn.cache\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cudnn', 'cupy_backends'))\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# =============================================================================================
# The CuPy runtime's handle and stream logic, on a fake CuPy


def _fake_cupy_runtime(fe):
    state = types.SimpleNamespace(stream=0, device=0)
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=state.stream),
        runtime=types.SimpleNamespace(getDevice=lambda: state.device),
        Device=lambda d: ("device-guard", d),
    )
    rt = driver.CupyRuntime.__new__(driver.CupyRuntime)
    rt.cp = types.SimpleNamespace(cuda=cuda, uint8=np.uint8, empty=lambda shape, dtype: np.empty(shape, dtype))
    rt.fe = fe
    rt._local = __import__("threading").local()
    rt._null = contextlib.nullcontext()
    return rt, state


def test_handles_follow_cupy_current_stream():
    fe = FakeFrontend()
    rt, state = _fake_cupy_runtime(fe)
    h = rt.handle(0)
    assert rt.handle(0) is h and len(fe.stream_sets) == 1 and fe.stream_sets[0][1] == 0
    state.stream = 12345
    assert rt.handle(0) is h and fe.stream_sets[-1] == (h, 12345)
    rt.handle(0)
    assert len(fe.stream_sets) == 2                       # unchanged stream: no cudnnSetStream
    assert rt.handle(1) is not h                          # one handle per device
    assert isinstance(rt.on_device(0), contextlib.nullcontext)
    assert rt.on_device(1) == ("device-guard", 1)
    assert rt.workspace(0) == (None, 0)


def test_handles_are_per_thread():
    import threading

    fe = FakeFrontend()
    rt, _ = _fake_cupy_runtime(fe)
    main = rt.handle(0)
    other = []
    t = threading.Thread(target=lambda: other.append(rt.handle(0)))
    t.start()
    t.join()
    assert other[0] is not main


# =============================================================================================
# End to end on the fake: the public API -> core legalization -> CudnnBackend -> fake cuDNN


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(DTYPES[dtype])


def _channels_last(a):
    order = (0,) + tuple(range(2, a.ndim)) + (1,)
    inverse = tuple(np.argsort(order))
    return np.ascontiguousarray(a.transpose(order)).transpose(inverse)


CASES = [
    dict(input=(2, 4, 9, 8), weight=(6, 4, 3, 3), padding=1),
    dict(input=(2, 4, 9, 8), weight=(6, 4, 3, 2), stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2)),
    dict(input=(1, 6, 7, 7), weight=(9, 2, 3, 3), groups=3, padding=1, stride=2),
    dict(input=(2, 5, 8, 6), weight=(5, 1, 3, 3), groups=5, padding=(1, 1)),                # depthwise
    dict(input=(2, 3, 11), weight=(4, 3, 5), padding=((3, 1),), stride=2),                 # 1-D, lifted
    dict(input=(1, 2, 5, 4, 6), weight=(3, 2, 2, 3, 3), padding=((0, 1), (1, 1), (2, 0))),   # 3-D
    dict(input=(2, 4, 5, 5), weight=(4, 3, 3, 3), transposed=True, stride=2, padding=1, output_padding=1),
    dict(input=(1, 4, 4, 6), weight=(4, 2, 3, 2), transposed=True, groups=2, stride=(2, 3), dilation=(2, 1)),
    dict(input=(2, 3, 6), weight=(3, 2, 3), transposed=True, stride=3, padding=((1, 0),)),   # transposed 1-D
]


def _conv_kwargs(case):
    return {k: v for k, v in case.items() if k not in ("input", "weight")}


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_backward_matches_numpy_backend(case, layout):
    backend, fe = fake_backend()
    rng = np.random.default_rng(0)
    x = _rand(rng, case["input"], "float32")
    w = _rand(rng, case["weight"], "float32")
    conv = _conv_kwargs(case)
    out_shape = xconv.output_shape(case["input"], case["weight"], **conv)
    dy = _rand(rng, out_shape, "float32")
    if layout == "channels_last":
        x, dy = _channels_last(x), _channels_last(dy)
    c_out = out_shape[1]
    for mask in itertools.product([True, False], repeat=3):
        got = xconv.convolution_backward(dy, x, w, bias_sizes=[c_out], output_mask=mask, backend=backend, **conv)
        want = xconv.convolution_backward(dy, x, w, bias_sizes=[c_out], output_mask=mask, backend="numpy", **conv)
        for g, r in zip(got, want):
            assert (g is None) == (r is None)
            if g is not None:
                assert g.shape == r.shape and g.dtype == r.dtype and g.flags.c_contiguous
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    bias = _rand(rng, (c_out,), "float32")
    got = xconv.conv_fprop(x, w, bias=bias, backend=backend, **conv)
    want = xconv.conv_fprop(x, w, bias=bias, backend="numpy", **conv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fe.executions, "the fake cuDNN never ran"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes_end_to_end(dtype):
    backend, fe = fake_backend()
    rng = np.random.default_rng(1)
    case = CASES[1]
    x, w = _rand(rng, case["input"], dtype), _rand(rng, case["weight"], dtype)
    dy = _rand(rng, xconv.output_shape(case["input"], case["weight"], **_conv_kwargs(case)), dtype)
    got = xconv.convolution_backward(dy, x, w, backend=backend, **_conv_kwargs(case))
    want = xconv.convolution_backward(dy, x, w, backend="numpy", **_conv_kwargs(case))
    for g, r in zip(got, want):
        assert g.dtype == DTYPES[dtype]
        np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=1e-2, atol=1e-2)
    io = compiler.CUDNN_DATA_TYPE[dtype]
    assert all(g.kwargs["io_data_type"] == io for g in fe.graphs)


def test_which_graphs_each_mask_builds():
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (1, 2, 5, 5), "float32"), _rand(rng, (3, 2, 3, 3), "float32")
    dy = _rand(rng, (1, 3, 3, 3), "float32")
    ops, keys = {}, {}
    for mask in itertools.product([True, False], repeat=3):
        backend, fe = fake_backend()                  # a fresh cache per mask
        xconv.convolution_backward(dy, x, w, output_mask=mask, backend=backend)
        ops[mask] = sorted(tuple(n[0] for n in g.nodes) for g in fe.graphs)
        keys[mask] = sorted(k[0] for k in backend.cache.keys())
    assert ops[(True, True, True)] == [("conv_dgrad",), ("conv_wgrad", "reduction")]
    assert ops[(True, True, False)] == [("conv_dgrad",), ("conv_wgrad",)]
    assert ops[(True, False, True)] == [("conv_dgrad",), ("reduction",)]
    assert ops[(True, False, False)] == [("conv_dgrad",)]
    assert ops[(False, True, True)] == [("conv_wgrad", "reduction")]
    assert ops[(False, True, False)] == [("conv_wgrad",)]
    assert ops[(False, False, True)] == [("reduction",)]
    assert ops[(False, False, False)] == [] and keys[(False, False, False)] == []
    assert keys[(True, True, True)] == ["dgrad", "wgrad_bgrad"]


def test_cache_hits_and_no_rebuild():
    backend, fe = fake_backend()
    rng = np.random.default_rng(3)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    dy = _rand(rng, (2, 4, 4, 4), "float32")
    xconv.convolution_backward(dy, x, w, backend=backend)
    graphs, misses = len(fe.graphs), backend.cache.misses
    for _ in range(3):
        xconv.convolution_backward(dy, x, w, backend=backend)
    assert len(fe.graphs) == graphs and backend.cache.misses == misses
    assert backend.cache.hits >= 6
    xconv.convolution_backward(dy, _channels_last(x), w, backend=backend)     # new layout: new key
    assert len(fe.graphs) > graphs


def test_keys_are_reproducible_through_plan_key_for():
    backend, _ = fake_backend()
    p = _p(padding=1)
    x = np.zeros(p.input_shape, np.float32)
    dy = np.zeros(p.output_shape, np.float32)
    k1 = backend.plan_key_for("wgrad", p, (x, dy))
    assert k1 == backend.plan_key_for("wgrad", p, (x.copy(), dy.copy()))
    k2 = backend.plan_key_for("wgrad", p, (_channels_last(x), dy))
    assert k1 != k2 and k2[2][0] == packed_strides(p.input_shape, (0, 2, 3, 1))


def test_misaligned_operands_are_copied():
    backend, fe = fake_backend()
    rng = np.random.default_rng(4)
    raw = _rand(rng, 1 + 2 * 3 * 6 * 6, "float32")
    x = raw[1:].reshape(2, 3, 6, 6)                       # 4 bytes past an aligned buffer
    assert x.__array_interface__["data"][0] % 16 != 0 and x.flags.c_contiguous
    w = _rand(rng, (4, 3, 3, 3), "float32")
    got = xconv.conv_fprop(x, w, backend=backend)         # the fake asserts 16-byte aligned bindings
    np.testing.assert_allclose(got, xconv.conv_fprop(x, w, backend="numpy"), rtol=1e-5, atol=1e-5)


def test_non_describable_strides_are_copied_not_refused():
    backend, fe = fake_backend()
    rng = np.random.default_rng(5)
    x = _rand(rng, (2, 3, 6, 6), "float32")[:, :, ::-1]
    w = _rand(rng, (4, 3, 3, 3), "float32")
    np.testing.assert_allclose(xconv.conv_fprop(x, w, backend=backend), xconv.conv_fprop(x, w, backend="numpy"),
                               rtol=1e-5, atol=1e-5)


# ---- fallbacks decided once per key -------------------------------------------------------------


def _refuse_when(predicate, reason="not supported"):
    return lambda graph: reason if predicate(graph) else ""


def _node_attrs(graph):
    return [n[2] for n in graph.nodes if n[0].startswith("conv")]


def test_asymmetric_padding_falls_back_to_core_padding():
    asym = lambda g: any(a["pre_padding"] != a["post_padding"] for a in _node_attrs(g))  # noqa: E731
    backend, fe = fake_backend(refuse=_refuse_when(asym))
    case = CASES[1]
    rng = np.random.default_rng(6)
    x, w = _rand(rng, case["input"], "float32"), _rand(rng, case["weight"], "float32")
    dy = _rand(rng, xconv.output_shape(case["input"], case["weight"], **_conv_kwargs(case)), "float32")
    got = xconv.convolution_backward(dy, x, w, backend=backend, **_conv_kwargs(case))
    want = xconv.convolution_backward(dy, x, w, backend="numpy", **_conv_kwargs(case))
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    delegates = {k[0]: e.delegate for k, e in backend.cache._entries.items() if e.kind == "delegate"}
    assert delegates.get("dgrad") == "symmetric" and delegates.get("wgrad_bgrad") == "unfused"
    assert not any(asym(g) for g, _ in fe.executions)
    builds = fe.builds
    xconv.convolution_backward(dy, x, w, backend=backend, **_conv_kwargs(case))
    assert fe.builds == builds                            # the decision is cached


def test_strided_layouts_fall_back_to_copies():
    def strided(graph):
        return any(not is_packed_nchw(t.dim, t.stride) for t in graph.tensors)

    backend, fe = fake_backend(refuse=_refuse_when(strided))
    rng = np.random.default_rng(7)
    x = _channels_last(_rand(rng, (2, 3, 6, 6), "float32"))
    w = _rand(rng, (4, 3, 3, 3), "float32")
    np.testing.assert_allclose(xconv.conv_fprop(x, w, padding=1, backend=backend),
                               xconv.conv_fprop(x, w, padding=1, backend="numpy"), rtol=1e-5, atol=1e-5)
    kinds = sorted(e.delegate or e.kind for e in backend.cache._entries.values())
    assert kinds == ["contiguous", "plan"]


def test_fused_bias_falls_back_to_separate_graphs_and_cupy():
    fused = lambda g: len(g.nodes) > 1 or any(n[0] == "reduction" for n in g.nodes)  # noqa: E731
    backend, fe = fake_backend(refuse=_refuse_when(fused))
    rng = np.random.default_rng(8)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    dy, bias = _rand(rng, (2, 4, 4, 4), "float32"), _rand(rng, (4,), "float32")
    got = xconv.convolution_backward(dy, x, w, backend=backend)
    want = xconv.convolution_backward(dy, x, w, backend="numpy")
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xconv.conv_fprop(x, w, bias=bias, backend=backend),
                               xconv.conv_fprop(x, w, bias=bias, backend="numpy"), rtol=1e-5, atol=1e-5)
    delegates = {k[0]: e.delegate for k, e in backend.cache._entries.items() if e.kind == "delegate"}
    assert delegates == {"wgrad_bgrad": "unfused", "bgrad": "cupy", "fprop_bias": "unfused"}


def test_unfused_mode_never_builds_fused_graphs():
    backend, fe = fake_backend()
    backend.fuse_bias = False
    rng = np.random.default_rng(9)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    dy, bias = _rand(rng, (2, 4, 4, 4), "float32"), _rand(rng, (4,), "float32")
    xconv.convolution_backward(dy, x, w, backend=backend)
    xconv.conv_fprop(x, w, bias=bias, backend=backend)
    assert all(len(g.nodes) == 1 for g in fe.graphs)


# ---- determinism, math and dtype refusals ----------------------------------------------------


def test_deterministic_refusal_before_any_work():
    only_atomic = lambda g: [("NONDETERMINISTIC",)] if any(n[0] == "conv_wgrad" for n in g.nodes) else [()]  # noqa: E731
    backend, fe = fake_backend()
    fe.engine_rule = only_atomic
    rng = np.random.default_rng(10)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    dy = _rand(rng, (2, 4, 4, 4), "float32")
    with pytest.raises(UnsupportedError, match="no deterministic engine") as info:
        xconv.conv_wgrad(x, dy, w.shape, deterministic=True, backend=backend)
    assert "backend 'cudnn'" in str(info.value) and "wgrad" in str(info.value)
    assert fe.executions == []
    builds = fe.builds
    with pytest.raises(UnsupportedError, match="no deterministic engine"):
        xconv.conv_wgrad(x, dy, w.shape, deterministic=True, backend=backend)
    assert fe.builds == builds                             # refused from the cache, nothing rebuilt
    dw = xconv.conv_wgrad(x, dy, w.shape, deterministic=False, backend=backend)
    np.testing.assert_allclose(dw, xconv.conv_wgrad(x, dy, w.shape, backend="numpy"), rtol=1e-5, atol=1e-5)


def test_deterministic_bias_gradient_uses_a_deterministic_reduction():
    backend, fe = fake_backend()
    rng = np.random.default_rng(11)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    dy = _rand(rng, (2, 4, 4, 4), "float32")
    a = xconv.convolution_backward(dy, x, w, deterministic=True, backend=backend)
    b = xconv.convolution_backward(dy, x, w, deterministic=True, backend=backend)
    for u, v in zip(a, b):
        assert u.tobytes() == v.tobytes()
    assert not any(n[0] == "reduction" for g in fe.graphs for n in g.nodes)
    assert all("NONDETERMINISTIC" in dict.fromkeys(c[1]) for g in fe.graphs for c in g.calls
               if c[0] == "deselect_numeric_notes")


def test_keep_dtype_refusal_names_the_math_mode():
    backend, fe = fake_backend(engines=[("TENSOR_CORE",)])
    rng = np.random.default_rng(12)
    x, w = _rand(rng, (1, 2, 5, 5), "float32"), _rand(rng, (3, 2, 3, 3), "float32")
    with pytest.raises(UnsupportedError, match="math='keep_dtype'.*allow_tf32 may admit one"):
        xconv.conv_fprop(x, w, backend=backend)
    y = xconv.conv_fprop(x, w, math="allow_tf32", backend=backend)
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, backend="numpy"), rtol=1e-5, atol=1e-5)
    half = xconv.conv_fprop(x.astype(np.float16), w.astype(np.float16), backend=backend)   # math irrelevant
    assert half.dtype == np.float16


def test_float64_refusal_is_precise():
    no_double = lambda g: "no DOUBLE engine" if g.kwargs["io_data_type"] == "DOUBLE" else ""  # noqa: E731
    backend, fe = fake_backend(refuse=no_double)
    x, w = np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3))
    with pytest.raises(UnsupportedError, match="cuDNN has no float64 engine for this configuration: fprop float64"):
        xconv.conv_fprop(x, w, backend=backend)
    assert fe.executions == []


def test_shape_errors_still_come_from_the_core():
    backend, _ = fake_backend()
    with pytest.raises(ShapeError):
        xconv.conv_fprop(np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 3, 3, 3), np.float32), backend=backend)


# ---- execution errors, autotune, empty tensors ----------------------------------------------


def test_execution_failure_becomes_backend_error():
    backend, fe = fake_backend()
    fe.fail_execute = "cudnnBackendExecute failed with message: boom, and code: CUDNN_STATUS_EXECUTION_FAILED_CUDART"
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(BackendError) as info:
        xconv.conv_fprop(x, w, backend=backend)
    assert info.value.status == 5003 and info.value.status_name == "CUDNN_STATUS_EXECUTION_FAILED_CUDART"
    assert info.value.call == "fprop execute"


def test_autotune_mode_times_candidates_once_per_key(monkeypatch):
    monkeypatch.setenv("XCONV_CUDNN_BENCHMARK", "1")
    backend, fe = fake_backend(engines=[(), (), ("NONDETERMINISTIC",), ()], plan_times=(3.0, 1.0, 0.5, 2.0))
    rng = np.random.default_rng(13)
    x, w = _rand(rng, (2, 3, 6, 6), "float32"), _rand(rng, (4, 3, 3, 3), "float32")
    y = xconv.conv_fprop(x, w, deterministic=True, backend=backend)
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, backend="numpy"), rtol=1e-5, atol=1e-5)
    (entry,) = [e for e in backend.cache._entries.values() if e.kind == "plan"]
    assert entry.plan_index == 1 and [i for i, _ in entry.timings] == [0, 1, 3]   # plan 2 deselected
    assert entry.workspace == 128 * 2
    assert fe.executions[-1][1] == 1                      # the call itself ran the fastest plan
    timed = len(fe.executions)
    xconv.conv_fprop(x, w, deterministic=True, backend=backend)
    assert len(fe.executions) == timed + 1 and fe.executions[-1][1] == 1
    assert next(iter(backend.cache.keys()))[-1] is True   # autotune is part of the key
    monkeypatch.delenv("XCONV_CUDNN_BENCHMARK")
    xconv.conv_fprop(x, w, deterministic=True, backend=backend)
    assert fe.executions[-1][1] is None and len(backend.cache) == 2


def test_empty_tensors_never_reach_the_backend():
    backend, fe = fake_backend()
    x, w = np.zeros((0, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    dy = np.zeros((0, 3, 3, 3), np.float32)
    dx, dw, db = xconv.convolution_backward(dy, x, w, backend=backend)
    assert dx.shape == x.shape and not dw.any() and db.shape == (3,)
    assert fe.graphs == []


def test_bias_is_added_in_the_bias_dtype_path():
    backend, fe = fake_backend()
    x, w = np.ones((1, 2, 4, 4), np.float16), np.ones((3, 2, 1, 1), np.float16)
    bias = np.arange(3, dtype=np.float16)
    y = xconv.conv_fprop(x, w, bias=bias, backend=backend)
    assert y.dtype == np.float16 and np.array_equal(y[0, :, 0, 0], np.array([2, 3, 4], np.float16))


def test_host_path_is_cheap_on_a_cache_hit():
    """Not the GPU number (benchmarks/gpu_check.py measures that); guards against slow Python in the hit path."""
    backend, fe = fake_backend()
    p = _p((1, 1, 2, 2), (1, 1, 1, 1))
    x, w = np.ones(p.input_shape, np.float32), np.ones(p.weight_shape, np.float32)
    fe_run = FakeGraph._run
    FakeGraph._run = lambda self, pack, ws: None           # time only the backend's own work
    try:
        backend.fprop(x, w, None, p)
        start = time.perf_counter()
        for _ in range(2000):
            backend.fprop(x, w, None, p)
        per_call = (time.perf_counter() - start) / 2000
    finally:
        FakeGraph._run = fe_run
    assert per_call < 200e-6, f"{per_call * 1e6:.1f} us per cached call on the CPU fake"


def test_entry_dataclass_defaults():
    e = Entry("delegate", delegate="cupy")
    assert e.plan_index is None and e.inputs == () and dataclasses.asdict(e)["delegate"] == "cupy"


def test_cupy_fallbacks_handle_bfloat16_bit_patterns():
    """CuPy has no bfloat16: bf16 data arrives as int16 bits; the fallbacks widen and round to nearest-even."""
    import ml_dtypes

    rt = driver.CupyRuntime.__new__(driver.CupyRuntime)
    rt.cp = np                                             # NumPy stands in for CuPy (same array API)
    rng = np.random.default_rng(14)
    vals = rng.standard_normal((3, 4, 5, 5)).astype(np.float32) * 100
    bf = vals.astype(ml_dtypes.bfloat16)
    bits = bf.view(np.int16)
    assert np.array_equal(rt._widen(bits, np.float32), bf.astype(np.float32))
    assert np.array_equal(rt._narrow(vals, bits).view(ml_dtypes.bfloat16), bf)
    total = rt.sum_bias(bits, "bfloat16")
    assert total.dtype == np.int16
    assert np.array_equal(total.view(ml_dtypes.bfloat16), bf.astype(np.float32).sum(axis=(0, 2, 3)).astype(bf.dtype))
    bias = rng.standard_normal(4).astype(ml_dtypes.bfloat16)
    y = rt.add_bias(bits.copy(), bias.view(np.int16))
    want = (bf.astype(np.float32) + bias.astype(np.float32).reshape(1, -1, 1, 1)).astype(bf.dtype)
    assert np.array_equal(y.view(ml_dtypes.bfloat16), want)
    nan = rt._narrow(np.array([np.nan], np.float32), bits[:1, 0, 0, :1].reshape(1))
    assert np.isnan(nan.view(ml_dtypes.bfloat16).astype(np.float32)).all()
    np.testing.assert_allclose(rt.sum_bias(vals, "float32"), vals.sum(axis=(0, 2, 3)), rtol=1e-5)


def test_conformance_corpus_through_the_backend_on_the_fake_frontend():
    """Every conformance case through the core's legalization, this backend's graphs, caches and
    fallbacks, with the fake executing each graph with the NumPy reference (the orchestration, not cuDNN)."""
    kit = pytest.importorskip("xconv_conformance")
    backend, fe = fake_backend()
    outcomes = [kit.run_case(case, backend) for case in kit.load_corpus()]
    refused = {o.case_id for o in outcomes if o.status == "refused" and "batch-invariant" in o.message}
    assert refused == {c.id for c in kit.load_corpus() if c.deterministic == "batch_invariant"}   # cannot prove it
    bad = [(o.case_id, o.status, o.message.strip().splitlines()[:1]) for o in outcomes
           if o.status != "passed" and o.case_id not in refused]
    assert not bad, bad[:10]
    assert len(fe.graphs) > 100 and fe.executions


def test_extras_pin_validated_frontend_ranges_that_agree_with_the_driver_minimum():
    """pyproject's cuda12/cuda13/test pins: the ranges validated (docs/cudnn-backend.md), floors = MIN_FRONTEND."""
    import pathlib  # noqa: PLC0415
    import tomllib  # noqa: PLC0415

    extras = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    floor = ".".join(map(str, driver.MIN_FRONTEND))
    assert f"nvidia-cudnn-frontend>={floor},<1.29" in extras["cuda12"]      # 1.29 pulls CUDA 13 bindings
    assert "nvidia-cudnn-frontend>=1.14,<1.30" in extras["cuda13"]           # 1.30 needs the driver in validate()
    assert "nvidia-cudnn-frontend==1.14.1" in extras["test"]
    assert any(r.startswith("nvidia-cudnn-cu12==") for r in extras["test"])
    assert not any(r.startswith("cupy") for r in extras["test"])            # no GPU package in CI


def test_cached_plan_runs_on_any_thread_with_that_threads_handle():
    """Contract: the plan cache is shared by all threads; a cached graph runs on whichever thread calls, with
    that thread's own cuDNN handle (one per thread and device, bound to its current stream), never another's."""
    import threading  # noqa: PLC0415

    backend, fe = fake_backend()
    seen = []

    class PerThreadHandles(NumpyRuntime):
        def handle(self, device):
            return f"handle-{threading.get_ident()}-{device}"

    backend._runtime = PerThreadHandles(fe)
    real_execute = FakeGraph.execute

    def execute(self, pack, workspace, handle=None):
        seen.append((threading.get_ident(), handle))
        return real_execute(self, pack, workspace, handle)

    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    FakeGraph.execute = execute
    try:
        xconv.conv_fprop(x, w, backend=backend)
        builds = fe.builds
        barrier = threading.Barrier(3)    # all alive together: distinct thread idents

        def call():
            barrier.wait()
            xconv.conv_fprop(x, w, backend=backend)
            barrier.wait()

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        FakeGraph.execute = real_execute
    assert fe.builds == builds                      # the plan built on the main thread was reused
    assert len(seen) == 4 and len({ident for ident, _ in seen}) == 4
    assert all(handle == f"handle-{ident}-0" for ident, handle in seen)
