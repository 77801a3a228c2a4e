"""Moving a call's arrays onto the backend's JAX device and its results back to the caller.

- JAX arrays (family "jaxlib", ``jax.Array``) on one device of the backend's platform are used as
  they are, and the results are JAX arrays on that device: no copy either way (JAX arrays that
  cross from other libraries do so through DLPack, ``jax.dlpack.from_dlpack``);
- NumPy arrays (any strides, read-only, memory-mapped; the core has made them native byte order and
  aligned) are copied to the platform's first device and the results come back as new, writable,
  C-contiguous NumPy arrays;
- JAX arrays on another platform, or on several devices, are refused by name.
"""

from __future__ import annotations

import numpy as np

from xconv import UnsupportedError


class Placement:
    """How a call's results go back to the caller (built by :func:`place`)."""

    def __init__(self, to_numpy: bool):
        self.to_numpy = to_numpy

    def out(self, r):
        if r is None:
            return None
        return np.array(r, order="C", copy=True) if self.to_numpy else r


def place(jax, platform: str, backend: str, arrays):
    """(JAX arrays on the device, Placement) for ``arrays`` (None entries stay None)."""
    present = [a for a in arrays if a is not None]
    if present and all(isinstance(a, jax.Array) for a in present):
        devices = set()
        for a in present:
            devices |= set(a.devices())
        if len(devices) != 1:
            raise UnsupportedError(f"backend {backend!r}: the arrays of one call must be on one device "
                                   f"(given {sorted(map(str, devices))})")
        device = devices.pop()
        if device.platform != platform and not (platform == "gpu" and device.platform in ("cuda", "rocm")):
            raise UnsupportedError(f"backend {backend!r} computes on {platform} devices; these JAX arrays are on "
                                   f"{device} (choose backend='jax-{device.platform}')")
        return list(arrays), Placement(False)
    if any(isinstance(a, jax.Array) for a in present):
        raise UnsupportedError(f"backend {backend!r}: the arrays of one call must all be JAX arrays or all NumPy "
                               "arrays")
    device = jax.devices(platform)[0]
    return [None if a is None else jax.device_put(np.asarray(a), device) for a in arrays], Placement(True)
