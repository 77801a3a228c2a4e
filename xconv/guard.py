"""The one place where the core calls into a backend: no exception but an XconvError comes back out.

Every primitive call (``fprop``, ``dgrad``, ``wgrad``, ``bgrad``, ``backward``) and every
``capabilities_for`` query goes through :func:`call`. An :class:`~xconv.errors.XconvError` a
backend raises passes unchanged (it is already xconv's own); anything else (a Numba typing error,
a ctypes ``ArgumentError``, an ``OSError`` from a loader, a ``MemoryError``, a CuPy or cuDNN
frontend exception, a plain bug) is re-raised as :class:`~xconv.errors.BackendFailedError`
(``BackendOutOfMemoryError`` for a MemoryError) naming the backend and the operation, chained
with ``from``. ``KeyboardInterrupt`` and other non-``Exception`` signals pass through. The public
calls also run their whole legalization through :func:`call` (operation ``conv_fprop`` and so on), so
an exception from the core's own array work for that backend (a padded copy of a CuPy array running
out of device memory) is wrapped the same way.
"""

from __future__ import annotations

from .errors import BackendFailedError, BackendOutOfMemoryError, XconvError


def backend_name(backend) -> str:
    """The backend's ``name``, or its type's name when it has none (never raises)."""
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) and name else type(backend).__name__


def call(backend, operation: str, fn, *args):
    """``fn(*args)``, with any non-XconvError exception it raises wrapped (see the module docstring)."""
    try:
        return fn(*args)
    except XconvError:
        raise
    except MemoryError as exc:
        raise BackendOutOfMemoryError(backend_name(backend), operation, exc) from exc
    except Exception as exc:
        raise BackendFailedError(backend_name(backend), operation, exc) from exc
