"""Moving the arrays of a call to the backend's torch device and its results back to the caller.

- torch tensors on the backend's device type are used as they are (detached: xconv computes
  gradients, it records no autograd graph), and the results stay there: zero-copy both ways;
- NumPy arrays, and torch tensors in host memory given to an accelerator backend, are copied to
  the device; the results come back as the same kind of host array;
- DLPack producers the backend declares (CuPy on CUDA) cross through DLPack without a copy, and
  their results go back through the producer's ``from_dlpack``.

A call's arrays all share one family (the core checks that); their devices must agree too.
"""

from __future__ import annotations

import importlib

import numpy as np

from xconv import UnsupportedError
from xconv.arrays import array_family
from xconv.dtypes import bfloat16

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu")      # those with a backend (backend.DEVICE_TYPES)


def _numpy_to_torch(torch, a: np.ndarray):
    """A CPU tensor over ``a``'s memory where torch can share it, else over a copy."""
    if (not a.flags.writeable or not a.flags.aligned or not a.dtype.isnative or any(s < 0 for s in a.strides)
            or a.dtype == bfloat16):
        a = np.array(a, dtype=a.dtype.newbyteorder("="), order="K", copy=True)
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _torch_to_numpy(torch, t) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16)
    return t.numpy()


class Placement:
    """Where a call's arrays live and how its results go back: built by :func:`place`."""

    def __init__(self, torch, family: str, device, back_to_host: bool, module=None):
        self.torch, self.family, self.device = torch, family, device
        self.back_to_host, self.module = back_to_host, module

    def out(self, t):
        """A result tensor as the caller's kind of array."""
        if t is None:
            return None
        t = t.contiguous()
        if self.family == "numpy":
            return _torch_to_numpy(self.torch, t)
        if self.family == "torch":
            return t.cpu() if self.back_to_host else t
        return self.module.from_dlpack(t)


def place(torch, device_type: str, backend: str, arrays):
    """(tensors on the device, Placement) for ``arrays`` (None entries stay None)."""
    present = [a for a in arrays if a is not None]
    family = array_family(present[0]) if present else "numpy"
    if family == "numpy":
        device = torch.device(device_type)
        tensors = [None if a is None else _numpy_to_torch(torch, np.asarray(a)).to(device) for a in arrays]
        return tensors, Placement(torch, family, device, True)
    if family == "torch":
        devices = {a.device for a in present}
        if len(devices) > 1:
            raise UnsupportedError(f"backend {backend!r}: the tensors of one call must be on one device "
                                   f"(given {sorted(map(str, devices))})")
        device = devices.pop()
        if device.type == device_type:
            return [None if a is None else a.detach() for a in arrays], Placement(torch, family, device, False)
        if device.type == "cpu":
            target = torch.device(device_type)
            return ([None if a is None else a.detach().to(target) for a in arrays],
                    Placement(torch, family, target, True))
        hint = f" (choose backend='torch-{device.type}')" if device.type in _DEVICE_TYPES else ""
        raise UnsupportedError(f"backend {backend!r} computes on {device_type} devices; these tensors are on "
                               f"{device}{hint}")
    module = importlib.import_module(family)
    tensors = [None if a is None else torch.from_dlpack(a) for a in arrays]
    devices = {t.device for t in tensors if t is not None}
    if any(d.type != device_type for d in devices) or len(devices) > 1:
        raise UnsupportedError(f"backend {backend!r} computes on {device_type} devices; these {family} arrays are "
                               f"on {sorted(map(str, devices))}")
    return tensors, Placement(torch, family, devices.pop(), False, module)
