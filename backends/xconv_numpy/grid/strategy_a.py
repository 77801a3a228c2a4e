"""Grid strategy A ("dy-columns"): per phase, the taps' shifted dy slices gathered for the phase's valid input
positions, then dx_p = W_p^T @ cols_p and dW_p = cols_p @ x_p^T."""

from __future__ import annotations

import math

import numpy as np

from xconv.dtypes import DTYPES

from .. import tuning
from ..workers import cap_workers as _cap_workers
from .chunks import budget as _budget, chunks_compact as _chunks_compact
from .geometry import Geom, compute_dtype, io_bytes as _io_bytes
from .layout import finish_dw as _finish_dw, new_output as _new_output, weight_layout as _weight_layout, x4 as _x4
from .scratch import GridBuf as _GridBuf, Lease, Slots as _Slots, n_slots as _n_slots, run_guarded as _run_guarded



def _implicit_outer(geo: Geom, ip: int, single_sample: bool) -> bool:
    """Whether phase ip's first-dim taps should be line-shifted views of inner-tap columns.

    That copies 1/n_1 of the columns, at the price of n_1 smaller GEMMs and, for the input
    gradient, n_1 - 1 additions of a (C_in/g, rows) block. Needs chunks inside one sample (the
    shifted views must be plain matrices). Measured on the suite: 5-7% faster for 2-D kernels
    with C_in/g >= 8, slower for the 3x3x3 one (whose GEMMs get too small) and for depthwise.
    """
    if geo.nd == 1 or geo.tapgrid[ip][0][2] == 1 or not single_sample:
        return False
    if tuning.get("implicit_outer") is not None:
        return bool(tuning.get("implicit_outer"))
    return geo.nd == 2 and geo.Cg >= 8



def backward(geo: Geom, dy, x, w, need_dx: bool, need_dw: bool, workers: int, lease: Lease):
    """dy-columns on the valid input positions only.

    Per chunk and phase p: cols_p = the taps' shifted slices of the dy grid, gathered for the
    positions u of x's phase p only (garbage and padding positions are skipped), then
    dx_p = W_p^T @ cols_p (scattered into dx) and dW_p = cols_p @ x_p^T.
    """
    p = geo.p
    cdt = compute_dtype(p)
    it = cdt.itemsize
    g, Cg, Cog, line, h, nd, L1 = geo.g, geo.Cg, geo.Cog, geo.line, geo.halo, geo.nd, geo.L1
    gs = geo.gstride
    live = [ip for ip, (r, _) in enumerate(geo.phases) if all(v[1] > v[0] for v in geo.x_valid[r])]
    if not live:
        return (_new_output(p.input_shape, p, zero=True) if need_dx else None,
                np.zeros(p.weight_shape, DTYPES[p.dtype]) if need_dw else None)
    valid = {ip: geo.x_valid[geo.phases[ip][0]] for ip in live}
    dead = [ip for ip in range(len(geo.phases)) if ip not in valid]
    # positions per line: the valid ones only (compact), or whole grid lines (flat: long contiguous
    # copies, GEMM work on the few padding columns, whose x is zero and whose dx is dropped)
    # (measured: compact is faster for C_in/g >= 64, where the GEMMs dominate; flat for the thin
    # channel counts, where copies do)
    compact = tuning.get("compact_inner")                  # knobs: tuning.py
    flat = nd > 1 and not (compact if compact is not None else Cg >= 64)
    # flat 3-D: the grid rows of the second dim that hold no input are skipped too (whole rows)
    trim = {ip: (valid[ip][1][:2] if flat and nd >= 3 else (0, geo.L[1] if nd > 1 else 1)) for ip in live}
    tail = math.prod(geo.L[2:])
    rest_n = {ip: (trim[ip][1] - trim[ip][0]) * tail if flat else math.prod(v[1] - v[0] for v in valid[ip][1:])
              for ip in live}
    lo1 = min(valid[ip][0][0] for ip in live)
    hi1 = max(valid[ip][0][1] for ip in live)
    per_sample_positions = max(rest_n[ip] * (valid[ip][0][1] - valid[ip][0][0]) for ip in live)
    implicit_knob = tuning.get("implicit_outer")
    single = (nd == 2 and Cg >= 8 and per_sample_positions >= 2048) if implicit_knob is None else bool(implicit_knob)
    implicit = {ip: _implicit_outer(geo, ip, single) for ip in live}
    J = {ip: len(geo.phases[ip][1]) for ip in live}
    n1 = {ip: geo.tapgrid[ip][0][2] for ip in live}
    ext = {ip: ((n1[ip] - 1) * geo.tapgrid[ip][0][1] if implicit[ip] else 0) for ip in live}
    col_rows = {ip: (J[ip] // n1[ip] if implicit[ip] else J[ip]) * Cog for ip in live}
    # chunks (and so dw's sum order and the products' shapes) as the full call's, whatever the mask
    unit_bytes = it * g * max(rest_n[ip] * (col_rows[ip] + Cg * (1 + implicit[ip]) + Cg) for ip in live)
    io = _io_bytes(geo, DTYPES[p.dtype].itemsize, True, True)
    budget = _budget(io, p)
    chunks, dy_lines, c_lines = _chunks_compact(geo, lo1, hi1, it * g * Cog * line, unit_bytes, budget, single)
    workers = _cap_workers(workers, budget, dy_lines * it * g * Cog * line + c_lines * unit_bytes)
    U = max(rest_n[ip] * (c_lines + ext[ip]) for ip in live)
    cols_len = max(col_rows[ip] * rest_n[ip] * (c_lines + ext[ip]) for ip in live)
    dy4 = _x4(dy, g, Cog)
    if need_dx:
        dx = _new_output(p.input_shape, p, zero=not geo.full_cover or len(live) < len(geo.phases))
        dx4 = _x4(dx, g, Cg)
        wt = _weight_layout(w, geo, cdt, "gcko", lease)                   # taps in phase order
        wts, k0 = {}, 0
        for ip, (_, taps) in enumerate(geo.phases):                         # views (g, Cg, J*Cog)
            wts[ip] = wt[:, :, k0:k0 + len(taps)].reshape(g, Cg, -1)
            k0 += len(taps)
    if need_dw:
        x4 = _x4(x, g, Cg)
        slots = _Slots(_n_slots(io, it * g * geo.K * Cog * Cg),
                       [(g, len(taps) * Cog, Cg) for _, taps in geo.phases], cdt, lease)

    def workspace():
        return dict(dy=_GridBuf(geo, g, Cog, dy_lines, cdt, lease), cols=lease.empty((g, cols_len), cdt),
                    dx=lease.empty((g, Cg, U), cdt) if need_dx else None,
                    dx2=lease.empty((g, Cg, U), cdt) if need_dx and any(implicit.values()) else None,
                    x={ip: lease.empty((g, Cg, U), cdt) for ip in live} if need_dw else None,
                    fresh=set(live),                        # flat x blocks still to zero (padding columns)
                    dw=slots.scratch() if need_dw and len(chunks) > slots.S else None)

    def tensor_block(t4, ip, n0, nb, ca, c1):
        """The phase-ip positions of samples n0.., first-dim grid lines [ca, ca+c1) of tensor t4 (N, G, C, *S)."""
        sl = [slice(n0, n0 + nb), slice(None), slice(None)]
        for d, (lo, hi, start, step) in enumerate(valid[ip]):
            first, cnt = (start + (ca - lo) * step, c1) if d == 0 else (start, hi - lo)
            sl.append(slice(first, first + (cnt - 1) * step + 1, step))
        return t4[tuple(sl)].transpose((1, 2, 0) + tuple(range(3, 3 + nd)))      # (G, C, nb, c1, ...)

    def task(ws, i, n0, nb, a, b):
        E0 = n0 * L1 + a - h
        dyg = ws["dy"].fill(dy4, E0, (n0 + nb - 1) * L1 + b, geo.y_valid)
        parts = slots.target(i, ws["dw"]) if need_dw else None
        for ip in dead if need_dw else ():     # phases whose taps read no input: zero, not leftover scratch
            parts[ip].fill(0)
        for ip in live:
            r, taps = geo.phases[ip]
            v = valid[ip]
            ca, cb = max(a, v[0][0]), min(b, v[0][1])
            c1 = cb - ca
            if c1 <= 0:
                if need_dw:
                    parts[ip].fill(0)
                continue
            rows = nb * c1 * rest_n[ip]
            spec = geo.tapgrid[ip]
            if flat:
                t0, t1 = trim[ip]
                inner_off = t0 * gs[1]
                pos_shape, pos_strides = (nb, c1 + ext[ip], rest_n[ip]), (L1 * line, line, 1)
                inner = ((slice(None),) * 4 + (slice(None) if nd >= 3 else slice(*v[1][:2]),)
                         + tuple(slice(lo, hi) for lo, hi, _, _ in v[2:]))
                grid_shape = (t1 - t0,) + geo.L[2:]
            else:
                rest_shape = tuple(hi - lo for lo, hi, _, _ in v[1:])
                inner_off = sum(lo * gstr for (lo, _, _, _), gstr in zip(v[1:], gs[1:]))
                pos_shape = (nb, c1 + ext[ip]) + rest_shape
                pos_strides = (L1 * line, line) + gs[1:]
                inner, grid_shape = (Ellipsis,), rest_shape
            base = (n0 * L1 + ca - E0) * line + inner_off
            if implicit[ip]:
                q0, dq, cnt = spec[0]
                base -= (q0 + (cnt - 1) * dq) * line                         # virtual line 0
                tspec = spec[1:]
                tgs = gs[1:]
            else:
                tspec, tgs = spec, gs
            start = base - sum(q * gstr for (q, _, _), gstr in zip(tspec, tgs))
            tap_shape = tuple(c for _, _, c in tspec)
            tap_strides = tuple(-dqq * gstr for (_, dqq, _), gstr in zip(tspec, tgs))
            view = np.lib.stride_tricks.as_strided(                         # start >= 0: h covers every tap
                dyg[:, :, start:], shape=(g,) + tap_shape + (Cog,) + pos_shape,
                strides=(dyg.strides[0],) + tuple(st * it for st in tap_strides) + (dyg.strides[1],)
                + tuple(st * it for st in pos_strides), writeable=False)
            full = nb * (c1 + ext[ip]) * rest_n[ip]
            cols = ws["cols"][:, :col_rows[ip] * full].reshape(g, col_rows[ip], full)
            cols.reshape(view.shape)[...] = view
            if implicit[ip]:
                q0, dq, cnt = spec[0]
                blocks = [cols[:, :, (cnt - 1 - k) * dq * rest_n[ip]:(cnt - 1 - k) * dq * rest_n[ip] + rows]
                          for k in range(cnt)]
            else:
                blocks = [cols]
            kb = col_rows[ip]
            if need_dx:
                dxc = ws["dx"][:, :, :rows]
                for k, blk in enumerate(blocks):
                    wk = wts[ip][:, :, k * kb:(k + 1) * kb]
                    if k == 0:
                        np.matmul(wk, blk, out=dxc)
                    else:
                        tmp = ws["dx2"][:, :, :rows]
                        np.matmul(wk, blk, out=tmp)
                        dxc += tmp
                tensor_block(dx4, ip, n0, nb, ca, c1)[...] = dxc.reshape((g, Cg, nb, c1) + grid_shape)[inner]
            if need_dw:
                if flat and ip in ws["fresh"]:
                    ws["x"][ip].fill(0)
                    ws["fresh"].discard(ip)
                xc = ws["x"][ip][:, :, :rows]
                xc.reshape((g, Cg, nb, c1) + grid_shape)[inner] = tensor_block(x4, ip, n0, nb, ca, c1)
                xt = xc.transpose(0, 2, 1)
                for k, blk in enumerate(blocks):
                    np.matmul(blk, xt, out=parts[ip][:, k * kb:(k + 1) * kb])
        if need_dw:
            slots.commit(i, parts)

    _run_guarded(chunks, task, workspace, workers, slots if need_dw else None)
    dw = None
    if need_dw:
        accs = slots.total()
        dw = _finish_dw(geo, p, [([kf for kf, _ in taps],
                                  accs[ip].reshape(g, len(taps), Cog, Cg).transpose(0, 2, 3, 1) if ip in valid
                                  else np.zeros((g, Cog, Cg, len(taps)), cdt))   # taps that read no input
                                 for ip, (r, taps) in enumerate(geo.phases)])
    return (dx if need_dx else None), dw
