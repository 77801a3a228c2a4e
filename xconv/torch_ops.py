"""xconv's convolutions as PyTorch custom operators: their fake kernels, autograd formulas, vmap rules, torch.func.

Importing this module imports PyTorch and registers four operators in the ``xconv`` namespace
(``import xconv`` never does; ``import xconv.torch`` and the first call of the functional API on
torch tensors do, and those calls then run as these operators):

- ``xconv::fprop(input, weight, bias?, *conf) -> output``
- ``xconv::dgrad(grad_output, weight, input_shape, *conf) -> grad_input``
- ``xconv::wgrad(input, grad_output, weight_shape, *conf) -> grad_weight``
- ``xconv::backward(grad_output, input, weight, output_mask, *conf) -> (grad_input, grad_weight, grad_bias)``
  (a masked entry is an empty tensor, read as None by the autograd formulas)

``*conf`` is the normalized convolution: stride, padding (pre, post per spatial dim, flattened),
dilation, groups, transposed, output_padding, deterministic (the level as a string: "False", "True" or
"batch_invariant"), math, backend (a registered name, or the token of a backend object, see
:func:`backend_token`), workspace_limit (bytes, or None). Each op's kernel runs the matching
public xconv function once; its fake kernel only computes the output's shape and layout, so
``torch.compile(fullgraph=True)`` and ``torch.export`` see one opaque op per convolution.

Every op is differentiable through the others (the bilinear identities of convolution), so
double backward works: fprop's backward is one ``backward`` call with the mask taken from
``ctx.needs_input_grad``; dgrad's is (fprop, wgrad); wgrad's is (dgrad, fprop).

Layout: results come back in the memory format torch's CPU/CUDA convolutions return
(channels-last when the input or weight is channels-last, per ``suggest_memory_format``): the
backends compute in contiguous layout and the result is copied once into that layout.
"""

import dataclasses
import functools
import threading
from typing import Optional

import torch

import xconv
from xconv import torch_shapes

Tensor = torch.Tensor

# backend objects (not names) travel through the ops' string argument as a token
_OBJECTS: dict = {}


def backend_token(backend) -> Optional[str]:
    """``backend`` as the ops' string argument: a name as is, an object as a token resolved in the kernel."""
    if backend is None or isinstance(backend, str):
        return backend
    return _object_token(backend)


@torch.compiler.assume_constant_result  # under torch.compile: run at trace time, the token a constant
def _object_token(backend) -> str:
    token = f"<backend object {getattr(backend, 'name', '?')!r} {id(backend):#x}>"
    _OBJECTS[token] = backend  # held, so the id is never reused by another object
    return token


def _backend(token: Optional[str]):
    return _OBJECTS.get(token, token) if token is not None else None


@dataclasses.dataclass(frozen=True)
class Conf:
    """A normalized convolution as the ops take it (one value per spatial dim; padding as (pre, post) pairs)."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    transposed: bool
    output_padding: tuple
    deterministic: object           # False, True or "batch_invariant"
    math: str
    backend: Optional[str]
    workspace_limit: Optional[int] = None

    @classmethod
    def from_params(cls, p, deterministic, math, backend) -> "Conf":
        return cls(tuple(p.stride), tuple(p.padding), tuple(p.dilation), p.groups, p.transposed,
                   tuple(p.output_padding), p.deterministic, math, backend_token(backend), p.workspace_limit)

    @classmethod
    def from_args(cls, stride, padding, dilation, groups, transposed, output_padding, deterministic, math,
                  backend, workspace_limit=None) -> "Conf":
        pairs = tuple((padding[2 * i], padding[2 * i + 1]) for i in range(len(padding) // 2))
        level = {"False": False, "True": True}.get(deterministic, deterministic)   # the ops carry it as a string
        return cls(tuple(stride), pairs, tuple(dilation), groups, transposed, tuple(output_padding), level,
                   math, backend, workspace_limit)

    @functools.cached_property
    def exact(self) -> bool:
        """Whether every count (stride, padding, dilation, groups, output_padding) is a plain int: a bool or float
        equal to one compares equal (``groups=True`` == ``groups=1``) but the public calls refuse it, so only an exact
        Conf stands for its configuration's value in :mod:`xconv.lanes` (computed once per Conf)."""
        counts = (*self.stride, *(v for pair in self.padding for v in pair), *self.dilation, self.groups,
                  *self.output_padding)
        return all(type(v) is int for v in counts)

    def __hash__(self) -> int:
        """The fields' hash, computed once (a converted module's every call looks its lane up by its Conf); never
        pickled (a string's hash differs between processes)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def args(self) -> tuple:
        """The ops' trailing arguments."""
        return (list(self.stride), [v for pair in self.padding for v in pair], list(self.dilation), self.groups,
                self.transposed, list(self.output_padding), str(self.deterministic), self.math, self.backend,
                self.workspace_limit)

    def kwargs(self) -> dict:
        """The keywords of the public xconv functions."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    transposed=self.transposed, output_padding=self.output_padding if self.transposed else 0,
                    deterministic=self.deterministic, math=self.math, backend=_backend(self.backend),
                    workspace_limit=self.workspace_limit)

    def shape_kwargs(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    transposed=self.transposed, output_padding=self.output_padding if self.transposed else 0)


# ---------------------------------------------------------------------------------------------
# Layout


def _channels_last(t: Tensor) -> bool:
    """torch's suggest_memory_format(t) is channels-last (strides like channels-last, not plainly contiguous)."""
    if t.dim() == 4:
        return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    if t.dim() == 5:
        return t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous()
    return False


def memory_format(*tensors) -> torch.memory_format:
    """The format torch's convolution returns: channels-last when the input or the weight suggests it."""
    for t in tensors:
        if t is not None and _channels_last(t):
            return torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format


def _as(result: Tensor, fmt) -> Tensor:
    return result if fmt == torch.contiguous_format or result.dim() < 4 else result.contiguous(memory_format=fmt)


def _empty(shape, like: Tensor, fmt) -> Tensor:
    fmt = fmt if len(shape) >= 4 else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device, memory_format=fmt)


class _State(threading.local):
    depth = 0          # a class default: every thread reads 0 before its first kernel (a stable guard for Dynamo)


_state = _State()


def inside_kernel() -> bool:
    """True while an operator's kernel runs the public xconv function (which then takes its direct path)."""
    return _state.depth > 0


class _plain:
    """Inside a kernel: the public functions take their direct path; no autograd recording, no autocast."""

    def __init__(self, device: torch.device):
        self.no_grad = torch.no_grad()
        self.no_autocast = torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda") else None

    def __enter__(self):
        _state.depth += 1
        self.no_grad.__enter__()
        if self.no_autocast is not None:
            self.no_autocast.__enter__()

    def __exit__(self, *exc):
        if self.no_autocast is not None:
            self.no_autocast.__exit__(*exc)
        self.no_grad.__exit__(*exc)
        _state.depth -= 1


# ---------------------------------------------------------------------------------------------
# The operators


@torch.library.custom_op("xconv::fprop", mutates_args=())
def fprop_op(input: Tensor, weight: Tensor, bias: Optional[Tensor], stride: list[int], padding: list[int],
             dilation: list[int], groups: int, transposed: bool, output_padding: list[int], deterministic: str,
             math: str, backend: Optional[str], workspace_limit: Optional[int]) -> Tensor:
    conf = Conf.from_args(stride, padding, dilation, groups, transposed, output_padding, deterministic, math, backend,
                          workspace_limit)
    with _plain(input.device):
        y = xconv.conv_fprop(input, weight, bias=bias, **conf.kwargs())
    return _as(y, memory_format(input, weight))


@fprop_op.register_fake
def _fprop_fake(input, weight, bias, *args):
    shape = torch_shapes.output_shape({"input": input, "weight": weight, "bias": bias}, None, None,
                                      Conf.from_args(*args))
    return _empty(shape, input, memory_format(input, weight))


def _gradient(function, a: Tensor, b: Tensor, shape, *args) -> Tensor:
    """``function(a, b, shape, **conv)`` (conv_dgrad or conv_wgrad) in the layout of ``a`` and ``b``."""
    with _plain(a.device):
        result = function(a, b, list(shape), **Conf.from_args(*args).kwargs())
    return _as(result, memory_format(a, b))


@torch.library.custom_op("xconv::dgrad", mutates_args=())
def dgrad_op(grad_output: Tensor, weight: Tensor, input_shape: list[int], stride: list[int], padding: list[int],
             dilation: list[int], groups: int, transposed: bool, output_padding: list[int], deterministic: str,
             math: str, backend: Optional[str], workspace_limit: Optional[int]) -> Tensor:
    return _gradient(xconv.conv_dgrad, grad_output, weight, input_shape, stride, padding, dilation, groups,
                     transposed, output_padding, deterministic, math, backend, workspace_limit)


@dgrad_op.register_fake
def _dgrad_fake(grad_output, weight, input_shape, *args):
    torch_shapes.output_shape({"grad_output": grad_output, "weight": weight}, input_shape, None, Conf.from_args(*args))
    return _empty(input_shape, grad_output, memory_format(grad_output, weight))


@torch.library.custom_op("xconv::wgrad", mutates_args=())
def wgrad_op(input: Tensor, grad_output: Tensor, weight_shape: list[int], stride: list[int], padding: list[int],
             dilation: list[int], groups: int, transposed: bool, output_padding: list[int], deterministic: str,
             math: str, backend: Optional[str], workspace_limit: Optional[int]) -> Tensor:
    return _gradient(xconv.conv_wgrad, input, grad_output, weight_shape, stride, padding, dilation, groups,
                     transposed, output_padding, deterministic, math, backend, workspace_limit)


@wgrad_op.register_fake
def _wgrad_fake(input, grad_output, weight_shape, *args):
    torch_shapes.output_shape({"input": input, "grad_output": grad_output}, None, weight_shape, Conf.from_args(*args))
    return _empty(weight_shape, input, memory_format(input, grad_output))


@torch.library.custom_op("xconv::backward", mutates_args=())
def backward_op(grad_output: Tensor, input: Tensor, weight: Tensor, output_mask: list[bool], stride: list[int],
                padding: list[int], dilation: list[int], groups: int, transposed: bool, output_padding: list[int],
                deterministic: str, math: str, backend: Optional[str],
                workspace_limit: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    conf = Conf.from_args(stride, padding, dilation, groups, transposed, output_padding, deterministic, math, backend,
                          workspace_limit)
    mask = tuple(bool(b) for b in output_mask)
    c_out = weight.shape[1] * groups if transposed else weight.shape[0]
    with _plain(input.device):
        results = xconv.convolution_backward(grad_output, input, weight, bias_sizes=[c_out] if mask[2] else None,
                                             output_mask=mask, **conf.kwargs())
    fmt = memory_format(input, weight)
    empty = grad_output.new_empty(0)
    return tuple(empty.clone() if r is None else (_as(r, fmt) if i < 2 else r) for i, r in enumerate(results))


@backward_op.register_fake
def _backward_fake(grad_output, input, weight, output_mask, stride, padding, dilation, groups, transposed, *rest):
    torch_shapes.output_shape({"grad_output": grad_output, "input": input, "weight": weight}, None, None,
                              Conf.from_args(stride, padding, dilation, groups, transposed, *rest))
    fmt = memory_format(input, weight)
    c_out = weight.shape[1] * groups if transposed else weight.shape[0]
    shapes = (input.shape, weight.shape, (c_out,))
    return tuple(_empty(s, grad_output, fmt if i < 2 else torch.contiguous_format) if bit else grad_output.new_empty(0)
                 for i, (s, bit) in enumerate(zip(shapes, output_mask)))


# ---------------------------------------------------------------------------------------------
# Autograd formulas: each op's gradient in terms of the ops themselves


def _save(ctx, tensors, args):
    ctx.save_for_backward(*tensors)
    ctx.conf_args = args


def _fprop_setup(ctx, inputs, output):
    input, weight, bias, *args = inputs
    _save(ctx, (input, weight), tuple(args))
    ctx.has_bias = bias is not None


def _fprop_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [bool(need[0]), bool(need[1]), ctx.has_bias and bool(need[2])]
    none = (None,) * len(ctx.conf_args)
    if not any(mask):
        return (None, None, None) + none
    gx, gw, gb = backward(grad, input, weight, mask, *ctx.conf_args)
    return (gx if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None) + none


def _dgrad_setup(ctx, inputs, output):
    grad_output, weight, input_shape, *args = inputs
    _save(ctx, (grad_output, weight), tuple(args))


def _dgrad_backward(ctx, grad):
    # dx = A_w^T dy: d/d(dy) <G, dx> = A_w G (fprop of G); d/dw = wgrad of (G, dy)
    dy, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    g_dy = fprop(grad, weight, None, *ctx.conf_args) if need[0] else None
    g_w = wgrad(grad, dy, list(weight.shape), *ctx.conf_args) if need[1] else None
    return (g_dy, g_w, None) + (None,) * len(ctx.conf_args)


def _wgrad_setup(ctx, inputs, output):
    input, grad_output, weight_shape, *args = inputs
    _save(ctx, (input, grad_output), tuple(args))


def _wgrad_backward(ctx, grad):
    # <G, wgrad(x, dy)> = <dy, A_G x>: d/dx = dgrad of (dy, G); d/d(dy) = fprop of (x, G)
    x, dy = ctx.saved_tensors
    need = ctx.needs_input_grad
    g_x = dgrad(dy, grad, list(x.shape), *ctx.conf_args) if need[0] else None
    g_dy = fprop(x, grad, None, *ctx.conf_args) if need[1] else None
    return (g_x, g_dy, None) + (None,) * len(ctx.conf_args)


def _backward_setup(ctx, inputs, output):
    grad_output, input, weight, mask, *args = inputs
    _save(ctx, (grad_output, input, weight), tuple(args))
    ctx.mask = tuple(bool(b) for b in mask)


def _backward_backward(ctx, g_input, g_weight, g_bias):
    dy, x, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask, args = ctx.mask, ctx.conf_args
    g_input = g_input if mask[0] and g_input is not None else None
    g_weight = g_weight if mask[1] and g_weight is not None else None
    g_bias = g_bias if mask[2] and g_bias is not None else None
    g_dy = None
    if need[0]:
        terms = []
        if g_input is not None:
            terms.append(fprop(g_input, w, None, *args))
        if g_weight is not None:
            terms.append(fprop(x, g_weight, None, *args))
        if g_bias is not None:
            terms.append(g_bias.reshape((1, -1) + (1,) * (dy.dim() - 2)).expand(dy.shape))
        g_dy = sum(terms[1:], terms[0]) if terms else None
    g_x = dgrad(dy, g_weight, list(x.shape), *args) if need[1] and g_weight is not None else None
    g_w = wgrad(g_input, dy, list(w.shape), *args) if need[2] and g_input is not None else None
    return (g_dy, g_x, g_w, None) + (None,) * len(args)


fprop_op.register_autograd(_fprop_backward, setup_context=_fprop_setup)
dgrad_op.register_autograd(_dgrad_backward, setup_context=_dgrad_setup)
wgrad_op.register_autograd(_wgrad_backward, setup_context=_wgrad_setup)
backward_op.register_autograd(_backward_backward, setup_context=_backward_setup)


# ---------------------------------------------------------------------------------------------
# vmap: a batch of convolutions


def _per_element(op, info, in_dims, args, n_out: int):
    """``op`` once per batch element (the slices of the batched tensors), the results stacked along dim 0."""
    results = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if isinstance(a, Tensor) and d is not None else a for a, d in zip(args, in_dims)]
        results.append(op(*sliced))
    if n_out == 1:
        return torch.stack(results), 0
    return tuple(torch.stack([r[k] for r in results]) for k in range(n_out)), (0,) * n_out


def _fold_rule(op, batched_pos: int, shape_pos: Optional[int]):
    """vmap of ``op`` when only the tensor at ``batched_pos`` (input or grad_output) carries the vmap dim: one
    call with that dim folded into N (and, for dgrad, into the explicit input shape); else one call per element."""
    def rule(info, in_dims, *args):
        others = [d for i, (a, d) in enumerate(zip(args, in_dims)) if isinstance(a, Tensor) and i != batched_pos]
        if in_dims[batched_pos] is None or any(d is not None for d in others):
            return _per_element(op, info, in_dims, args, 1)
        args = list(args)
        x = args[batched_pos].movedim(in_dims[batched_pos], 0)
        b, n = x.shape[0], x.shape[1]
        args[batched_pos] = x.flatten(0, 1)
        if shape_pos is not None:
            args[shape_pos] = [b * n] + list(args[shape_pos])[1:]
        return op(*args).unflatten(0, (b, n)), 0
    return rule


fprop_op.register_vmap(_fold_rule(fprop_op, 0, None))
dgrad_op.register_vmap(_fold_rule(dgrad_op, 0, 2))
wgrad_op.register_vmap(lambda info, in_dims, *args: _per_element(wgrad_op, info, in_dims, args, 1))
backward_op.register_vmap(lambda info, in_dims, *args: _per_element(backward_op, info, in_dims, args, 3))


# ---------------------------------------------------------------------------------------------
# torch.func: the same formulas as setup_context-style autograd.Functions
#
# torch.func's transforms (grad, vjp, jacrev, vmap over grad) refuse the autograd wrapper that
# torch.library generates for a custom operator (it has no setup_context). Under those transforms
# each operator runs inside one of these Functions instead: forward is the operator itself (below
# autograd), setup_context and backward are the formulas above, and vmap runs the forward under
# vmap (the operators' own batching). Everywhere else (eager, torch.compile, torch.export) the
# operators are called directly, so graphs hold the operators and nothing else.


def _function(name: str, op, setup, formula) -> type:
    def forward(*args):
        return op(*args)

    return type(name, (torch.autograd.Function,), dict(
        forward=staticmethod(forward), setup_context=staticmethod(setup), backward=staticmethod(formula),
        generate_vmap_rule=True, __doc__=f"The operator {op} with its autograd formula, for torch.func."))


FpropFunction = _function("FpropFunction", fprop_op, _fprop_setup, _fprop_backward)
DgradFunction = _function("DgradFunction", dgrad_op, _dgrad_setup, _dgrad_backward)
WgradFunction = _function("WgradFunction", wgrad_op, _wgrad_setup, _wgrad_backward)
BackwardFunction = _function("BackwardFunction", backward_op, _backward_setup, _backward_backward)


def _under_transforms() -> bool:
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


def fprop(*args) -> Tensor:
    """``xconv::fprop(*args)``, differentiable also under torch.func transforms."""
    return FpropFunction.apply(*args) if _under_transforms() else fprop_op(*args)


def dgrad(*args) -> Tensor:
    """``xconv::dgrad(*args)``, differentiable also under torch.func transforms."""
    return DgradFunction.apply(*args) if _under_transforms() else dgrad_op(*args)


def wgrad(*args) -> Tensor:
    """``xconv::wgrad(*args)``, differentiable also under torch.func transforms."""
    return WgradFunction.apply(*args) if _under_transforms() else wgrad_op(*args)


def backward(*args) -> tuple:
    """``xconv::backward(*args)``, differentiable also under torch.func transforms."""
    return BackwardFunction.apply(*args) if _under_transforms() else backward_op(*args)
