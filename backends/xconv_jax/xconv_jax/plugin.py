"""xconv plugin module of the JAX backends (entry point ``jax`` in the ``xconv.backends`` group).

Cheap by contract: it imports no jax and touches no device.
"""

from xconv import hookimpl

from .backend import PLATFORMS, JaxBackend


@hookimpl
def xconv_backends():
    return [JaxBackend(platform) for platform in PLATFORMS]
