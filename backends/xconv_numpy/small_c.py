"""The small-call paths on the compiled loops (built at install; off with ``XCONV_NUMPY_C=0``):

- ``small-c`` (csrc/small_grid.c), stride 1: x (and dy, for dx) on zero-padded channel-major grids
  (:class:`small.Grid`); y, or dx, dW and db, by one C call of register-blocked vector loops, no BLAS;
- ``small-cols`` (csrc/small_cols.c), any stride: x's im2col columns by one C loop, ``y = W @ cols`` and
  ``dW = dy @ cols^T`` by BLAS, ``dx`` by ``W^T @ dy`` and a C col2im that adds each tap's columns in order.

The plans (geometry and tap offsets) are packed per configuration in the layouts :mod:`.layout` declares.
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES, accumulation_dtype

from . import jobs, native
from .aligned import empty_result
from .layout import SMALL_COLS_GEO, SMALL_S1_PLAN, SMALL_S1_STRIDES
from .plans import per_params
from .small import Grid, Plan, dy_channel_major, from_channel_major, grids, plan


@per_params
def _geo(p: ConvParams) -> np.ndarray:
    """The C loops' geometry (layout.SMALL_COLS_GEO) of ``p`` lifted to 3-D; x's strides left to fill."""
    nd = p.nd
    n, c = p.input_shape[:2]
    (d, h, w), (od, oh, ow) = _lift(p.input_shape[2:], nd, 1), _lift(p.output_shape[2:], nd, 1)
    (kd, kh, kw), (sd, sh, sw) = _lift(p.kernel, nd, 1), _lift(p.stride, nd, 1)
    (dd, dh, dw), (pd, ph, pw) = _lift(p.dilation, nd, 1), _lift((a for a, _ in p.padding), nd, 0)
    geo = np.array(SMALL_COLS_GEO.pack(n=n, c=c, d=d, h=h, w=w, od=od, oh=oh, ow=ow, kd=kd, kh=kh, kw=kw, sd=sd,
                                       sh=sh, sw=sw, dd=dd, dh=dh, dw=dw, pd=pd, ph=ph, pw=pw, xs=(0,) * 5), np.int64)
    geo.flags.writeable = False
    return geo


def _readable(t: np.ndarray, cdt) -> np.ndarray:
    """``t`` where it lies when the C loops can read it (compute dtype, native order, aligned), else a copy."""
    return t if t.dtype == cdt and t.flags.aligned else np.ascontiguousarray(t, dtype=cdt)


def im2col(t: np.ndarray, p: ConvParams, f: Plan, cdt) -> np.ndarray:
    """x's columns (g, C/g * K, N * Q), channel-major then tap; zeros where a tap reads padding."""
    t, geo = im2col_input(t, p, cdt)
    cols = np.empty((f.C * f.K, f.N * f.Q), cdt)
    getattr(native.library(), f"xconv_small_im2col_{_suffix(cdt)}")(_address(t), _address(cols), _address(geo))
    return cols.reshape(f.g, f.Cg * f.K, f.N * f.Q)


def im2col_input(t: np.ndarray, p: ConvParams, cdt) -> tuple:
    """(x as the im2col loop reads it: where it lies or a copy, its geometry with x's strides): what a caller of
    the loop (here, or a job: csrc/jobs.c) keeps alive while it runs."""
    t = _readable(t, cdt)
    geo = _geo(p).copy()
    xs = SMALL_COLS_GEO.index("xs")
    geo[xs:] = (t.strides[0], t.strides[1], *(0,) * (3 - p.nd), *t.strides[2:])
    geo[xs:] //= t.itemsize
    return t, geo


def col2im(dcols: np.ndarray, p: ConvParams, f: Plan, cdt, dx: np.ndarray | None = None) -> np.ndarray:
    """(g, C/g * K, N * Q) columns added, tap by tap in order, into a new (N, C, *spatial) array, or into ``dx``
    (C-contiguous, that shape, dtype ``cdt``: every element written)."""
    if dx is None:
        dx = empty_result(p.input_shape, cdt)
    geo = col2im_geometry(p)                       # held here: the cache may drop it meanwhile
    getattr(native.library(), f"xconv_small_col2im_{_suffix(cdt)}")(_address(dcols), _address(dx), geo.ctypes.data)
    return dx


def im2col_channels(x0: int, cols: np.ndarray, geo: np.ndarray, width: int, cdt) -> None:
    """The im2col loop for ``width`` channels of x whose first lies at address ``x0`` (x's geometry ``geo`` from
    :func:`im2col_input`), into ``cols`` (their ``width * K`` rows)."""
    getattr(native.library(), f"xconv_small_im2col_range_{_suffix(cdt)}")(x0, _address(cols), _address(geo), 0, width)


def col2im_channels(dcols: np.ndarray, dx0: int, geo: np.ndarray, width: int, cdt) -> None:
    """The col2im loop for ``width`` channels: ``dcols`` (their ``width * K`` rows) added, tap by tap in order, into
    dx's channels from the one at address ``dx0`` (dx contiguous; ``geo`` from :func:`col2im_geometry`)."""
    getattr(native.library(), f"xconv_small_col2im_range_{_suffix(cdt)}")(_address(dcols), dx0, geo.ctypes.data,
                                                                        0, width)


def col2im_geometry(p: ConvParams) -> np.ndarray:
    """The col2im loop's geometry of ``p`` (read-only; keep it while the loop runs)."""
    return _geo(p)


def _suffix(cdt) -> str:
    return "f64" if cdt == np.float64 else "f32"


def _lift(values, nd: int, fill: int) -> tuple:
    return (fill,) * (3 - nd) + tuple(values)


def _tap_offsets(grid: Grid) -> list:
    """Each tap's flat offset on ``grid`` (taps in row-major order)."""
    return [sum(t * o for t, o in zip(tap, grid.tap)) for tap in np.ndindex(*grid.k)]


class _S1Plan:
    """The C loops' plan of a stride-1 call (layout.SMALL_S1_PLAN, then the taps' offsets), and its address."""

    def __init__(self, p: ConvParams, f: Plan):
        xg, dyg, keep = grids(p)
        nd = p.nd

        def grid(gr: Grid):
            return (*_lift(gr.dims, nd, 1), *_lift(gr.at, nd, 0), gr.size, gr.rows)

        # dW reads dy from dx's dy grid when that grid holds all of dy and has the x grid's rows
        from_grid = tuple(keep) == p.output_shape[2:] and dyg.dims[1:] == xg.dims[1:]
        corner = sum(a * g for a, g in zip(dyg.at, dyg.gs))
        head = SMALL_S1_PLAN.pack(n=f.N, c=f.C, co=f.Co, g=f.g, cig=f.Cg, cog=f.Cog, k=f.K, xg=grid(xg), dg=grid(dyg),
                                  dbase=dyg.base, keep=_lift(keep, nd, 1), s=_lift(p.input_shape[2:], nd, 1),
                                  o=_lift(p.output_shape[2:], nd, 1), dz=int(from_grid), corner=corner,
                                  ycrop=_lift((xg.rows // xg.gs[0],) + xg.dims[1:], nd, 1),
                                  xcrop=_lift((dyg.rows // dyg.gs[0],) + dyg.dims[1:], nd, 1))
        self.vector = np.array((*head, *_tap_offsets(xg), *_tap_offsets(dyg)), np.int64)
        self.vector.flags.writeable = False
        self.address = self.vector.ctypes.data
        self.lift = (0,) * (3 - nd)
        self.dx_size, self.dw_size = math.prod(p.input_shape), math.prod(p.weight_shape)
        self._fns = {}

    def fprop_fn(self, cdt):
        """The library's forward loop for compute dtype ``cdt`` (looked up once)."""
        return self._fn("fprop", cdt)

    def backward_fn(self, cdt):
        """The library's backward loop for compute dtype ``cdt`` (looked up once)."""
        return self._fn("backward", cdt)

    def _fn(self, op: str, cdt):
        fn = self._fns.get((op, cdt))
        if fn is None:
            fn = self._fns[(op, cdt)] = getattr(native.library(), f"xconv_small_s1_{op}_{_suffix(cdt)}")
        return fn


@per_params
def _s1_plan(p: ConvParams) -> _S1Plan:
    return _S1Plan(p, plan(p))


_STRIDES: dict = {}


def _strides(t: np.ndarray, lift) -> tuple:
    """(array, its address): ``t``'s element strides (n, c, d, h, w) (lifted to 3 spatial dims) as a read-only int64
    array, kept per distinct strides (a handful: most calls pass contiguous arrays). The caller holds the array
    while C reads it (another thread may drop it from the table)."""
    key = (t.strides, t.itemsize, lift)
    held = _STRIDES.get(key)
    if held is None:
        it = t.itemsize
        d, h, w = (*lift, *(v // it for v in t.strides[2:]))
        a = np.array(SMALL_S1_STRIDES.pack(n=t.strides[0] // it, c=t.strides[1] // it, d=d, h=h, w=w), np.int64)
        a.flags.writeable = False
        if len(_STRIDES) > 256:
            _STRIDES.clear()
        held = _STRIDES[key] = (a, a.ctypes.data)
    return held


_address = native.address


def _scratch_failed(p: ConvParams):
    from xconv.errors import ResourceError
    return ResourceError("numpy: the scratch grids of a small-call path", 0, None,
                         f"malloc failed for input {p.input_shape}, weight {p.weight_shape}")


def _fprop_grid(x, w, bias, p: ConvParams, f: Plan, cdt):
    s1 = _s1_plan(p)
    x = _readable(x, cdt)
    w = np.ascontiguousarray(w, dtype=cdt)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=cdt)
    y = empty_result(p.output_shape, cdt)
    xs = _strides(x, s1.lift)                        # held: the C call reads it
    used = np.zeros(1, np.int64)                       # the bytes of scratch the C call malloc'd
    if s1.fprop_fn(cdt)(
            _address(x), _address(w), None if b is None else _address(b), _address(y), s1.address, xs[1],
            _address(used)):
        raise _scratch_failed(p)
    tracing.workspace(int(used[0]))
    return y.astype(DTYPES[p.dtype], copy=False)


def _backward_grid(dy, x, w, p: ConvParams, f: Plan, cdt, need_dx: bool, need_dw: bool, need_db: bool = False,
                   finite_only: bool = False):
    """(dx, dw, db) by one C call, None where not needed; with ``finite_only``, None instead when dy, x (read for
    dw) or w (read for dx) holds an inf or a NaN (see :func:`grid_backward`)."""
    s1 = _s1_plan(p)
    dy = _readable(dy, cdt)
    x = _readable(x, cdt) if need_dw else None
    w = np.ascontiguousarray(w, dtype=cdt) if need_dx else None
    sizes = (s1.dx_size if need_dx else 0, s1.dw_size if need_dw else 0, f.Co if need_db else 0)
    out = empty_result((sum(sizes),), cdt)              # dx, dw, db: one buffer, one address
    at = _address(out)
    it = out.itemsize
    dys, xs = _strides(dy, s1.lift), (None if x is None else _strides(x, s1.lift))   # held: the C call reads them
    used = np.zeros(1, np.int64)                       # the bytes of scratch the C call malloc'd
    rc = s1.backward_fn(cdt)(
        _address(dy), None if x is None else _address(x), None if w is None else _address(w),
        at if need_dx else None, at + it * sizes[0] if need_dw else None,
        at + it * (sizes[0] + sizes[1]) if need_db else None, s1.address, dys[1], None if xs is None else xs[1],
        _address(used))
    if rc == 2 and finite_only:
        return None
    if rc == 1:
        raise _scratch_failed(p)
    tracing.workspace(int(used[0]))
    out = out.astype(DTYPES[p.dtype], copy=False)
    dx = out[:sizes[0]].reshape(p.input_shape) if need_dx else None
    dw = out[sizes[0]:sizes[0] + sizes[1]].reshape(p.weight_shape) if need_dw else None
    return dx, dw, (out[sizes[0] + sizes[1]:] if need_db else None)


def _fprop_compiled(x, w, bias, p: ConvParams, f: Plan, cdt):
    y = np.matmul(np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K), im2col(x, p, f, cdt))   # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    return from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype])


def _backward_compiled(dy, x, w, p: ConvParams, f: Plan, cdt, need_dx: bool, need_dw: bool):
    out_dt = DTYPES[p.dtype]
    dyc = dy_channel_major(dy, f, cdt)
    dx = dw = None
    if need_dw:
        cols = im2col(x, p, f, cdt)
        dw = np.matmul(dyc, cols.transpose(0, 2, 1)).reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        wt = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K).transpose(0, 2, 1)   # (g, Cg*K, Cog)
        dx = col2im(np.matmul(wt, dyc), p, f, cdt).astype(out_dt, copy=False)
    return dx, dw


# ---------------------------------------------------------------------------------------------
# The calls


def grid_fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias at stride 1 by one C call (``small-c``)."""
    return _fprop_grid(x, w, bias, p, plan(p), accumulation_dtype(p.dtype))


def grid_fprop_runner(p: ConvParams):
    """:func:`grid_fprop` of ``p`` with its plan and compute dtype looked up once: ``run(x, w, bias) -> y`` (a lane's
    runner: the same C call)."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)
    return lambda x, w, bias: _fprop_grid(x, w, bias, p, f, cdt)


def grid_backward_runner(p: ConvParams, need_dx: bool, need_dw: bool):
    """:func:`grid_backward` of ``p`` for the outputs asked, without db, with its plan and compute dtype looked up
    once: ``run(dy, x, w) -> (dx, dw)``, None where an input it reads is not finite (a lane's runner: the same C
    call)."""
    f, cdt = plan(p), accumulation_dtype(p.dtype)

    def run(dy, x, w):
        results = _backward_grid(dy, x, w, p, f, cdt, need_dx, need_dw, False, True)
        return None if results is None else results[:2]
    return run


def grid_backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool):
    """(dx, dw, db) at stride 1 by one C call (``small-c``), None where not needed; or None when an input the call
    reads (dy; x for dw; w for dx) holds an inf or a NaN, which must run where padding zeros are not multiplied.
    db is summed in double (a fixed order), whatever the dtype."""
    return _backward_grid(dy, x, w, p, plan(p), accumulation_dtype(p.dtype), need_dx, need_dw, need_db, True)


def cols_fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias, any stride (``small-cols``)."""
    return _fprop_compiled(x, w, bias, p, plan(p), accumulation_dtype(p.dtype))


def cols_backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw), any stride (``small-cols``), None where not needed; a NaN or an infinity gives the definition's NaNs
    and infs (its columns' terms are the definition's)."""
    return _backward_compiled(dy, x, w, p, plan(p), accumulation_dtype(p.dtype), need_dx, need_dw)


def grid_fprop_blocks(x, w, b, y, p: ConvParams, blocks, workers: int):
    """``y`` (float32, preallocated) = conv(x, w) + b at stride 1 for blocks [(n0, n1, q)] of samples, q the block's
    parameters, as C jobs (:mod:`.jobs`: torch's OpenMP team where it is loaded), each the C call :func:`grid_fprop`
    makes for its block: one small call's bits (grid_blocks.py). w and b float32 and contiguous."""
    x = _readable(x, np.float32)
    plans = {q: _s1_plan(q) for _, _, q in blocks}                     # held while C runs
    xs, xs_at = _strides(x, plans[blocks[0][2]].lift)
    out = np.zeros((len(blocks), 2), np.int64)                         # per block: status, scratch bytes
    xa, ya, wa, oa = (_address(a) for a in (x, y, w, out))
    ba = 0 if b is None else _address(b)
    run = jobs.Jobs()
    run.rows("small_fprop", [(xa + n0 * x.strides[0], wa, ba, ya + n0 * y.strides[0], plans[q].address, xs_at,
                              oa + 16 * i) for i, (n0, _, q) in enumerate(blocks)])
    run.run(workers)
    if out[:, 0].any():
        raise _scratch_failed(p)
    tracing.workspace(int(out[:min(workers, len(blocks)), 1].sum()))      # the blocks running at once, at most
    return y


def grid_backward_blocks(dy, x, w, p: ConvParams, blocks, need_dx: bool, need_dw: bool, workers: int):
    """(dx, dw) (float32, None where not needed) at stride 1 for blocks [(n0, n1, q)] of samples, q the block's
    parameters, as C jobs, each the C call :func:`grid_backward` makes for its block without db; or None when an
    input a block reads (dy; x for dw; w for dx) holds an inf or a NaN. A sample's dx is one small call's bits
    (grid_blocks.py); dw is the blocks' weight gradients added in block order, so its bits are those of the blocks,
    whatever the workers."""
    dy = _readable(dy, np.float32)
    x = _readable(x, np.float32) if need_dw else None
    w = np.ascontiguousarray(w, dtype=np.float32) if need_dx else None
    plans = {q: _s1_plan(q) for _, _, q in blocks}                     # held while C runs
    lift = plans[blocks[0][2]].lift
    dys, dys_at = _strides(dy, lift)
    xs, xs_at = _strides(x, lift) if need_dw else (None, 0)
    dx = empty_result(p.input_shape, np.float32) if need_dx else None
    parts = np.empty((len(blocks),) + tuple(p.weight_shape), np.float32) if need_dw else None
    out = np.zeros((len(blocks), 2), np.int64)                         # per block: status, scratch bytes
    dya, oa = _address(dy), _address(out)
    xa = _address(x) if need_dw else 0
    wa = _address(w) if need_dx else 0
    dxa = _address(dx) if need_dx else 0
    pa = _address(parts) if need_dw else 0
    wbytes = 4 * math.prod(p.weight_shape)
    run = jobs.Jobs()
    run.rows("small_backward", [
        (dya + n0 * dy.strides[0], xa + n0 * x.strides[0] if need_dw else 0, wa,
         dxa + n0 * dx.strides[0] if need_dx else 0, pa + i * wbytes if need_dw else 0, plans[q].address, dys_at,
         xs_at, oa + 16 * i) for i, (n0, _, q) in enumerate(blocks)])
    run.run(workers)
    if (out[:, 0] == 1).any():
        raise _scratch_failed(p)
    if (out[:, 0] == 2).any():
        return None
    running = int(np.sort(out[:, 1])[::-1][:min(workers, len(blocks))].sum())     # the blocks running at once
    tracing.workspace(running + (parts.nbytes if need_dw else 0))      # and the blocks' dw
    dw = None
    if need_dw:
        dw = parts[0].copy()                                           # its own buffer: not a view of the blocks'
        for part in parts[1:]:                                         # block order: the bits of the blocks
            dw += part
    return dx, dw
