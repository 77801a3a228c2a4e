"""Semantics the reference defines: empty tensors, dtypes, layouts, masks, determinism."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, registered
from xconv.dtypes import DTYPES


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("x_shape, c_out", [((0, 4, 5, 5), 6), ((2, 0, 5, 5), 6), ((2, 4, 5, 5), 0)])
def test_empty_tensors_give_zero_gradients(x_shape, c_out, transposed):
    c_in = x_shape[1]
    w_shape = (c_in, c_out, 3, 3) if transposed else (c_out, c_in, 3, 3)
    out = xconv.output_shape(x_shape, w_shape, padding=1, transposed=transposed)
    rng = np.random.default_rng(0)
    x, w, dy = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(out)
    dx, dw, db = xconv.convolution_backward(dy, x, w, padding=1, transposed=transposed)
    assert dx.shape == x_shape and dw.shape == w_shape and db.shape == (c_out,)
    assert not dx.any() and not dw.any()
    np.testing.assert_array_equal(db, dy.sum(axis=(0, 2, 3)))  # C_in = 0 still has a bias gradient
    bias = rng.standard_normal(c_out)
    y = xconv.conv_fprop(x, w, bias=bias, padding=1, transposed=transposed)
    np.testing.assert_array_equal(y, np.broadcast_to(bias[:, None, None], out))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_outputs_have_input_dtype_and_are_c_contiguous(dtype):
    dt = DTYPES[dtype]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 6, 5)).astype(dt).transpose(0, 1, 3, 2)  # non-contiguous view
    w = rng.standard_normal((4, 4, 2, 3)).astype(dt)[:, :, ::-1]  # negative strides
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, groups=2)).astype(dt)
    for r in (*xconv.convolution_backward(dy, x, w, groups=2), xconv.conv_fprop(x, w, groups=2)):
        assert r.dtype == dt and r.flags.c_contiguous
    want = xconv.convolution_backward(dy, np.ascontiguousarray(x), np.ascontiguousarray(w), groups=2)
    for g, t in zip(xconv.convolution_backward(dy, x, w, groups=2), want):
        np.testing.assert_array_equal(g, t)


def test_16bit_inputs_accumulate_in_float32():
    """A 4096-term reduction of bfloat16 values: float32 accumulation keeps it to one final bf16 rounding."""
    rng = np.random.default_rng(2)
    bf16 = DTYPES["bfloat16"]
    x = rng.uniform(0.5, 1.5, (1, 4096, 1)).astype(bf16)
    w = rng.uniform(0.5, 1.5, (1, 4096, 1)).astype(bf16)
    y = xconv.conv_fprop(x, w)
    exact = float(np.sum(x.astype(np.float64) * w.astype(np.float64)))
    assert abs(float(y.astype(np.float64)[0, 0, 0]) - exact) <= 2.0**-8 * exact + 2.0**-20 * exact


def test_masked_gradients_are_none_and_not_computed():
    spy = SpyBackend()
    with registered(spy):
        x, w = np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3))
        dy = np.ones((1, 3, 3, 3))
        for mask in [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]:
            spy.calls.clear()
            mask = tuple(bool(m) for m in mask)
            got = xconv.convolution_backward(dy, x, w, output_mask=mask, backend="spy")
            assert [g is not None for g in got] == list(mask)
            ran = {c[0] for c in spy.calls}
            assert ran == {name for name, bit in zip(("dgrad", "wgrad", "bgrad"), mask) if bit}


def test_numpy_bool_mask_accepted():
    x, w = np.ones((1, 2, 5)), np.ones((3, 2, 3))
    got = xconv.convolution_backward(np.ones((1, 3, 3)), x, w, output_mask=np.array([True, False, True]).tolist())
    assert got[1] is None


_DETERMINISM_SCRIPT = textwrap.dedent("""
    import hashlib, numpy as np, xconv
    rng = np.random.default_rng(7)
    h = hashlib.sha256()
    for backend in ("numpy", "numpy-exact"):
        for xs, ws, kw in [((2, 64, 30, 30), (64, 64, 3, 3), dict(padding=1)),
                           ((1, 1, 100000), (1, 1, 1), {}),
                           ((3, 32, 20, 20), (32, 1, 3, 3), dict(groups=32, stride=2)),
                           ((64, 512, 4, 4), (1, 512, 1, 1), {}),
                           ((2, 16, 9, 9), (16, 8, 3, 3), dict(transposed=True, stride=2, groups=2))]:
            for dt in (np.float32, np.float64):
                x, w = rng.standard_normal(xs).astype(dt), rng.standard_normal(ws).astype(dt)
                dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw)).astype(dt)
                for r in xconv.convolution_backward(dy, x, w, deterministic=True, backend=backend, **kw):
                    h.update(r.tobytes())
    print(h.hexdigest())
""")


def _run_in_subprocess(threads: str) -> str:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    out = subprocess.run([sys.executable, "-c", _DETERMINISM_SCRIPT], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_deterministic_across_calls_processes_and_blas_thread_counts():
    hashes = {threads: _run_in_subprocess(threads) for threads in ("1", "2", "4")}
    assert len(set(hashes.values())) == 1, hashes
    ns = {}
    exec(compile(_DETERMINISM_SCRIPT.replace("print(h.hexdigest())", "result = h.hexdigest()"), "s", "exec"), ns)
    assert ns["result"] == hashes["1"]


def test_selection_by_array_family_and_environment(monkeypatch):
    x, w = np.ones((1, 1, 3)), np.ones((1, 1, 1))
    spy = SpyBackend("envspy")
    with registered(spy):
        monkeypatch.setenv("XCONV_BACKEND", "envspy")
        xconv.conv_fprop(x, w)
        assert len(spy.calls) == 1
        monkeypatch.delenv("XCONV_BACKEND")
        xconv.conv_fprop(x, w)  # numpy arrays pick "numpy"
        assert len(spy.calls) == 1
        xconv.conv_fprop(x, w, backend=spy)  # a backend object is accepted too
        assert len(spy.calls) == 2


def test_unavailable_backend_raises_with_reason():
    class Missing(SpyBackend):
        def availability(self):
            return False, "libfoo.so not found in /opt/foo"

    with registered(Missing("missing")):
        with pytest.raises(xconv.BackendUnavailableError) as info:
            xconv.conv_fprop(np.ones((1, 1, 3)), np.ones((1, 1, 1)), backend="missing")
        assert info.value.reason == "libfoo.so not found in /opt/foo" and "missing" in str(info.value)
        row = {r.name: r for r in xconv.list_backends()}["missing"]
        assert (row.available, row.reason, row.devices) == (False, "libfoo.so not found in /opt/foo", ())


def test_backend_refuses_foreign_array_family():
    class CupyOnly(SpyBackend):
        array_families = ("cupy",)

    with registered(CupyOnly("cupyonly")):
        with pytest.raises(xconv.ShapeError, match="'cupyonly' does not take numpy arrays"):
            xconv.conv_fprop(np.ones((1, 1, 3)), np.ones((1, 1, 1)), backend="cupyonly")


def test_unknown_backend_names_registered_ones():
    with pytest.raises(xconv.UnknownBackendError, match="no backend named 'does-not-exist' is registered "
                                                       r"\(registered: .*numpy") as info:
        xconv.get_backend("does-not-exist")
    assert isinstance(info.value, KeyError) and "numpy" in info.value.registered
    with pytest.raises(KeyError):
        xconv.conv_fprop(np.ones((1, 1, 3)), np.ones((1, 1, 1)), backend="does-not-exist")


def test_numpy_result_is_repeatable_bitwise():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 16, 12, 12)).astype(np.float32), rng.standard_normal((8, 16, 3, 3)).astype(
        np.float32)
    dy = rng.standard_normal((4, 8, 10, 10)).astype(np.float32)
    first = [hashlib.sha256(r.tobytes()).hexdigest() for r in xconv.convolution_backward(dy, x, w)]
    for _ in range(3):
        assert [hashlib.sha256(r.tobytes()).hexdigest() for r in xconv.convolution_backward(dy, x, w)] == first
