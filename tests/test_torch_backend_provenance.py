"""The torch-device backends' trace records and their answers to batch_invariant and workspace_limit."""

import numpy as np
import pytest

import xconv

pytest.importorskip("xconv_torch", reason="the xconv-torch distribution (backends/xconv_torch) is not installed")


def test_record_and_refusals():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    with xconv.trace() as t:
        xconv.conv_fprop(x, w, padding=[(0, 1), (1, 1)], backend="torch-cpu", math="allow_tf32")
        xconv.convolution_backward(dy, x, w, backend="torch-cpu", deterministic=True)
    fwd, bwd = t.records
    assert fwd.path == "torch aten.convolution on cpu" and fwd.math == "allow_tf32" and fwd.deterministic == "none"
    assert fwd.legalized == [xconv.legalize.EXPLICIT_PADDING]
    assert bwd.path == "torch aten.convolution_backward on cpu" and bwd.deterministic == "run_to_run"
    with pytest.raises(xconv.UnsupportedError, match="batch-invariant"):
        xconv.conv_fprop(x, w, backend="torch-cpu", deterministic="batch_invariant")
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit=4096"):
        xconv.conv_fprop(x, w, backend="torch-cpu", workspace_limit=4096)
