"""Pinning BLAS to one thread, so that results do not depend on the BLAS thread count.

OpenBLAS (and MKL) partition some matrix products differently with different thread counts,
which changes the summation order and so the rounding. The reference computes with one BLAS
thread; the pin is reference-counted, so concurrent Python threads share it safely.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_depth = 0
_limiter = None
_controller = None


@contextlib.contextmanager
def single_threaded_blas():
    """Run the body with every loaded BLAS library limited to one thread; restore on exit."""
    global _depth, _limiter, _controller
    with _lock:
        if _depth == 0:
            if _controller is None:
                from threadpoolctl import ThreadpoolController
                _controller = ThreadpoolController()
            _limiter = _controller.limit(limits=1, user_api="blas")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _limiter.restore_original_limits()
                _limiter = None
