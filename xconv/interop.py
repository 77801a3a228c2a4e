"""DLPack interop: any array with ``__dlpack__``/``__dlpack_device__`` goes in, the caller's family comes out.

Backends see only "native" families (NumPy on the CPU, CuPy on CUDA), except that a backend
named for the call (``backend=`` or ``$XCONV_BACKEND``) that declares a foreign family itself
(the torch backends declare "torch") gets those arrays as they are (:func:`to_native_for`).
Otherwise a foreign array (a PyTorch tensor, a JAX array, …) is viewed, without copying, as the
native array of its device (``numpy.from_dlpack`` for CPU memory, ``cupy.from_dlpack`` for CUDA
memory); results are handed
back through the caller's ``from_dlpack``, again without copying.

DLPack has no portable bfloat16 for NumPy, so bfloat16 CPU tensors cross as their 16-bit pattern
(an int16 view on both sides). CuPy has no bfloat16 at all: bfloat16 CUDA tensors are refused.
"""

from __future__ import annotations

import importlib

import numpy as np

from .arrays import array_family
from . import dtypes, settings
from .errors import BackendUnavailableError, ShapeError, UnsupportedError, XconvError

NATIVE_FAMILIES = ("numpy", "cupy")

# DLPack device types (dlpack.h DLDeviceType)
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13


def is_foreign(array) -> bool:
    """True for an array that is not NumPy/CuPy but speaks DLPack."""
    return (array is not None and array_family(array) not in NATIVE_FAMILIES
            and hasattr(array, "__dlpack__") and hasattr(array, "__dlpack_device__"))


def to_native(array, name: str = "array"):
    """``array`` itself when native or not an array; else a zero-copy NumPy or CuPy view of it.

    A torch tensor with the conjugate or negative bit set is resolved first (a copy); a foreign array
    DLPack cannot export is refused as a ShapeError naming ``name``.
    """
    if not is_foreign(array):
        return array
    family = array_family(array)
    if family == "torch":
        array = array.detach()
        if array.is_conj():
            array = array.resolve_conj()
        if array.is_neg():
            array = array.resolve_neg()
    try:
        return _from_dlpack(array, family)
    except (BufferError, TypeError, RuntimeError, ValueError) as exc:
        raise ShapeError(name, f"this {family} array cannot be viewed through DLPack ({type(exc).__name__}: {exc})",
                         expected="a strided CPU or CUDA array", given=f"{type(array).__name__} of dtype "
                         f"{getattr(array, 'dtype', '?')}") from exc


def _from_dlpack(array, family: str):
    device_type = int(array.__dlpack_device__()[0])
    if device_type in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
        native = np
    elif device_type in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
        try:
            native = importlib.import_module("cupy")
        except ImportError as exc:
            raise BackendUnavailableError("cudnn", f"CUDA arrays need CuPy, which is not installed ({exc})") from None
    else:
        raise BackendUnavailableError("auto", f"no xconv backend takes arrays on DLPack device type {device_type}")
    if family == "torch" and str(array.dtype) == "torch.bfloat16":
        if native is not np:
            raise UnsupportedError("bfloat16 CUDA tensors cannot cross into xconv: CuPy has no bfloat16 dtype "
                                   "(convert to float16 or float32, or use a CPU tensor)")
        import torch
        return native.from_dlpack(array.view(torch.int16)).view(dtypes.DTYPES["bfloat16"])
    return native.from_dlpack(array)


def to_native_for(backend, family: str | None, named: dict) -> list:
    """The arrays of ``named`` (argument name -> array) as the call's backend takes them: as they are
    when ``backend`` (else ``$XCONV_BACKEND``; else, for a family other than torch, the backend automatic
    selection picks for it) declares their foreign ``family`` itself (a torch backend taking torch tensors on
    their own device, a jax backend taking JAX arrays), else each through
    :func:`to_native`, which names the argument in its errors."""
    if family is not None and family not in NATIVE_FAMILIES and family in _families_of(backend, family):
        return list(named.values())
    return [to_native(a, name) for name, a in named.items()]


def _families_of(backend, family: str | None = None) -> tuple:
    chosen = backend if backend is not None else settings.current().backend
    if chosen is None and family not in (None, "torch", *NATIVE_FAMILIES):
        # no backend named: the one automatic selection would pick for these arrays, if one declares their
        # family (JAX arrays go to a jax backend); torch tensors have their own route (xconv.torch_ops)
        from .registry import select_backend
        try:
            chosen = select_backend(None, family)
        except XconvError:
            return ()
    if isinstance(chosen, str):
        from .registry import get_backend
        try:
            chosen = get_backend(chosen)
        except XconvError:
            return ()                       # unknown or broken: reported when the call selects its backend
    return tuple(getattr(chosen, "array_families", None) or ())


def to_family(result, family: str):
    """``result`` (a native array or None) as an array of ``family``, without copying."""
    if result is None or family in NATIVE_FAMILIES or array_family(result) == family:
        return result
    module = importlib.import_module(family)
    if family == "torch" and dtypes.dtype_name(result.dtype) == "bfloat16":
        return module.from_dlpack(result.view(np.int16)).view(module.bfloat16)
    from_dlpack = getattr(module, "from_dlpack", None) or importlib.import_module(f"{family}.dlpack").from_dlpack
    return from_dlpack(result)
