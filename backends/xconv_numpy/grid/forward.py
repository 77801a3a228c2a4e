"""The grid forward: y = W @ cols per chunk, cols the im2col of the x phases."""

from __future__ import annotations

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES

from ..aligned import empty_result
from ..workers import cap_workers as _cap_workers, run as _run
from .chunks import budget as _budget, chunks as _chunks
from .geometry import compute_dtype, geom as _geom, io_bytes as _io_bytes, x_columns as _x_columns
from .layout import weight_layout as _weight_layout, x4 as _x4
from .scratch import GridBuf as _GridBuf, Lease, scatter as _scatter


def fprop(x, w, bias, p: ConvParams, workers: int, lease: Lease):
    """y = conv(x, w) + bias, by x-columns (im2col of the x phases) and one GEMM per chunk, on up to ``workers``
    threads, scratch from ``lease``."""
    geo = _geom(p)
    cdt = compute_dtype(p)
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    line_bytes = cdt.itemsize * line * g * (Cog + K * Cg + nph * Cg)
    budget = _budget(_io_bytes(geo, DTYPES[p.dtype].itemsize, False, False, fprop=True), p)
    chunks, lines, _ = _chunks(geo, line_bytes, h, budget)
    R = lines * line
    chunk_bytes = (lines + h) * line_bytes
    wm = _weight_layout(w, geo, cdt, "gokc", lease).reshape(g, Cog, K * Cg)
    b = None if bias is None else bias.astype(cdt).reshape(g, Cog, 1)
    x4 = _x4(x, g, Cg)
    y = empty_result(p.output_shape, DTYPES[p.dtype])
    y4 = _x4(y, g, Cog)

    def workspace():
        return dict(x=[_GridBuf(geo, g, Cg, lines + h, cdt, lease) for _ in geo.phases],
                    cols=lease.empty((g, K * Cg * R), cdt), y=lease.empty((g, Cog, R), cdt))

    def task(ws, i, e0, e1):
        rows = (e1 - e0) * line
        xgs = [buf.fill(x4, e0, e1 + h, geo.x_valid[r]) for buf, (r, _) in zip(ws["x"], geo.phases)]
        cols = ws["cols"][:, :K * Cg * rows].reshape(g, K * Cg, rows)
        _x_columns(geo, xgs, cols, rows)
        yg = ws["y"][:, :, :rows]
        np.matmul(wm, cols, out=yg)
        if b is not None:
            yg += b
        _scatter(geo, yg, y4, e0, e1, geo.y_valid)

    _run(chunks, task, workspace, _cap_workers(workers, budget, chunk_bytes))
    return y
