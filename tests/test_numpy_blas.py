"""BLAS thread control of the NumPy backend (backends/xconv_numpy/blas.py, issue 24).

Every BLAS product of an xconv call runs single-threaded whichever thread makes the call, a BLAS whose thread
count cannot be held is reported and refused under ``deterministic=True``, and a fork resets the pin.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import xconv
from xconv_numpy import blas


def _numpy_openblas():
    blas.control()                                   # looks the libraries up
    libs = [lib for lib in blas._BLAS.libs if lib.is_numpy and lib.name.startswith("OpenBLAS")]
    if not libs or libs[0].threading != "pthreads":
        pytest.skip("NumPy's BLAS here is not a pthreads OpenBLAS (the case the pin is for)")
    return libs[0]


def test_the_pin_holds_on_threads_other_than_the_first_that_used_blas():
    """threadpoolctl's OpenBLAS setter ignores every thread but the first that used it (a pin from a worker
    thread did nothing); blas.py calls OpenBLAS's own setter, so the count inside the pin is 1 on any thread."""
    lib = _numpy_openblas()
    before = lib.count()
    if before == 1:
        lib.set(2)
    try:
        with blas.single_threaded_blas():                # the main thread first
            assert lib.count() == 1
        seen = []

        def other():
            with blas.single_threaded_blas():
                seen.append(lib.count())
            seen.append(lib.count())

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen == [1, max(before, 2)]                # pinned inside, restored after
    finally:
        lib.set(before)


class _OpenMPBlas:
    name, is_numpy, threading = "OpenBLAS (fake OpenMP build)", True, "openmp"

    def __init__(self, n):
        self.n = n

    def get(self):
        return self.n

    def set(self, n):                                    # pragma: no cover - never called for an OpenMP build
        raise AssertionError("an OpenMP build's count cannot be pinned process-wide")

    def count(self):
        return self.n


def test_an_uncontrollable_blas_refuses_determinism_by_name(monkeypatch):
    """An OpenMP-built BLAS takes each calling thread's OpenMP count: with more than one thread the promise cannot
    be kept, so deterministic=True is refused before any work (deterministic=False still runs)."""
    monkeypatch.setattr(blas._BLAS, "libs", [_OpenMPBlas(4)])
    assert "uncontrolled" in blas.control() and not blas.pinned()
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    with pytest.raises(xconv.UnsupportedError, match="OMP_NUM_THREADS=1"):
        xconv.conv_fprop(x, w, backend="numpy", deterministic=True)
    with pytest.raises(xconv.UnsupportedError, match="BLAS at one thread"):
        xconv.conv_fprop(x, w, backend="numpy-exact", deterministic="batch_invariant")
    assert xconv.conv_fprop(x, w, backend="numpy").shape == (1, 3, 3, 3)
    monkeypatch.setattr(blas._BLAS, "libs", [_OpenMPBlas(1)])          # OMP_NUM_THREADS=1: one thread, kept
    assert blas.pinned()
    xconv.conv_fprop(x, w, backend="numpy", deterministic=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_fork_while_another_thread_holds_the_pin_gives_the_child_no_pin():
    lib = _numpy_openblas()
    before = lib.count()
    if before == 1:
        lib.set(2)
    try:
        with blas.single_threaded_blas():                # as if another thread's call were running
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                ok = blas._BLAS.depth == 0 and lib.count() == max(before, 2) and blas._BLAS.lock.acquire(timeout=5)
                os.write(w, b"1" if ok else b"0")
                os._exit(0)
            os.close(w)
            got = os.read(r, 1)
            os.waitpid(pid, 0)
        assert got == b"1"
    finally:
        lib.set(before)
