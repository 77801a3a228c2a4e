"""xconv backends running PyTorch's own convolution kernels, one per torch device type.

A plugin distribution of its own (``backends/xconv_torch/pyproject.toml``, entry point ``torch``
in the group ``xconv.backends``); nothing in the xconv core names it. Importing it imports no
torch: torch is imported when a backend is probed (``availability()``) or used.
See docs/backends.md.
"""

from .backend import DEVICE_TYPES, TorchBackend

__all__ = ["DEVICE_TYPES", "TorchBackend"]
