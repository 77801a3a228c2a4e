"""The Ascend backend's trace records, determinism levels and workspace budget, on the CANN emulator."""

import numpy as np
import pytest

import xconv
from test_ascend import KIND_EXECUTOR, env, lib_dir, module_env  # noqa: F401 - the emulator fixtures


def _data(dtype=np.float16):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 6)).astype(dtype)
    w = rng.standard_normal((8, 4, 3, 3)).astype(dtype)
    dy = rng.standard_normal((2, 8, 6, 6)).astype(dtype)
    return x, w, dy


def test_record_names_the_aclnn_op_and_cube_math(env):
    x, w, dy = _data()
    env.fc.set_workspace_size(512)
    with xconv.trace() as t:
        xconv.convolution_backward(dy, x, w, padding=1, backend="ascend", deterministic=True, math="allow_tf32")
        xconv.conv_fprop(x, w, padding=1, backend="ascend")
    bwd, fwd = t.records
    assert bwd.path == "aclnnConvolutionBackward cubeMathType=0 (KEEP_DTYPE) outputMask=111"
    assert bwd.math == "keep_dtype"                        # float16 runs KEEP_DTYPE whatever was asked
    assert bwd.deterministic == "run_to_run" and fwd.deterministic == "none"
    assert bwd.workspace_bytes == 512 == fwd.workspace_bytes
    assert fwd.path == "aclnnConvolution cubeMathType=0 (KEEP_DTYPE)" and fwd.plan_cache is None


def test_workspace_above_limit_refused_and_executor_released(env):
    x, w, dy = _data()
    env.fc.set_workspace_size(4096)
    with pytest.raises(xconv.UnsupportedError, match="needs 4096 bytes of aclnnConvolutionBackward workspace"):
        xconv.convolution_backward(dy, x, w, padding=1, backend="ascend", workspace_limit=1024)
    assert env.fc.prepare_count() == 1 and env.fc.call_count() == 0       # phase 1 only: nothing ran
    assert env.fc.live_count(KIND_EXECUTOR) == 0
    got = xconv.convolution_backward(dy, x, w, padding=1, backend="ascend", workspace_limit=4096)
    assert got[0].shape == x.shape


def test_batch_invariant_refused_before_device_work(env):
    x, w, dy = _data()
    with pytest.raises(xconv.UnsupportedError, match="batch-invariant"):
        xconv.convolution_backward(dy, x, w, padding=1, backend="ascend", deterministic="batch_invariant")
    assert env.fc.prepare_count() == 0 and env.fc.call_count() == 0
