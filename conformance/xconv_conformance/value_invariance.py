"""The mask and layout checks of deterministic cases, on backends that declare those properties.

docs/semantics.md ("Determinism"): under ``deterministic=True`` (and ``"batch_invariant"``) each output's
bits are a function of the input values and the call's parameters. A backend declares which parts of
that promise it keeps beyond run to run (``Capabilities.mask_invariant``, ``Capabilities.layout_invariant``);
for a deterministic case the kit then checks:

- mask: each output the case asks for has the bits of the same call asking for that output alone
  and of the call asking for all three;
- layout: every output has the bits of the same call with the inputs in each other memory layout the
  kit makes (contiguous, channels-last, strided).

A backend that declares neither is checked run to run only (the runner's second call).
"""

from __future__ import annotations

import numpy as np

import xconv

from .cases import LAYOUTS, Case

OUTPUTS = ("grad_input", "grad_weight", "grad_bias")


def declared(b) -> tuple[bool, bool]:
    """(mask_invariant, layout_invariant) as the backend declares them (False when it says nothing)."""
    caps = getattr(b, "capabilities", None)
    return bool(getattr(caps, "mask_invariant", False)), bool(getattr(caps, "layout_invariant", False))


def problems(case: Case, backend, b, inputs, outputs, fam, kwargs: dict) -> list[str]:
    """Messages for each output whose bits change with the mask or the inputs' layout (where declared)."""
    if not case.deterministic:
        return []
    mask_inv, layout_inv = declared(b)
    found: list[str] = []
    values = (inputs.grad_output, inputs.input, inputs.weight)

    def call(layout, mask):
        arrays = tuple(fam.make(a, layout) for a in values)
        kw = dict(kwargs, output_mask=mask)
        return [None if r is None else np.ascontiguousarray(fam.to_numpy(r))
                for r in xconv.convolution_backward(*arrays, backend=backend, **kw)]

    if mask_inv:
        masks = [(True, True, True)] + [tuple(j == i for j in range(3)) for i in range(3) if case.mask[i]]
        for mask in masks:
            if mask == tuple(case.mask):
                continue
            got = call(case.layout, mask)
            for i, bit in enumerate(mask):
                if bit and case.mask[i] and outputs[i] is not None and not _same_bits(got[i], outputs[i]):
                    found.append(f"{OUTPUTS[i]}: bits differ when the output mask is {mask} "
                                 f"(mask_invariant declared)")
    if layout_inv:
        for layout in LAYOUTS:
            if layout == case.layout:
                continue
            got = call(layout, tuple(case.mask))
            for i, bit in enumerate(case.mask):
                if bit and outputs[i] is not None and not _same_bits(got[i], outputs[i]):
                    found.append(f"{OUTPUTS[i]}: bits differ with {layout} inputs (layout_invariant declared)")
    return found


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is b
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
