"""The fast NumPy convolution: runs the paths :mod:`.paths` chooses (this module only dispatches).

:mod:`.reference` defines the math; this module computes the same sums, accumulating in float32
(float64 for float64 inputs), laid out for BLAS. ``docs/numpy-backend.md`` describes the design;
in short:

- Polyphase grid. Per dim, the zero-padded input (length ``Sp = S + pre + post``) is split into
  ``stride`` phases, phase ``r`` holding ``x_pad[m*s + r]``, ``m < L = ceil(Sp / s)``. Tap ``j``
  reads ``x_pad[i*s + j*d] = phase_{r_j}[i + q_j]``, ``(q_j, r_j) = divmod(j*d, s)``: every tap is
  a stride-1 shift of one phase. Phases, dy and y live on one grid ``(N, L_1, ..., L_nd)``,
  flattened and channel-major, ``(groups, C/groups, positions)``, where a tap is a constant
  offset, so the shifted operand of all of a phase's taps is one strided view. Grid positions
  outside the real tensors hold zeros ("garbage" rows read the next row; never copied out).
- Strategy A ("dy-columns", the usual one): per phase, the taps' shifted dy slices gathered for
  the phase's valid input positions (im2col of dy, one strided copy), then
  ``dx_p = W_p^T @ cols_p`` and ``dW_p = cols_p @ x_p^T``. For 2-D kernels with enough channels
  the first-dim taps are line-shifted views of inner-tap columns.
- Strategy B ("x-columns", few input channels, e.g. a 3-channel stem): im2col of the x phases,
  ``dW = dy @ cols^T``, ``y = W @ cols`` (fprop), ``dx`` by ``Z = W^T @ dy`` and col2im adds.
- Pointwise (1x1, stride 1, no padding): per-sample products on the native layout.
- Small calls (:mod:`.small`, at most ``small.MAX_ELEMENTS`` elements of columns): one C call on
  zero-padded grids (stride 1), or C columns and one matrix product per gradient, on the calling thread
  (without the compiled loops: one strided copy or one gather per operand); four paths of the table.
- Columns (:mod:`.columns`): geometries the grid serves badly, and backward calls whose inputs hold
  a NaN or infinity, run on the reference's chunked im2col in the compute dtype instead.
- Chunks of grid lines (whole samples, or line ranges of one sample with halos) sized to a
  working-set budget proportional to the call's bytes, run on a few Python threads with BLAS
  single-threaded; weight-gradient partials summed in a fixed order; scratch from an arena.

Everything is a fixed sequence of NumPy operations on shapes that depend only on the
convolution's parameters, so results are bitwise reproducible run to run, process to process
and (with BLAS thread control available) across BLAS thread counts.
"""

from __future__ import annotations

from xconv import ConvParams, tracing

from . import (bias, colgemm, columns, cost, dense, depthwise, grid_blocks, jobs, omp_team, paths, small,
               small_c, small_numpy, stem, tuning)
from .blas import _BLAS, blas_workers, single_threaded_blas as pinned_blas_workers
from .budget import check_im2col
from .finite import all_finite
from .grid import forward, pointwise, pointwise_planned, strategy_a, strategy_b
from .grid.chunks import budget as _budget
from .grid.geometry import compute_dtype, geom, io_bytes
from .grid.scratch import Lease, release_memory  # noqa: F401  (release_memory: the backend's public call)
from xconv.dtypes import DTYPES


def _note(path: paths.Path, outputs, rule: str) -> None:
    if tracing.active():
        tracing.note(_words(path, outputs, rule))


def _words(path: paths.Path, outputs, rule: str) -> str:
    """What the trace record says of a run: the path's name and note, the outputs and the rule that chose it."""
    return f"{path.name}: {path.note} [{', '.join(outputs)}: {rule}]"


#: The small-call paths run from Python (BLAS products under the pin): {name: (fprop, backward)}.
_SMALL = {"small-cols": (small_c.cols_fprop, small_c.cols_backward),
          "small-grid": (small_numpy.grid_fprop, small_numpy.grid_backward),
          "small-gather": (small_numpy.gather_fprop, small_numpy.gather_backward)}


def _small_scratch(p: ConvParams, need_dx: bool, need_dw: bool, fprop: bool = False) -> None:
    """Report the scratch of the small paths run from Python (:data:`_SMALL`): dy channel-major (or y before its
    layout), and the columns of x (fprop, dw) and of dx, in the compute dtype, from the small paths' sizes
    (the grid forms hold about as much)."""
    if tracing.active():
        f = small.plan(p)
        cols, dyc = f.C * f.K * f.N * f.Q, f.Co * f.N * f.Q
        tracing.workspace(compute_dtype(p).itemsize * (dyc + cols * (1 if fprop else need_dx + need_dw)))


def _columns(dy, x, w, p, need_dx, need_dw, rule):
    outs = [o for o, bit in (("grad_input", need_dx), ("grad_weight", need_dw)) if bit]
    check_im2col("numpy", p, [op for op, bit in (("dgrad", need_dx), ("wgrad", need_dw)) if bit],
                 compute_dtype(p).itemsize, _words(paths.PATHS["columns"], outs, rule))
    return columns.backward(dy, x, w, p, need_dx, need_dw)


def _share(p: ConvParams, workers: int, op: str, as_jobs: bool = False) -> int:
    """The workers a call of ``p`` gets: all of them, or the calling thread alone when the full call's work (the
    forward's multiply-adds, or dx's and dw's together, whatever the mask) is below the knob ``parallel_min_work``
    (2^24): a hand-off to the worker pool costs 120-250 us of wall time (measured on a 2-core Zen 4: a 1x1 forward
    of 7M multiply-adds took 190 us on one worker and 310 on two; a 42M-multiply-add backward 2.2 ms and 1.3 ms).
    A path that runs as C jobs (``as_jobs``: :mod:`.jobs`) on torch's OpenMP team has the knob ``team_min_work`` (2^18)
    instead (measured, torch's team hot as in a model step: a 0.3M-multiply-add depthwise forward 112 us on one
    thread, 99 on two). No path's bits depend on its worker count."""
    return share_of(work_of(p, op), workers, as_jobs)


def work_of(p: ConvParams, op: str) -> int:
    """The multiply-adds :func:`_share` weighs for a call of ``p``: the forward's, or dx's and dw's together."""
    return cost.macs(p) * (1 if op == "fprop" else 2)


def share_of(work: int, workers: int, as_jobs: bool) -> int:
    """:func:`_share` for a call of ``work`` multiply-adds (a lane's runner counts them once)."""
    if workers <= 1:
        return workers
    least = tuning.get("team_min_work") if as_jobs and omp_team.available() else tuning.get("parallel_min_work")
    return workers if work >= least else 1


def team_share(work: int) -> int:
    """``share_of(work, blas_workers(), True)`` in one step: the workers of a lane's path of C jobs that calls no
    BLAS (read anew each call: the BLAS thread count, the team, the knobs)."""
    workers = _BLAS.worker_count()
    if workers <= 1:
        return workers
    over = tuning._overrides                                     # tuning.get, in line
    name = "team_min_work" if omp_team.available() else "parallel_min_work"
    return workers if work >= (over[name] if name in over else tuning.KNOBS[name][0]) else 1


def _run_grads(path, dy, x, w, p, need_dx, need_dw, need_db):
    """(dx, dw, db or None) by ``path``; db only from the paths that sum dy in the same pass. The dense loops'
    working-set budget is the full call's whatever the mask (their dW chunking, so its bits, must not depend on it)."""
    name = path.name
    if name == "depthwise":
        workers = _share(p, blas_workers(), "backward", depthwise.runs_as_jobs(p))
        return depthwise.backward(dy, x, w, p, need_dx, need_dw, need_db, workers)
    if name in _SMALL:
        _small_scratch(p, need_dx, need_dw)
        with pinned_blas_workers():
            return _SMALL[name][1](dy, x, w, p, need_dx, need_dw) + (None,)
    if name == "colgemm":
        with pinned_blas_workers() as workers:
            workers = _share(p, workers, "backward", colgemm.runs_as_jobs(p))
            return colgemm.backward(dy, x, w, p, need_dx, need_dw, workers) + (None,)
    if name == "stem":                               # the weight gradient only (paths.cost_pick)
        return None, stem.wgrad(dy, x, p, _share(p, blas_workers(), "backward", True)), None
    if name == "pointwise" and p.dtype == "float32" and not need_db and jobs.sgemm_available():
        with pinned_blas_workers() as workers:
            done = pointwise_planned.backward(p, dy, x, w, need_dx, need_dw, _share(p, workers, "backward", True))
            if done is not None:
                return done + (None,)
    if name == "dense":                              # the C loops: no BLAS, no pin
        budget = _budget(io_bytes(geom(p), DTYPES[p.dtype].itemsize, True, True), p)         # the full call's: any mask
        workers = _share(p, blas_workers(), "backward", True)
        for check_first in (False, True):            # None: w held an inf or a NaN (found in its copy): again,
            with Lease(p.workspace_limit) as lease:  # checking first, with the first run's scratch given back
                results = dense.backward(dy, x, w, p, need_dx, need_dw, need_db, workers, budget, lease,
                                         check_first=check_first)
            if results is dense.NONFINITE_BOTH:      # dx on the columns (as the definition has it); dw here
                rx = _columns(dy, x, w, p, True, False, "non-finite detour")[0]
                if not need_dw:
                    return rx, None, None
                with Lease(p.workspace_limit) as lease:
                    return rx, dense.backward(dy, x, w, p, False, True, False, workers, budget, lease)[1], None
            if results is not None:
                return results
    with pinned_blas_workers() as workers, Lease(p.workspace_limit) as lease:
        workers = _share(p, workers, "backward")
        if name == "pointwise":
            return pointwise.backward(geom(p), dy, x if need_dw else None, w, need_dx, need_dw, need_db, workers,
                                      lease)
        run = strategy_a.backward if name == "grid-a" else strategy_b.backward
        return run(geom(p), dy, x if need_dw else None, w, need_dx, need_dw, workers, lease) + (None,)


def _grads(path, rule, dy, x, w, p, gx, gw):
    """(dx, dw) of one path for the outputs asked (gx, gw). The non-finite detour is decided per output from the
    inputs that output reads (dx: dy and w; dw: dy and x), so the mask never changes an output's path."""
    outs = [o for o, bit in (("grad_input", gx), ("grad_weight", gw)) if bit]
    if path.name == "columns":
        return _columns(dy, x, w, p, gx, gw, rule)
    bad_x = bad_w = False
    if path.nonfinite == "self-check":                # C calls that check what they read for inf/NaN themselves
        if path.name == "small-c-blocks":
            results = grid_blocks.backward(dy, x, w, p, gx, gw, _share(p, blas_workers(), "backward", True))
        else:
            results = small_c.grid_backward(dy, x, w, p, gx, gw, False)
        if results is not None:
            _note(path, outs, rule)
            return results[0], results[1]
        if not (gx and gw):
            return _columns(dy, x, w, p, gx, gw, "non-finite detour")
        bad_x, bad_w = _nonfinite(p, dy, x, w, True, True)
    elif path.nonfinite == "detour":
        bad_x, bad_w = _nonfinite(p, dy, x, w, gx, gw)
    elif path.name == "dense" and gx and tracing.active():     # the record names dx's detour alone (untraced, the
        bad_x = not all_finite(w) and not all_finite(dy)      # loops find it: dense.NONFINITE_BOTH, _run_grads)
    if bad_x or bad_w:
        rx, rw = _columns(dy, x, w, p, bad_x, bad_w, "non-finite detour")
        if (gx and not bad_x) or (gw and not bad_w):          # the other output: on its own path, as if alone
            fx, fw = _grads(path, rule, dy, x, w, p, gx and not bad_x, gw and not bad_w)
            rx, rw = (rx if bad_x else fx), (rw if bad_w else fw)
        return rx, rw
    _note(path, outs, rule)
    rx, rw, _ = _run_grads(path, dy, x, w, p, gx, gw, False)
    return rx, rw


def _nonfinite(p, dy, x, w, gx, gw):
    """(dx's inputs hold an inf or a NaN, dw's do): one pass over each input read."""
    bad_dy = columns.has_nonfinite(p, dy, None, None)
    return (gx and (bad_dy or columns.has_nonfinite(p, None, None, w)),
            gw and (bad_dy or columns.has_nonfinite(p, None, x, None)))


def backward(dy, x, w, p: ConvParams, mask):
    """(dx, dw, db) of a direct convolution, None where the mask bit is False; each output by the path
    :func:`paths.choose` picks for it (from the parameters alone: the same whatever the mask)."""
    runs, bias_path = paths.backward_plan(p, mask)
    return _backward_on(runs, bias_path, dy, x, w, p)


def _backward_on(runs, bias_path, dy, x, w, p: ConvParams):
    """:func:`backward` by the runs of :func:`paths.backward_plan` given."""
    dx = dw = db = None
    for path, rule, outs, gx, gw, _ in runs:
        rx, rw = _grads(path, rule, dy, x, w, p, gx, gw)
        if gx:
            dx = rx
        if gw:
            dw = rw
    if bias_path is not None:                        # always its own path: one order for every call
        _note(bias_path[0], ("grad_bias",), bias_path[1])
        db = bias.bias_sum(dy, p)                                  # notes its scratch in the trace
    return dx, dw, db


def dgrad(dy, w, p: ConvParams):
    return backward(dy, None, w, p, (True, False, False))[0]


def wgrad(x, dy, p: ConvParams):
    return backward(dy, x, None, p, (False, True, False))[1]


def bgrad(dy, p: ConvParams):
    """dy summed over N and the spatial dims (:func:`bias.bias_sum`)."""
    return backward(dy, None, None, p, (False, False, True))[2]


def fprop(x, w, b, p: ConvParams):
    """y = conv(x, w) + b by the path :func:`paths.choose` picks."""
    path, rule = paths.choose_all(p, "fprop", (True,))["output"]
    return _fprop_on(path, rule, x, w, b, p)


def _fprop_on(path, rule, x, w, b, p: ConvParams):
    """:func:`fprop` by ``path`` (its ``rule`` for the trace)."""
    name = path.name
    # a non-finite weight: the dense loops (the dual's) would multiply the grid's zeros by it, and the stem loops
    # skip the tap rows that read padding, where the definition has 0 * inf. The dense forward checks w in its copy
    # (None: not finite) unless a trace is open (its record names the detour alone)
    if name == "stem" or (name == "dense" and tracing.active()):
        if not all_finite(w):
            path, rule, name = paths.PATHS["columns"], "non-finite detour", "columns"
    if name == "columns":
        check_im2col("numpy", p, ["fprop"], compute_dtype(p).itemsize, _words(path, ["output"], rule))
        return columns.fprop(x, w, b, p)
    _note(path, ["output"], rule)
    if name == "depthwise":
        return depthwise.fprop(x, w, b, p, _share(p, blas_workers(), "fprop", depthwise.runs_as_jobs(p)))
    if name == "small-c":
        return small_c.grid_fprop(x, w, b, p)
    if name == "small-c-blocks":
        return grid_blocks.fprop(x, w, b, p, _share(p, blas_workers(), "fprop", p.dtype == "float32"))   # C jobs
    if name == "stem":
        return stem.fprop(x, w, b, p, _share(p, blas_workers(), "fprop", True))
    if name == "dense":                              # stride 1: the dual call's input gradient, its working-set budget
        q = dense.dual(p) if all(s == 1 for s in p.stride) else None
        budget = None if q is None else _budget(io_bytes(geom(q), DTYPES[p.dtype].itemsize, True, True), q)
        with Lease(p.workspace_limit) as lease:                            # the C loops: no BLAS, no pin
            y = dense.fprop(x, w, b, p, _share(p, blas_workers(), "fprop", True), budget, lease)
        if y is not None:
            return y
        return _fprop_on(paths.PATHS["columns"], "non-finite detour", x, w, b, p)     # w not finite
    if name == "pointwise":
        with pinned_blas_workers() as workers:
            workers = _share(p, workers, "fprop", p.dtype == "float32" and jobs.sgemm_available())    # sgemm jobs
            y = pointwise_planned.fprop(p, x, w, b, workers)
            if y is not None:
                return y
            with Lease(p.workspace_limit) as lease:
                return pointwise.fprop(geom(p), x, w, b, workers, lease)
    if name == "colgemm":
        with pinned_blas_workers() as workers:
            return colgemm.fprop(x, w, b, p, _share(p, workers, "fprop", colgemm.runs_as_jobs(p)))
    if name in _SMALL:
        _small_scratch(p, False, False, fprop=True)
        with pinned_blas_workers():
            return _SMALL[name][0](x, w, b, p)
    with pinned_blas_workers() as workers, Lease(p.workspace_limit) as lease:
        return forward.fprop(x, w, b, p, _share(p, workers, "fprop"), lease)
