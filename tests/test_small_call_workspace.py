"""The one-C-call small path reports the scratch it malloc'd (an out-parameter of the C call) in the trace record,
for the forward and the backward; the results are the bits they were before."""

import math

import numpy as np
import pytest

import xconv
from xconv_numpy import small


@pytest.mark.skipif(not small.compiled_available(), reason="the compiled loops are not built here")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_small_c_path_reports_its_scratch_bytes(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 5)).astype(dtype)
    w = rng.standard_normal((4, 3, 3, 3)).astype(dtype)
    dy = rng.standard_normal(xconv.output_shape(x.shape, w.shape, padding=1)).astype(dtype)
    with xconv.trace() as t:
        y = xconv.conv_fprop(x, w, padding=1, backend="numpy")
        grads = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy")
    fwd, bwd = t.records
    assert fwd.path.startswith("small-c:") and bwd.path.startswith("small-c:"), (fwd.path, bwd.path)
    item = np.dtype(dtype).itemsize
    grid = 3 * 3 * 8 * 7 * item                       # at least one zero-padded grid of x: (N+1) * padded positions
    assert isinstance(fwd.workspace_bytes, int) and fwd.workspace_bytes >= grid
    assert isinstance(bwd.workspace_bytes, int) and bwd.workspace_bytes >= grid + 3 * 4 * 9 * item   # + flipped w
    # what they computed: the exact path's values (the reporting changes no bit, see the digest test)
    exact = xconv.convolution_backward(dy, x, w, padding=1, backend="numpy-exact")
    np.testing.assert_allclose(y, xconv.conv_fprop(x, w, padding=1, backend="numpy-exact"), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, exact):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(np.sum(grads[0])))


def test_every_numpy_path_that_ran_reports_its_scratch_bytes():
    """The whole valid corpus on the NumPy backend (backward and forward): every call the backend ran has an int
    workspace_bytes in its trace record (the calls the core answers alone, empty or all-masked, run no path)."""
    from xconv_conformance.cases import load_corpus, make_inputs
    from xconv_conformance.runner import call_kwargs

    missing = []
    for case in (c for c in load_corpus() if c.kind == "valid"):
        inputs = make_inputs(case)
        with xconv.trace() as t:
            xconv.convolution_backward(inputs.grad_output, inputs.input, inputs.weight, backend="numpy",
                                       **call_kwargs(case))
            xconv.conv_fprop(inputs.input, inputs.weight, backend="numpy", **case.conv_kwargs())
        missing += [(case.id, r.op, r.path) for r in t.records if r.path is not None and r.workspace_bytes is None]
    assert not missing, missing[:10]
