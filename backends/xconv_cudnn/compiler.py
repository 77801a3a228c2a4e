"""Translation of normalized xconv parameters into cuDNN frontend graph attributes.

Everything above :func:`build_graph` is pure Python over plain tuples: it never imports CuPy or
cuDNN and is tested on the CPU. :func:`build_graph` turns a :class:`GraphSpec` into a real
``cudnn.pygraph`` through the frontend module handed to it (the real ``cudnn`` on a GPU machine,
a recording fake in the CPU tests).

Operations (``GraphSpec.op``) and their tensors, all on direct convolutions (the core maps
transposed convolution onto these, see :mod:`xconv.legalize`):

============  ====================  ===============  ===========================================
op            inputs                outputs          cuDNN nodes
============  ====================  ===============  ===========================================
fprop         x, w                  y                conv_fprop(image=x, weight=w)
fprop_bias    x, w, bias            y                conv_fprop then bias(input, bias)
dgrad         dy, w                 dx               conv_dgrad(loss=dy, filter=w)
wgrad         x, dy                 dw               conv_wgrad(image=x, loss=dy)
wgrad_bgrad   x, dy                 dw, db           conv_wgrad and reduction(ADD) of dy
bgrad         dy                    db               reduction(ADD) of dy to (1, C, 1, ...)
============  ====================  ===============  ===========================================

Groups need no attribute: cuDNN infers them from the channel ratio, image ``(N, C_in, ...)``
against weight ``(C_out, C_in/groups, ...)``.
"""

from __future__ import annotations

import dataclasses
import math as _math

from xconv.params import ConvParams

#: cuDNN frontend ``data_type`` member for each xconv dtype.
CUDNN_DATA_TYPE = {"float16": "HALF", "bfloat16": "BFLOAT16", "float32": "FLOAT", "float64": "DOUBLE"}
#: Compute (accumulation) type of the convolution and reduction nodes for each xconv dtype.
COMPUTE_TYPE = {"float16": "FLOAT", "bfloat16": "FLOAT", "float32": "FLOAT", "float64": "DOUBLE"}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
#: Byte alignment cuDNN frontend tensors assume (Tensor_attributes::alignment defaults to 16).
ALIGNMENT = 16

CONV_OPS = ("fprop", "fprop_bias", "dgrad", "wgrad", "wgrad_bgrad")
OPS = CONV_OPS + ("bgrad",)
#: Operand names of each op, in the order the cache key lists their layouts.
OPERANDS = {
    "fprop": ("x", "w"),
    "fprop_bias": ("x", "w", "bias"),
    "dgrad": ("dy", "w"),
    "wgrad": ("x", "dy"),
    "wgrad_bgrad": ("x", "dy"),
    "bgrad": ("dy",),
}
#: The same op without its fused bias part (used when cuDNN cannot fuse).
UNFUSED = {"fprop_bias": "fprop", "wgrad_bgrad": "wgrad"}

#: Engine-config heuristics queried for candidates, in order (``cudnn.heur_mode`` members).
HEUR_MODES = ("A", "FALLBACK")

#: Numerical notes deselected for each math mode on float32 (``cudnn.numerical_note`` members).
#: TENSOR_CORE on float32 I/O means TF32; DOWN_CONVERT_INPUTS means inputs converted to a narrower
#: type; REDUCED_PRECISION_REDUCTION means accumulation narrower than float32. FFT engines are
#: also left out of keep_dtype: their error is bounded norm-wise, not per element, so a small
#: element of a large result may miss the per-element float32 bound the conformance kit checks.
_FLOAT32_DESELECT = {
    "keep_dtype": ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT"),
    "allow_tf32": ("DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"),
    "allow_fp16": ("REDUCED_PRECISION_REDUCTION",),
}
#: float16/bfloat16: math changes nothing (docs/semantics.md); tensor cores are their normal path;
#: accumulation stays float32 (no REDUCED_PRECISION_REDUCTION) and inputs are never narrowed
#: (no DOWN_CONVERT_INPUTS, which PyTorch's cuDNN path also always deselects).
#: float64: math concerns float32 work only; FP64 tensor cores (DMMA) are full precision.
_OTHER_DESELECT = {
    "float16": ("DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"),
    "bfloat16": ("DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"),
    "float64": ("DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT"),
}
NONDETERMINISTIC = "NONDETERMINISTIC"


@dataclasses.dataclass(frozen=True)
class MathPolicy:
    """How one (dtype, math) pair maps onto cuDNN: data/compute types and deselected notes."""

    io_type: str
    intermediate_type: str
    compute_type: str
    deselect: tuple[str, ...]

    @property
    def tf32(self) -> bool:
        """Whether TF32 tensor-core engines stay eligible (float32 I/O only)."""
        return self.io_type == "FLOAT" and "TENSOR_CORE" not in self.deselect


def math_policy(dtype: str, math: str) -> MathPolicy:
    io = CUDNN_DATA_TYPE[dtype]
    compute = COMPUTE_TYPE[dtype]
    deselect = _FLOAT32_DESELECT[math] if dtype == "float32" else _OTHER_DESELECT[dtype]
    return MathPolicy(io_type=io, intermediate_type=compute, compute_type=compute, deselect=deselect)


# ---------------------------------------------------------------------------------------------
# Layouts


def packed_strides(shape, order) -> tuple[int, ...]:
    """Element strides of a dense tensor of ``shape`` whose dims nest as ``order`` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(int(shape[axis]), 1)
    return tuple(strides)


def layout_orders(rank: int) -> dict[str, tuple[int, ...]]:
    """Dim nesting of the two layouts described natively: NCHW-like and channels-last (NHWC-like)."""
    return {"nchw": tuple(range(rank)), "nhwc": (0,) + tuple(range(2, rank)) + (1,)}


def describe_strides(shape, strides) -> tuple[int, ...] | None:
    """The element strides to give cuDNN for an array, or None when it must be copied first.

    Accepted: any array whose non-unit dims nest in NCHW order or channels-last order, with
    positive, non-overlapping strides (dense or padded, e.g. a crop of a larger buffer). The
    strides of unit dims are irrelevant to addressing (views like ``a[:, :, None]`` give them 0),
    so they are replaced by the value the layout's nesting implies. NCHW wins ties.
    """
    shape = tuple(int(n) for n in shape)
    strides = tuple(int(s) for s in strides)
    if len(shape) != len(strides):
        return None
    if any(s <= 0 for s, n in zip(strides, shape) if n > 1):
        return None
    for order in layout_orders(len(shape)).values():
        result = [0] * len(shape)
        inner_extent = 1  # elements spanned by the dims nested inside the current one
        ok = True
        for axis in reversed(order):
            n, s = shape[axis], strides[axis]
            if n == 1:
                result[axis] = inner_extent
                continue
            if s < inner_extent:
                ok = False
                break
            result[axis] = s
            inner_extent = s * n
        if ok:
            return tuple(result)
    return None


def is_packed_nchw(shape, strides) -> bool:
    """Whether ``strides`` address ``shape`` exactly like a C-contiguous array."""
    return all(s == p for s, p, n in zip(strides, packed_strides(shape, range(len(shape))), shape) if n > 1)


# ---------------------------------------------------------------------------------------------
# Graph specifications


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One graph tensor: ``dims`` and element ``strides`` as cuDNN sees them; ``shape`` of the array bound to it."""

    name: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    shape: tuple[int, ...]

    @property
    def data_type(self) -> str:
        return CUDNN_DATA_TYPE[self.dtype]


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """Everything :func:`build_graph` needs to build one cuDNN graph, and nothing else."""

    op: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    io_type: str
    intermediate_type: str
    compute_type: str
    math: str
    deterministic: bool
    deselect_notes: tuple[str, ...]
    heur_modes: tuple[str, ...] = HEUR_MODES
    autotune: bool = False
    workspace_limit: int | None = None      # engines needing more workspace are deselected

    def tensor(self, name: str) -> TensorSpec:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def without_filters(self, *, math: bool = True, determinism: bool = True) -> "GraphSpec":
        """This spec with the math and/or determinism note filters dropped (diagnosis only)."""
        keep = tuple(n for n in self.deselect_notes
                     if not ((determinism and n == NONDETERMINISTIC) or (math and n != NONDETERMINISTIC)))
        return dataclasses.replace(self, deselect_notes=keep)


def conv_attributes(p: ConvParams) -> dict[str, tuple[int, ...]]:
    """pre_padding, post_padding, stride and dilation of a direct convolution, one value per spatial dim."""
    if p.transposed:
        raise ValueError("cuDNN graphs describe direct convolutions; the core maps transposed ones onto them")
    return {"pre_padding": tuple(pre for pre, _ in p.padding), "post_padding": tuple(post for _, post in p.padding),
            "stride": tuple(p.stride), "dilation": tuple(p.dilation)}


def _packed(name: str, shape, dtype: str) -> TensorSpec:
    shape = tuple(shape)
    return TensorSpec(name, shape, packed_strides(shape, range(len(shape))), dtype, shape)


def _operand(name: str, shape, strides, dtype: str) -> TensorSpec:
    shape = tuple(shape)
    strides = packed_strides(shape, range(len(shape))) if strides is None else tuple(strides)
    return TensorSpec(name, shape, strides, dtype, shape)


def _channel_vector(name: str, channels: int, rank: int, dtype: str) -> TensorSpec:
    """A per-channel vector, bound to a (C,) array, seen by cuDNN as (1, C, 1, ...)."""
    dims = (1, channels) + (1,) * (rank - 2)
    return TensorSpec(name, dims, (channels, 1) + (1,) * (rank - 2), dtype, (channels,))


def graph_spec(op: str, p: ConvParams, strides: dict | None = None, *, autotune: bool = False,
               dy_shape: tuple[int, ...] | None = None) -> GraphSpec:
    """The graph for ``op`` on convolution ``p`` with operands of the given element strides.

    ``strides`` maps operand names (see :data:`OPERANDS`) to the strides from
    :func:`describe_strides`; a missing name means C-contiguous. Outputs are always C-contiguous
    (the backend contract). ``bgrad`` reads only ``dy_shape`` (default ``p.output_shape``), the
    dtype and the flags of ``p``, which may then be transposed; a 1-D ``dy`` gets a unit H so that
    every cuDNN tensor has rank 4 or 5.
    """
    if op not in OPS:
        raise ValueError(f"unknown cuDNN graph op {op!r} (known: {OPS})")
    strides = strides or {}
    dtype = p.dtype
    policy = math_policy(dtype, p.math)
    deselect = policy.deselect + ((NONDETERMINISTIC,) if p.deterministic else ())
    common = dict(op=op, io_type=policy.io_type, intermediate_type=policy.intermediate_type,
                  compute_type=policy.compute_type, math=p.math, deterministic=p.deterministic,
                  deselect_notes=deselect, autotune=autotune, workspace_limit=p.workspace_limit)
    if op == "bgrad":
        shape = tuple(dy_shape or p.output_shape)
        dy = _operand("dy", shape, strides.get("dy"), dtype)
        if len(shape) == 3:   # 1-D: described with a unit H, like the core's lift of 1-D convolutions
            dy = dataclasses.replace(dy, dims=shape[:2] + (1,) + shape[2:],
                                     strides=dy.strides[:2] + (dy.strides[2] * shape[2],) + dy.strides[2:])
        rank = len(dy.dims)
        zeros = (0,) * (rank - 2)
        ones = (1,) * (rank - 2)
        return GraphSpec(inputs=(dy,), outputs=(_channel_vector("db", shape[1], rank, dtype),),
                         pre_padding=zeros, post_padding=zeros, stride=ones, dilation=ones, **common)
    attrs = conv_attributes(p)
    rank = len(p.input_shape)
    x = _operand("x", p.input_shape, strides.get("x"), dtype)
    w = _operand("w", p.weight_shape, strides.get("w"), dtype)
    dy = _operand("dy", p.output_shape, strides.get("dy"), dtype)
    if op == "fprop":
        inputs, outputs = (x, w), (_packed("y", p.output_shape, dtype),)
    elif op == "fprop_bias":
        inputs = (x, w, _channel_vector("bias", p.output_shape[1], rank, dtype))
        outputs = (_packed("y", p.output_shape, dtype),)
    elif op == "dgrad":
        inputs, outputs = (dy, w), (_packed("dx", p.input_shape, dtype),)
    elif op == "wgrad":
        inputs, outputs = (x, dy), (_packed("dw", p.weight_shape, dtype),)
    else:  # wgrad_bgrad
        inputs = (x, dy)
        outputs = (_packed("dw", p.weight_shape, dtype), _channel_vector("db", p.output_shape[1], rank, dtype))
    return GraphSpec(inputs=inputs, outputs=outputs, **attrs, **common)


# ---------------------------------------------------------------------------------------------
# Cache keys


def operand_layout(shape, strides) -> object:
    """The layout part of a cache key: ``"C"`` for C-contiguous, else the described strides."""
    return "C" if strides is None or is_packed_nchw(shape, strides) else tuple(strides)


def plan_key(op: str, p: ConvParams, layouts: tuple, device: int, autotune: bool,
             dy_shape: tuple[int, ...] | None = None) -> tuple:
    """Everything that changes the plan, as a hashable tuple.

    ``p`` carries the shapes, dtype, stride, padding, dilation, groups, math and determinism;
    ``layouts`` the operands' strides (one :func:`operand_layout` per name in ``OPERANDS[op]``);
    ``op`` the direction and, through the fused ops, the output mask; then the device and
    whether plans are autotuned. Data pointers are not part of it: operands are always 16-byte
    aligned (the backend copies the rare misaligned view) and outputs are fresh allocations.
    For ``bgrad`` only the grad_output shape, dtype and determinism matter, so the key holds those
    (``p`` may then be a transposed convolution's parameters).
    """
    if op == "bgrad":
        shape = tuple(dy_shape or p.output_shape)
        return (op, shape, p.dtype, p.deterministic, layouts, device, autotune, p.workspace_limit)
    return (op, p, layouts, device, autotune)


# ---------------------------------------------------------------------------------------------
# Building the real graph


@dataclasses.dataclass
class BuiltGraph:
    """A cuDNN graph with its plans built, and what executing it needs."""

    graph: object
    uids: dict[str, int]
    workspace: int
    plan_count: int


def _enum(namespace, name: str):
    return getattr(namespace, name)


def _padding_kwargs(spec: GraphSpec) -> dict:
    return dict(pre_padding=list(spec.pre_padding), post_padding=list(spec.post_padding),
                stride=list(spec.stride), dilation=list(spec.dilation))


def declare_graph(fe, spec: GraphSpec, handle=None):
    """The cuDNN graph of ``spec`` declared on frontend ``fe``: (pygraph, tensors by name), not yet validated.

    Tensors and nodes, then the outputs marked with explicit dims, strides and data type (cuDNN
    cannot infer dgrad and wgrad output dims, and defaults unset output strides to NHWC). Needs
    neither a device nor a handle (``handle=None`` leaves the graph without one): the CPU tests
    validate every corpus graph through the real frontend with exactly this function.
    """
    dt = fe.data_type
    compute = _enum(dt, spec.compute_type)
    kwargs = dict(io_data_type=_enum(dt, spec.io_type), intermediate_data_type=_enum(dt, spec.intermediate_type),
                  compute_data_type=compute)
    if handle is not None:
        kwargs["handle"] = handle
    g = fe.pygraph(**kwargs)
    t = {}
    for ts in spec.inputs:
        t[ts.name] = g.tensor(name=ts.name, dim=list(ts.dims), stride=list(ts.strides),
                              data_type=_enum(dt, ts.data_type))
    produced = {}
    op = spec.op
    if op in ("fprop", "fprop_bias"):
        y = g.conv_fprop(image=t["x"], weight=t["w"], compute_data_type=compute, name="fprop", **_padding_kwargs(spec))
        if op == "fprop_bias":
            y = g.bias(input=y, bias=t["bias"], compute_data_type=compute, name="bias")
        produced["y"] = y
    elif op == "dgrad":
        produced["dx"] = g.conv_dgrad(loss=t["dy"], filter=t["w"], compute_data_type=compute, name="dgrad",
                                      **_padding_kwargs(spec))
    elif op in ("wgrad", "wgrad_bgrad"):
        produced["dw"] = g.conv_wgrad(image=t["x"], loss=t["dy"], compute_data_type=compute, name="wgrad",
                                      **_padding_kwargs(spec))
    if op in ("wgrad_bgrad", "bgrad"):
        produced["db"] = g.reduction(input=t["dy"], mode=fe.reduction_mode.ADD, compute_data_type=compute,
                                     name="bgrad")
    for ts in spec.outputs:
        out = produced[ts.name]
        # One call per setter: older bindings return copies from non-chaining setters.
        out.set_output(True)
        out.set_dim(list(ts.dims))
        out.set_stride(list(ts.strides))
        out.set_data_type(_enum(dt, ts.data_type))
        t[ts.name] = out
    return g, t


def build_graph(fe, spec: GraphSpec, handle) -> BuiltGraph:
    """Build, check and plan the cuDNN graph described by ``spec``; raise the frontend's errors.

    ``fe`` is the ``cudnn`` frontend module. Steps, in the frontend's required order:
    :func:`declare_graph`; ``validate`` (host only); ``build_operation_graph`` (needs the device);
    ``create_execution_plans`` with the heuristics modes; ``deselect_numeric_notes`` (math and
    determinism filters, applied to the engine configs just created); ``check_support``;
    ``build_plans`` (``ALL`` when autotuning, else ``HEURISTICS_CHOICE``, which builds the first
    supported plan).
    """
    g, t = declare_graph(fe, spec, handle)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([_enum(fe.heur_mode, m) for m in spec.heur_modes])
    if spec.deselect_notes:
        g.deselect_numeric_notes([_enum(fe.numerical_note, n) for n in spec.deselect_notes])
    if spec.workspace_limit is not None:
        g.deselect_workspace_greater_than(spec.workspace_limit)
    g.check_support()
    policy = fe.build_plan_policy.ALL if spec.autotune else fe.build_plan_policy.HEURISTICS_CHOICE
    g.build_plans(policy)
    uids = {name: int(tensor.get_uid()) for name, tensor in t.items()}
    count = int(g.get_execution_plan_count()) if spec.autotune else 1
    return BuiltGraph(graph=g, uids=uids, workspace=int(g.get_workspace_size()), plan_count=count)


def nbytes(shape, dtype: str) -> int:
    return _math.prod(shape) * ITEMSIZE[dtype]
