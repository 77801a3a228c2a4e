"""``xconv conformance fuzz``: a search for disagreements beyond the fixed corpus, shrunk to minimal cases.

Hypothesis is the engine. :func:`configurations` draws valid cases within what the backend
declares (its ranks, dtypes, math modes, determinism; the core legalizes the rest, as it does for
any caller): 1-D to 3-D, strides, dilations, groups and depthwise, transposed with output_padding,
symmetric, asymmetric and string padding, output masks, memory layouts, batch 0 to 3, and, with
``exact=True``, integer fills (:mod:`.exact`). Each case runs on the backend in this process through
the kit's own judge (:func:`.runner.run_case`: the reference's error bound, or bitwise agreement in
exact mode, and a second call's bits where determinism is claimed). A case the backend refuses
by name (UnsupportedError) is not a finding; one that fails (outside the bound, not bitwise in
exact mode, a wrong shape or dtype, an exception other than a refusal) is.

On a failure Hypothesis shrinks: fewer dimensions, then smaller sizes, channel counts, strides and
dilations (each drawn so that its simplest value comes first), while the case still fails. The
minimal failing case is printed as one JSON line in the format of ``xconv conformance cases
--json``; ``xconv conformance run --backend NAME --cases-from FILE`` replays it.

Time: generation stops at ``seconds``; shrinking a found failure may take up to ``shrink_seconds``
more (the smallest failing case found by then is reported). Seeds make runs reproducible (up to
the timing of the time limit: a longer run draws more cases), and shard the search across machines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time

from xconv.errors import ShapeError

from .cases import LAYOUTS, CorpusError, _make_case
from .runner import FAILING, resolve, run_case

_DTYPE_ORDER = ("float32", "float64", "float16", "bfloat16")      # the simplest first: shrinking goes there
_MATH_ORDER = ("keep_dtype", "allow_tf32", "allow_fp16")
_MASKS = ("111", "100", "010", "001", "110", "101", "011")
_STRINGS = ("valid", "same", "same_lower", "full")


class _TimeUp(BaseException):
    """Raised inside the property when the time is up: Hypothesis lets a BaseException through at once."""


class Disagreement(AssertionError):
    def __init__(self, case, outcome):
        super().__init__(f"{case.id}: {outcome.status}: {outcome.message[:500]}")
        self.case, self.outcome = case, outcome


@dataclasses.dataclass
class Finding:
    case: object
    status: str
    message: str

    def line(self) -> str:
        return json.dumps(self.case.spec(), sort_keys=True)


@dataclasses.dataclass
class FuzzResult:
    findings: list
    examples: int
    seconds: float
    refused: int


def ranks(caps) -> list[int]:
    """The ranks a backend runs, natively or as the core legalizes them (1-D as 2-D)."""
    dims = set(caps.spatial_dims)
    if 2 in dims:
        dims.add(1)
    return sorted(dims)


def configurations(caps, exact: bool = False):
    """A Hypothesis strategy of valid Cases within capabilities ``caps``."""
    from hypothesis import assume, strategies as st

    dtypes = [d for d in _DTYPE_ORDER if d in caps.dtypes]
    maths = [m for m in _MATH_ORDER if m in caps.math]
    determinism = [False] + ([True] if caps.deterministic else []) + (
        ["batch_invariant"] if getattr(caps, "batch_invariant", False) else [])

    @st.composite
    def draw_case(draw):
        # every draw happens whatever the earlier ones were (three dims' worth, the last `nd` kept; every
        # padding form, one chosen), so that shrinking one choice never shifts the others
        nd = draw(st.sampled_from(ranks(caps)))
        transposed = draw(st.booleans())
        groups = draw(st.integers(1, 3))
        depthwise = draw(st.booleans()) and groups > 1
        c_in_per_group, c_out_per_group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        c_in = groups * (1 if depthwise else c_in_per_group)
        c_out = groups * c_out_per_group
        three = lambda low, high: [draw(st.integers(low, high)) for _ in range(3)][3 - nd:]  # noqa: E731
        kernel, stride, dilation = three(1, 4), three(1, 3), three(1, 3)
        spatial = three(1, 9 if nd < 3 else 5)
        pairs = [[draw(st.integers(0, 3)), draw(st.integers(0, 3))] for _ in range(3)][3 - nd:]
        number, string = draw(st.integers(0, 2)), draw(st.sampled_from(_STRINGS))
        kind = draw(st.sampled_from(("int", "pairs", "string")))
        padding = {"int": number, "pairs": pairs, "string": string}[kind]
        output_padding = [min(op, max(s, d) - 1) if transposed else 0
                          for op, s, d in zip(three(0, 2), stride, dilation)]
        n = draw(st.integers(1, 3))
        empty = draw(st.integers(0, 9)) == 9                  # one case in ten with an empty batch
        raw = dict(n=0 if empty else n, c_in=c_in, c_out=c_out, dims=nd,
                   spatial=spatial, kernel=kernel, stride=stride, padding=padding, dilation=dilation, groups=groups,
                   transposed=transposed, output_padding=output_padding, dtype=draw(st.sampled_from(dtypes)),
                   math=draw(st.sampled_from(maths)), mask=draw(st.sampled_from(_MASKS)),
                   layout=draw(st.sampled_from(LAYOUTS)), deterministic=draw(st.sampled_from(determinism)),
                   bias_sizes=draw(st.booleans()))
        if exact:
            raw["fill"] = "exact"
        case = _build(raw)
        assume(case is not None)
        return case

    return draw_case()


def _build(raw: dict):
    """The Case of ``raw`` with an id from its content ("fuzz/<12 hex>"), or None when it is invalid."""
    text = json.dumps(raw, sort_keys=True)
    case_id = "fuzz/" + hashlib.sha256(text.encode()).hexdigest()[:12]
    try:
        return _make_case(case_id, "fuzz", raw)
    except (CorpusError, ShapeError):
        return None


def fuzz(backend: str, seconds: float = 30.0, seed: int = 0, exact: bool = False, shrink_seconds: float | None = None,
         on_example=None) -> FuzzResult:
    """Search for cases that fail on ``backend`` for ``seconds``; shrink what is found (see the module docstring)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    b = resolve(backend)
    caps = b.capabilities
    start = time.monotonic()
    stop_generating = start + seconds
    stop_shrinking = stop_generating + (max(seconds, 30.0) if shrink_seconds is None else shrink_seconds)
    failing: list = []            # the failing cases in the order found: the last is the smallest so far
    counts = {"examples": 0, "refused": 0}

    @hypothesis_seed(seed)
    @settings(max_examples=10**9, deadline=None, database=None, derandomize=False, report_multiple_bugs=False,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck), print_blob=False)
    @given(configurations(caps, exact))
    def prop(case):
        now = time.monotonic()
        if now > (stop_shrinking if failing else stop_generating):
            raise _TimeUp()
        counts["examples"] += 1
        out = run_case(case, b, repeat_deterministic=True)
        counts["refused"] += out.status == "refused"
        if on_example is not None:
            on_example(case, out)
        if out.status in FAILING:
            failing.append(Finding(case, out.status, out.message))
            raise Disagreement(case, out)

    try:
        prop()
    except _TimeUp:
        pass
    except Exception:             # noqa: BLE001 - Disagreement (or Hypothesis's Flaky): the last one recorded
        if not failing:           # is the minimal failing example Hypothesis re-ran
            raise
    findings = [failing[-1]] if failing else []
    return FuzzResult(findings, counts["examples"], time.monotonic() - start, counts["refused"])
