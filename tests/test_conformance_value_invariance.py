"""The conformance kit's mask and layout checks (xconv_conformance/value_invariance.py, issue 24).

A backend that declares ``Capabilities.mask_invariant`` / ``layout_invariant`` has every deterministic case
checked against the same call under the other output masks / input layouts; one that declares neither is
checked run to run only. Two instrumented backends (the oracle, with grad_weight's last bit flipped when the
mask or grad_output's layout says so) show that a broken declaration fails and an undeclared one is not held.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import xconv
import xconv_conformance as xcc
from core_helpers import register  # noqa: F401  (a fixture)
from xconv import Capabilities
from xconv_conformance.cases import load_corpus
from xconv_numpy import NumpyBackend

CASES = {c.id: c for c in load_corpus()}


def _case(mask=(True, True, True)):
    return dataclasses.replace(CASES["kernel/k3-s1-psym"], deterministic=True, mask=mask)


def _flip_last_bit(a):
    a = np.array(a)
    a.reshape(-1).view(np.uint8)[-1] ^= 1
    return a


class Drifting(NumpyBackend):
    """numpy-exact whose grad_weight changes its last bit with the mask (grad_input not requested) or with
    grad_output's layout (not C-contiguous)."""

    def __init__(self, name, on, **caps):
        super().__init__(exact=True)
        self.name, self.on = name, on
        self.capabilities = dataclasses.replace(self.capabilities, **dict(
            dict(mask_invariant=False, layout_invariant=False), **caps))

    def backward(self, dy, x, w, p, mask):
        dx, dw, db = super().backward(dy, x, w, p, mask)
        drift = (not mask[0]) if self.on == "mask" else not dy.flags.c_contiguous
        return dx, (_flip_last_bit(dw) if dw is not None and drift else dw), db


def test_the_numpy_backends_declare_and_keep_both():
    for name in ("numpy", "numpy-exact"):
        caps = xconv.get_backend(name).capabilities
        assert caps.mask_invariant and caps.layout_invariant
        for mask in ((True, True, True), (False, True, True)):
            out = xcc.run_case(_case(mask), name)
            assert out.status == "passed", out.message


def test_a_declared_mask_invariance_that_does_not_hold_fails_by_output_and_mask(register):
    name = register(Drifting("drifts-with-mask", "mask", mask_invariant=True))
    out = xcc.run_case(_case(), name)
    assert out.status == "failed"
    assert "grad_weight: bits differ when the output mask is (False, True, False)" in out.message


def test_a_declared_layout_invariance_that_does_not_hold_fails_by_output_and_layout(register):
    name = register(Drifting("drifts-with-layout", "layout", layout_invariant=True))
    out = xcc.run_case(_case(), name)
    assert out.status == "failed"
    assert "grad_weight: bits differ with channels_last inputs" in out.message


def test_undeclared_properties_are_not_checked(register):
    assert not Capabilities().mask_invariant and not Capabilities().layout_invariant
    for on in ("mask", "layout"):
        name = register(Drifting(f"undeclared-{on}", on))
        out = xcc.run_case(_case(), name)
        assert out.status == "passed", out.message
