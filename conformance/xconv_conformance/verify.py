"""A bundle's record of a case held to the case itself, before its numbers are judged.

A bundle comes from another machine and may have been edited. :func:`record_problems` checks
that a record is what running this case can give: the case's dtype and kind, a result for
exactly the outputs its mask asks for (none for an invalid case), each of the case's dtype and
shape, a reason with every refusal, the expected argument named by an invalid case's ShapeError,
and result digests that the stored arrays reproduce (a digest is recomputed from the array, not
trusted). Each problem is one line; any problem makes the case a disagreement.
"""

from __future__ import annotations

from . import status
from .runner import digest
from .tolerance import OUTPUTS


def expected_shapes(case) -> tuple:
    """(grad_input, grad_weight, grad_bias) shapes of a valid case."""
    c_out = case.weight_shape[1] * case.groups if case.transposed else case.weight_shape[0]
    return case.input_shape, case.weight_shape, (c_out,)


def record_problems(case, bundle, rec: dict) -> list[str]:
    """What is wrong with ``rec`` (a case record of ``bundle``) for ``case``; [] when nothing is."""
    problems = []
    state = rec["status"]
    if rec.get("kind", case.kind) != case.kind:
        problems.append(f"records a {rec.get('kind')} case, this case is {case.kind}")
    if rec["dtype"] != case.dtype:
        problems.append(f"records dtype {rec['dtype']}, the case is {case.dtype}")
    if state == status.REFUSED and not (rec.get("message") or "").strip():
        problems.append("records a refusal without a reason")
    if case.kind == "invalid" and state == status.PASSED and case.argument not in (rec.get("message") or ""):
        problems.append(f"records the invalid case as passed without a ShapeError naming {case.argument!r}")
    outputs = rec.get("outputs") or {}
    shapes = expected_shapes(case) if case.kind == "valid" else (None, None, None)
    recorded = rec.get("digests")
    for k, (name, bit, shape) in enumerate(zip(OUTPUTS, case.mask, shapes)):
        entry = outputs.get(name)
        if entry is None:
            if state == status.PASSED and case.kind == "valid" and bit:
                problems.append(f"records the case as passed but holds no {name}")
            continue
        if case.kind != "valid":
            problems.append(f"holds a {name} for an invalid case")
            continue
        if not bit:
            problems.append(f"holds a {name} although its output_mask bit is False")
        if entry["dtype"] != case.dtype:
            problems.append(f"stores {name} as {entry['dtype']}, the case is {case.dtype}")
        if tuple(entry["shape"]) != tuple(shape):
            problems.append(f"stores {name} with shape {tuple(entry['shape'])}, expected {tuple(shape)}")
        want = recorded[k] if isinstance(recorded, list) and len(recorded) == len(OUTPUTS) else None
        got = digest(bundle.output(rec, name))
        if want is None:
            problems.append(f"records no digest for its {name}")
        elif want != got:
            problems.append(f"{name}: recorded digest {want[:8]}… but the stored array gives {got[:8]}…")
    return problems
