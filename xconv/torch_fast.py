"""The eager fast path of xconv's torch modules: one ``autograd.Function`` per call, not the operator chain.

A converted module's forward normally calls the ``xconv::fprop`` custom operator (:mod:`.torch_ops`),
whose Python dispatch (autograd wrapper, redispatch, the compile-disable wrapper, the kernel) costs
about 100-150 µs per call on CPU, several times a digits-sized convolution. In plain eager mode the
same kernels run here through one ``torch.autograd.Function``: forward runs the body of
``xconv::fprop``, backward the body of ``xconv::backward`` (the same public xconv calls, so the same
bits). Whenever the operators' machinery matters the operators run instead:

- under ``torch.compile`` / ``torch.export`` tracing, any torch function or dispatch mode (fake tensors,
  meta tensors, FX proxies), functorch transforms (vmap, grad), tensor subclasses, non-CPU devices;
- double backward: a backward run with ``create_graph=True`` calls the ``xconv::backward`` operator,
  which is itself differentiable.

A converted module's usual call (batched, zeros padding, no autocast) decides all of this in one step
(:func:`eager`, then :func:`eager_fprop`). On NumPy views the kernels call :mod:`xconv.lanes`, so a configuration's
repeated calls skip the public calls' per-call checks (with their results, bits and errors).
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad as _forward_ad

from . import interop, lanes, registry, settings, torch_ops

_PLAIN = (torch.Tensor, torch.nn.Parameter)
#: dtypes whose CPU tensors ``Tensor.numpy()`` views (bfloat16 crosses through DLPack as its bit pattern instead)
_NUMPY_DTYPES = frozenset((torch.float16, torch.float32, torch.float64))
_is_compiling = torch.compiler.is_compiling
_function_mode = torch._C._is_torch_function_mode_enabled
_functorch = torch._C._are_functorch_transforms_active
_autocast = torch.is_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack    # what _get_current_dispatch_mode reads first


def eager(input, weight, bias) -> bool:
    """:func:`usable` for a module's three operands, and autocast off on the CPU (so that torch_functional.autocast
    would return them as they are): a converted module's call takes :func:`eager_fprop` as it is. Inlined: it runs
    before every module call, right after a torch operator has had the caches."""
    return (type(input) in _PLAIN and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)
            and input.is_cpu and weight.is_cpu and (bias is None or bias.is_cpu)
            and not (_is_compiling() or _function_mode() or _dispatch_modes() > 0 or _functorch())   # _traced()
            and not _autocast("cpu"))


def _traced() -> bool:
    """Whether torch.compile/export, a torch function or dispatch mode, or a functorch transform is active: the
    operators' machinery is needed (both :func:`eager` and :func:`usable` step aside)."""
    return _is_compiling() or _function_mode() or _dispatch_modes() > 0 or _functorch()


def eager_fprop(input, weight, bias, conf: torch_ops.Conf):
    """:func:`fprop` for operands :func:`usable` accepts: the kernel itself where autograd has nothing to record (no
    forward-mode AD level open: a dual tensor's tangent needs the Function, which refuses it by name; and grad mode
    off or no tensor requiring grad), else the Function."""
    if getattr(_forward_ad, "_current_level", 0) < 0 and not (
            _grad_enabled() and (input.requires_grad or weight.requires_grad
                                 or (bias is not None and bias.requires_grad))):
        return _fprop_kernel(input, weight, bias, conf)
    return _Fprop.apply(input, weight, bias, conf)


def usable(*tensors) -> bool:
    """Whether a call on ``tensors`` (None entries skipped) may take the fast path (see the module docstring)."""
    if _traced():
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or not t.is_cpu):
            return False
    return True


def fprop(input, weight, bias, conf: torch_ops.Conf):
    """``xconv::fprop(input, weight, bias, *conf.args())``: by the fast path when :func:`usable`, else the operator."""
    if usable(input, weight, bias):
        return eager_fprop(input, weight, bias, conf)
    return torch_ops.fprop(input, weight, bias, *conf.args())


#: (backend name, registry generation) -> whether that backend takes torch tensors itself
_TAKES_TORCH: dict = {}


_last_takes = (None, None, None)        # (the last token given by name, its registry generation, the answer)


def _takes_torch(token) -> bool:
    """Whether the call's backend (a name, a backend object's token, or None: ``$XCONV_BACKEND``, else none)
    declares the torch family (see :func:`interop._families_of`); by name, kept per registry generation."""
    global _last_takes
    last = _last_takes
    if token is last[0] and token is not None and last[1] == registry._generation:     # a module's repeated calls
        return last[2]
    name = token if token is not None else settings.current().backend
    if type(name) is not str or name in torch_ops._OBJECTS:
        return "torch" in interop._families_of(torch_ops._backend(token))
    key = (name, registry.generation())
    takes = _TAKES_TORCH.get(key)
    if takes is None:
        takes = "torch" in interop._families_of(name)
        if len(_TAKES_TORCH) > 64:
            _TAKES_TORCH.clear()
        _TAKES_TORCH[key] = takes
    if token is not None:
        _last_takes = (token, key[1], takes)
    return takes


def _as_numpy(conf: torch_ops.Conf, *tensors) -> list | None:
    """The tensors (None entries kept) as NumPy views (``Tensor.numpy()``, no DLPack capsules) when the public
    functions would hand NumPy views of them to the backend anyway: the call's backend does not take torch tensors
    itself, and each is a plain strided tensor of a dtype NumPy has, without a conjugate or negative bit (those go
    through :mod:`.interop`, which resolves the bits or names the argument it cannot view). Else None."""
    if _takes_torch(conf.backend):
        return None
    views = []
    for t in tensors:
        if t is None:
            views.append(None)
        elif t.dtype not in _NUMPY_DTYPES:
            return None
        else:
            try:                    # refuses what interop resolves: a negative bit, a layout other than strided
                views.append((t.detach() if t.requires_grad else t).numpy())   # (detach: a new tensor each call)
            except (RuntimeError, TypeError):
                return None
    return views


def _memory_format(input, weight) -> torch.memory_format:
    """:func:`torch_ops.memory_format` of two real tensors, at once when both are plainly contiguous (the usual case:
    a contiguous tensor never suggests channels-last)."""
    if input.is_contiguous() and weight.is_contiguous():
        return torch.contiguous_format
    return torch_ops.memory_format(input, weight)


def _fprop_kernel(input, weight, bias, conf: torch_ops.Conf):
    views = _as_numpy(conf, input, weight, bias)
    if views is not None:
        y = torch.from_numpy(lanes.fprop(conf if conf.exact else None, *views, conf.kwargs))
        if input.is_contiguous() and weight.is_contiguous():         # _memory_format's usual case, in line
            return y
        return torch_ops._as(y, torch_ops.memory_format(input, weight))
    fmt = _memory_format(input, weight)
    with torch_ops._plain(input.device):
        y = torch_ops.xconv.conv_fprop(input, weight, bias=bias, **conf.kwargs())
    return torch_ops._as(y, fmt)


def _backward_kernel(grad_output, input, weight, mask, conf: torch_ops.Conf):
    c_out = weight.shape[1] * conf.groups if conf.transposed else weight.shape[0]
    bias_sizes = [c_out] if mask[2] else None
    fmt = _memory_format(input, weight)
    views = _as_numpy(conf, grad_output, input, weight)
    if views is not None:
        gx, gw, gb = lanes.backward(conf if conf.exact else None, *views, bias_sizes, tuple(mask), conf.kwargs)
        results = (None if gx is None else torch.from_numpy(gx), None if gw is None else torch.from_numpy(gw),
                   None if gb is None else torch.from_numpy(gb))
    else:
        with torch_ops._plain(input.device):
            results = torch_ops.xconv.convolution_backward(grad_output, input, weight, bias_sizes=bias_sizes,
                                                           output_mask=tuple(mask), **conf.kwargs())
    if fmt == torch.contiguous_format:                  # torch_ops._as returns them as they are
        return tuple(results)
    return tuple(None if r is None else (torch_ops._as(r, fmt) if i < 2 else r) for i, r in enumerate(results))


class _Fprop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, conf):
        ctx.save_for_backward(input, weight)
        ctx.conf = conf
        ctx.has_bias = bias is not None
        return _fprop_kernel(input, weight, bias, conf)

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        mask = [bool(need[0]), bool(need[1]), ctx.has_bias and bool(need[2])]
        if not any(mask):
            return None, None, None, None
        if torch.is_grad_enabled() or not usable(grad, input, weight):   # create_graph: differentiable operator
            gx, gw, gb = torch_ops.backward(grad, input, weight, mask, *ctx.conf.args())
        else:
            gx, gw, gb = _backward_kernel(grad, input, weight, mask, ctx.conf)
        return (gx if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None, None)
