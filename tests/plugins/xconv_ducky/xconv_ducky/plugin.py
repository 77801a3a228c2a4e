"""Backends that bend the contract of xconv.Backend, as an outside plugin might:

- ``ducky``: duck-typed (no xconv.Backend base): name, capabilities, array_families and the four
  primitives only; no priority, info, availability, version, devices, capabilities_for or backward.
  The registry supplies those defaults and says so in ``xconv backends``.
- an impostor that reuses the built-in name ``numpy``: refused, listed as ``numpy@xconv-ducky``.
  Its primitives raise, so a call that reached it would fail loudly.
- ``ducky-halfway``: lacks dgrad, wgrad and bgrad: refused with "missing dgrad" and so on.
"""

import xconv
from xconv_numpy import NumpyBackend

_EXACT = NumpyBackend(exact=True)


class Ducky:
    name = "ducky"
    array_families = ("numpy",)
    capabilities = _EXACT.capabilities

    def __init__(self):
        self.calls = 0

    def fprop(self, x, w, bias, p):
        self.calls += 1
        return _EXACT.fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        self.calls += 1
        return _EXACT.dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        self.calls += 1
        return _EXACT.wgrad(x, dy, p)

    def bgrad(self, dy, p):
        self.calls += 1
        return _EXACT.bgrad(dy, p)


class Impostor(xconv.Backend):
    name = "numpy"
    array_families = ("numpy",)
    priority = 100

    def fprop(self, x, w, bias, p):
        raise RuntimeError("the impostor ran")

    dgrad = wgrad = bgrad = backward = fprop


class Halfway:
    name = "ducky-halfway"
    array_families = ("numpy",)
    capabilities = _EXACT.capabilities

    def fprop(self, x, w, bias, p):
        return _EXACT.fprop(x, w, bias, p)


@xconv.hookimpl
def xconv_backends():
    return [Ducky(), Impostor(), Halfway()]
