"""xconv's cuDNN backend (``cudnn``): cuDNN frontend graphs on CuPy arrays.

Importing this package imports neither CuPy nor cuDNN; they load on first use.
"""

from .backend import CudnnBackend

__all__ = ["CudnnBackend"]
