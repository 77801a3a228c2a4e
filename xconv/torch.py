"""PyTorch modules whose convolutions run on xconv: ``XConv1d/2d/3d``, ``XConvTranspose1d/2d/3d``, :func:`convert`.

Importing this module imports PyTorch and registers xconv's custom operators (:mod:`xconv.torch_ops`);
``import xconv`` never does. PyTorch comes with the ``torch`` extra, installed from the checkout:
``pip install -e ".[torch]"`` (docs/torch.md says how to get the CPU-only build).

Each module subclasses the matching ``torch.nn`` module: the same constructor, parameters,
``state_dict``, ``padding_mode`` and ``output_size`` handling, plus three keyword-only arguments,
``backend=None`` (a backend name or object; None selects as ``xconv.conv_fprop`` does),
``deterministic=False`` and ``math="keep_dtype"``, forwarded to every xconv call.

Forward is the ``xconv::fprop`` operator (one :func:`xconv.conv_fprop` call). Backward is the
``xconv::backward`` operator: :func:`xconv.convolution_backward` exactly once, with ``output_mask``
taken from which of (input, weight, bias) need gradients, so a frozen layer computes no weight
gradient and a layer fed with data that needs no gradient computes no input gradient. Backward is
itself differentiable (double backward runs through the same operators). In plain eager mode the same
kernel bodies run without the operators' dispatch (:mod:`xconv.torch_fast`), and a configuration's repeated
calls without the public calls' per-call checks (:mod:`xconv.lanes`: the same backend, params, results and
errors; a repeated call makes no new public call). Under ``torch.autocast``
the operands are cast as torch casts its own convolutions'; results come back in the memory
format torch's convolution would return (channels-last in, channels-last out).
"""

from __future__ import annotations

from operator import is_

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # say what to install, not only what is missing
    from .install import torch_hint

    raise ImportError(f"xconv.torch needs PyTorch, which is not importable here ({exc}): {torch_hint()}") from exc

from . import interop, registry, torch_fast, torch_functional, torch_ops
from .arrays import array_family
from .backend import availability_of
from .errors import BackendUnavailableError, ShapeError
from .params import check_deterministic, check_math

__all__ = ["XConv1d", "XConv2d", "XConv3d", "XConvTranspose1d", "XConvTranspose2d", "XConvTranspose3d",
           "convert"]


def _padding_pairs(module) -> tuple[tuple[int, int], ...]:
    """The module's zero padding as one (pre, post) pair per spatial dim, exactly as torch pads.

    For torch's padding strings this is ``_reversed_padding_repeated_twice`` ('same': total
    ``dilation*(k-1)``, the extra element at the end; 'valid': none).
    """
    if isinstance(module.padding, str):
        flat = module._reversed_padding_repeated_twice
        return tuple((flat[2 * i], flat[2 * i + 1]) for i in reversed(range(len(flat) // 2)))
    return tuple((p, p) for p in module.padding)


class _XConvMixin:
    """Shared by the six modules: the xconv keywords, the autograd call, batching and the repr."""

    # class-level defaults, so modules made by convert() or unpickled from older objects have them
    backend = None
    deterministic = False
    math = "keep_dtype"
    _nd: int

    def _set_xconv(self, backend, deterministic, math):
        check_deterministic(deterministic)
        check_math(math)
        check_backend(backend)
        self.backend = backend
        self.deterministic = deterministic
        self.math = math

    def _check_input(self, input, weight):
        """Refuse, in torch's words, an input of the wrong rank or channel count (the user's argument, not the
        module's weight, is the one to blame). Sizes are compared, not converted: symbolic sizes guard."""
        nd = self._nd
        dim = input.dim()
        if dim != nd + 1 and dim != nd + 2:
            op = f"conv{'_transpose' if self.transposed else ''}{nd}d"
            raise _torch_worded("input", f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {op}, "
                                         f"but got input of size: {list(input.shape)}",
                                expected=f"rank {nd + 1} or {nd + 2}", given=input.dim())
        channels = input.shape[0 if dim == nd + 1 else 1]
        want = weight.shape[0] if self.transposed else weight.shape[1] * self.groups
        if channels != want:
            given = "transposed=1" if self.transposed else f"groups={self.groups}"
            shape = list(input.shape) if dim == nd + 2 else [1] + list(input.shape)
            raise _torch_worded("input", f"Given {given}, weight of size {list(weight.shape)}, expected "
                                         f"input{shape} to have {want} channels, but got {channels} channels instead",
                                expected=want, given=channels, dim="dim 1 (C_in)")

    def _xconv_apply(self, input, weight, bias, padding, output_padding=0):
        nd = self._nd
        unbatched = input.dim() == nd + 1
        if unbatched:
            input = input.unsqueeze(0)
        input, weight, bias = torch_functional.autocast(input, weight, bias)
        conf = self._conf(padding, output_padding)
        out = torch_fast.fprop(input, weight, bias, conf)       # the xconv::fprop operator, or its eager fast path
        return out.squeeze(0) if unbatched else out

    def _conf(self, padding, output_padding) -> torch_ops.Conf:
        """The call's :class:`torch_ops.Conf`, from the module's attributes, ``padding`` (an int, (pre, post) pairs,
        or None: the module's own, see :func:`_padding_pairs`) and ``output_padding``.

        The last one made is kept on the module with the very objects it was made from and is reused only while
        each of them is the same object (``is``: a reassigned attribute, even one equal in value, such as
        ``deterministic=1`` for True, builds and checks a new one), so its checks run once per configuration."""
        # torch keeps _reversed_padding_repeated_twice as a list: its values, not its identity, are compared
        reversed_pads = tuple(self._reversed_padding_repeated_twice) if isinstance(self.padding, str) else None
        sources = (self.stride, padding, self.padding, self.dilation, self.groups, self.transposed, output_padding,
                   self.deterministic, self.math, self.backend)
        cached = self.__dict__.get("_xconv_conf")
        if (cached is not None and cached.reversed_pads == reversed_pads
                and all(map(is_, cached.sources, sources))):
            return cached.conf
        nd = self._nd
        if padding is None:
            padding = _padding_pairs(self)
        elif isinstance(padding, int):
            padding = ((padding, padding),) * nd
        conf = torch_ops.Conf(tuple(self.stride), tuple(padding), tuple(self.dilation), self.groups, self.transposed,
                              tuple(output_padding) if self.transposed else (0,) * nd,
                              check_deterministic(self.deterministic), check_math(self.math),
                              torch_ops.backend_token(self.backend))
        if all(_immutable(v) for v in sources[:7]):   # a list attribute may change in place: made anew each call
            self.__dict__["_xconv_conf"] = _ConfCache(sources, reversed_pads, conf)
        else:
            self.__dict__.pop("_xconv_conf", None)
        return conf

    def extra_repr(self):
        s = super().extra_repr()
        backend = self.backend if self.backend is None or isinstance(self.backend, str) else self.backend.name
        s += f", backend={backend!r}"
        if self.deterministic:
            s += f", deterministic={self.deterministic!r}"
        if self.math != "keep_dtype":
            s += f", math={self.math!r}"
        return s


class _ConfCache:
    """A module's last :class:`torch_ops.Conf` and what it was made from (see ``_XConvMixin._conf``). Never copied
    or pickled (a copy reads as None and makes its own): a backend object's token names one object in one process."""

    __slots__ = ("sources", "reversed_pads", "conf")

    def __init__(self, sources, reversed_pads, conf):
        self.sources, self.reversed_pads, self.conf = sources, reversed_pads, conf

    def __reduce__(self):
        return _no_cache, ()


def _no_cache():
    return None


def _immutable(value) -> bool:
    """An int, bool, str or None, or a tuple of such values or of such tuples (what a module's attribute cannot change
    in place)."""
    t = type(value)
    if t is tuple:
        return all(_immutable(v) for v in value)
    return t in (int, bool, str, type(None))


def _torch_worded(argument: str, text: str, *, expected, given, dim=None) -> ShapeError:
    """A ShapeError whose message is ``argument: text`` (torch's wording), with expected/given set as attributes."""
    error = ShapeError(argument, text)
    error.expected, error.given, error.dim = expected, given, dim
    return error


class _XConvDirect(_XConvMixin):
    def _conv_forward(self, input, weight, bias):
        self._check_input(input, weight)
        if self.padding_mode == "zeros" and input.dim() == self._nd + 2 and torch_fast.eager(input, weight, bias):
            return torch_fast.eager_fprop(input, weight, bias, self._conf(None, 0))   # the usual call, in one step
        if self.padding_mode != "zeros":
            nd = self._nd
            if input.dim() == nd + 1:  # pad as a batch of one, as torch's pad modes expect
                return self._conv_forward(input.unsqueeze(0), weight, bias).squeeze(0)
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return self._xconv_apply(input, weight, bias, 0)
        return self._xconv_apply(input, weight, bias, None)


class _XConvTransposed(_XConvMixin):
    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":
            raise ValueError(f"Only `zeros` padding mode is supported for {type(self).__name__}")
        if not isinstance(self.padding, tuple):
            raise AssertionError("self.padding must be a tuple")
        self._check_input(input, self.weight)
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._nd, self.dilation)
        weight, bias = self.weight, self.bias
        if input.dim() == self._nd + 2 and torch_fast.eager(input, weight, bias):   # the usual call, in one step
            return torch_fast.eager_fprop(input, weight, bias, self._conf(None, output_padding))
        return self._xconv_apply(input, weight, bias, None, output_padding)


def _full_padding(base, args, kwargs):
    """torch has no padding="full": give the base its explicit ints, dilation*(k-1) per dim (xconv.params)."""
    args, kwargs = list(args), dict(kwargs)
    if (args[4] if len(args) > 4 else kwargs.get("padding")) != "full":
        return args, kwargs
    nd = int(base.__name__[-2])
    k = args[2] if len(args) > 2 else kwargs["kernel_size"]
    d = args[5] if len(args) > 5 else kwargs.get("dilation", 1)
    k, d = ((v,) * nd if isinstance(v, int) else tuple(v) for v in (k, d))
    pads = tuple(dd * (kk - 1) for kk, dd in zip(k, d))
    if len(args) > 4:
        args[4] = pads
    else:
        kwargs["padding"] = pads
    return args, kwargs


def _init(self, base, args, kwargs, backend, deterministic, math):
    args, kwargs = _full_padding(base, args, kwargs)
    base.__init__(self, *args, **kwargs)
    self._set_xconv(backend, deterministic, math)


class XConv1d(_XConvDirect, torch.nn.Conv1d):
    """``torch.nn.Conv1d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 1

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.Conv1d, args, kwargs, backend, deterministic, math)


class XConv2d(_XConvDirect, torch.nn.Conv2d):
    """``torch.nn.Conv2d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 2

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.Conv2d, args, kwargs, backend, deterministic, math)


class XConv3d(_XConvDirect, torch.nn.Conv3d):
    """``torch.nn.Conv3d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 3

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.Conv3d, args, kwargs, backend, deterministic, math)


class XConvTranspose1d(_XConvTransposed, torch.nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 1

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.ConvTranspose1d, args, kwargs, backend, deterministic, math)


class XConvTranspose2d(_XConvTransposed, torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 2

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.ConvTranspose2d, args, kwargs, backend, deterministic, math)


class XConvTranspose3d(_XConvTransposed, torch.nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` on xconv; extra keyword-only ``backend``, ``deterministic``, ``math``."""
    _nd = 3

    def __init__(self, *args, backend=None, deterministic=False, math="keep_dtype", **kwargs):
        _init(self, torch.nn.ConvTranspose3d, args, kwargs, backend, deterministic, math)


_EQUIVALENT = {
    torch.nn.Conv1d: XConv1d, torch.nn.Conv2d: XConv2d, torch.nn.Conv3d: XConv3d,
    torch.nn.ConvTranspose1d: XConvTranspose1d, torch.nn.ConvTranspose2d: XConvTranspose2d,
    torch.nn.ConvTranspose3d: XConvTranspose3d,
}


def _swap(module, backend, deterministic, math):
    """The xconv equivalent of ``module``, sharing its Parameters, hooks and every other attribute."""
    new = _EQUIVALENT[type(module)].__new__(_EQUIVALENT[type(module)])
    # the containers (parameter, buffer, module and hook dicts, the non-persistent buffer set) are copied,
    # their contents (the Parameters themselves) shared
    state = {k: (v.copy() if isinstance(v, (dict, set, list)) else v) for k, v in module.__dict__.items()}
    new.__dict__.update(state)
    new._set_xconv(backend, deterministic, math)
    return new


def check_backend(backend, device=None) -> None:
    """Raise now what the first convolution would raise about ``backend``: a name no backend has
    (UnknownBackendError), a plugin that failed to load or a backend that cannot run on this machine
    (BackendUnavailableError), something that is neither a name nor a backend (ShapeError); and with a
    ``device``, a backend that does not take that device's tensors. None (chosen per call) passes."""
    if backend is None:
        return
    if device is not None and device.type != "meta":
        (native,) = interop.to_native_for(backend, "torch", {"input": torch.empty(0, device=device)})
        registry.select_backend(backend, array_family(native))
        return
    if not isinstance(backend, str) and not all(hasattr(backend, a) for a in ("name", "capabilities",
                                                                              "array_families")):
        registry.select_backend(backend, "numpy")          # neither a name nor a backend: its ShapeError
    chosen = registry.get_backend(backend) if isinstance(backend, str) else backend
    available, reason = availability_of(chosen)
    if not available:
        raise BackendUnavailableError(chosen.name, reason)


def _device_of(model: torch.nn.Module):
    """The device of the first convolution convert() would swap (None when there is none)."""
    for module in model.modules():
        if type(module) in _EQUIVALENT:
            return module.weight.device
    return None


def convert(model: torch.nn.Module, *, backend=None, deterministic=False, math="keep_dtype") -> torch.nn.Module:
    """Replace every ``torch.nn.Conv{1,2,3}d`` / ``ConvTranspose{1,2,3}d`` in ``model`` by its xconv equivalent.

    In place: children are swapped inside ``model`` (recursively) and ``model`` is returned; when
    ``model`` is itself such a layer the new module is returned. The new modules share the old
    ones' Parameters (so an optimizer built before the conversion still updates them), buffers,
    hooks, training mode, device, dtype, ``padding_mode`` and padding. Only those six exact
    classes are swapped: subclasses of them (they may override ``forward``) and modules already
    on xconv are left alone. ``backend``, ``deterministic`` and ``math`` go to every swapped layer.

    The arguments are checked here, not at the first forward: ``backend`` must be registered, able to
    run on this machine and take tensors of the device the model's convolutions are on (so move the
    model to its device before converting it), see :func:`check_backend`.
    """
    check_deterministic(deterministic)
    check_math(math)
    check_backend(backend, _device_of(model))
    return _convert(model, backend, deterministic, math)


def _convert(model, backend, deterministic, math):
    if type(model) in _EQUIVALENT:
        return _swap(model, backend, deterministic, math)
    for name, child in list(model.named_children()):
        if type(child) in _EQUIVALENT:
            setattr(model, name, _swap(child, backend, deterministic, math))
        else:
            _convert(child, backend, deterministic, math)
    return model

