"""The ``planted`` backend: the NumPy backend, except for one subtly wrong grad_weight element.

``$XCONV_PLANTED_BUG`` chooses the bug:

- ``family`` (the default): on grouped convolutions (groups > 1) with an even kernel size in some
  dim, the first element of grad_weight is 3% too large. The conformance corpus holds no such case
  (tests/test_fuzz.py checks that), so ``xconv conformance run`` passes it; the fuzzer must find it.
- ``ulp``: on every call, the first element of grad_weight is one unit in the last place off: within
  every error bound, so only exact mode can see it.

What the core hands the backend (``p``, the normalized parameters) decides; 1-D calls arrive as 2-D
with a unit kernel dim, transposed ones as direct primitives, neither of which changes the family.
"""

import os

import numpy as np

import xconv
from xconv_numpy import NumpyBackend


def _wrong(dw, p):
    if dw is None:
        return dw
    bug = os.environ.get("XCONV_PLANTED_BUG", "family")
    if bug == "family" and not (p.groups > 1 and any(k % 2 == 0 for k in p.kernel)):
        return dw
    dw = np.array(dw, copy=True)
    flat = dw.reshape(-1)
    if bug == "family":
        flat[0] = flat[0] * flat.dtype.type(1.03)
    else:
        bits = flat.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[flat.dtype.itemsize])
        bits[0] += 1                          # the next representable value (away from zero)
    return dw


class PlantedBackend(NumpyBackend):
    def __init__(self):
        super().__init__()
        self.name = "planted"
        self.priority = -100                  # never chosen unless named

    def version(self):
        return "planted 0.1.0 (NumPy with a planted bug)"

    def wgrad(self, x, dy, p):
        return _wrong(super().wgrad(x, dy, p), p)

    def backward(self, dy, x, w, p, mask):
        dx, dw, db = super().backward(dy, x, w, p, mask)
        return dx, _wrong(dw, p), db


@xconv.hookimpl
def xconv_backends():
    return [PlantedBackend()]
