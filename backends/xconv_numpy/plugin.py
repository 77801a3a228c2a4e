"""xconv plugin module for the NumPy backend (named by the ``xconv.backends`` entry point ``numpy``)."""

from xconv import hookimpl

from .backend import NumpyBackend


@hookimpl
def xconv_backends():
    return [NumpyBackend(), NumpyBackend(exact=True)]
