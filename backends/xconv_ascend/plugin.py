"""xconv plugin module for the Ascend backend (entry point ``ascend`` in the ``xconv.backends`` group).

Cheap by contract: it loads no CANN library and touches no device; availability is asked later.
"""

from xconv import hookimpl

from .backend import AscendBackend


@hookimpl
def xconv_backends():
    return [AscendBackend()]
