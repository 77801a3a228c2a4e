"""xconv plugin module of the torch backends (entry point ``torch`` in the ``xconv.backends`` group).

Cheap by contract: it imports no torch and touches no device.
"""

from xconv import hookimpl

from .backend import DEVICE_TYPES, TorchBackend


@hookimpl
def xconv_backends():
    return [TorchBackend(device_type) for device_type in DEVICE_TYPES]
