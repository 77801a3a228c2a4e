"""The public convolution functions. Each validates once, selects a backend, then legalizes and runs."""

from __future__ import annotations

import math

from . import guard, interop, legalize, limits, plan_cache, tracing
from .arrays import common_family, copies_needed, host_ready
from .dtypes import DTYPES
from .errors import ShapeError
from .params import (check_bias_sizes, check_grad_output, check_output_mask, common_dtype, make_params, shape_arg,
                     tensor_shape)
from .registry import select_backend


def _torch_route(family: str) -> object | None:
    """xconv.torch_functional for torch tensors (their calls run as xconv's torch operators: autograd, autocast,
    torch's memory format, torch.compile, torch.func), else None."""
    if family != "torch":
        return None
    from . import torch_functional, torch_ops  # the caller holds torch tensors, so torch is already imported

    return None if torch_ops.inside_kernel() else torch_functional


def _prepare(tensors: dict, backend, outputs, **args):
    """Validate the tensors and parameters, guard the call's memory, pick the backend; return (backend, params).

    A call identical in everything validation reads to one that passed before takes that one's
    result from its plan (see :mod:`xconv.plan_cache`); any other is validated by :func:`_validate`.
    """
    return plan_cache.prepared(tensors, backend, outputs, args, _validate, _guard_memory)


def _prepare_plan(tensors: dict, backend, outputs, **args):
    """:func:`_prepare`, and the cached plan the call was found in (None: validated now; see
    :func:`xconv.plan_cache.prepared_plan`)."""
    return plan_cache.prepared_plan(tensors, backend, outputs, args, _validate, _guard_memory)


def _runner(plan, op: str, mask=None):
    """The backend's runner kept on ``plan`` for a repeated call of NumPy arrays (:func:`xconv.plan_cache.runner`:
    what the backend's primitive does without its per-call decisions), or None: a first call, an open trace (the
    primitive runs, and is recorded), or no runner for the plan."""
    if plan is None or tracing.active():
        return None
    return plan_cache.runner(plan, op, mask)


def fprop_args(*, bias=None, stride=1, padding=0, dilation=1, groups=1, transposed=False, output_padding=0,
               deterministic=False, math="keep_dtype", workspace_limit=None) -> dict:
    """The keywords :func:`conv_fprop` validates (all but ``backend``), in the order of its plan's key."""
    return dict(bias=bias, stride=stride, padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                output_padding=output_padding, math=math, deterministic=deterministic, workspace_limit=workspace_limit)


def backward_args(*, bias_sizes=None, stride=1, padding=0, dilation=1, groups=1, transposed=False, output_padding=0,
                  deterministic=False, math="keep_dtype", workspace_limit=None) -> dict:
    """The keywords :func:`convolution_backward` validates (all but ``backend`` and ``output_mask``), in the order of
    its plan's key."""
    return dict(bias_sizes=bias_sizes, stride=stride, padding=padding, dilation=dilation, groups=groups,
                transposed=transposed, output_padding=output_padding, math=math, deterministic=deterministic,
                workspace_limit=workspace_limit)


def _validate(tensors: dict, backend, outputs, *, input_shape=None, weight_shape=None, bias=None, bias_sizes=None,
              **conv):
    """The checks of :func:`_prepare`, in full.

    The convolution's input and weight shapes come from ``tensors["input"]``/``tensors["weight"]``,
    or from the explicit ``input_shape``/``weight_shape`` arguments (conv_dgrad, conv_wgrad), which
    are then the arguments blamed for a disagreement with grad_output. ``outputs`` names the
    results the call makes ("input", "weight", "bias", "output").
    """
    shapes = {name: tensor_shape(a, name) for name, a in tensors.items()}
    arrays = dict(tensors, bias=bias)
    p = params_for(shapes, common_dtype(arrays), input_shape, weight_shape, **conv)
    if bias is not None and tuple(getattr(bias, "shape", ())) != (p.bias_size,):
        raise ShapeError("bias", "must be 1-D of length C_out", expected=(p.bias_size,),
                         given=tuple(getattr(bias, "shape", ())))
    check_bias_sizes(p, bias_sizes)
    family = common_family(arrays)
    b = select_backend(backend, family)
    legalize.check_supported(b, p)
    if family == "numpy":
        _guard_memory(b, p, outputs, arrays)
    return b, p


def params_for(shapes: dict, dtype: str, input_shape=None, weight_shape=None, **conv):
    """The validated ConvParams of a call whose tensors have ``shapes`` (name -> shape), with the input and
    weight shapes taken from ``shapes["input"]``/``shapes["weight"]`` or from the explicit ``input_shape``/
    ``weight_shape`` arguments (conv_dgrad, conv_wgrad), which are then the arguments blamed for a
    disagreement with the tensors. Every front end (NumPy and the torch operators) validates through it."""
    explicit_input, explicit_weight = input_shape is not None, weight_shape is not None
    in_shape = shape_arg(input_shape, "input_shape") if explicit_input else shapes["input"]
    w_shape = shape_arg(weight_shape, "weight_shape") if explicit_weight else shapes["weight"]
    p = make_params(in_shape, w_shape, dtype=dtype, input_name="input_shape" if explicit_input else "input",
                    weight_name="weight_shape" if explicit_weight else "weight", **conv)
    if "grad_output" in shapes:
        check_grad_output(p, shapes["grad_output"], blame=_blame(explicit_input, explicit_weight))
    return p


def _blame(explicit_input: bool, explicit_weight: bool):
    """Who is wrong when grad_output disagrees with the output shape: an explicit shape argument where the
    disagreeing dim follows from it (N and spatial dims from input_shape, C_out from weight_shape)."""
    def culprit(axis: int) -> str:
        if explicit_input and axis != 1:
            return "input_shape"
        if explicit_weight and axis != 0:
            return "weight_shape"
        return "grad_output"
    return culprit


def _guard_memory(backend, p, outputs, arrays) -> None:
    """Refuse (limits.ResourceError) a call whose results, explicit-padding copies and converted inputs
    would not fit in memory, before anything is allocated."""
    itemsize = DTYPES[p.dtype].itemsize
    shapes = {"input": p.input_shape, "weight": p.weight_shape, "bias": (p.bias_size,), "output": p.output_shape}
    extra = sum(copies_needed(a) for a in arrays.values())
    if not p.symmetric and p.nd not in backend.capabilities.asymmetric_padding:
        # the core pads explicitly: a padded copy of the (direct) input or (transposed) output
        grown = p.output_shape if p.transposed else p.input_shape
        extra += math.prod(grown[:2]) * math.prod(n + pre + post for n, (pre, post) in zip(grown[2:], p.padding)) * itemsize
    limits.check_call(itemsize, [shapes[o] for o in outputs], extra)


def _native(backend, family: str, **named):
    """Each named argument as the call's backend takes it: as it is when that backend declares its foreign
    ``family`` (a torch backend taking torch tensors), else native (a zero-copy DLPack view)."""
    if family in interop.NATIVE_FAMILIES:
        return list(named.values())              # to_native passes native arrays (and non-arrays) unchanged
    return interop.to_native_for(backend, family, named)


def _ready(**named):
    """Each named (validated) array as the backends take it (see arrays.host_ready)."""
    return [host_ready(a, name) for name, a in named.items()]


def convolution_backward(grad_output, input, weight, *, bias_sizes=None, stride=1, padding=0, dilation=1,
                         transposed=False, output_padding=0, groups=1, output_mask=(True, True, True),
                         deterministic=False, math="keep_dtype", backend=None,
                         workspace_limit=None):
    """(grad_input, grad_weight, grad_bias) of a convolution (or transposed convolution), as aten and aclnn.

    Entries whose ``output_mask`` bit is False are None and are not computed. ``bias_sizes``,
    when given, must be ``[C_out]`` (``[weight.shape[1] * groups]`` when transposed); when
    omitted the bias length is inferred from the weight. ``deterministic`` is False, True or
    "batch_invariant"; ``workspace_limit`` caps the backend's scratch bytes (default
    ``$XCONV_WORKSPACE_LIMIT``, else none); see docs/semantics.md.
    """
    mask = check_output_mask(output_mask)
    family = common_family({"grad_output": grad_output, "input": input, "weight": weight})
    if (route := _torch_route(family)) is not None:
        return route.convolution_backward(grad_output, input, weight, bias_sizes=bias_sizes, output_mask=mask,
                                          stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                                          output_padding=output_padding, groups=groups, deterministic=deterministic,
                                          math=math, backend=backend, workspace_limit=workspace_limit)
    grad_output, input, weight = _native(backend, family, grad_output=grad_output, input=input, weight=weight)
    outputs = [name for name, bit in zip(("input", "weight", "bias"), mask) if bit]
    b, p, plan = _prepare_plan({"grad_output": grad_output, "input": input, "weight": weight}, backend, outputs,
                               **backward_args(bias_sizes=bias_sizes, stride=stride, padding=padding,
                                               dilation=dilation, groups=groups, transposed=transposed,
                                               output_padding=output_padding, deterministic=deterministic, math=math,
                                               workspace_limit=workspace_limit))
    grad_output, input, weight = _ready(grad_output=grad_output, input=input, weight=weight)
    run = _runner(plan, "backward", mask) if any(mask) else None
    if run is not None:
        results = guard.call(b, "convolution_backward", run, grad_output, input, weight)
        if results is not NotImplemented:
            return tuple(interop.to_family(r, family) for r in legalize.checked_backward(b, results, p, mask))
    results = tracing.run("backward", b, p, lambda: guard.call(b, "convolution_backward", legalize.run_backward, b,
                                                                grad_output, input, weight, p, mask))
    return tuple(interop.to_family(r, family) for r in results)


def conv_fprop(input, weight, *, bias=None, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """The convolution of ``input`` with ``weight`` plus ``bias``; transposed=True is PyTorch's conv_transpose."""
    family = common_family({"input": input, "weight": weight, "bias": bias})
    if (route := _torch_route(family)) is not None:
        return route.conv_fprop(input, weight, bias=bias, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, transposed=transposed, output_padding=output_padding,
                                deterministic=deterministic, math=math, backend=backend,
                                workspace_limit=workspace_limit)
    input, weight, bias = _native(backend, family, input=input, weight=weight, bias=bias)
    b, p, plan = _prepare_plan({"input": input, "weight": weight}, backend, ["output"],
                               **fprop_args(bias=bias, stride=stride, padding=padding, dilation=dilation,
                                            groups=groups, transposed=transposed, output_padding=output_padding,
                                            deterministic=deterministic, math=math, workspace_limit=workspace_limit))
    input, weight, bias = _ready(input=input, weight=weight, bias=bias)
    run = _runner(plan, "fprop")
    if run is not None:
        y = guard.call(b, "conv_fprop", run, input, weight, bias)
        if y is not NotImplemented:
            return interop.to_family(legalize._expect(b, y, p.output_shape, "fprop output"), family)
    return interop.to_family(tracing.run("fprop", b, p, lambda: guard.call(b, "conv_fprop", legalize.run_fprop, b,
                                                                             input, weight, bias, p)), family)


def conv_dgrad(grad_output, weight, input_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """grad_input of the convolution whose input has ``input_shape``, given ``grad_output`` and ``weight``."""
    family = common_family({"grad_output": grad_output, "weight": weight})
    if (route := _torch_route(family)) is not None:
        return route.conv_dgrad(grad_output, weight, input_shape, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, transposed=transposed, output_padding=output_padding,
                                deterministic=deterministic, math=math, backend=backend,
                                workspace_limit=workspace_limit)
    grad_output, weight = _native(backend, family, grad_output=grad_output, weight=weight)
    b, p = _prepare({"grad_output": grad_output, "weight": weight}, backend, ["input"], input_shape=input_shape,
                    stride=stride, padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    grad_output, weight = _ready(grad_output=grad_output, weight=weight)
    return interop.to_family(tracing.run("dgrad", b, p, lambda: guard.call(b, "conv_dgrad", legalize.dgrad, b,
                                                                             grad_output, weight, p)), family)


def conv_wgrad(input, grad_output, weight_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """grad_weight (of ``weight_shape``) of the convolution of ``input``, given ``grad_output``."""
    family = common_family({"input": input, "grad_output": grad_output})
    if (route := _torch_route(family)) is not None:
        return route.conv_wgrad(input, grad_output, weight_shape, stride=stride, padding=padding, dilation=dilation,
                                groups=groups, transposed=transposed, output_padding=output_padding,
                                deterministic=deterministic, math=math, backend=backend,
                                workspace_limit=workspace_limit)
    input, grad_output = _native(backend, family, input=input, grad_output=grad_output)
    b, p = _prepare({"input": input, "grad_output": grad_output}, backend, ["weight"], weight_shape=weight_shape,
                    stride=stride, padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    input, grad_output = _ready(input=input, grad_output=grad_output)
    return interop.to_family(tracing.run("wgrad", b, p, lambda: guard.call(b, "conv_wgrad", legalize.wgrad, b, input,
                                                                             grad_output, p)), family)
