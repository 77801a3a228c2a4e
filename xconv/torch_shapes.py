"""Shapes of xconv's torch operators on concrete and symbolic sizes (``torch.SymInt``).

Under ``torch.compile`` with dynamic shapes and under ``torch.export`` with a ``Dim``, the operators'
fake kernels see sizes that are symbols with a hint (the value of the example being traced). Each
check here works on both kinds, without converting a symbol to an int (which would specialize it):

1. the core's own validation (:func:`xconv.api.params_for`, the same checks and messages as an eager
   call) runs on the hints, so a call that is wrong for the example raises the core's error;
2. every check of the core that reads a size is then stated on the symbols as a guard
   (``torch._check``): the compiled graph is reused only for sizes that pass it, and any other size
   recompiles, so its error is raised by step 1 for that size;
3. the output shape comes from the core's formulas (:func:`xconv.params.direct_output_size`,
   :func:`~xconv.params.transposed_output_size`) applied to the symbols.

On plain ints steps 2 and 3 reduce to what step 1 computed.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx.experimental.symbolic_shapes import guard_int, guarding_hint_or_throw

from xconv.errors import ShapeError
from xconv.params import common_dtype, direct_output_size, transposed_output_size


def is_symbolic(*shapes) -> bool:
    """Whether any size in ``shapes`` (sequences of sizes; None and non-sequences skipped) is a SymInt."""
    return any(isinstance(s, torch.SymInt) for shape in shapes if isinstance(shape, (tuple, list, torch.Size))
               for s in shape)


def hint(size):
    """The concrete value of a size: an int as is, a SymInt's hint (the traced example's value; no guard)."""
    return guarding_hint_or_throw(size) if isinstance(size, torch.SymInt) else size


def hints(shape) -> tuple:
    return tuple(hint(s) for s in shape)


def specialized(value):
    """A convolution parameter (an int or a tuple of ints) with any symbol fixed to its value by a guard, as
    torch specializes its own convolutions' parameters (Dynamo makes symbols of the ints a function closes
    over under dynamic=True). Padding is not specialized: "same" makes it a function of the sizes."""
    if isinstance(value, (tuple, list)):
        return tuple(specialized(v) for v in value)
    return guard_int(value) if isinstance(value, torch.SymInt) else value


def _check(condition, what: str) -> None:
    """A guard on a symbolic condition that held for the traced example (plain bools: already checked)."""
    if isinstance(condition, torch.SymBool):
        torch._check(condition, lambda: f"xconv: {what}")


def output_shape(tensors: dict, input_shape, weight_shape, conf) -> tuple:
    """The output shape of the convolution ``conf`` (a :class:`xconv.torch_ops.Conf`) on ``tensors``.

    ``tensors`` maps argument names (input, weight, grad_output, bias) to tensors, fake or real;
    ``input_shape``/``weight_shape`` are explicit shape arguments (dgrad, wgrad) or None to take
    them from ``tensors``. Raises the core's ShapeError for the traced example; see the module doc.
    """
    from xconv.api import params_for

    shapes = {name: t.shape for name, t in tensors.items() if t is not None and name != "bias"}
    in_shape = tuple(input_shape) if input_shape is not None else tuple(shapes["input"])
    w_shape = tuple(weight_shape) if weight_shape is not None else tuple(shapes["weight"])
    pairs = tuple((pre, post) for pre, post in conf.padding)
    conf = dataclasses.replace(conf, stride=specialized(conf.stride), dilation=specialized(conf.dilation),
                               groups=specialized(conf.groups), output_padding=specialized(conf.output_padding))
    p = params_for({name: hints(s) for name, s in shapes.items()}, common_dtype(tensors),
                   None if input_shape is None else hints(in_shape), None if weight_shape is None else hints(w_shape),
                   stride=conf.stride, padding=tuple((hint(a), hint(b)) for a, b in pairs), dilation=conf.dilation,
                   groups=conf.groups, transposed=conf.transposed,
                   output_padding=conf.output_padding if conf.transposed else 0,
                   deterministic=conf.deterministic, math=conf.math, workspace_limit=conf.workspace_limit)
    bias = tensors.get("bias")
    if bias is not None and hints(bias.shape) != (p.bias_size,):
        raise ShapeError("bias", "must be 1-D of length C_out", expected=(p.bias_size,), given=hints(bias.shape))
    if not is_symbolic(in_shape, w_shape, *shapes.values(), *pairs, None if bias is None else bias.shape):
        return p.output_shape
    return _guarded_output_shape(in_shape, w_shape, pairs, conf, shapes.get("grad_output"), bias)


def _guarded_output_shape(in_shape, w_shape, pairs, conf, grad_output_shape, bias) -> tuple:
    """Steps 2 and 3 of the module doc: the core's size checks as guards, then its formulas on the symbols."""
    groups, c_in = conf.groups, in_shape[1]
    _check(c_in % groups == 0, "groups must divide the input's channels")
    _check(w_shape[0] % groups == 0, "groups must divide the weight's dim 0")
    if conf.transposed:
        _check(w_shape[0] == c_in, "the weight's dim 0 must equal the input's channels (transposed)")
        c_out = w_shape[1] * groups
    else:
        _check(w_shape[1] * groups == c_in, "the weight's dim 1 times groups must equal the input's channels")
        c_out = w_shape[0]
    out = [in_shape[0], c_out]
    for size, k, s, pad, d, op in zip(in_shape[2:], w_shape[2:], conf.stride, pairs, conf.dilation,
                                      conf.output_padding):
        if conf.transposed:
            o = transposed_output_size(size, k, s, pad, d, op)
            _check(o >= 1, "the transposed output must not be empty")
        else:
            _check(size + pad[0] + pad[1] >= d * (k - 1) + 1, "the padded input must hold the dilated kernel")
            o = direct_output_size(size, k, s, pad, d)
        out.append(o)
    if grad_output_shape is not None:
        for want, got in zip(out, grad_output_shape):
            _check(want == got, "grad_output must have the convolution's output shape")
    if bias is not None:
        _check(bias.shape[0] == c_out, "bias must be 1-D of length C_out")
    return tuple(out)
