"""The batch-invariance check of ``deterministic="batch_invariant"`` cases.

Each sample's forward output and grad_input must be bitwise what the same call gives that sample
alone (a batch of one): grad_input from the case's backward call, the forward from conv_fprop on
the same inputs. grad_weight and grad_bias sum over the batch and are checked run to run only.
"""

from __future__ import annotations

import numpy as np

import xconv

from .cases import Case


def problems(case: Case, backend, arrays, batched_dx, fam, kwargs: dict) -> list[str]:
    """Messages for each sample whose forward output or grad_input differs from its batch-of-one bits."""
    dy, x, w = arrays
    conv = {k: v for k, v in kwargs.items() if k not in ("output_mask", "bias_sizes")}
    found = []
    y = fam.to_numpy(xconv.conv_fprop(x, w, backend=backend, **conv))
    dx = None if batched_dx is None else np.ascontiguousarray(batched_dx)
    for n in range(case.n):
        y1 = fam.to_numpy(xconv.conv_fprop(x[n:n + 1], w, backend=backend, **conv))
        if not _same_bits(y[n:n + 1], y1):
            found.append(f"forward output of sample {n}: differs from its batch-of-one result")
        if dx is not None:
            dx1 = fam.to_numpy(xconv.convolution_backward(dy[n:n + 1], x[n:n + 1], w, backend=backend,
                                                          output_mask=(True, False, False), **conv)[0])
            if not _same_bits(dx[n:n + 1], dx1):
                found.append(f"grad_input of sample {n}: differs from its batch-of-one result")
    return found


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
