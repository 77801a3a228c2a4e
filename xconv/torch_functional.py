"""The functional API on torch tensors: ``xconv.conv_fprop`` and its siblings as xconv's torch operators.

:mod:`xconv.api` hands calls on torch tensors here (outside the operators' kernels). Each call is
validated as the core validates NumPy arrays (same checks, same errors), cast as torch's autocast
casts a convolution, and run as one operator of :mod:`xconv.torch_ops`, so the result carries the
autograd graph, works under torch.func transforms, and compiles (see :func:`_params` for symbolic sizes).
"""

from typing import Optional

import torch

from xconv import torch_shapes, workspace
from xconv.errors import ShapeError
from xconv.params import (_is_int, check_bias_sizes, check_deterministic, check_flag, check_math, check_output_mask,
                          common_dtype, parse_padding, per_dim, string_padding, tensor_shape)
from xconv.torch_ops import Conf, backend_token, backward, dgrad, fprop, wgrad

def autocast(*tensors):
    """``tensors`` cast as torch's autocast casts a convolution's operands, when autocast is on for their device.

    torch lists the convolutions among its lower-precision ops: every floating operand that is
    not float64 is cast to the autocast dtype (``torch.get_autocast_dtype``).
    """
    first = next((t for t in tensors if t is not None), None)
    if first is None:
        return tensors
    device = first.device.type
    if device not in ("cpu", "cuda") or not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


class _Meta:
    """What validation reads of a tensor: its shape and dtype (so it runs on constants under torch.compile)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


@torch.compiler.assume_constant_result  # under torch.compile: validated once, at trace time
def _validate(metas: tuple, input_shape, weight_shape, conv: tuple, backend: Optional[str], bias_sizes=None) -> tuple:
    """Validate as the core does (tensor shapes and dtypes first, then the convolution).

    ``metas`` holds (name, shape, dtype name) per tensor; returns (op arguments, input shape,
    weight shape, bias length).
    """
    from xconv.api import params_for

    tensors = {name: _Meta(shape, dtype) for name, shape, dtype in metas}
    shapes = {name: tensor_shape(t, name) for name, t in tensors.items() if name != "bias"}
    conv = dict(conv)
    p = params_for(shapes, common_dtype(tensors), None if input_shape == "input" else input_shape,
                   None if weight_shape == "weight" else weight_shape, **conv)
    if "bias" in tensors and tuple(tensors["bias"].shape) != (p.bias_size,):
        raise ShapeError("bias", "must be 1-D of length C_out", expected=(p.bias_size,),
                         given=tuple(tensors["bias"].shape))
    check_bias_sizes(p, list(bias_sizes) if isinstance(bias_sizes, tuple) else bias_sizes)
    conf = Conf.from_params(p, conv["deterministic"], conv["math"], backend)
    return conf.args(), list(p.input_shape), list(p.weight_shape), p.bias_size


def _params(tensors: dict, input_shape, weight_shape, conv: dict, bias_sizes=None) -> tuple:
    """(op arguments, input shape, weight shape, bias length) of a call on torch tensors, validated.

    On symbolic sizes (torch.compile with dynamic shapes, torch.export with a Dim) see :func:`_symbolic_params`.
    """
    if any(t is not None and not hasattr(t, "shape") for t in tensors.values()):  # the core's message names it
        common_dtype(tensors)
    if torch.compiler.is_compiling() or torch_shapes.is_symbolic(
            input_shape, weight_shape, *(t.shape for t in tensors.values() if t is not None)):
        return _symbolic_params(tensors, input_shape, weight_shape, conv, bias_sizes)  # Dynamo: any size may be
    metas = tuple((name, tuple(t.shape), str(t.dtype) if hasattr(t, "dtype") else type(t).__name__)
                  for name, t in tensors.items() if t is not None)
    items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in conv.items() if k != "backend")
    if isinstance(input_shape, list):
        input_shape = tuple(input_shape)
    if isinstance(weight_shape, list):
        weight_shape = tuple(weight_shape)
    if isinstance(bias_sizes, list):
        bias_sizes = tuple(bias_sizes)
    return _validate(metas, input_shape, weight_shape, items, backend_token(conv.get("backend")), bias_sizes)


def _normalize(nd: int, conv: dict, backend: Optional[str]) -> tuple:
    """The checks of the core that read no size, and the op arguments they normalize (a padding string is
    left for :func:`xconv.params.string_padding`: the arguments hold a placeholder, the string comes second).

    Plain Python on the call's constants, traced by Dynamo (not ``assume_constant_result``, which cannot
    take the ints a compiled function closes over). The tensors' ranks and dtypes and every check that
    reads a size run in the operators' fake kernels (:mod:`xconv.torch_shapes`) and again, on ints, in
    their kernels.
    """
    groups = conv.get("groups", 1)
    if not _is_int(groups) or groups < 1:
        raise ShapeError("groups", "must be an int >= 1", expected=">= 1", given=repr(groups))
    transposed = check_flag(conv.get("transposed", False), "transposed")
    stride = per_dim(conv.get("stride", 1), nd, "stride", 1)
    dilation = per_dim(conv.get("dilation", 1), nd, "dilation", 1)
    output_padding = per_dim(conv.get("output_padding", 0), nd, "output_padding", 0)
    padding = conv.get("padding", 0)
    pairs = parse_padding(padding, nd, (1,) * nd, (1,) * nd, stride, dilation, transposed)  # names a bad padding
    string = padding if isinstance(padding, str) else None
    conf = Conf(stride, pairs, dilation, groups, transposed, output_padding,
                check_deterministic(conv.get("deterministic", False)), check_math(conv.get("math", "keep_dtype")),
                backend, _workspace_limit(conv.get("workspace_limit")))
    return conf.args(), string


def _workspace_limit(value) -> Optional[int]:
    """``workspace_limit`` checked; None: the environment's default, read once at trace time under torch.compile."""
    return _default_workspace_limit() if value is None else workspace.resolve_limit(value)


@torch.compiler.assume_constant_result  # the settings snapshot reads os.environ's storage: not for Dynamo to trace
def _default_workspace_limit() -> Optional[int]:
    return workspace.resolve_limit(None)


def _symbolic_params(tensors: dict, input_shape, weight_shape, conv: dict, bias_sizes) -> tuple:
    """:func:`_params` on symbolic sizes: what reads no size is checked by :func:`_normalize`, a padding string is resolved by the core's formulas on the symbols, and the checks that
    read sizes are the operator's fake kernel's (guards; :mod:`xconv.torch_shapes`). Traced, not converted."""
    in_shape = tuple(tensors["input"].shape if input_shape == "input" else input_shape)
    w_shape = tuple(tensors["weight"].shape if weight_shape == "weight" else weight_shape)
    args, string = _normalize(max(len(in_shape) - 2, 1), conv, backend_token(conv.get("backend")))
    stride, _, dilation, groups, transposed = args[:5]
    if string is not None:
        pairs = string_padding(string, in_shape[2:], w_shape[2:], stride, dilation)
        args = args[:1] + ([v for pair in pairs for v in pair],) + args[2:]
    c_out = w_shape[1] * groups if transposed else w_shape[0]
    if bias_sizes is not None and (len(bias_sizes) != 1 or bias_sizes[0] != c_out):
        what = "[weight.shape[1] * groups]" if transposed else "[weight.shape[0]]"
        raise ShapeError("bias_sizes", f"must be {what}", expected=[c_out], given=repr(bias_sizes))
    return args, list(in_shape), list(w_shape), c_out


def conv_fprop(input, weight, bias=None, **conv):
    """``xconv.conv_fprop`` on torch tensors, as the ``xconv::fprop`` operator (differentiable)."""
    input, weight, bias = autocast(input, weight, bias)
    args, _, _, _ = _params({"input": input, "weight": weight, "bias": bias}, "input", "weight", conv)
    return fprop(input, weight, bias, *args)


def conv_dgrad(grad_output, weight, input_shape, **conv):
    """``xconv.conv_dgrad`` on torch tensors, as ``xconv::dgrad`` (differentiable in grad_output and weight)."""
    grad_output, weight = autocast(grad_output, weight)
    args, in_shape, _, _ = _params({"grad_output": grad_output, "weight": weight}, input_shape, "weight", conv)
    return dgrad(grad_output, weight, in_shape, *args)


def conv_wgrad(input, grad_output, weight_shape, **conv):
    """``xconv.conv_wgrad`` on torch tensors, as ``xconv::wgrad`` (differentiable in input and grad_output)."""
    input, grad_output = autocast(input, grad_output)
    args, _, w_shape, _ = _params({"input": input, "grad_output": grad_output}, "input", weight_shape, conv)
    return wgrad(input, grad_output, w_shape, *args)


def convolution_backward(grad_output, input, weight, bias_sizes=None, output_mask=(True, True, True), **conv):
    """``xconv.convolution_backward`` on torch tensors, as ``xconv::backward`` (differentiable); masked entries None."""
    mask = check_output_mask(output_mask)
    grad_output, input, weight = autocast(grad_output, input, weight)
    args, _, _, _ = _params({"grad_output": grad_output, "input": input, "weight": weight}, "input", "weight",
                            conv, bias_sizes)
    results = backward(grad_output, input, weight, list(mask), *args)
    return tuple(r if bit else None for r, bit in zip(results, mask))
