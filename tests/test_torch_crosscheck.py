"""Cross-check against PyTorch CPU: autograd on F.conv*d / conv_transpose*d, and aten.convolution_backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import xconv
from core_helpers import TORCH_MISSING, conv_configs, torch_reference
from xconv.dtypes import DTYPES

torch = pytest.importorskip("torch", reason=TORCH_MISSING)


def _close(got, want, tol):
    scale = np.abs(want).max(initial=0.0) + 1.0
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0, atol=tol * scale)


@settings(max_examples=80, deadline=None)
@given(cfg=conv_configs(), seed=st.integers(0, 2**31 - 1), backend=st.sampled_from(["numpy", "numpy-exact"]))
def test_float64_matches_torch_autograd(cfg, seed, backend):
    rng = np.random.default_rng(seed)
    p = cfg["params"]
    x, w = rng.standard_normal(cfg["input_shape"]), rng.standard_normal(cfg["weight_shape"])
    bias, dy = rng.standard_normal(p.bias_size), rng.standard_normal(cfg["output_shape"])
    ty, tdx, tdw, tdb = torch_reference(cfg, x, w, dy, bias)
    _close(xconv.conv_fprop(x, w, bias=bias, backend=backend, **cfg["kwargs"]), ty, 1e-12)
    dx, dw, db = xconv.convolution_backward(dy, x, w, backend=backend, **cfg["kwargs"])
    _close(dx, tdx, 1e-12)
    _close(dw, tdw, 1e-12)
    _close(db, tdb, 1e-12)


@settings(max_examples=40, deadline=None)
@given(cfg=conv_configs(), seed=st.integers(0, 2**31 - 1),
       mask=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_matches_aten_convolution_backward(cfg, seed, mask):
    p = cfg["params"]
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(cfg["input_shape"]), rng.standard_normal(cfg["weight_shape"])
    dy = rng.standard_normal(cfg["output_shape"])
    if not p.symmetric:
        return  # aten takes symmetric padding only; the autograd test covers asymmetric padding
    want = torch.ops.aten.convolution_backward(
        torch.tensor(dy), torch.tensor(x), torch.tensor(w), [p.bias_size], list(p.stride),
        [pre for pre, _ in p.padding], list(p.dilation), p.transposed, list(p.output_padding), p.groups, list(mask))
    got = xconv.convolution_backward(dy, x, w, bias_sizes=[p.bias_size], output_mask=mask, **cfg["kwargs"])
    for g, t, bit in zip(got, want, mask):
        if bit:
            _close(g, t.numpy(), 1e-12)
        else:
            assert g is None


@settings(max_examples=40, deadline=None)
@given(cfg=conv_configs(dims=(1, 2)), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from(["float16", "bfloat16", "float32"]))
def test_low_precision_matches_torch_within_rounding(cfg, seed, dtype):
    """16/32-bit inputs: compared with torch in float64 on the same (rounded) values."""
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    x = rng.standard_normal(cfg["input_shape"]).astype(dt)
    w = rng.standard_normal(cfg["weight_shape"]).astype(dt)
    dy = rng.standard_normal(cfg["output_shape"]).astype(dt)
    _, tdx, tdw, tdb = torch_reference(cfg, x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
    _, adx, adw, adb = torch_reference(cfg, np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                                       np.abs(dy.astype(np.float64)))
    got = xconv.convolution_backward(dy, x, w, **cfg["kwargs"])
    u_out = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[dtype]
    half_subnormal = {"float16": 2.0**-25, "bfloat16": 2.0**-134, "float32": 2.0**-150}[dtype]  # rounding near 0
    for g, want, absolute in zip(got, (tdx, tdw, tdb), (adx, adw, adb)):
        assert g.dtype == dt
        # accumulation in float32 over at most a few hundred terms, then one rounding to the output dtype
        bound = u_out * np.abs(want) + 2.0**-24 * 1e3 * absolute + half_subnormal
        err = np.abs(g.astype(np.float64) - want)
        assert np.all(err <= bound), (dtype, float((err / bound).max()))
