"""Small calls: compiled loops (or a handful of NumPy operations) planned once per configuration, on the calling thread.

At digits sizes (8x8 images, a few channels) a call's time is its per-call work, not its arithmetic: the
grid path of :mod:`.fast` plans chunks, leases scratch and runs workers for a few thousand multiply-adds.
Here a call is a few C loops (csrc/small_grid.c, csrc/small_cols.c, built at install) and matrix products:

- stride 1: x (and dy, for dx) copied onto zero-padded channel-major grids, on which every tap is a fixed
  flat offset; y, dx (dy's grid with the kernel flipped) and dW are then vector loops over consecutive grid
  positions, register-blocked over output channels and taps (no im2col matrix at all);
- other strides: x's im2col columns ``(groups, C/g * K, N*Q)`` by one C loop, ``y = W @ cols`` and
  ``dW = dy @ cols^T`` by BLAS, ``dx`` by ``W^T @ dy`` and a C col2im that adds each tap's columns in order.

Without the compiled loops (installed without a C compiler, or ``XCONV_NUMPY_C=0``) the same plans run as
NumPy gathers: ``cols = x[:, fidx]`` (index tables per configuration), or at stride 1 one strided copy of a
padded grid, and dx from dy's columns gathered the same way.

Each sum has the compute dtype (float32, float64 for float64) and a fixed order for given shapes and build,
so results are bitwise reproducible. Padding zeros are multiplied (0 * inf is NaN), so calls with non-finite
inputs run in :mod:`.columns` instead (as for the grid): the stride-1 C call checks what it reads on the way
and says so (:func:`compiled_backward`); for the others the backend checks first. :func:`serves` takes calls
whose im2col matrices would be small (:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES, accumulation_dtype

from . import native
from .grid.geometry import padded
from .layout import SMALL_COLS_GEO, SMALL_S1_PLAN, SMALL_S1_STRIDES
from .plans import per_params

#: Calls whose largest gathered matrix (x or dy columns) holds at most this many elements run here (measured on
#: the digits layers: 1.5-6x faster than the grid path up to 590k elements, the grouped 32x16x8x8 layer).
MAX_ELEMENTS = 1 << 20
def computes(p: ConvParams) -> bool:
    """Whether this path can compute ``p``: direct, not empty."""
    return not (p.transposed or min(p.input_shape) == 0 or p.output_shape[1] == 0)


def serves(p: ConvParams, need_dx: bool = False) -> bool:
    """Whether ``p`` is small enough for this path (see the module docstring; ``paths.force("small")`` takes it
    for all it computes)."""
    return computes(p) and _elements(p, need_dx) <= MAX_ELEMENTS


#: One input channel per group and at least this many outputs per input channel: the small path's compiled
#: loops beat the depthwise ones (a (32, 1, 8, 8) input to 16 or 32 channels: 1.1-4x faster, measured).
DEPTHWISE_MULTIPLIER = 8


def before_depthwise(p: ConvParams, need_dx: bool = False) -> bool:
    """Whether a depthwise-shaped ``p`` (one input channel per group) runs here rather than in the depthwise loops:
    many outputs per input channel, small, and the compiled copies built."""
    return (p.output_shape[1] >= DEPTHWISE_MULTIPLIER * p.input_shape[1] and compiled_available()
            and serves(p, need_dx))


def _elements(p: ConvParams, need_dx: bool) -> int:
    K, N = math.prod(p.kernel), p.input_shape[0]
    x_cols = p.input_shape[1] * K * N * math.prod(p.output_shape[2:])
    dy_cols = p.output_shape[1] * K * N * math.prod(p.input_shape[2:]) if need_dx else 0
    return max(x_cols, dy_cols)


class _Plan:
    """The sizes of one configuration, and its index tables (built on first use, read only; the stride-1
    grid columns need none)."""

    def __init__(self, p: ConvParams):
        N, C = p.input_shape[:2]
        Co = p.output_shape[1]
        self.p = p
        self.g = g = p.groups
        self.N, self.C, self.Co, self.Cg, self.Cog = N, C, Co, C // g, Co // g
        self.K = math.prod(p.kernel)
        self.P, self.Q = math.prod(p.input_shape[2:]), math.prod(p.output_shape[2:])

    def _geometry(self):
        p = self.p
        k = p.kernel
        taps = np.array(list(np.ndindex(*k)), np.int64).reshape(self.K, len(k))        # (K, nd)
        pre = np.array([a for a, _ in p.padding], np.int64)
        return taps, pre, np.array(p.stride, np.int64), np.array(p.dilation, np.int64)

    @functools.cached_property
    def fidx(self) -> np.ndarray:
        """fprop / dW: per tap and output position (all samples), the input position read, or N*P (the zero)."""
        taps, pre, st, dl = self._geometry()
        S, O = self.p.input_shape[2:], self.p.output_shape[2:]
        opos = np.array(list(np.ndindex(*O)), np.int64).reshape(self.Q, len(O))
        ipos = opos[None] * st + taps[:, None] * dl - pre                               # (K, Q, nd)
        inside = np.all((ipos >= 0) & (ipos < np.array(S)), axis=2)
        flat = np.ravel_multi_index(tuple(np.clip(ipos, 0, np.array(S) - 1).transpose(2, 0, 1)), S)
        return _per_sample(np.where(inside, flat, -1), self.N, self.P)

    @functools.cached_property
    def bidx(self) -> np.ndarray:
        """dx: per tap and input position (all samples), the output position whose tap reads it, or N*Q."""
        taps, pre, st, dl = self._geometry()
        S, O = self.p.input_shape[2:], self.p.output_shape[2:]
        ip = np.array(list(np.ndindex(*S)), np.int64).reshape(self.P, len(S))
        o, rem = np.divmod(ip[None] + pre - taps[:, None] * dl, st)                    # (K, P, nd)
        ok = np.all((rem == 0) & (o >= 0) & (o < np.array(O)), axis=2)
        flat = np.ravel_multi_index(tuple(np.clip(o, 0, np.array(O) - 1).transpose(2, 0, 1)), O)
        return _per_sample(np.where(ok, flat, -1), self.N, self.Q)


def _per_sample(idx: np.ndarray, N: int, n: int) -> np.ndarray:
    """(K, M) positions within one sample (-1: none) as (K, N*M) flat positions in a (N*n + 1) row whose
    last element is the zero."""
    K, M = idx.shape
    flat = idx[:, None, :] + (np.arange(N, dtype=np.int64) * n)[None, :, None]
    flat = np.where(idx[:, None, :] < 0, N * n, flat)
    out = np.ascontiguousarray(flat.reshape(K, N * M).astype(np.intp))
    out.flags.writeable = False
    return out


@per_params
def _plan(p: ConvParams) -> _Plan:
    return _Plan(p)


def _channel_major(t: np.ndarray, N: int, C: int, n: int, cdt) -> np.ndarray:
    """``t`` (N, C, *spatial) as a (C, N*n + 1) array of the compute dtype, its last column zero."""
    out = np.empty((C, N * n + 1), cdt)
    out[:, :N * n].reshape(C, N, n)[...] = t.reshape(N, C, n).transpose(1, 0, 2)
    out[:, N * n] = 0
    return out


def _columns(src: np.ndarray, idx: np.ndarray, g: int) -> np.ndarray:
    """src (C, ...) gathered at idx (K, M): (g, C/g * K, M), rows channel-major then tap."""
    C = src.shape[0]
    return np.take(src, idx, axis=1).reshape(g, (C // g) * idx.shape[0], idx.shape[1])


def _from_channel_major(a: np.ndarray, N: int, shape, dt) -> np.ndarray:
    """(g, C/g, N*n) as an (N, C, *spatial) array of dtype ``dt``."""
    out = np.empty(shape, dt)
    C = shape[1]
    out.reshape(N, C, -1)[...] = a.reshape(C, N, -1).transpose(1, 0, 2)
    return out


# ---------------------------------------------------------------------------------------------
# Stride 1: the columns as one strided copy of a zero-padded grid (long contiguous runs), not a gather


class _Grid:
    """A zero-padded channel-major grid ``(C, (N + 1) * size)`` of one tensor, and its tap windows.

    Per sample the grid holds ``dims`` (per dim: the tensor at ``at``, zeros around it), flattened;
    one more sample of zeros follows (the windows of the last sample read into it). A stride-1
    correlation with kernel ``k`` and dilation ``d`` reads tap t at flat offset sum t_i d_i gs_i, so
    its columns for ``rows`` positions per sample, from offset ``base``, are one strided view.
    """

    def __init__(self, dims, at, k, d, base_at, rows_first: int):
        self.dims, self.at = tuple(dims), tuple(at)
        self.gs = [math.prod(self.dims[i + 1:]) for i in range(len(self.dims))]
        self.size = math.prod(self.dims)
        self.tap = [dd * g for dd, g in zip(d, self.gs)]
        self.k = tuple(k)
        self.base = sum(b * g for b, g in zip(base_at, self.gs))
        self.rows = rows_first * self.gs[0]                 # positions per sample (first dim, whole rows)

    def fill(self, t: np.ndarray, N: int, C: int, keep, cdt) -> np.ndarray:
        buf = np.zeros((C, (N + 1) * self.size), cdt)
        view = buf[:, :N * self.size].reshape((C, N) + self.dims)
        view[(slice(None), slice(None)) + tuple(slice(a, a + n) for a, n in zip(self.at, keep))] = \
            t[(slice(None), slice(None)) + tuple(slice(0, n) for n in keep)].swapaxes(0, 1)
        return buf

    def columns(self, buf: np.ndarray, N: int, g: int) -> np.ndarray:
        """(g, C/g * K, N * rows): channel-major, then tap, then sample and position."""
        C, it = buf.shape[0], buf.itemsize
        view = np.lib.stride_tricks.as_strided(buf[:, self.base:], shape=(C,) + self.k + (N, self.rows),
                                               strides=(buf.strides[0],) + tuple(o * it for o in self.tap)
                                               + (self.size * it, it), writeable=False)
        cols = np.empty(view.shape, buf.dtype)
        np.copyto(cols, view)
        return cols.reshape(g, (C // g) * math.prod(self.k), N * self.rows)

    def crop(self, a: np.ndarray, N: int, shape, dt) -> np.ndarray:
        """(g, C/g, N * rows) positions of this grid as an (N, C, *spatial) array (spatial = shape[2:])."""
        C = shape[1]
        grid = a.reshape((C, N, self.rows // self.gs[0]) + self.dims[1:])
        out = np.empty(shape, dt)
        out[...] = grid[(slice(None), slice(None)) + tuple(slice(0, n) for n in shape[2:])].swapaxes(0, 1)
        return out


def _unit_stride(p: ConvParams) -> bool:
    return all(s == 1 for s in p.stride)


@per_params
def _grids(p: ConvParams):
    """(x grid, dy grid for dx) of a stride-1 convolution (see _Grid)."""
    S, O, k, d = p.input_shape[2:], p.output_shape[2:], p.kernel, p.dilation
    pre = [a for a, _ in p.padding]
    xg = _Grid(padded(p), pre, k, d, [0] * len(S), O[0])
    # dx[i] = sum_t dyp[B + i + t*d] w[k-1-t], dy at A in dyp: A = max(0, (k-1)d - pre), B = pre + A - (k-1)d
    A = [max(0, (kk - 1) * dd - a) for kk, dd, a in zip(k, d, pre)]
    B = [a + aa - (kk - 1) * dd for a, aa, kk, dd in zip(pre, A, k, d)]
    dims = [b + n + (kk - 1) * dd for b, n, kk, dd in zip(B, S, k, d)]
    dyg = _Grid(dims, A, k, d, B, S[0])
    keep = [min(o, L - a) for o, L, a in zip(O, dims, A)]        # dy beyond: reads only padding, adds nothing
    return xg, dyg, keep


# ---------------------------------------------------------------------------------------------
# Compiled column copies (csrc/small_cols.c): x's columns by one C loop, dx by one GEMM and a C col2im


#: The switch of the compiled copies (the settings field of ``$XCONV_NUMPY_C``; off: the NumPy gathers serve).
SWITCH = "numpy_c"


def compiled_available() -> bool:
    """Whether the compiled column copies serve (built at install, not disabled by XCONV_NUMPY_C=0)."""
    return native.part_on(SWITCH)


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


def _im2col(t: np.ndarray, p: ConvParams, f: _Plan, cdt) -> np.ndarray:
    """x's columns (g, C/g * K, N * Q), channel-major then tap; zeros where a tap reads padding."""
    t = _readable(t, cdt)
    geo = _geo(p).copy()
    xs = SMALL_COLS_GEO.index("xs")
    geo[xs:] = (t.strides[0], t.strides[1], *(0,) * (3 - p.nd), *t.strides[2:])
    geo[xs:] //= t.itemsize
    cols = np.empty((f.C * f.K, f.N * f.Q), cdt)
    getattr(native.library(), f"xconv_small_im2col_{_suffix(cdt)}")(_address(t), _address(cols), _address(geo))
    return cols.reshape(f.g, f.Cg * f.K, f.N * f.Q)


def _col2im(dcols: np.ndarray, p: ConvParams, f: _Plan, cdt) -> np.ndarray:
    """(g, C/g * K, N * Q) columns added, tap by tap in order, into a new (N, C, *spatial) array."""
    dx = np.empty(p.input_shape, cdt)
    geo = _geo(p)                                  # held here: the cache may drop it meanwhile
    getattr(native.library(), f"xconv_small_col2im_{_suffix(cdt)}")(_address(dcols), _address(dx), geo.ctypes.data)
    return dx


def _suffix(cdt) -> str:
    return "f64" if cdt == np.float64 else "f32"


def _lift(values, nd: int, fill: int) -> tuple:
    return (fill,) * (3 - nd) + tuple(values)


def _tap_offsets(grid: _Grid) -> list:
    """Each tap's flat offset on ``grid`` (taps in row-major order)."""
    return [sum(t * o for t, o in zip(tap, grid.tap)) for tap in np.ndindex(*grid.k)]


class _S1Plan:
    """The C loops' plan of a stride-1 call (layout.SMALL_S1_PLAN, then the taps' offsets), and its address."""

    def __init__(self, p: ConvParams, f: _Plan):
        xg, dyg, keep = _grids(p)
        nd = p.nd

        def grid(gr: _Grid):
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


@per_params
def _s1_plan(p: ConvParams) -> _S1Plan:
    return _S1Plan(p, _plan(p))


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


def _fprop_grid(x, w, bias, p: ConvParams, f: _Plan, cdt):
    plan = _s1_plan(p)
    x = _readable(x, cdt)
    w = np.ascontiguousarray(w, dtype=cdt)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=cdt)
    y = np.empty(p.output_shape, cdt)
    xs = _strides(x, plan.lift)                        # held: the C call reads it
    used = np.zeros(1, np.int64)                       # the bytes of scratch the C call malloc'd
    if getattr(native.library(), f"xconv_small_s1_fprop_{_suffix(cdt)}")(
            _address(x), _address(w), None if b is None else _address(b), _address(y), plan.address, xs[1],
            _address(used)):
        raise _scratch_failed(p)
    tracing.workspace(int(used[0]))
    return y.astype(DTYPES[p.dtype], copy=False)


def _backward_grid(dy, x, w, p: ConvParams, f: _Plan, cdt, need_dx: bool, need_dw: bool, need_db: bool = False,
                   finite_only: bool = False):
    """(dx, dw, db) by one C call, None where not needed; with ``finite_only``, None instead when dy, x (read for
    dw) or w (read for dx) holds an inf or a NaN (see :func:`compiled_backward`)."""
    plan = _s1_plan(p)
    dy = _readable(dy, cdt)
    x = _readable(x, cdt) if need_dw else None
    w = np.ascontiguousarray(w, dtype=cdt) if need_dx else None
    sizes = (plan.dx_size if need_dx else 0, plan.dw_size if need_dw else 0, f.Co if need_db else 0)
    out = np.empty(sum(sizes), cdt)                     # dx, dw, db: one buffer, one address
    at = _address(out)
    it = out.itemsize
    dys, xs = _strides(dy, plan.lift), (None if x is None else _strides(x, plan.lift))   # held: the C call reads them
    used = np.zeros(1, np.int64)                       # the bytes of scratch the C call malloc'd
    rc = getattr(native.library(), f"xconv_small_s1_backward_{_suffix(cdt)}")(
        _address(dy), None if x is None else _address(x), None if w is None else _address(w),
        at if need_dx else None, at + it * sizes[0] if need_dw else None,
        at + it * (sizes[0] + sizes[1]) if need_db else None, plan.address, dys[1], None if xs is None else xs[1],
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


def _dy_channel_major(dy: np.ndarray, f: _Plan, cdt) -> np.ndarray:
    """dy as (g, C_out/g, N * Q) in the compute dtype."""
    out = np.empty((f.Co, f.N, f.Q), cdt)
    out[...] = dy.reshape(f.N, f.Co, f.Q).transpose(1, 0, 2)
    return out.reshape(f.g, f.Cog, f.N * f.Q)


def _fprop_compiled(x, w, bias, p: ConvParams, f: _Plan, cdt):
    y = np.matmul(np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K), _im2col(x, p, f, cdt))   # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    return _from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype])


def _backward_compiled(dy, x, w, p: ConvParams, f: _Plan, cdt, need_dx: bool, need_dw: bool):
    out_dt = DTYPES[p.dtype]
    dyc = _dy_channel_major(dy, f, cdt)
    dx = dw = None
    if need_dw:
        cols = _im2col(x, p, f, cdt)
        dw = np.matmul(dyc, cols.transpose(0, 2, 1)).reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        wt = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K).transpose(0, 2, 1)   # (g, Cg*K, Cog)
        dx = _col2im(np.matmul(wt, dyc), p, f, cdt).astype(out_dt, copy=False)
    return dx, dw


# ---------------------------------------------------------------------------------------------
# The calls


def fprop(x, w, bias, p: ConvParams):
    """y = conv(x, w) + bias."""
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    if compiled_available():
        if _unit_stride(p):
            return _fprop_grid(x, w, bias, p, f, cdt)
        return _fprop_compiled(x, w, bias, p, f, cdt)
    if _unit_stride(p):
        xg, _, _ = _grids(p)
        cols = xg.columns(xg.fill(x, f.N, f.C, p.input_shape[2:], cdt), f.N, f.g)
    else:
        cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), f.fidx, f.g)
    wm = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg * f.K)
    y = np.matmul(wm, cols)                                        # (g, Cog, N*Q)
    if bias is not None:
        y += np.asarray(bias, cdt).reshape(f.g, f.Cog, 1)
    if _unit_stride(p):
        return xg.crop(y, f.N, p.output_shape, DTYPES[p.dtype])
    return _from_channel_major(y, f.N, p.output_shape, DTYPES[p.dtype])


def _backward_unit_stride(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    xg, dyg, keep = _grids(p)
    dx = dw = None
    if need_dw:
        cols = xg.columns(xg.fill(x, f.N, f.C, p.input_shape[2:], cdt), f.N, f.g)     # (g, Cg*K, N*R)
        # dy on the x grid's output positions (zeros at the others): (Co, N, O_1, *Sp[1:])
        dz = np.zeros((f.Co, f.N, xg.rows), cdt)
        dz.reshape((f.Co, f.N, p.output_shape[2]) + xg.dims[1:])[
            (slice(None), slice(None)) + tuple(slice(0, o) for o in p.output_shape[2:])] = dy.swapaxes(0, 1)
        dw = np.matmul(dz.reshape(f.g, f.Cog, f.N * xg.rows), cols.transpose(0, 2, 1))
        dw = dw.reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        cols = dyg.columns(dyg.fill(dy, f.N, f.Co, keep, cdt), f.N, f.g)               # (g, Cog*K, N*R')
        nd = p.nd
        flip = (Ellipsis,) + (slice(None, None, -1),) * nd                                  # taps reversed
        wf = np.ascontiguousarray(w, cdt).reshape((f.g, f.Cog, f.Cg) + tuple(p.kernel))[flip]
        wt = np.ascontiguousarray(wf.swapaxes(1, 2)).reshape(f.g, f.Cg, f.Cog * f.K)
        dx = dyg.crop(np.matmul(wt, cols), f.N, p.input_shape, out_dt)
    return dx, dw


def grid_compiled(p: ConvParams) -> bool:
    """Whether ``p`` (served here) runs as one C call on zero-padded grids (stride 1, loops built): the call that
    checks its inputs for infinities and NaNs itself (:func:`compiled_backward`) and uses no BLAS."""
    return _unit_stride(p) and compiled_available()


def compiled_backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool):
    """(dx, dw, db) of a :func:`grid_compiled` call, None where not needed; or None when an input the call reads
    (dy; x for dw; w for dx) holds an inf or a NaN, which must run where padding zeros are not multiplied. db is
    summed in double (a fixed order), whatever the dtype."""
    return _backward_grid(dy, x, w, p, _plan(p), accumulation_dtype(p.dtype), need_dx, need_dw, need_db, True)


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool):
    """(dx, dw), None where not needed (inputs finite: see the module docstring)."""
    if compiled_available():
        if _unit_stride(p):
            dx, dw, _ = _backward_grid(dy, x, w, p, _plan(p), accumulation_dtype(p.dtype), need_dx, need_dw)
            return dx, dw
        return _backward_compiled(dy, x, w, p, _plan(p), accumulation_dtype(p.dtype), need_dx, need_dw)
    if _unit_stride(p):
        return _backward_unit_stride(dy, x, w, p, need_dx, need_dw)
    f, cdt = _plan(p), accumulation_dtype(p.dtype)
    out_dt = DTYPES[p.dtype]
    dyc = _channel_major(dy, f.N, f.Co, f.Q, cdt)                  # (Co, N*Q + 1)
    dx = dw = None
    if need_dw:
        cols = _columns(_channel_major(x, f.N, f.C, f.P, cdt), f.fidx, f.g)     # (g, Cg*K, N*Q)
        dyg = dyc[:, :f.N * f.Q].reshape(f.g, f.Cog, f.N * f.Q)
        dw = np.matmul(dyg, cols.transpose(0, 2, 1)).reshape(p.weight_shape).astype(out_dt, copy=False)
    if need_dx:
        cols_dy = _columns(dyc, f.bidx, f.g)                       # (g, Cog*K, N*P)
        wt = np.ascontiguousarray(w, cdt).reshape(f.g, f.Cog, f.Cg, f.K).transpose(0, 2, 1, 3).reshape(
            f.g, f.Cg, f.Cog * f.K)
        dx = _from_channel_major(np.matmul(wt, cols_dy), f.N, p.input_shape, out_dt)
    return dx, dw
