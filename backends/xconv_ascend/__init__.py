"""xconv's Ascend backend (``ascend``): a ctypes shim over CANN's aclnnConvolution and aclnnConvolutionBackward.

Importing this package loads no CANN library; :class:`~xconv_ascend.driver.Driver` does, on first use.
It is also the module of the ``xconv_ascend`` array family (:class:`DeviceArray`), so it offers the
few array functions the core's legalization uses (``zeros``, ``ascontiguousarray``).
"""

from .backend import AscendBackend
from .device_array import DeviceArray, asarray, ascontiguousarray, empty, moveaxis, zeros
from .driver import Driver

__all__ = ["AscendBackend", "DeviceArray", "Driver", "asarray", "ascontiguousarray", "empty", "moveaxis", "zeros"]
