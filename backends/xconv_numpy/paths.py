"""Which path of the fast NumPy backend computes a call, and why: one table, read top to bottom.

A :class:`Path` says how an output is computed; :data:`RULES` lists, per op, the rules in the order they are tried;
:func:`choose` (cached) is the only place a path is picked, once per output (``grad_input``, ``grad_weight``,
``grad_bias``; ``output`` for the forward) and returns the path and the rule that chose it (docs/numpy-backend.md).

Cross-cutting rules, written once here:

- **workspace_limit**: a path whose scratch is not leased (``leases_scratch=False``: it cannot count it) runs
  under a workspace limit only when its scratch bound (``Path.bound``, bytes at most) fits the limit, so a limit
  that constrains nothing changes no path (issue 24); a limit that excludes a path says so in the trace;
- **non-finite detour**: a path with ``nonfinite="detour"`` multiplies zeros the definition never multiplies, so a
  call whose inputs hold a NaN or an infinity runs on ``columns`` instead (checked in :mod:`.fast` at run time;
  ``"self-check"``: the path checks on the way and says so; ``"keeps"``: the path keeps them as the reference);
- **BLAS policy**: ``"pinned"`` runs under one BLAS thread per worker (:mod:`.blas`), ``"none"`` calls no BLAS and
  is not pinned, ``"own"`` pins inside the path; **trace note**: the path's ``note`` and the rule's name go to the
  trace record (``xconv.trace()``, ``xconv run --explain``).

**Determinism** (docs/semantics.md): no rule reads the output mask or the operands' layout. Every output's path is
the one the full call (all three outputs) would take for it, so which outputs are requested never changes how one of
them is computed; grad_bias always has its own path (``bias-sum``: one order for every call).

Tests and experiments pick a path through :func:`force` and set how it runs through :func:`tune` (:mod:`.tuning`),
never by patching modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from typing import Callable

import numpy as np

from xconv import ConvParams, settings
from xconv.dtypes import DTYPES

from . import bounds, colgemm, columns, cost, dense, depthwise, native, small, stem
from .tuning import tuned as tune  # noqa: F401  (public: the paths' tuning knobs, tuning.KNOBS)
from .grid import pointwise_planned
from .grid.geometry import compute_dtype, geom

OUTPUTS = ("grad_input", "grad_weight", "grad_bias")


@dataclasses.dataclass(frozen=True)
class Path:
    """One way of computing outputs of a call."""

    name: str
    serves: str                 # which op and outputs it computes, in words
    runs: str                   # the module and function that run it
    blas: str                   # "pinned", "none" or "own" (see the module docstring)
    leases_scratch: bool        # its scratch is counted (leased or checked): it may run under a workspace_limit
    nonfinite: str              # "keeps", "detour" or "self-check"
    note: str                   # the trace note
    bound: Callable = None      # not leased: bytes of scratch at most, for ``p`` (see workspace_limit above)


PATHS = {p.name: p for p in (
    Path("columns", "fprop, dgrad, wgrad: geometries the grid serves badly; non-finite detours",
         "columns.fprop / columns.backward", "own", True, "keeps", "im2col columns (fallback)"),
    Path("depthwise", "fprop, backward (dx, dw and db in one pass): one input channel per group, 1-D/2-D",
         "depthwise.fprop / depthwise.backward (csrc/depthwise_impl.h)", "none", False, "keeps",
         "depthwise C loops", bounds.depthwise),
    Path("dense", "backward (dx, dw): channels per group multiples of 16, AVX-512 and AVX2 builds; fprop (float32): "
         "stride 1 the input gradient of the dual call, larger strides the same loops on x's stride-phase rows",
         "dense.backward / dense.fprop (csrc/direct_conv.c; dense_strided.py)", "none", True, "keeps",
         "C direct loops"),
    Path("small-c", "fprop, backward (dx, dw in one C call): small calls at stride 1, on zero-padded grids",
         "small_c.grid_fprop / small_c.grid_backward (csrc/small_grid.c)", "none", False, "self-check",
         "small-call C grid loops", bounds.small),
    Path("small-cols", "fprop, backward (dx, dw): small calls, any stride: C im2col/col2im around BLAS",
         "small_c.cols_fprop / small_c.cols_backward (csrc/small_cols.c)", "pinned", False, "keeps",
         "small-call C columns", bounds.small),
    Path("small-grid", "fprop, backward (dx, dw): small calls at stride 1 without the compiled loops",
         "small_numpy.grid_fprop / small_numpy.grid_backward", "pinned", False, "detour",
         "small-call NumPy grid columns", bounds.small),
    Path("small-gather", "fprop, backward (dx, dw): small calls, any stride, without the compiled loops",
         "small_numpy.gather_fprop / small_numpy.gather_backward", "pinned", False, "detour",
         "small-call NumPy gathers", bounds.small),
    Path("pointwise", "fprop, backward (dx, dw): 1x1 kernel, stride 1, no padding: per-sample products",
         "grid.pointwise.fprop / grid.pointwise.backward", "pinned", True, "keeps", "pointwise per-sample GEMM"),
    Path("grid-a", "backward (dx, dw): the polyphase grid, dy-columns", "grid.strategy_a.backward", "pinned", True,
         "detour", "blas-grid strategy A (dy-columns)"),
    Path("grid-b", "backward (dx, dw): the polyphase grid, x-columns", "grid.strategy_b.backward", "pinned", True,
         "detour", "blas-grid strategy B (x-columns)"),
    Path("grid-forward", "fprop: the polyphase grid, x-columns", "grid.forward.fprop", "pinned", True, "keeps",
         "blas-grid x-columns"),
    Path("bias-sum", "grad_bias: per sample and channel in float64, samples in order (one order for every call)",
         "bias.bias_sum", "none", True, "keeps", "float64 row sums in sample order"),
    Path("colgemm", "fprop, backward (dx, dw): im2col columns and blocked BLAS products on the workers",
         "colgemm.fprop / colgemm.backward (csrc/small_cols.c)", "pinned", False, "keeps", "colgemm columns",
         bounds.colgemm),
    Path("small-c-blocks", "fprop, backward (dx, dw; dw the blocks' added in block order): the small path's stride-1 "
         "loops in blocks of samples on the workers",
         "grid_blocks.fprop / grid_blocks.backward (csrc/small_grid.c)", "none", False, "self-check",
         "small-call loops in sample blocks", bounds.small),
    Path("stem", "fprop, wgrad (dw): at most 4 input channels, one group (a network's stem): direct loops along rows",
         "stem.fprop / stem.wgrad (csrc/stem.c)", "none", False, "detour", "stem C loops", stem.bound),
)}

#: The mask the rules see: the full call's, whatever the call asks for (see Determinism above).
FULL = (True, True, True)


@dataclasses.dataclass(frozen=True)
class Rule:
    """``path`` serves ``outputs`` of ``op`` when ``when(p, mask)`` holds (``mask``: always :data:`FULL`)."""

    name: str
    op: str                     # "fprop" or "backward"
    outputs: tuple
    path: str
    when: Callable


def _small_size(p, mask):   # dy's columns count as the full call's (dx requested), whatever the mask
    return small.serves(p, True)


#: The small-call paths in the order tried, and when each can run (its rule's words and test, :data:`_CAN`).
_SMALL_VARIANTS = (("small-c", "stride 1, C loops built"), ("small-cols", "C loops built"),
                   ("small-grid", "stride 1"), ("small-gather", "any stride"))
_CAN = {"small-c": lambda p: small.grid_compiled(p), "small-cols": lambda p: small.compiled_available(),
        "small-grid": lambda p: small.unit_stride(p), "small-gather": lambda p: True}


def _small_variant(name, size_rule):
    def when(p, mask):
        return size_rule(p, mask) and _CAN[name](p)
    return when


def _depthwise(p, mask):    # the small path's size test as the full call's
    return depthwise.serves(p) and not small.before_depthwise(p, True)


def single_channel(p, mask=None) -> bool:
    """One input channel in one group (a first layer on mono audio or grey images) that the depthwise loops would take
    by shape, where the stem loops serve: its weight gradient is the stem loops' (its input gradient stays the
    depthwise loops'). Zen 4, two threads, ms, weight gradient, depthwise / stem / the cost model's pick were it
    asked: the speech encoder's 4x1x16000 -> 512 10-tap s5 5.39 / 3.05; 8x1x64x64 -> 32 3x3 0.68 / 0.30 / -;
    16x1x28x28 -> 32 5x5 0.36 / 0.29 / 0.60 (small-c); 64x1x28x28 -> 32 3x3 0.71 / 0.51 / 2.31 (small-c); 8x1x128x128
    -> 16 7x7 s2 1.09 / 0.46."""
    return (p.groups == 1 and p.input_shape[1] == 1 and not p.transposed and _depthwise(p, mask)
            and stem.serves(p))


def _strategy_a(p, mask):   # the costs of the full call (dx and dw): the same strategy for every mask
    geo = geom(p)
    return geo.Cog <= 2 * geo.Cg          # B also pays a col2im of K*Cg per position


_GRADS = ("grad_input", "grad_weight")

#: Where the build has no dense loops (the baseline build), stride-1 backward calls of at least GRID_MACS multiply-adds
#: per output and GRID_POSITIONS output positions per sample run on the grid strategies: the cost model (fitted where the
#: dense loops compete) sends them to colgemm or the small loops, which run them slower there (AVX2 build and
#: OpenBLAS Haswell kernel on a Zen 4, backward ms, grid-a against the model's pick: 8x64x56x56 3x3 34 vs colgemm 53,
#: 8x256x28x28 g8 25 vs 48, dilated 2 at 28x28 29 vs 43, 3-D 2x32x8x28x28 22 vs the small loops' 35, 8x64x16x16 3.5
#: vs 3.7; smaller calls, 8x16x24x24: 2.1 vs the small loops' 1.05, and 1x1s, 8x256x28x28 -> 128: 8.0 vs the
#: pointwise path's 7.1, stay with the model).
GRID_MACS = 1 << 25
GRID_POSITIONS = 256


def _grid_without_dense(p, mask):      # not a stem (stem.serves): its weight gradient is the stem loops' (the AVX2
    #                                     build's 3-D stem at 2x3x8x56x56: 3.1 ms against grid-b's 8.5)
    return (not dense.available() and not p.transposed and all(s == 1 for s in p.stride) and not geom(p).pointwise
            and math.prod(p.output_shape[2:]) >= GRID_POSITIONS and cost.macs(p) >= GRID_MACS and not stem.serves(p))

#: A small call (small.serves) is a candidate for the small loops in sample blocks (float32, C jobs on torch's team)
#: with 2 * cost.CORES samples and BLOCKS_MIN_MACS multiply-adds or more: below, the team's hand-off costs what the second
#: core saves (two threads, a torch call between, us: 64x16x8x8 -> 32 in 4 groups, 4.7M, 323 one call -> 271 in blocks;
#: 32 samples, 2.4M, 234 -> 249, and 177 -> 222 with OMP_WAIT_POLICY=PASSIVE; 2x256x14x14 3x3, 2 samples, 2.36 ms on
#: the dense loops -> 2.55).
BLOCKS_MIN_MACS = 1 << 22

# (cost_pick) colgemm's forward is a candidate in at most ``cost.rates().forward_chunks`` sample chunks where the dense
# loops can take it (else cost.CORES) and at most ``forward_columns`` output positions: measured in cost.Rates.


def cost_pick(p, output: str):
    """The path the cost model (:mod:`.cost`) picks for ``output`` ("y", "dx", "dw") of ``p`` among those that can run
    it, as a table path name (a gradient's ``small-c`` as ``small-c-blocks`` where :func:`_in_blocks` and two or more
    blocks); None where the model does not decide (the rules below it do). A function of the configuration, the build
    and the kind of CPU (``cost.cpu_kind``: ``$XCONV_NUMPY_CPU`` or read from the CPU; never a clock) only (cached
    with the table's choice). A backward output's path is the full call's: dx's and dw's are chosen together
    (``cost.backward_pair``), whatever the mask asks for."""
    if p.transposed or not small.compiled_available() or columns.serves(p) \
            or (depthwise.serves(p) and not small.before_depthwise(p, output != "y")):
        return None     # the rules above it decide; a depthwise-shaped call that they pass on to the small path
                        # (small.before_depthwise) is the model's to pick, as any other
    mine = _candidates(p, output)
    if isinstance(mine, str) or not mine:
        return mine or None                                          # the small path by size, or nothing to weigh
    theirs = None if output == "y" else _candidates(p, "dw" if output == "dx" else "dx")
    if isinstance(theirs, str) or not theirs:
        picked = cost.cheapest(p, output, mine)
    else:
        dx, dw = cost.backward_pair(p, *((mine, theirs) if output == "dx" else (theirs, mine)))   # the full call's
        picked = dx if output == "dx" else dw
    if picked == "small-c" and output != "y" and _in_blocks(p) and cost.grid_block_samples(p) < p.input_shape[0]:
        return "small-c-blocks"          # the same loops in two or more sample blocks: where the model picks the loops
    return picked


def _in_blocks(p) -> bool:
    """Whether the small path's stride-1 loops may run ``p`` in sample blocks (float32: C jobs on the workers, at
    least 2 * cost.CORES samples and BLOCKS_MIN_MACS multiply-adds). The backward takes them only where the model
    picks the small loops for one call: as a candidate of its own, weighed at the loops' rate over the cores, they
    won where the loops lose to colgemm and the dense loops (3000 random configurations, two threads on the Zen 4, the
    changed picks from those paths: up to 4.5x slower on small planes with wide kernels; from the small loops: every
    one faster, 0.24-0.88 of one call's time, geomean 0.60 over 40)."""
    return (small.grid_compiled(p) and math.prod(p.kernel) > 1 and p.dtype == "float32"
            and all(s == 1 for s in p.stride) and p.input_shape[0] >= 2 * cost.CORES
            and cost.macs(p) >= BLOCKS_MIN_MACS)


def _pointwise_forward(p) -> bool:
    """A small 1x1 forward on the pointwise path's kept sgemm table where it builds (no columns): 14-47% less time
    than the small path on each one measured (docs/numpy-backend.md, fourteenth session); the backward keeps it."""
    return geom(p).pointwise and pointwise_planned.builds_forward(p)


def _candidates(p, output: str):
    """The paths that can run ``output`` of ``p`` for the cost model to weigh (a list), or the one path the small
    path's size rule gives it (a name)."""
    need_dx = output == "dx"
    served = small.serves(p, need_dx)                                # the small path by its own size rule
    same = np.dtype(DTYPES[p.dtype]) == compute_dtype(p)             # no wider copies: its grids stay small
    loops = small.grid_compiled(p) and math.prod(p.kernel) > 1     # a 1x1's columns are x: one product beats the loops
    small_path = "small-c" if loops else "small-cols"
    cands = [small_path] if served or (same and loops) else []      # its stride-1 loops at any size
    if served and cost.macs(p) <= cost.SMALL_MACS:                  # per-call work decides at this size
        return "pointwise" if output == "y" and _pointwise_forward(p) else small_path
    if output == "y":
        dense_fwd = dense.serves_fprop(p)
        chunks = len(colgemm.sample_chunks(p, False, False, True))    # 0: colgemm does not fit the contract
        r = cost.rates()
        if 0 < chunks <= (r.forward_chunks if dense_fwd else cost.CORES) \
                and p.input_shape[0] * math.prod(p.output_shape[2:]) <= r.forward_columns:
            cands.append("colgemm")                        # in chunks where the dense loops cannot take the forward
        if all(s == 1 for s in p.stride) and (not served or _in_blocks(p)):
            cands.append("small-c-blocks")         # the small path's loops in sample blocks (float32: as C jobs)
        if geom(p).pointwise:
            cands.append("pointwise")
        if dense_fwd:
            cands.append("dense")                          # the dense loops' input gradient of the dual call
        if not served:
            cands.append("grid-forward")
        if stem.serves(p):
            cands.append("stem")
    else:
        if colgemm.fits(p, True, True):
            cands.append("colgemm")
        if dense.serves(p):
            cands.append("dense")
        if geom(p).pointwise:
            cands.append("pointwise")
        if output == "dw" and stem.serves(p):
            cands.append("stem")
    return cands


def _cost(output: str, name: str):
    def when(p, mask):
        return cost_pick(p, output) == name
    return when

#: The table: per op, rules in the order they are tried; the first that holds (and whose path may run: see
#: the workspace_limit rule) chooses. grad_bias is always "bias-sum".
RULES = (
    Rule("grid serves badly (columns.serves)", "fprop", ("output",), "columns",
         lambda p, m: columns.serves(p)),
    Rule("one input channel per group (depthwise.serves)", "fprop", ("output",), "depthwise",
         lambda p, m: depthwise.serves(p) and not small.before_depthwise(p)),
    *(Rule(f"cost model: {name} cheapest (cost.py)", "fprop", ("output",), name, _cost("y", name))
      for name in ("small-c", "small-cols", "colgemm", "small-c-blocks", "pointwise", "dense", "grid-forward", "stem")),
    *(Rule(f"small, {why} (small.serves)", "fprop", ("output",), name, _small_variant(name, lambda p, m: small.serves(p)))
      for name, why in _SMALL_VARIANTS),
    Rule("otherwise", "fprop", ("output",), "grid-forward", lambda p, m: True),

    Rule("grid serves badly (columns.serves)", "backward", _GRADS, "columns", lambda p, m: columns.serves(p)),
    Rule("one input channel in one group: the stem loops' weight gradient (paths.single_channel)",
         "backward", ("grad_weight",), "stem", single_channel),
    Rule("one input channel per group (depthwise.serves)",
         "backward", _GRADS, "depthwise", _depthwise),
    Rule("no dense loops in this build, stride 1, large planes: A (paths.GRID_MACS)", "backward", _GRADS, "grid-a",
         lambda p, m: _grid_without_dense(p, m) and _strategy_a(p, m)),
    Rule("no dense loops in this build, stride 1, large planes: B (paths.GRID_MACS)", "backward", _GRADS, "grid-b",
         _grid_without_dense),
    *(Rule(f"cost model: {name} cheapest (cost.py)", "backward", (output,), name, _cost(short, name))
      for output, short in (("grad_input", "dx"), ("grad_weight", "dw"))
      for name in ("small-c", "small-cols", "colgemm", "dense", "pointwise") + (("stem",) if short == "dw" else ())),
    *(Rule("cost model: small-c cheapest, in two or more sample blocks (paths.cost_pick)", "backward", (output,),
           "small-c-blocks", _cost(short, "small-c-blocks")) for output, short in (("grad_input", "dx"),
                                                                                 ("grad_weight", "dw"))),
    Rule("dense C loops serve (dense.serves)", "backward", _GRADS, "dense", lambda p, m: dense.serves(p)),
    *(Rule(f"small, {why} (small.serves)", "backward", _GRADS, name, _small_variant(name, _small_size))
      for name, why in _SMALL_VARIANTS),
    Rule("1x1 kernel, stride 1, no padding", "backward", _GRADS, "pointwise", lambda p, m: geom(p).pointwise),
    Rule("cost: A cheaper", "backward", _GRADS, "grid-a", _strategy_a),
    Rule("cost: B cheaper", "backward", _GRADS, "grid-b",
         lambda p, m: True),
)


# ---------------------------------------------------------------------------------------------
# Forcing (tests, experiments)

_forced = threading.local()


def _state():
    return getattr(_forced, "value", ((), ()))


#: Forcing blocks (:func:`force`, :func:`without_cost_model`) open in any thread: while none is, every thread's
#: :func:`_state` is the default, which a lane's runner then knows without reading the thread's state.
_open_blocks = [0]
_blocks_lock = threading.Lock()


@contextlib.contextmanager
def _forcing(state):
    """This thread's forcing state is ``state`` within the block (counted in :data:`_open_blocks`)."""
    before = _state()
    with _blocks_lock:
        _open_blocks[0] += 1
    _forced.value = state
    try:
        yield
    finally:
        _forced.value = before
        with _blocks_lock:
            _open_blocks[0] -= 1


def unforced() -> bool:
    """Whether this thread's forcing state is the default (no :func:`force` block open: cheap where none is open in
    any thread)."""
    return _open_blocks[0] == 0 or _state() == ((), ())


#: What a forced path can compute, ``(p, op)`` (where it is not forced it serves by its rule above; a forced path
#: is also only tried for the ops and outputs its rules name). grad_bias has no choice: "bias-sum" cannot be forced.
_COMPUTES = {
    "columns": lambda p, op: True,
    "depthwise": lambda p, op: depthwise.serves(p),
    "dense": lambda p, op: dense.available() and (dense.computes_fprop(p) if op == "fprop" else dense.computes(p)),
    **{name: (lambda name: lambda p, op: small.computes(p) and _CAN[name](p))(name) for name, _ in _SMALL_VARIANTS},
    "pointwise": lambda p, op: geom(p).pointwise,
    "grid-a": lambda p, op: True,
    "grid-b": lambda p, op: True,
    "grid-forward": lambda p, op: True,
    "colgemm": lambda p, op: small.compiled_available() and colgemm.fits(p, True, True, op == "fprop"),
    "small-c-blocks": lambda p, op: (small.computes(p) and small.grid_compiled(p)
                                     and (op == "fprop" or p.dtype == "float32")),     # backward: float32 C jobs
    "stem": lambda p, op: stem.serves(p),           # backward: grad_weight only (its rules name no other output)
}


@contextlib.contextmanager
def force(*names: str, off=()):
    """Within the block (this thread), the paths ``names`` are chosen first, in that order, wherever they can
    compute the call (the workspace_limit rule still applies; a path that cannot compute the call is passed over,
    and the trace record shows the rule that chose instead), and the paths ``off`` are never chosen. E.g.
    ``force("grid-b")``, ``force("small-paths")``, ``force(off=["small-paths"])`` (the grid, whatever the size);
    :data:`GROUPS` names several paths at once. Nested blocks combine: the inner block's names are tried before
    the outer's, and ``off`` gathers both."""
    if isinstance(off, str):
        off = (off,)
    names = tuple(n for name in names for n in GROUPS.get(name, (name,)))
    off = tuple(n for name in off for n in GROUPS.get(name, (name,)))
    unknown = [n for n in names + off if n not in _COMPUTES]
    if unknown:
        raise ValueError(f"unknown path(s) {unknown}; paths that can be forced: {sorted(_COMPUTES)}; groups: "
                         f"{sorted(GROUPS)} (grad_bias always runs bias-sum)")
    before = _state()
    with _forcing((names + tuple(n for n in before[0] if n not in names),
                   before[1] + tuple(n for n in off if n not in before[1]))):
        yield


#: In the ``off`` list of the forcing state: the cost-model rules are skipped (:func:`without_cost_model`).
COST_MODEL_OFF = "(cost model)"


@contextlib.contextmanager
def without_cost_model():
    """Within the block (this thread), the table without its cost-model rules: the rules below them choose, as
    before the cost model (the bitwise before/after test of the table's refactoring runs so)."""
    names, off = _state()
    with _forcing((names, off + (COST_MODEL_OFF,))):
        yield


#: Names for several paths at once in :func:`force`.
GROUPS = {"small-paths": ("small-c", "small-cols", "small-grid", "small-gather")}


# ---------------------------------------------------------------------------------------------
# Choosing


def choose_all(p: ConvParams, op: str, mask) -> dict:
    """{output: (path, rule name)} for every requested output of the call (``choose`` per output, cached as one)."""
    return _choose_all(p, op, tuple(mask), _state(), _switches())


@functools.lru_cache(maxsize=256)
def _choose_all(p, op, mask, forced, switches) -> dict:
    outputs = ("output",) if op == "fprop" else [o for o, bit in zip(OUTPUTS, mask) if bit]
    return {o: _choose(p, op, o, forced, switches) for o in outputs}


def backward_plan(p: ConvParams, mask) -> tuple:
    """The call's :func:`choose_all` as the runs it makes: a tuple of (path, rule, outputs, dx, dw, db) per path
    (outputs it computes together, in table order; db always False: grad_bias is left to ``bias-sum``), and
    grad_bias's (path, rule), or None when it is not asked."""
    return _backward_plan(p, tuple(mask), _state(), _switches())


@functools.lru_cache(maxsize=256)
def _backward_plan(p, mask, forced, switches) -> tuple:
    chosen = _choose_all(p, "backward", mask, forced, switches)
    runs = {}
    for o in ("grad_input", "grad_weight"):
        if o in chosen:
            runs.setdefault(chosen[o][0].name, []).append(o)
    plan = []
    for name, outs in runs.items():
        path, rule = chosen[outs[0]]
        plan.append((path, rule, tuple(outs), "grad_input" in outs, "grad_weight" in outs, False))
    return tuple(plan), (_choose(p, "backward", "grad_bias", forced, switches) if mask[2] else None)


def choose(p: ConvParams, op: str, output: str, mask=FULL) -> tuple[Path, str]:
    """(path, rule name) computing ``output`` of ``op`` ("fprop", "backward"; "dgrad" and "wgrad" are backward
    calls with one output) for ``p``. The only place a path is picked. ``mask`` (the call's output mask) is
    accepted and not read: an output's path never depends on which other outputs are requested."""
    return _choose(p, op, output, _state(), _switches())


def _switches() -> tuple:
    """What the rules read besides ``p``: the compiled parts' switches and build, the cost model's kind of CPU."""
    on = settings.current()
    return (getattr(on, dense.SWITCH), getattr(on, depthwise.SWITCH), id(native.library()), dense.DENSE_ISAS,
            on.numpy_cpu)


@functools.lru_cache(maxsize=256)
def _choose(p: ConvParams, op: str, output: str, forced, switches) -> tuple[Path, str]:
    with cost.choosing(switches[-1]):          # the kind of CPU the key holds, read once for the whole choice
        return _choose_rule(p, op, output, forced)


def _choose_rule(p: ConvParams, op: str, output: str, forced) -> tuple[Path, str]:
    names, off = forced
    if output == "grad_bias":
        return PATHS["bias-sum"], "always"
    excluded = []

    def may_run(path):
        if path.name in off:
            return False
        if p.workspace_limit is None or path.leases_scratch or path.bound(p) <= p.workspace_limit:
            return True
        excluded.append(path.name)
        return False

    def why(rule):
        return rule if not excluded else \
            f"{rule}; workspace_limit {p.workspace_limit} excludes {', '.join(excluded)} (scratch not leased)"

    for name in names:
        path = PATHS[name]
        if name not in off and may_run(path) and any(r.path == name and r.op == op and output in r.outputs for r in RULES) \
                and _COMPUTES[name](p, op):
            return path, "forced"
    for rule in RULES:
        if rule.op == op and output in rule.outputs:
            if COST_MODEL_OFF in off and rule.name.startswith("cost model"):
                continue
            path = PATHS[rule.path]
            if rule.when(p, FULL) and may_run(path):
                return path, why(rule.name)
    raise AssertionError(f"no rule chose a path for {op} {output}")      # the last rule of each op holds


def table() -> str:
    """The table as text (docs, ``xconv run --explain``)."""
    rows = [f"{r.op:9} {', '.join(r.outputs):24} {r.path:13} {r.name}" for r in RULES]
    rows.append(f"{'backward':9} {'grad_bias':24} {'bias-sum':13} always (one order for every call)")
    return "\n".join(rows)
