"""Arrays whose first element starts a 64-byte cache line, in blocks that a later 64-byte-aligned allocation of the
same size can take: the dense loops' weight copies, and the activation-sized results the backend returns (y, dx).

NumPy's arrays need not start a line (glibc's large blocks start 16 bytes past one): every 16-float block of a padded
weight row then spanned two lines, and the AVX2 build's second 32-byte load of each was split. And NumPy's block is
the array's size exactly, while PyTorch's CPU tensors come from ``posix_memalign(64, n)``, for which glibc takes a
free block of n + 64 + 32 bytes or more: inside a torch model a freed result of NumPy's fitted no later tensor of its
own size, and every such tensor took fresh pages (issue 25, the speech encoder's evaluation, two threads: the GELU
after the GroupNorm, whose input's size is the first convolution's output's, 4.3 ms in the torch model against 11.9
in the converted one: 6398 page faults a call against none).
"""

from __future__ import annotations

import math

import numpy as np

from .native import address

#: Bytes past the array's own in its block: up to 64 to start a line wherever malloc's block starts, and 64 more so
#: that the block, once freed, holds a ``posix_memalign(64, n)`` of the array's n bytes (n + 96 asked of the free
#: lists; the block's own header is another 16 bytes: its 8-byte size field, rounded to 16).
SLACK = 128
#: Bytes from which :func:`empty_result` places a result so (a smaller one is NumPy's own: the placing costs about
#: 4 µs, a tenth of a small call, and a few pages are no fault's worth).
RESULT_MIN_BYTES = 1 << 16


def line_aligned(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype`` whose first element starts a 64-byte line: a
    view of a block SLACK bytes longer (an empty array: NumPy's own, with no first element to place)."""
    dt = np.dtype(dtype)
    shape = tuple(shape)
    n = math.prod(shape) * dt.itemsize
    if n == 0:
        return np.empty(shape, dt)
    raw = np.empty(n + SLACK, np.uint8)
    a = -address(raw) % 64
    return raw[a:a + n].view(dt).reshape(shape)


def empty_result(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array for a result the backend returns (y, dx): :func:`line_aligned` from
    RESULT_MIN_BYTES, else NumPy's own."""
    dt = np.dtype(dtype)
    if math.prod(shape) * dt.itemsize < RESULT_MIN_BYTES:
        return np.empty(shape, dt)
    return line_aligned(shape, dt)
