"""The bias gradient: dy summed over the batch and the spatial dims."""

from __future__ import annotations

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES, accumulation_dtype

from .blas import single_threaded_blas as pinned_blas_workers
from .workers import executor as _executor

#: The bias gradient sums dy in blocks of whole samples of about this many bytes, in parallel.
BGRAD_BLOCK_BYTES = 2 << 20


def bias_sum(dy, p: ConvParams):
    """dy summed over N and the spatial dims: per block of samples (blocks fixed by the shape alone),
    blocks summed on the workers, partial sums added in block order."""
    cdt = accumulation_dtype(p.dtype)
    axes = (0,) + tuple(range(2, dy.ndim))
    N = dy.shape[0]
    per_sample = max(1, dy.size // max(N, 1) * dy.itemsize)
    nb = max(1, BGRAD_BLOCK_BYTES // per_sample)
    blocks = [(n, min(n + nb, N)) for n in range(0, N, nb)]
    if len(blocks) <= 1:
        db = np.sum(dy, axis=axes, dtype=cdt)
    else:
        def part(b):
            return np.sum(dy[b[0]:b[1]], axis=axes, dtype=cdt)
        with pinned_blas_workers() as workers:
            parts = list(_executor(workers).map(part, blocks)) if workers > 1 else [part(b) for b in blocks]
        db = parts[0]
        for more in parts[1:]:
            db += more
    return np.ascontiguousarray(db.astype(DTYPES[p.dtype], copy=False))
