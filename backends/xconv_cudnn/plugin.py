"""xconv plugin module for the cuDNN backend (entry point ``cudnn`` in the ``xconv.backends`` group).

Cheap by contract: it imports no CuPy, no cuDNN and touches no device.
"""

from xconv import hookimpl

from .backend import CudnnBackend


@hookimpl
def xconv_backends():
    return [CudnnBackend()]
