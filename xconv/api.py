"""The public convolution functions. Each validates once, selects a backend, then legalizes and runs."""

from __future__ import annotations

from collections.abc import Sequence

from . import interop, legalize, tracing
from .arrays import common_family
from .errors import ShapeError
from .params import (check_bias_sizes, check_grad_output, check_output_mask, common_dtype, make_params,
                     tensor_shape)
from .registry import select_backend


def _prepare(tensors: dict, input_shape, weight_shape, backend, bias=None, bias_sizes=None, **conv):
    """Validate the tensors and parameters, pick the backend; return (backend, params, shapes).

    ``input_shape``/``weight_shape`` are names of entries in ``tensors`` or explicit shapes.
    """
    shapes = {name: tensor_shape(a, name) for name, a in tensors.items()}
    arrays = dict(tensors, bias=bias)
    dtype = common_dtype(arrays)
    p = make_params(_resolve(input_shape, shapes, "input_shape"), _resolve(weight_shape, shapes, "weight_shape"),
                    dtype=dtype, **conv)
    if "grad_output" in shapes:
        check_grad_output(p, shapes["grad_output"])
    if bias is not None and tuple(getattr(bias, "shape", ())) != (p.bias_size,):
        raise ShapeError("bias", "must be 1-D of length C_out", expected=(p.bias_size,),
                         given=tuple(getattr(bias, "shape", ())))
    check_bias_sizes(p, bias_sizes)
    b = select_backend(backend, common_family(arrays))
    legalize.check_supported(b, p)
    return b, p


def _resolve(value, shapes: dict, name: str) -> tuple[int, ...]:
    """The shape of the tensor named ``value``, or ``value`` itself checked to be a sequence of ints."""
    if isinstance(value, str) and value in shapes:
        return shapes[value]
    if (not isinstance(value, Sequence) or isinstance(value, str)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ShapeError(name, "must be a sequence of ints", expected="(N, C, *spatial) ints", given=repr(value))
    return tuple(value)


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
    grad_output, input, weight = map(interop.to_native, (grad_output, input, weight))
    b, p = _prepare({"grad_output": grad_output, "input": input, "weight": weight}, "input", "weight", backend,
                    bias_sizes=bias_sizes, stride=stride, padding=padding, dilation=dilation, groups=groups,
                    transposed=transposed, output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    results = tracing.run("backward", b, p, lambda: legalize.backward(b, grad_output, input, weight, p, mask))
    return tuple(interop.to_family(r, family) for r in results)


def conv_fprop(input, weight, *, bias=None, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """The convolution of ``input`` with ``weight`` plus ``bias``; transposed=True is PyTorch's conv_transpose."""
    family = common_family({"input": input, "weight": weight, "bias": bias})
    input, weight, bias = map(interop.to_native, (input, weight, bias))
    b, p = _prepare({"input": input, "weight": weight}, "input", "weight", backend, bias=bias, stride=stride,
                    padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    return interop.to_family(tracing.run("fprop", b, p, lambda: legalize.fprop(b, input, weight, bias, p)), family)


def conv_dgrad(grad_output, weight, input_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """grad_input of the convolution whose input has ``input_shape``, given ``grad_output`` and ``weight``."""
    family = common_family({"grad_output": grad_output, "weight": weight})
    grad_output, weight = map(interop.to_native, (grad_output, weight))
    b, p = _prepare({"grad_output": grad_output, "weight": weight}, input_shape, "weight", backend, stride=stride,
                    padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    return interop.to_family(tracing.run("dgrad", b, p, lambda: legalize.dgrad(b, grad_output, weight, p)), family)


def conv_wgrad(input, grad_output, weight_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
               output_padding=0, deterministic=False, math="keep_dtype", backend=None, workspace_limit=None):
    """grad_weight (of ``weight_shape``) of the convolution of ``input``, given ``grad_output``."""
    family = common_family({"input": input, "grad_output": grad_output})
    input, grad_output = map(interop.to_native, (input, grad_output))
    b, p = _prepare({"input": input, "grad_output": grad_output}, "input", weight_shape, backend, stride=stride,
                    padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, math=math, deterministic=deterministic,
                    workspace_limit=workspace_limit)
    return interop.to_family(tracing.run("wgrad", b, p, lambda: legalize.wgrad(b, input, grad_output, p)), family)
