"""xconv_numpy.omp_team: with torch in the process, the NumPy backend's workers run on torch's OpenMP threads
(libgomp's GOMP_parallel) instead of a pool of Python threads; the same chunks and the same bits either way."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from core_helpers import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

import xconv  # noqa: E402
from xconv_numpy import omp_team, workers  # noqa: E402

pytestmark = pytest.mark.skipif(omp_team._torch_libgomp_path() is None,
                                reason="this torch build maps no libgomp of its own (nothing to share)")


def _thread_names(n_chunks: int, n_workers: int) -> list:
    names = []
    lock = threading.Lock()

    def task(ws, i, a, b):
        with lock:
            names.append(threading.current_thread().name)
        threading.Event().wait(0.01)            # long enough for every thread of the team to take a chunk

    workers.run([(i, i + 1) for i in range(n_chunks)], task, dict, n_workers)
    return names


def test_workers_run_on_torchs_openmp_threads(monkeypatch):
    """The chunks run on the calling thread and on threads Python did not start (libgomp's); with
    XCONV_NUMPY_OPENMP=0 on the backend's own Python threads."""
    assert omp_team.available()
    names = _thread_names(8, 2)
    assert len(names) == 8
    assert threading.current_thread().name in names
    assert not any(n.startswith("xconv-numpy") for n in names)
    assert any(n.startswith("Dummy") for n in names)          # a foreign (OpenMP) thread ran a chunk
    monkeypatch.setenv("XCONV_NUMPY_OPENMP", "0")
    assert not omp_team.available()
    names = _thread_names(8, 2)
    assert any(n.startswith("xconv-numpy") for n in names) and not any(n.startswith("Dummy") for n in names)


def test_an_exception_in_a_chunk_reaches_the_caller():
    def task(ws, i, a, b):
        if i == 3:
            raise ValueError("chunk 3 failed")

    with pytest.raises(ValueError, match="chunk 3 failed"):
        workers.run([(i, i + 1) for i in range(6)], task, dict, 2)
    assert omp_team.available()                                # the team is still usable afterwards
    assert len(_thread_names(4, 2)) == 4


def test_no_nested_team():
    """A region asked for from inside the team is refused (the caller then uses its Python threads)."""
    inner = []
    assert omp_team.parallel(lambda: inner.append(omp_team.parallel(lambda: None, 2)), 2)
    assert inner and not any(inner)


@pytest.mark.parametrize("case", [
    dict(x=(4, 32, 28, 28), w=(32, 32, 3, 3), kw=dict(padding=1)),                      # dense C loops
    dict(x=(4, 32, 28, 28), w=(32, 1, 3, 3), kw=dict(padding=1, groups=32)),           # depthwise loops
    dict(x=(2, 16, 9, 9, 9), w=(16, 16, 3, 3, 3), kw=dict(padding=1)),                 # 3-D
    dict(x=(8, 64, 14, 14), w=(128, 64, 1, 1), kw={}),                                 # pointwise BLAS
    dict(x=(4, 16, 30, 30), w=(16, 16, 3, 3), kw=dict(stride=3, dilation=2, padding=2)),  # BLAS grid
])
def test_same_bits_on_the_team_and_on_python_threads(case, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case["x"]).astype(np.float32)
    w = rng.standard_normal(case["w"]).astype(np.float32)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, **case["kw"])).astype(np.float32)
    team = xconv.convolution_backward(dy, x, w, backend="numpy", **case["kw"])
    y_team = xconv.conv_fprop(x, w, backend="numpy", **case["kw"])
    monkeypatch.setenv("XCONV_NUMPY_OPENMP", "0")
    threads = xconv.convolution_backward(dy, x, w, backend="numpy", **case["kw"])
    y_threads = xconv.conv_fprop(x, w, backend="numpy", **case["kw"])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(team, threads))
    assert y_team.tobytes() == y_threads.tobytes()


def test_the_switch_is_read_through_settings_so_off_means_off():
    """XCONV_NUMPY_OPENMP takes the settings module's spellings (off/false/no/0), not only "0"."""
    import subprocess
    import sys
    code = "import torch, xconv_numpy.omp_team as o; print(o._library() is None)"
    for value in ("off", "false", "0"):
        env = dict(__import__("os").environ, XCONV_NUMPY_OPENMP=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "True", (value, out.stdout, out.stderr)
