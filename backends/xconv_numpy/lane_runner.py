"""A lane's runner (:meth:`.backend.NumpyBackend.lane`): one configuration's repeated calls on the paths chosen once.

:func:`runner` runs :mod:`.fast`'s dispatch on the paths chosen when the lane opened; where the chosen path keeps job
templates (the dense loops' one-block calls: :mod:`.dense_quick`; the pointwise sgemm jobs:
:mod:`.grid.pointwise_planned`; colgemm's one-chunk calls: :mod:`.colgemm_quick`; the depthwise loops across
channels: :mod:`.depthwise_quick`; the dense loops' strided forward: :mod:`.dense_strided_quick`; the stem loops'
forward: :mod:`.stem_quick`), it runs them
straight, what depends on the configuration looked up once, and falls back to the dispatch for any call that is not
the template's (the same jobs either way, so the same bits).
"""

from __future__ import annotations

import numpy as np

from xconv import ConvParams, tracing
from xconv.dtypes import DTYPES

from . import (bias, colgemm, colgemm_quick, dense, dense_quick, dense_strided_quick, depthwise_quick, grid_blocks,
               jobs, paths, small_c, stem_quick)
from .blas import _BLAS, single_threaded_blas as pinned_blas_workers
from .fast import _backward_on, _fprop_on, share_of, team_share, work_of
from .grid import pointwise_planned
from .grid.chunks import budget as _budget
from .grid.geometry import geom, io_bytes


def runner(p: ConvParams, op: str, mask=None):
    """A lane's runner for ``p``: :func:`.fast.fprop` (``runner(x, w, b)``) or :func:`.fast.backward` for ``mask``
    (``runner(dy, x, w)``) on the paths chosen now, with NumPy's floating-point warnings off as in the primitives;
    NotImplemented (the lane then calls the primitive, which chooses again) once this thread's forced paths
    (:func:`paths.force`) differ from now. The choice reads nothing else that a lane does not check (the settings) or
    hold (the build); the paths read the tuning knobs when they run."""
    if op == "dgrad":
        return _dgrad_runner(p)
    forced = paths._state()
    default = forced == ((), ())
    if op == "fprop":
        run, chosen = _fprop_on, paths.choose_all(p, "fprop", (True,))["output"]       # (path, rule)
        quick = _quick_fprop(chosen[0], p)
    else:
        run, chosen = _backward_on, paths.backward_plan(p, mask)                        # (runs, bias path)
        quick = _quick_backward(*chosen, p)

    def run_lane(*arrays):
        # (paths._open_blocks[0] == 0: no force block open in any thread, unforced()'s first test, in line)
        if not (default and (paths._open_blocks[0] == 0 or paths.unforced())) and paths._state() != forced:
            return NotImplemented
        if quick is not None:                        # its NumPy arithmetic under errstate: see _quiet
            results = quick(*arrays)
            if results is not None:
                return results
        with np.errstate(all="ignore"):
            return run(*chosen, *arrays, p)
    return run_lane


def _dgrad_runner(p: ConvParams):
    """``runner(dy, w) -> dx``: :func:`.fast.dgrad` (the backward of mask (T, F, F) without x) on the path chosen
    now, as :func:`runner` (NotImplemented once this thread's forced paths differ); the kept template only on the
    dense loops, whose runner reads no x without dw (others' runners take an x)."""
    forced = paths._state()
    default = forced == ((), ())
    chosen = paths.backward_plan(p, (True, False, False))
    runs = chosen[0]
    quick = _quick_backward(*chosen, p) if len(runs) == 1 and runs[0][0].name == "dense" else None

    def run_lane(dy, w):
        # (paths._open_blocks[0] == 0: no force block open in any thread, unforced()'s first test, in line)
        if not (default and (paths._open_blocks[0] == 0 or paths.unforced())) and paths._state() != forced:
            return NotImplemented
        if quick is not None:
            results = quick(dy, None, w)
            if results is not None:
                return results[0]
        with np.errstate(all="ignore"):
            return _backward_on(*chosen, dy, None, w, p)[0]
    return run_lane


def _quiet(fn):
    """``fn`` with NumPy's floating-point warnings off, as the primitives run (for a quick path's NumPy arithmetic or
    casts, such as a float16 result's, which may overflow to inf: a path of C jobs alone needs no errstate, as NumPy
    clears the flags before its own loops)."""
    def quiet(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    return quiet


def _quiet_bias(fn):
    """:func:`_quiet` for a forward ``fn(x, w, bias, *rest)`` whose one NumPy arithmetic is adding the bias: under
    errstate only with a bias (three calls fewer a call without: inside a model, caches cold, a few µs each)."""
    quiet = _quiet(fn)

    def run(x, w, bias, *rest):
        return fn(x, w, bias, *rest) if bias is None else quiet(x, w, bias, *rest)
    return run


def _sgemm_jobs(p: ConvParams) -> bool:
    """Whether ``p``'s pointwise path runs its sgemm jobs (float32, NumPy's ILP64 sgemm found, tables within their
    bounds), as the dispatch would."""
    return p.dtype == "float32" and jobs.sgemm_available() and pointwise_planned.takes(p)[0]


def _pinned(products, p: ConvParams, op: str):
    """``products(*arrays, workers)`` with BLAS pinned to one thread and the workers :func:`.fast._share` gives, as
    the dispatch runs the pointwise path; None while a trace is open (the dispatch records the call). A forward's
    products are C jobs and NumPy copies: its one arithmetic that may warn is the bias, so a forward without one
    runs without ``np.errstate`` (three calls fewer: inside a model every call costs a few µs, caches cold)."""
    work, fprop = work_of(p, op), op == "fprop"

    def quick(*arrays):
        if tracing._open:                            # tracing.active()
            return None
        with _BLAS as workers:                       # pinned_blas_workers()
            if fprop and arrays[2] is None:
                return products(*arrays, share_of(work, workers, True))
            with np.errstate(all="ignore"):
                return products(*arrays, share_of(work, workers, True))
    return quick


def _plain_jobs(run, p: ConvParams, op: str):
    """``run(*arrays, workers)`` on the workers :func:`.fast._share` gives a path of C jobs that calls no BLAS (the
    dense and depthwise loops: not pinned, as the dispatch runs them); None while a trace is open. Not under errstate:
    a ``run`` that does NumPy arithmetic (the depthwise sums, a bias) comes wrapped in :func:`_quiet`."""
    work = work_of(p, op)

    def quick(*arrays):
        if tracing._open:                            # tracing.active()
            return None
        return run(*arrays, team_share(work))
    return quick


def _pinned_numpy(run):
    """``run(*arrays)`` with BLAS pinned to one thread and NumPy's floating-point warnings off, as the dispatch runs
    the small-call paths from Python; None while a trace is open (the dispatch records the call)."""
    def quick(*arrays):
        if tracing._open:                            # tracing.active()
            return None
        with pinned_blas_workers(), np.errstate(all="ignore"):
            return run(*arrays)
    return quick


def _quick_fprop(path, p: ConvParams):
    """The forward's runner of a template path, ``quick(x, w, b) -> y`` (None: that call is not its template's), or
    None where ``path`` keeps none (the dense loops at any stride, the pointwise sgemm jobs, colgemm's one-chunk
    float32 jobs, the depthwise loops across channels and the stem loops do)."""
    if path.name == "pointwise" and pointwise_planned.builds_forward(p):    # (a table refused: the primitive runs)
        return _pinned(pointwise_planned.fprop_runner(p), p, "fprop")
    if path.name == "colgemm" and p.dtype == "float32" and colgemm.runs_as_jobs(p):
        run = colgemm_quick.fprop_runner(p)
        return None if run is colgemm_quick._never else _pinned(run, p, "fprop")
    if path.name == "small-c":                       # quiet: a float16 result's cast may overflow to inf
        return _quiet(small_c.grid_fprop_runner(p))
    if path.name == "small-cols":
        return _pinned_numpy(lambda x, w, b: small_c.cols_fprop(x, w, b, p))
    if path.name == "depthwise":                    # (C jobs and NumPy copies: the bias alone may warn)
        run = depthwise_quick.fprop_runner(p)
        return None if run is None else _plain_jobs(_quiet_bias(run), p, "fprop")
    if path.name == "dense" and any(s != 1 for s in p.stride):
        run = dense_strided_quick.fprop_runner(p)
        return None if run is None else _plain_jobs(run, p, "fprop")
    if path.name == "stem":
        run = stem_quick.fprop_runner(p)
        return None if run is None else _plain_jobs(run, p, "fprop")
    if path.name != "dense" or not dense.computes_fprop(p):
        return None
    q = dense.dual(p)
    loops = dense_quick.runner(q, True, False, flip=True)
    if loops is None:
        return None
    nbytes, nd, work = io_bytes(geom(q), DTYPES[p.dtype].itemsize, True, True), p.nd, work_of(p, "fprop")

    def quick(x, w, b):                              # (_plain_jobs, in line: one call fewer on the hot path)
        if tracing._open:
            return None
        out = loops(x, None, w, team_share(work), _budget(nbytes, q))
        if out is None:
            return None
        y = out[0]
        if b is not None:                            # as dense.fprop adds it
            with np.errstate(all="ignore"):
                y += np.asarray(b, np.float32).reshape((1, -1) + (1,) * nd)
        return y
    return quick


def _quick_backward(runs, bias_path, p: ConvParams):
    """:func:`_quick_fprop` for a backward of one run (``quick(dy, x, w) -> (dx, dw, db)``), its bias by
    :func:`.bias.bias_sum` as :func:`.fast._backward_on` sums it."""
    if len(runs) != 1:
        return None
    path, _, _, gx, gw, _ = runs[0]
    if path.name == "pointwise" and _sgemm_jobs(p):
        products = pointwise_planned.backward_runner(p)
        grads = _pinned(lambda dy, x, w, workers: products(dy, x, w, gx, gw, workers), p, "backward")
    elif path.name == "colgemm" and (loops := colgemm_quick.backward_runner(p)) is not colgemm_quick._never_backward:
        grads = _pinned(lambda dy, x, w, workers: loops(dy, x, w, gx, gw, workers), p, "backward")
    elif path.name == "depthwise" and (loops := depthwise_quick.backward_runner(p)) is not None:
        grads = _plain_jobs(_quiet(lambda dy, x, w, workers: loops(dy, x, w, gx, gw, workers)), p, "backward")
    elif path.name == "small-c" and path.nonfinite == "self-check":
        grads = _quiet(small_c.grid_backward_runner(p, gx, gw))
    elif path.name == "small-c-blocks" and path.nonfinite == "self-check":      # dw's blocks added: NumPy sums
        grads = _plain_jobs(_quiet(grid_blocks.backward_runner(p, gx, gw)), p, "backward")
    elif path.name == "small-cols" and path.nonfinite == "keeps":
        grads = _pinned_numpy(lambda dy, x, w: small_c.cols_backward(dy, x, w, p, gx, gw))
    elif path.name == "dense" and (loops := dense_quick.runner(p, gx, gw)) is not None:
        nbytes = io_bytes(geom(p), DTYPES[p.dtype].itemsize, True, True)          # the full call's: any mask
        work = work_of(p, "backward")

        def grads(dy, x, w):                         # (_plain_jobs, in line: two calls fewer on the hot path)
            if tracing._open:
                return None
            return loops(dy, x, w, team_share(work), _budget(nbytes, p))
    else:
        return None

    def quick(dy, x, w):
        done = grads(dy, x, w)
        if done is None:
            return None
        return done[0], done[1], (None if bias_path is None else bias_sum(dy, p))
    return quick


bias_sum = _quiet(bias.bias_sum)
