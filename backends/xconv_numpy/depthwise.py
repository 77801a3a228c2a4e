"""Compiled direct loops (csrc/depthwise.c) for the convolutions that BLAS serves badly: depthwise ones.

A depthwise convolution (one input channel per group; 2-D, 1-D as height 1) does K multiply-adds
per output element and has nothing a matrix product could reuse, so im2col + GEMM mostly moves
memory. These loops take one (sample, input channel) plane at a time, in cache, on the polyphase
grid of the zero-padded input (per dim, phase r holds ``x_pad[a*s + r]``; tap j reads phase
``r_j`` at offset ``q_j``, ``(q_j, r_j) = divmod(j*d, s)``). Only the phases some tap reads are
kept, so scratch is about K planes at most, whatever the stride:

- ``dx_phase[a, b] = sum over the taps t of the phase of w_t * dy[a - qh_t, b - qw_t]`` (only the
  (t, dy position) pairs that exist), scattered to dx;
- ``dw_t (per sample) = sum over dy positions of dy * x_phase[. + q_t]``, ``db`` (per sample) the
  sum of dy; the per-sample partials are added in sample order afterwards;
- ``y[o] = sum over t of w_t * x_phase[o + q_t]`` for the forward.

Every product is one the convolution defines (nothing outside dy's box or beyond the padded input
is multiplied: an infinity stays where the exact path has it). Tasks are ranges of planes and never
split a sum, so results do not depend on the number of threads; each loop is a fixed sequence of
floating-point operations for given shapes and build, so results are bitwise reproducible run to
run. Inputs are read where they lie (any strides, read-only too) when they have the compute dtype
and are aligned; others are converted a block of samples at a time. Nothing is written into them.

The loops are built at install (see :mod:`.native`); :func:`available` says whether they were.
"""

from __future__ import annotations

import math

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import accumulation_dtype

from . import depthwise_cv, native, tuning
from .aligned import empty_result
from .finite import all_finite
from .jobs import Jobs
from .layout import DEPTHWISE_GEO
from .native import address
from .workers import even_ranges, run
from .plans import per_params

#: Inputs that need converting (another dtype, unaligned) are converted a block of samples at a time: at
#: most this many bytes, and at most half the bytes of the call's inputs and outputs.
BLOCK_BYTES = 8 << 20
#: Kernels with more taps than this go to the BLAS path (whose work does not grow with the tap count alone).
MAX_TAPS = 4096

#: The switch of these loops (the settings field of ``$XCONV_NUMPY_DIRECT``).
SWITCH = "numpy_direct"


def available() -> bool:
    """Whether the compiled loops can run (built at install, not disabled by XCONV_NUMPY_DIRECT=0)."""
    return native.part_on(SWITCH)


def import_error() -> str | None:
    """Why the compiled loops could not be loaded (None if they were, or were not tried)."""
    return native.load_error()


def serves(p: ConvParams) -> bool:
    """Whether these loops compute ``p``: one input channel per group, 1-D or 2-D, at most MAX_TAPS taps,
    paddings and dilated kernel extents below 2**40 (int64 grid arithmetic), built."""
    return (p.nd in (1, 2) and p.input_shape[1] == p.groups and min(p.input_shape) > 0
            and math.prod(p.kernel) <= MAX_TAPS
            and all(a + b < 1 << 40 for a, b in p.padding)
            and all((k - 1) * d < 1 << 40 for k, d in zip(p.kernel, p.dilation)) and available())


_DX, _DW, _DB, _XS, _DYS, _FLATDX = (DEPTHWISE_GEO.index(n) for n in ("dx", "dw", "db", "xs", "dys", "flatdx"))


class _Plan:
    """The 2-D polyphase geometry of a depthwise convolution (1-D as height 1): what the C loops take."""

    def __init__(self, p: ConvParams):
        lift = p.nd == 1
        two = (lambda t: (1,) + tuple(t)) if lift else tuple
        self.in4 = tuple(p.input_shape[:2]) + two(p.input_shape[2:])
        self.out4 = tuple(p.output_shape[:2]) + two(p.output_shape[2:])
        kh, kw = self.kernel = two(p.kernel)
        sh, sw = two(p.stride)
        dh, dw = two(p.dilation)
        (ph0, ph1), (pw0, pw1) = ((0, 0),) * lift + tuple(p.padding)
        H, W = self.in4[2:]
        # a stride past the padded input gives one output and one phase per tap: the padded size serves as well
        # (and keeps every value of the plan within int64, for a stride of 2**70)
        sh, sw = min(sh, H + ph0 + ph1), min(sw, W + pw0 + pw1)
        self.Lh = -(-(H + ph0 + ph1) // sh)
        self.Lw = -(-(W + pw0 + pw1) // sw)
        # per dim: each tap's offset q and phase slot (phases some tap reads, in order); per input row its row
        # phase's slot (-1: no tap reads it) and index in the phase; per column slot its run of input columns
        qh, th_slot, used_h = _dim(kh, dh, sh)
        qw, tw_slot, used_w = _dim(kw, dw, sw)
        self.nRw, self.sw = len(used_w), sw
        self.nslots = len(used_h) * self.nRw
        a, rp = np.divmod(np.arange(H, dtype=np.int64) + ph0, sh)
        where = np.minimum(np.searchsorted(used_h, rp), len(used_h) - 1)
        rows = np.where(used_h[where] == rp, where, -1)
        runs = []
        for r in used_w.tolist():                        # columns z with (z + pw0) % sw == r: z0, z0 + sw, ...
            z0 = (r - pw0) % sw
            cnt = 0 if z0 >= W else (W - 1 - z0) // sw + 1
            runs += [min(z0, W), (z0 + pw0) // sw, cnt]
        self.tab = np.array(np.concatenate([rows, a, np.array(runs, np.int64)]), np.int64)
        th, tw = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
        taps = np.stack([(th * kw + tw).ravel(), qh[th].ravel(), qw[tw].ravel(),
                         (th_slot[th] * self.nRw + tw_slot[tw]).ravel()], axis=1)
        self.taps = np.ascontiguousarray(taps[np.lexsort((taps[:, 0], taps[:, 3]))], np.int64)
        self.F = int((self.taps[:, 1] * self.Lw + self.taps[:, 2]).max())      # the largest flat tap offset
        self.m = p.output_shape[1] // p.input_shape[1]
        self.K = kh * kw
        for a in (self.tab, self.taps):
            a.flags.writeable = False
        self.tab_at, self.taps_at = self.tab.ctypes.data, self.taps.ctypes.data     # held with the arrays
        C, H, W = self.in4[1], self.in4[2], self.in4[3]
        OH, OW = self.out4[2:]
        self._geo = list(DEPTHWISE_GEO.pack(c=C, m=self.m, h=H, w=W, oh=OH, ow=OW, lh=self.Lh, lw=self.Lw,
                                            k=self.K, nrw=self.nRw, nslots=self.nslots, dx=0, dw=0, db=0,
                                            xs=(0,) * 4, dys=(0,) * 4, sw=self.sw, flatdx=1, f=self.F))

    def geo(self, need_dx: bool, need_dw: bool, need_db: bool, xs, ds, finite_w: bool = True) -> np.ndarray:
        """The C loops' geometry vector (layout.DEPTHWISE_GEO) with element strides xs of x and ds of dy."""
        geo = self._geo.copy()                 # the call's slots set by name (a per-call pack costs ~10 us)
        geo[_DX], geo[_DW], geo[_DB], geo[_FLATDX] = need_dx, need_dw, need_db, finite_w
        geo[_XS:_XS + 4], geo[_DYS:_DYS + 4] = xs, ds
        return np.array(geo, np.int64)

    def scratch(self, dtype, need_acc: bool = True):
        """One worker's scratch: (g, xph, acc): dy (or y) on the grid behind F zeros, the phases kept of x and dx."""
        size = self.nslots * (self.Lh + 1) * self.Lw
        return (np.empty(self.F + (self.Lh + 1) * self.Lw, dtype), np.empty(size, dtype),
                np.empty(size if need_acc else 1, dtype))

    def scratch_bytes(self, dtype, need_acc: bool = True) -> int:
        """The bytes of one :meth:`scratch`."""
        size = self.nslots * (self.Lh + 1) * self.Lw
        return (self.F + (self.Lh + 1) * self.Lw + size + (size if need_acc else 1)) * np.dtype(dtype).itemsize

    def scratch_floats(self) -> tuple:
        """(g's, xph's) elements of :meth:`scratch` (acc, when needed, as many as xph's): one C job thread's scratch
        holds them in order."""
        return self.F + (self.Lh + 1) * self.Lw, self.nslots * (self.Lh + 1) * self.Lw

    def run_planes(self, fn, kind: str, args, n0: int, n1: int, workers: int, cdt, need_acc) -> list:
        """``fn(*args, g, xph[, acc], p0, p1)`` over the plane chunks of samples [n0, n1) (planes counted from the
        block's start; ``need_acc`` None: the forward's loop, which takes no acc), as C jobs of ``kind`` (float32 on
        several workers: on torch's team where it is loaded; each thread's scratch holds g, xph, acc in order) or on
        the Python workers: the same chunks either way. Returns the chunks."""
        C = self.in4[1]
        parts = 2 if need_acc is None else 3
        if cdt == np.float32 and workers > 1:
            chunks = self.chunks(n0, n1, workers, as_jobs=True)
            g_n, xph_n = self.scratch_floats()
            offsets = (g_n, g_n + xph_n)[:parts - 1]              # where xph (and acc) start in a thread's scratch
            jobs = Jobs()
            jobs.split(kind, tuple(0 if a is None else a for a in args) + offsets, len(args) + len(offsets),
                       [(a - n0 * C, b - n0 * C) for a, b in chunks])
            jobs.run(workers, g_n + xph_n + (0 if need_acc is None else xph_n if need_acc else 1))
            return chunks

        def task(ws, _i, a, b):
            fn(*args, *(address(s) for s in ws[:parts]), a - n0 * C, b - n0 * C)

        chunks = self.chunks(n0, n1, workers)
        run(chunks, task, lambda: self.scratch(cdt, bool(need_acc)), workers)
        return chunks

    def sample_blocks(self, per_sample_bytes: int, io_bytes: int):
        """[n0, n1) blocks of samples whose converted copies fit the block budget (one sample at least)."""
        nb = max(1, min(BLOCK_BYTES, io_bytes // 2) // max(per_sample_bytes, 1))
        return [(n, min(n + nb, self.in4[0])) for n in range(0, self.in4[0], nb)]

    def chunks(self, n0: int, n1: int, workers: int, as_jobs: bool = False):
        """Plane ranges of samples [n0, n1): about 4 per worker, 8 planes at least; one (run on the calling
        thread, no hand-off) when the work is below the knob ``depthwise_small_work`` (2^20 multiply-adds: a
        hand-off to the pool costs 30-100 us; measured, same process: 590k multiply-adds, 8x32x16x16 3x3 backward,
        253 us alone against 350 us on two workers; 295k, 32x1x8x8 to 16 channels, 133 against 222 us; on a loaded
        2-core machine); C jobs (``as_jobs``: float32 on several workers, the caller's share already decided) split
        at any size. Results do not depend on them."""
        C = self.in4[1]
        a, b = n0 * C, n1 * C
        work = (b - a) * self.m * self.K * math.prod(self.out4[2:])
        small_work = work < tuning.get("depthwise_small_work") and not as_jobs
        parts = 1 if small_work else max(1, min((b - a) // 8, 4 * workers))
        return [(a + u, a + v) for u, v in even_ranges(b - a, parts)]


def _dim(k: int, d: int, s: int):
    """One dim of the polyphase plan: per tap its offset q and its phase's slot, and the phases some tap reads."""
    q, r = np.divmod(np.arange(k, dtype=np.int64) * d, s)
    used = np.unique(r)
    return q, np.searchsorted(used, r).astype(np.int64), used


@per_params
def _plan(p: ConvParams) -> _Plan:
    return _Plan(p)


def _suffix(cdt: np.dtype) -> str:
    return "f64" if cdt == np.float64 else "f32"


def _readable(a: np.ndarray, cdt: np.dtype) -> bool:
    """Whether the C loops can read ``a`` where it lies: the compute dtype (native order), aligned."""
    return a.dtype == cdt and a.flags.aligned


def _elem_strides(a: np.ndarray, shape4) -> tuple:
    """Element strides of ``a`` viewed with shape ``shape4`` (a 1-D array gets height 1)."""
    v = a.reshape(shape4) if a.ndim != 4 else a
    return tuple(s // v.itemsize for s in v.strides)


def backward(dy, x, w, p: ConvParams, need_dx: bool, need_dw: bool, need_db: bool, workers: int):
    """(dx, dw, db), None where not needed, of a depthwise convolution ``p`` (see :func:`serves`); at
    least one of dx and dw must be needed (db is summed on the way, from the same plane copies).

    Inputs in the compute dtype and aligned are read in place, at any strides; others are converted a
    block of samples at a time (so extra memory stays about BLOCK_BYTES), and so is dx when its dtype
    is not the compute dtype.
    """
    if not need_db and depthwise_cv.serves(p):          # small planes: the loops across channels
        return depthwise_cv.backward(dy, x, w, p, need_dx, need_dw, workers) + (None,)
    lib, plan, cdt = native.library(), _plan(p), accumulation_dtype(p.dtype)
    fn = getattr(lib, f"xconv_depthwise_backward_{_suffix(cdt)}")
    out_dt = np.dtype(dy.dtype).newbyteorder("=")
    N, C = plan.in4[:2]
    dy4 = dy.reshape(plan.out4)
    x4 = x.reshape(plan.in4) if need_dw else None
    w2 = np.ascontiguousarray(np.asarray(w, dtype=cdt).reshape(plan.out4[1], plan.K)) if need_dx else None
    finite_w = all_finite(w2) if need_dx else True
    dx = empty_result(plan.in4, out_dt) if need_dx else None
    dwp = np.empty((N, plan.out4[1], plan.K), cdt) if need_dw else np.zeros(1, cdt)
    dbp = np.empty((N, plan.out4[1]), cdt) if need_db else np.zeros(1, cdt)
    in_place = _readable(dy, cdt) and (not need_dw or _readable(x, cdt)) and (not need_dx or out_dt == cdt)
    per_sample = cdt.itemsize * (math.prod(plan.out4[1:]) + math.prod(plan.in4[1:]) * (need_dw + need_dx))
    x_bytes, w_bytes = math.prod(p.input_shape) * out_dt.itemsize, math.prod(p.weight_shape) * out_dt.itemsize
    io = dy.nbytes + (x_bytes + w_bytes) * (need_dx + need_dw)      # inputs and outputs of this call
    dwb_all = address(dwp)
    dbb_all = address(dbp)
    peak = 0                                   # the most scratch of one block: its copies and the workers' scratch
    for n0, n1 in ([(0, N)] if in_place else plan.sample_blocks(per_sample, io)):
        dyb = dy4[n0:n1] if in_place else np.ascontiguousarray(dy4[n0:n1], dtype=cdt)
        xb = (x4[n0:n1] if in_place else np.ascontiguousarray(x4[n0:n1], dtype=cdt)) if need_dw else None
        dxb = (dx[n0:n1] if out_dt == cdt else np.empty((n1 - n0,) + plan.in4[1:], cdt)) if need_dx else None
        xs = _elem_strides(xb, plan.in4) if need_dw else (0, 0, 0, 0)
        geo = plan.geo(need_dx, need_dw, need_db, xs, _elem_strides(dyb, plan.out4), finite_w)
        Co = plan.out4[1]
        # the C loop indexes samples from its block's start: offset the partials' pointers to the block
        args = (address(dyb), address(xb) if need_dw else None, address(w2) if need_dx else None,
                address(dxb) if need_dx else None,
                dwb_all + n0 * Co * plan.K * cdt.itemsize if need_dw else None,
                dbb_all + n0 * Co * cdt.itemsize if need_db else None,
                address(geo), plan.taps_at, plan.tab_at)

        chunks = plan.run_planes(fn, "dw_backward", args, n0, n1, workers, cdt, need_dx)
        copies = sum(a.nbytes for a in (dyb, xb, dxb) if a is not None and a.base is None)   # converted copies
        peak = max(peak, copies + min(workers, len(chunks)) * plan.scratch_bytes(cdt, need_dx))
        if need_dx and out_dt != cdt:
            dx[n0:n1] = dxb
    tracing.workspace(peak + dwp.nbytes + dbp.nbytes + (w2.nbytes if need_dx and w2.base is None else 0))
    rdx = dx.reshape(p.input_shape) if need_dx else None
    rdw = _sum_samples(dwp).reshape(p.weight_shape).astype(out_dt, copy=False) if need_dw else None
    rdb = _sum_samples(dbp).astype(out_dt, copy=False) if need_db else None
    return rdx, rdw, rdb


def _sum_samples(parts: np.ndarray) -> np.ndarray:
    """The per-sample partials summed over the first axis (a fixed order for given shapes)."""
    return parts.sum(axis=0)


def runs_as_jobs(p: ConvParams) -> bool:
    """Whether ``p``'s loops run as C jobs (:mod:`.jobs`; a hand-off costs microseconds on torch's team, not a Python
    worker's 30-100 us): float32 compute, so the loops across channels (float32 only) and the plane loops there."""
    return accumulation_dtype(p.dtype) == np.float32


def fprop(x, w, bias, p: ConvParams, workers: int):
    """y = conv(x, w) + bias for a depthwise convolution ``p`` (see :func:`serves`), x converted by sample blocks
    when it cannot be read in place."""
    if depthwise_cv.fprop_serves(p, w):                 # small planes: the loops across channels
        return depthwise_cv.fprop(x, w, bias, p, workers)
    lib, plan, cdt = native.library(), _plan(p), accumulation_dtype(p.dtype)
    fn = getattr(lib, f"xconv_depthwise_fprop_{_suffix(cdt)}")
    out_dt = np.dtype(x.dtype).newbyteorder("=")
    N, C = plan.in4[:2]
    x4 = x.reshape(plan.in4)
    w2 = np.ascontiguousarray(np.asarray(w, dtype=cdt).reshape(plan.out4[1], plan.K))
    b = None if bias is None else np.asarray(bias, dtype=cdt).reshape((1, -1, 1, 1))
    y = empty_result(plan.out4, out_dt)
    in_place = _readable(x, cdt) and out_dt == cdt
    per_sample = cdt.itemsize * (math.prod(plan.out4[1:]) + math.prod(plan.in4[1:]))
    io = x.nbytes + w.nbytes + N * math.prod(plan.out4[1:]) * out_dt.itemsize
    peak = 0                                   # the most scratch of one block: its copies and the workers' scratch
    for n0, n1 in ([(0, N)] if in_place else plan.sample_blocks(per_sample, io)):
        xb = x4[n0:n1] if in_place else np.ascontiguousarray(x4[n0:n1], dtype=cdt)
        yb = y[n0:n1] if out_dt == cdt else np.empty((n1 - n0,) + plan.out4[1:], cdt)
        geo = plan.geo(False, False, False, _elem_strides(xb, plan.in4), (0, 0, 0, 0))
        args = (address(xb), address(w2), address(yb), address(geo), plan.taps_at, plan.tab_at)
        chunks = plan.run_planes(fn, "dw_fprop", args, n0, n1, workers, cdt, None)
        copies = sum(a.nbytes for a in (xb, yb) if a.base is None)                            # converted copies
        peak = max(peak, copies + min(workers, len(chunks)) * plan.scratch_bytes(cdt, False))
        if b is not None:
            yb += b
        if out_dt != cdt:
            y[n0:n1] = yb
    tracing.workspace(peak + (w2.nbytes if w2.base is None else 0))
    return y.reshape(p.output_shape)
