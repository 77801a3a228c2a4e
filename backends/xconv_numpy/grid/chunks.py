"""Chunk planning: the working-set budget of a call and the line ranges its chunks cover. Depends only on shapes."""

from __future__ import annotations

import math

from xconv import ConvParams, tracing

from .. import tuning
from ..blas import MAX_WORKERS
from ..workers import even_ranges
from .geometry import Geom, compute_dtype

#: The batch is cut into at least this many chunks when it has that many lines, to share the work.
MIN_CHUNKS = 2


def budget(nbytes: int, p: ConvParams | None = None) -> int:
    """Working-set budget of one call: all chunks in flight together stay within it: the bytes of the call's inputs
    and outputs, at least 1 MiB (below it chunking only adds overhead) and at most 32 MiB (bigger chunks stop
    paying once they leave the cache; knob ``chunk_bytes``, :mod:`..tuning`). Under ``p.workspace_limit``
    it is the limit less a reserve for the weight-sized scratch (layouts, accumulator slots: at most
    3 + 2 * MAX_WORKERS weights in the compute dtype)."""
    low, high = tuning.get("chunk_bytes")
    budget = int(min(high, max(low, nbytes)))
    if p is not None and p.workspace_limit is not None:
        reserve = (3 + 2 * MAX_WORKERS) * math.prod(p.weight_shape) * compute_dtype(p).itemsize
        if p.workspace_limit - reserve < budget:          # the limit binds: other chunks, other partial sums
            budget = max(1, p.workspace_limit - reserve)
            tracing.note(f"workspace_limit binds: chunks within {budget} bytes (grad_weight's partial sums, and "
                         f"the products' shapes, differ from the unlimited call's)")
    return budget


def split(total: int, most: int):
    """[start, stop) ranges covering range(total), each at most ``most`` long, sizes differing by at
    most one, and an even number of them where possible (two workers finish together)."""
    n = max(1, -(-total // max(most, 1)))
    if n % 2 and n < total:
        n += 1
    return even_ranges(total, n)


def chunks(geo: Geom, line_bytes: int, halo_lines: int, budget: int):
    """(chunks, max lines, aligned): line ranges [e0, e1) covering the batch.

    Each chunk's buffers take at most budget / 2 bytes (two chunks in flight fit the budget; four,
    the most, twice the budget), and there are at least MIN_CHUNKS chunks when the batch has enough
    lines, so that the workers share the work. Whole samples per chunk when one sample fits
    (``aligned``), else equal line ranges of one sample. Depends only on the shapes.
    """
    L1, N = geo.L1, geo.N
    line_bytes = max(line_bytes, 1)
    cap = max(1, budget // 2)
    if (L1 + halo_lines) * line_bytes <= cap:
        nb = max(1, min(N, (cap - halo_lines * line_bytes) // (L1 * line_bytes), -(-N // MIN_CHUNKS)))
        parts = split(N, nb)
        return [(a * L1, b * L1) for a, b in parts], max(b - a for a, b in parts) * L1, True
    nl = max(1, min(cap // line_bytes - halo_lines, -(-N * L1 // MIN_CHUNKS)))
    parts = split(L1, nl)
    return ([(n * L1 + a, n * L1 + b) for n in range(N) for a, b in parts], max(b - a for a, b in parts),
            False)



def chunks_compact(geo: Geom, lo1: int, hi1: int, dy_line_bytes: int, unit_bytes: int, budget: int,
                    single_sample: bool):
    """Chunks (n0, nb, a, b): samples n0..n0+nb-1, grid lines [a, b) of the first dim, within [lo1, hi1).

    Whole samples per chunk when one fits half the budget (and ``single_sample`` is False), else
    line ranges of one sample; at least MIN_CHUNKS chunks when there is enough work. Also returns
    the most dy-grid lines and compact lines a chunk has. Depends only on the shapes.
    """
    N, L1, h = geo.N, geo.L1, geo.halo
    S1 = hi1 - lo1
    cap = max(1, budget // 2)
    sample = S1 * unit_bytes + L1 * dy_line_bytes
    if not single_sample and sample + h * dy_line_bytes <= cap:
        nb = max(1, min(N, (cap - h * dy_line_bytes) // max(sample, 1), -(-N // MIN_CHUNKS)))
        parts = split(N, nb)
        nb = max(b - a for a, b in parts)
        return [(a, b - a, lo1, hi1) for a, b in parts], nb * L1 + h, nb * S1
    per_line = unit_bytes + dy_line_bytes
    nl = max(1, min(cap // max(per_line, 1) - h, -(-N * S1 // MIN_CHUNKS)))
    parts = split(S1, nl)
    nl = max(b - a for a, b in parts)
    return [(n, 1, lo1 + a, lo1 + b) for n in range(N) for a, b in parts], nl + h, nl
