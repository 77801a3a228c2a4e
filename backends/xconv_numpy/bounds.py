"""Upper bounds of the scratch of the paths that do not lease it (:mod:`.paths`, the workspace_limit rule).

The depthwise loops and the small-call paths allocate their scratch themselves (C ``malloc``, per-worker
planes, converted blocks), so a workspace lease cannot count it. Under a ``workspace_limit`` such a path runs
only when its bound fits the limit: a limit that constrains nothing (at least the bound) then changes no path and
no bit (issue 24), and a limit below it excludes the path, which the trace record says. The bounds are generous
(every buffer in float64) and depend on the parameters only.
"""

from __future__ import annotations

import math

from xconv import ConvParams

from . import depthwise as _depthwise, small as _small
from .blas import MAX_WORKERS


def small(p: ConvParams) -> int:
    """The small-call paths: columns, zero-padded grids of x and dy, results and converted inputs."""
    pad = math.prod(s + a + b + (k - 1) * d + t for s, (a, b), k, d, t in
                    zip(p.input_shape[2:], p.padding, p.kernel, p.dilation, p.stride))
    io = math.prod(p.input_shape) + math.prod(p.output_shape) + math.prod(p.weight_shape)
    return 8 * (2 * _small.elements(p, True, every_path=True)
                + p.input_shape[0] * (p.input_shape[1] + p.output_shape[1]) * pad + 3 * io)


def depthwise(p: ConvParams) -> int:
    """The depthwise loops: every worker's plane scratch, the per-sample partials of dw, the weight copy and one
    block of converted samples (at most ``depthwise.BLOCK_BYTES``, or one sample)."""
    plan, it = _depthwise._plan(p), 8
    N, Co = plan.in4[0], plan.out4[1]
    worker = plan.F + (plan.Lh + 1) * plan.Lw * (1 + 2 * plan.nslots)
    sample = math.prod(plan.out4[1:]) + 2 * math.prod(plan.in4[1:])
    return it * (MAX_WORKERS * worker + N * Co * (plan.K + 1) + Co * plan.K + sample) + \
        max(_depthwise.BLOCK_BYTES, it * sample)


def colgemm(p: ConvParams) -> int:
    """colgemm (issue 25): its columns and products stay within the call's input and output bytes per chunk of
    samples (``colgemm.sample_chunks``); counted generously as four times those bytes in float64, plus dW's partial."""
    io = math.prod(p.input_shape) * 2 + math.prod(p.output_shape) + math.prod(p.weight_shape) * 3
    return 8 * 4 * io
