"""Array-family helpers the core needs to legalize calls: family detection, zero padding, cropping.

They use only what NumPy and CuPy share (``zeros``, slicing, ``ascontiguousarray``), so the core
never imports a vendor array library itself.
"""

from __future__ import annotations

import importlib
import sys

from .errors import ShapeError


def array_family(array) -> str:
    """The array library an array belongs to: "numpy", "cupy", "torch", … (its top-level module)."""
    return type(array).__module__.split(".", 1)[0]


def common_family(arrays: dict) -> str:
    """The one family shared by all named arrays (None entries skipped); ShapeError when they differ."""
    first_name = first = None
    for name, array in arrays.items():
        if array is None or not hasattr(array, "shape"):
            continue  # not an array: reported by the shape checks
        family = array_family(array)
        if first is None:
            first_name, first = name, family
        elif family != first:
            raise ShapeError(name, f"array family differs from {first_name}'s", expected=first, given=family)
    return first


def host_ready(array, name: str):
    """A NumPy ``array`` as the backends take it: a plain ndarray (a memmap's view), in native byte order
    and aligned (a converted copy where it is not). Never written to. Other arrays pass unchanged.

    NumPy computes on byte-swapped and unaligned arrays, so xconv does too, by converting them once
    here; a masked array is refused (its mask has no meaning in a convolution).
    """
    import numpy as np

    if array is None or not isinstance(array, np.ndarray):
        return array
    if type(array) is not np.ndarray:
        ma = sys.modules.get("numpy.ma")          # no masked array exists before numpy.ma is imported (not by us)
        if ma is not None and isinstance(array, ma.MaskedArray):
            raise ShapeError(name, "masked arrays are not taken (the mask has no meaning in a convolution)",
                             expected="a plain array, e.g. .filled(0)", given=type(array).__name__)
        array = array.view(np.ndarray)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.aligned:
        array = np.array(array, copy=True)
    return array


def copies_needed(array) -> int:
    """The bytes :func:`host_ready` copies for ``array`` (0 when it takes it as it is)."""
    import numpy as np

    if not isinstance(array, np.ndarray) or (array.dtype.isnative and array.flags.aligned):
        return 0
    return int(array.size) * array.dtype.itemsize


def array_module(array):
    """The module whose ``zeros``/``ascontiguousarray`` make arrays of ``array``'s family."""
    namespace = getattr(array, "__array_namespace__", None)
    if namespace is not None:
        module = namespace()
        if hasattr(module, "zeros"):
            return module
    return importlib.import_module(array_family(array))


def zeros(like, shape):
    """C-contiguous zeros of ``shape`` with ``like``'s dtype, family (and device, for torch tensors)."""
    new_zeros = getattr(like, "new_zeros", None)         # torch tensors: same dtype and device
    if callable(new_zeros):
        return new_zeros(tuple(shape))
    return array_module(like).zeros(tuple(shape), dtype=like.dtype)


def contiguous(array):
    """``array`` itself when C-contiguous, else a C-contiguous copy."""
    if callable(getattr(array, "is_contiguous", None)):  # torch tensors
        return array.contiguous()
    module = array_module(array)
    # an array-API namespace without ascontiguousarray (JAX) has arrays without strides: asarray is enough
    return (getattr(module, "ascontiguousarray", None) or module.asarray)(array)


def spatial_slices(starts, sizes):
    """Index selecting ``sizes`` elements from ``starts`` along each spatial dim (all of N and C)."""
    return (slice(None), slice(None)) + tuple(slice(a, a + n) for a, n in zip(starts, sizes))


def zero_pad(array, pads):
    """``array`` with (pre, post) zeros added along each spatial dim."""
    if not any(pre or post for pre, post in pads):
        return array
    spatial = array.shape[2:]
    out = zeros(array, array.shape[:2] + tuple(s + pre + post for s, (pre, post) in zip(spatial, pads)))
    out[spatial_slices([pre for pre, _ in pads], spatial)] = array
    return out


def crop(array, starts, sizes):
    """The C-contiguous window of ``sizes`` starting at ``starts`` along each spatial dim."""
    if all(a == 0 for a in starts) and tuple(sizes) == tuple(array.shape[2:]):
        return array
    return contiguous(array[spatial_slices(starts, sizes)])
