"""The pointwise path (1x1 kernel, stride 1, no padding): per-sample matrix products on the native layout."""

from __future__ import annotations

import numpy as np

from xconv.dtypes import DTYPES

from .. import jobs
from ..aligned import empty_result
from ..workers import cap_workers as _cap_workers
from .chunks import MIN_CHUNKS, budget as _budget, split as _split
from .geometry import Geom, compute_dtype, io_bytes as _io_bytes
from .scratch import Lease, Slots as _Slots, n_slots as _n_slots, run_guarded as _run_guarded


def _blasable(a: np.ndarray, cdt) -> bool:
    """Whether matmul can hand ``a`` (..., rows, cols) to BLAS as is: compute dtype, unit inner stride."""
    return (a.dtype == cdt and a.strides[-1] == cdt.itemsize and a.strides[-2] >= a.shape[-1] * cdt.itemsize
            and all(st >= 0 for st in a.strides))


def _copied(t: np.ndarray, shape, cdt) -> bool:
    """Whether ``t`` (viewed as ``shape``) is copied per chunk rather than handed to BLAS where it lies."""
    return not (t.flags.c_contiguous and _blasable(t.reshape(shape), cdt))


def _samples(t: np.ndarray, n0: int, n1: int, G: int, C: int, P: int, cdt, scratch: np.ndarray):
    """t[n0:n1] as (n, G, C, P) in the compute dtype: a view when BLAS can take it, else copied into scratch."""
    part = t[n0:n1]
    view = None
    try:
        view = part.view()
        view.shape = (n1 - n0, G, C, P)                    # raises where no view exists
    except AttributeError:
        view = None
    if view is not None and _blasable(view, cdt):
        return view
    out = scratch[:(n1 - n0) * G * C * P].reshape(n1 - n0, G, C, P)
    out.reshape(part.shape)[...] = part
    return out


def _sgemm_jobs(x, wm, y, g: int, Cg: int, Cog: int, P: int, N: int, workers: int) -> bool:
    """y[n, g] = wm[g] @ x[n, g] for every sample and group as C jobs, each the ``cblas_sgemm`` call numpy.matmul
    makes for that matrix (jobs.sgemm: the same bits), when float32 operands BLAS takes as they lie and
    NumPy's ILP64 sgemm is there; False (nothing run) otherwise."""
    return jobs.sgemm_stack(np.broadcast_to(wm, (N, g, Cog, Cg)), x.reshape(N, g, Cg, P), y.reshape(N, g, Cog, P),
                            workers)


def backward_chunks(geo: Geom):
    """(chunks of samples, dW's accumulator slots, bytes per sample, working-set budget) of the backward: dW's sum
    order (per chunk a sum over its samples in order, chunk i added to slot i % slots in chunk order, then the slots in
    order), from the full call's shapes on C-contiguous operands (copied only when 16-bit): the same for any mask and
    layout (other layouts' copies take their buffers beyond that)."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    it = cdt.itemsize
    out_dt = DTYPES[p.dtype]
    conv = out_dt != cdt
    sample_bytes = it * g * P * (Cog + 2 * Cg) * conv + it * g * Cog * Cg
    io = _io_bytes(geo, out_dt.itemsize, True, True)
    budget = _budget(io, p)
    cap = max(1, budget // 2)
    nb = max(1, min(N, cap // max(sample_bytes, 1), -(-N // MIN_CHUNKS)))
    return _split(N, nb), _n_slots(io, it * g * Cog * Cg), sample_bytes, budget


def dw_dy_rows(geo: Geom) -> bool:
    """Whether dW's per-sample products are ``dy @ x^T`` (else ``x @ dy^T``): the wider of the two channel counts as
    their rows (both operands hold the positions contiguously: OpenBLAS runs such a product up to 1.5x faster with the
    wider one first; 8x16x24x24 -> 96, one thread: 346 us as x @ dy^T, 240 as dy @ x^T; each element the same dot
    product over the positions: the same bits either way on this build). From the shapes alone."""
    return geo.Cog >= geo.Cg


def backward(geo: Geom, dy, x, w, need_dx: bool, need_dw: bool, need_db: bool, workers: int,
             lease: Lease):
    """(dx, dw, db) of a 1x1 kernel, stride 1, no padding: per-sample matrix products on the (N, C, positions)
    layout as is; db from the same samples of dy while they are in cache (per sample, then samples in order)."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    out_dt = DTYPES[p.dtype]
    copy_dy = _copied(dy, (N, g, Cog, P), cdt)
    copy_x = need_dw and _copied(x, (N, g, Cg, P), cdt)
    chunks, n_dw_slots, sample_bytes, budget = backward_chunks(geo)
    nb = max(b - a for a, b in chunks)
    workers = _cap_workers(workers, budget, nb * sample_bytes)
    if need_dx:
        dx = empty_result(p.input_shape, out_dt)
        wt = lease.empty((g, Cg, Cog), cdt)
        wt[...] = w.reshape(g, Cog, Cg).transpose(0, 2, 1)
    dy_rows = dw_dy_rows(geo)
    dw_shape = (g, Cog, Cg) if dy_rows else (g, Cg, Cog)
    if need_dw:
        slots = _Slots(n_dw_slots, [dw_shape], cdt, lease)
    db_parts = lease.empty((N, g * Cog), cdt) if need_db else None

    def workspace():
        return dict(dy=lease.empty((nb * g * Cog * P,), cdt) if copy_dy else None,
                    x=lease.empty((nb * g * Cg * P,), cdt) if copy_x else None,
                    dx=lease.empty((nb, g, Cg, P), cdt) if need_dx and out_dt != cdt else None,
                    dws=lease.empty((nb,) + dw_shape, cdt) if need_dw else None,
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def task(ws, i, n0, n1):
        m = n1 - n0
        dyc = _samples(dy, n0, n1, g, Cog, P, cdt, ws["dy"])
        if need_db:
            db_parts[n0:n1] = dyc.sum(axis=3).reshape(m, g * Cog)
        if need_dx:
            if ws["dx"] is None:
                np.matmul(wt, dyc, out=dx[n0:n1].reshape(m, g, Cg, P))
            else:
                out = ws["dx"][:m]
                np.matmul(wt, dyc, out=out)
                dx[n0:n1].reshape(m, g, Cg, P)[...] = out
        if need_dw:
            xc = _samples(x, n0, n1, g, Cg, P, cdt, ws["x"])
            per = ws["dws"][:m]                                        # dW (or dW^T) per sample
            if dy_rows:
                np.matmul(dyc, xc.transpose(0, 1, 3, 2), out=per)
            else:
                np.matmul(xc, dyc.transpose(0, 1, 3, 2), out=per)
            parts = slots.target(i, ws["dw"])
            np.sum(per, axis=0, out=parts[0])
            slots.commit(i, parts)

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        dw = np.empty(p.weight_shape, out_dt)
        total = slots.total()[0]
        dw.reshape(g, Cog, Cg)[...] = total if dy_rows else total.transpose(0, 2, 1)
    db = np.ascontiguousarray(db_parts.sum(axis=0).astype(out_dt, copy=False)) if need_db else None
    return (dx if need_dx else None), dw, db


def fprop(geo: Geom, x, w, bias, workers: int, lease: Lease):
    """y = conv(x, w) + bias of a 1x1 kernel, stride 1, no padding: per group ``y[n] = W @ x[n]`` on the
    (N, C, positions) layout as is (one BLAS product per sample and group, so the chunks of samples, fixed by the
    shapes, never change a bit), the bias added after in the compute dtype. Nothing the definition does not
    multiply is multiplied (no padding): non-finite values stay where the exact path has them."""
    p = geo.p
    cdt = compute_dtype(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    it = cdt.itemsize
    out_dt = DTYPES[p.dtype]
    copy_x = _copied(x, (N, g, Cg, P), cdt)
    conv = out_dt != cdt
    sample_bytes = it * g * P * (Cg * copy_x + Cog * conv) + 1
    budget = _budget(_io_bytes(geo, out_dt.itemsize, False, False, fprop=True), p)
    nb = max(1, min(N, max(1, budget // 2) // sample_bytes, -(-N // MIN_CHUNKS)))
    chunks = _split(N, nb)
    nb = max(b - a for a, b in chunks)
    workers = _cap_workers(workers, budget, nb * sample_bytes)
    wm = lease.empty((g, Cog, Cg), cdt)
    wm[...] = w.reshape(g, Cog, Cg)
    b = None if bias is None else np.asarray(bias, cdt).reshape(1, g, Cog, 1)
    y = empty_result(p.output_shape, out_dt)
    if not copy_x and not conv and _sgemm_jobs(x, wm, y, g, Cg, Cog, P, N, workers):
        if b is not None:
            y.reshape(N, g, Cog, P)[...] += b
        return y

    def workspace():
        return dict(x=lease.empty((nb * g * Cg * P,), cdt) if copy_x else None,
                    y=lease.empty((nb, g, Cog, P), cdt) if conv else None)

    def task(ws, i, n0, n1):
        m = n1 - n0
        xc = _samples(x, n0, n1, g, Cg, P, cdt, ws["x"])
        out = y[n0:n1].reshape(m, g, Cog, P) if ws["y"] is None else ws["y"][:m]
        np.matmul(wm, xc, out=out)
        if b is not None:
            out += b
        if ws["y"] is not None:
            y[n0:n1].reshape(m, g, Cog, P)[...] = out

    _run_guarded(chunks, task, workspace, workers, None)
    return y
