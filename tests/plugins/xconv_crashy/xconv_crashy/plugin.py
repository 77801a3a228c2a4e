"""The ``crashy`` backend: the NumPy float64 backend, except on the configurations below.

What it does, by what the core hands it (``p``: the normalized parameters):

- every call: prints to stdout (Python ``print`` and a raw ``write(1, ...)``) and to stderr,
  as a chatty vendor library does: none of it may disturb the kit;
- 3-D float16: dereferences NULL (SIGSEGV); 3-D float64: ``abort()`` (SIGABRT);
- 3-D bfloat16: hangs (sleeps for an hour);
- only in the fresh process of the determinism check (``$XCONV_CONFORMANCE_ROLE`` is "digest"):
  2-D float16 dereferences NULL, 2-D bfloat16 hangs.

Everything else gives the reference's answers.
"""

import ctypes
import os
import sys
import time

import xconv
from xconv_numpy import NumpyBackend


def _misbehave(p) -> None:
    print(f"crashy: chatty stdout from a {p.nd}-D {p.dtype} call")
    os.write(1, b"crashy: raw bytes on fd 1 \x00\xff\n")
    print(f"crashy: stderr line of a {p.nd}-D {p.dtype} call", file=sys.stderr, flush=True)
    fresh = os.environ.get("XCONV_CONFORMANCE_ROLE") == "digest"
    what = {(3, "float16"): "segfault", (3, "float64"): "abort", (3, "bfloat16"): "hang"}.get((p.nd, p.dtype))
    if fresh:
        what = what or {(2, "float16"): "segfault", (2, "bfloat16"): "hang"}.get((p.nd, p.dtype))
    if what:
        print(f"crashy: about to {what}", file=sys.stderr, flush=True)
    if what == "segfault":
        ctypes.string_at(0)
    elif what == "abort":
        os.abort()
    elif what == "hang":
        time.sleep(3600)


class CrashyBackend(NumpyBackend):
    def __init__(self):
        super().__init__(exact=True)
        self.name = "crashy"
        self.priority = -100            # never chosen by array family

    def version(self):
        return "crashy 0.1 (a test fixture)"

    def fprop(self, x, w, bias, p):
        _misbehave(p)
        return super().fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        _misbehave(p)
        return super().dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        _misbehave(p)
        return super().wgrad(x, dy, p)

    def backward(self, dy, x, w, p, mask):
        _misbehave(p)
        return super().backward(dy, x, w, p, mask)


@xconv.hookimpl
def xconv_backends():
    return [CrashyBackend()]
