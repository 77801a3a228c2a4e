"""The NumPy reference backend of xconv. ``NumpyBackend(exact=True)`` is the float64-accumulating oracle."""

from .backend import NumpyBackend

__all__ = ["NumpyBackend"]
