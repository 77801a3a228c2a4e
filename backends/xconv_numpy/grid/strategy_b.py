"""Grid strategy B ("x-columns", few input channels): im2col of the x phases, dW = dy @ cols^T, dx by
Z = W^T @ dy and col2im adds."""

from __future__ import annotations

import numpy as np

from xconv.dtypes import DTYPES

from ..workers import cap_workers as _cap_workers
from .chunks import budget as _budget, chunks as _chunks
from .geometry import Geom, compute_dtype, io_bytes as _io_bytes, tap_order as _tap_order, x_columns as _x_columns
from .layout import finish_dw as _finish_dw, new_output as _new_output, weight_layout as _weight_layout, x4 as _x4
from .scratch import (GridBuf as _GridBuf, Lease, Slots as _Slots, n_slots as _n_slots, run_guarded as _run_guarded,
                      scatter as _scatter)


def backward(geo: Geom, dy, x, w, need_dx: bool, need_dw: bool, workers: int, lease: Lease):
    """x-columns: cols = shifted x-phase slices; dW = dy @ cols^T; dx by Z = W^T @ dy and col2im."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, line, h, K = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.K
    nph = len(geo.phases)
    # chunks (and so dw's sum order and the products' shapes) as the full call's, whatever the mask
    line_bytes = cdt.itemsize * line * g * (Cog + 2 * K * Cg + 2 * nph * Cg)
    io = _io_bytes(geo, DTYPES[p.dtype].itemsize, True, True)
    budget = _budget(io, p)
    chunks, lines, aligned = _chunks(geo, line_bytes, 2 * h, budget)
    workers = _cap_workers(workers, budget, (lines + 2 * h) * line_bytes)
    hf = 0 if aligned else h           # dy lines before the chunk whose col2im reaches into it
    order = _tap_order(geo)
    dy4 = _x4(dy, g, Cog)
    if need_dw:
        x4 = _x4(x, g, Cg)
        slots = _Slots(_n_slots(io, cdt.itemsize * g * K * Cog * Cg), [(g, Cog, K * Cg)], cdt, lease)
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover)
        dx4 = _x4(dx, g, Cg)
        wt = _weight_layout(w, geo, cdt, "gkco", lease).reshape(g, K * Cg, Cog)

    def workspace():
        return dict(dy=_GridBuf(geo, g, Cog, lines + hf, cdt, lease),
                    cols=lease.empty((g, K * Cg * lines * line), cdt) if need_dw else None,
                    z=lease.empty((g, K * Cg * (lines + hf) * line), cdt) if need_dx else None,
                    x=[_GridBuf(geo, g, Cg, lines + h, cdt, lease) for _ in geo.phases] if need_dw else None,
                    dx=[lease.empty((g, Cg, (hf + lines + h) * line), cdt) for _ in geo.phases] if need_dx else None,
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def task(ws, i, e0, e1):
        rows = (e1 - e0) * line
        ext = rows + hf * line
        dyg = ws["dy"].fill(dy4, e0 - hf, e1, geo.y_valid)
        if need_dw:
            xgs = [b.fill(x4, e0, e1 + h, geo.x_valid[r]) for b, (r, _) in zip(ws["x"], geo.phases)]
            cols = ws["cols"][:, :K * Cg * rows].reshape(g, K * Cg, rows)
            _x_columns(geo, xgs, cols, rows)
            parts = slots.target(i, ws["dw"])
            np.matmul(dyg[:, :, hf * line:], cols.transpose(0, 2, 1), out=parts[0])   # (g, Cog, K*Cg)
            slots.commit(i, parts)
        if need_dx:
            z = ws["z"][:, :K * Cg * ext].reshape(g, K * Cg, ext)
            np.matmul(wt, dyg, out=z)
            jj = 0
            for (r, taps), buf in zip(geo.phases, ws["dx"]):
                dxg = buf[:, :, :ext + h * line]
                dxg.fill(0)
                for _, off in taps:
                    dxg[:, :, off:off + ext] += z[:, jj * Cg:(jj + 1) * Cg]
                    jj += 1
                _scatter(geo, dxg[:, :, hf * line:], dx4, e0, e1, geo.x_valid[r])

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        dw = _finish_dw(geo, p, [(order, slots.total()[0].reshape(g, Cog, K, Cg).transpose(0, 1, 3, 2))])
    return (dx if need_dx else None), dw
