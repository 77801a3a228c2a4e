"""xconv: one convolution interface (forward and backward-with-output-mask) over many vendors' kernels.

Public API: :func:`convolution_backward`, :func:`conv_fprop`, :func:`conv_dgrad`, :func:`conv_wgrad`,
:func:`output_shape`, :func:`list_backends`, :func:`get_backend`, :func:`trace` (per-call provenance, see
:mod:`xconv.tracing`), and the errors below.
Backends are plugins (see :mod:`xconv.hookspec`).
"""

from . import forking  # noqa: F401  (records this process's pid: see xconv.forking)
from .api import conv_dgrad, conv_fprop, conv_wgrad, convolution_backward
from .backend import Backend, BackendInfo, Capabilities
from .errors import (BackendError, BackendFailedError, BackendOutOfMemoryError, BackendUnavailableError, ConfigError, DTypeError,
                     ResourceError, ShapeError, UnknownBackendError, UnsupportedError, XconvError)
from .hookspec import hookimpl
from .params import ConvParams, output_shape
from .registry import get_backend, list_backends, register_backend, unregister_backend
from .tracing import Record, trace

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendError", "BackendFailedError", "BackendInfo", "BackendOutOfMemoryError",
    "BackendUnavailableError", "Capabilities", "ConfigError", "ConvParams", "DTypeError", "Record", "ResourceError", "ShapeError",
    "UnknownBackendError", "UnsupportedError", "XconvError", "conv_dgrad", "conv_fprop", "conv_wgrad", "convolution_backward",
    "get_backend", "hookimpl", "list_backends", "output_shape", "register_backend", "trace", "unregister_backend",
    "__version__",
]
