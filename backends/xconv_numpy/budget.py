"""Scratch bytes of the NumPy paths whose buffers are not leased from the fast path's arena (the reference's
im2col, used by numpy-exact and by the fast path's column fallback), checked against ``workspace_limit``."""

from __future__ import annotations

import math

from xconv import ConvParams, tracing
from xconv.workspace import check_request

from . import reference


def im2col_bytes(p: ConvParams, op: str, itemsize: int) -> int:
    """One chunk of the reference's columns plus x (or dx) and the result in the compute dtype (``itemsize``
    bytes): what :func:`reference._require` counts beyond the returned array."""
    chunk = reference.columns_chunk_bytes(p, itemsize)
    result = {"fprop": p.output_shape, "dgrad": p.input_shape, "wgrad": p.weight_shape}[op]
    return chunk + itemsize * (math.prod(p.input_shape) + math.prod(result))


def check_im2col(backend: str, p: ConvParams, ops, itemsize: int, path: str) -> None:
    """Refuse (UnsupportedError) im2col work above ``p.workspace_limit``; note the path and its scratch."""
    need = max(im2col_bytes(p, op, itemsize) for op in ops)
    check_request(backend, need, p.workspace_limit, "im2col scratch (columns chunk, compute-dtype copies)")
    tracing.note(path, workspace_bytes=need)
