"""Every invalid argument raises ShapeError naming the argument, the dim and expected vs given, before backend work."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, registered

Z = np.zeros


def backward(dy, x, w, **kw):
    return xconv.convolution_backward(dy, x, w, backend="spy", **kw)


x4 = Z((2, 4, 8, 8), np.float32)
w4 = Z((6, 4, 3, 3), np.float32)
dy4 = Z((2, 6, 6, 6), np.float32)

# (id, call, argument named, fragments that must appear in the message)
CASES = [
    ("input-rank", lambda: backward(dy4, Z((2, 4, 8, 8, 8, 8), np.float32), w4), "input",
     ["rank must be 3, 4 or 5", "expected 3, 4 or 5, given 6"]),
    ("weight-rank-mismatch", lambda: backward(dy4, x4, Z((6, 4, 3), np.float32)), "weight",
     ["rank must equal input's rank", "expected 4, given 3"]),
    ("grad-output-rank", lambda: backward(Z((2, 6, 6), np.float32), x4, w4), "grad_output",
     ["rank must equal input's rank", "expected 4, given 3"]),
    ("padded-too-small", lambda: backward(Z((2, 6, 1, 1), np.float32), Z((2, 4, 2, 8), np.float32),
                                          Z((6, 4, 5, 3), np.float32)), "input",
     ["dim 2 (H)", "padded size is smaller than the dilated kernel", ">= dilation*(k-1)+1 = 5", "given 2 + 0 + 0 = 2"]),
    ("dilated-too-large", lambda: backward(dy4, x4, w4, dilation=(4, 1)), "input",
     ["dim 2 (H)", "= 9", "given 8 + 0 + 0 = 8"]),
    ("stride-zero", lambda: backward(dy4, x4, w4, stride=(1, 0)), "stride",
     ["spatial dim 1 (W)", "expected >= 1, given 0"]),
    ("stride-type", lambda: backward(dy4, x4, w4, stride=1.5), "stride", ["expected int or 2 ints, given 1.5"]),
    ("stride-length", lambda: backward(dy4, x4, w4, stride=(1, 1, 1)), "stride", ["expected 2 ints, given (1, 1, 1)"]),
    ("dilation-zero", lambda: backward(dy4, x4, w4, dilation=0), "dilation",
     ["spatial dim 0 (H)", "expected >= 1, given 0"]),
    ("padding-negative", lambda: backward(dy4, x4, w4, padding=(0, -1)), "padding",
     ["spatial dim 1 (W)", "expected >= 0, given (-1, -1)"]),
    ("padding-pair-negative", lambda: backward(dy4, x4, w4, padding=((0, 0), (1, -2))), "padding",
     ["spatial dim 1 (W)", "given (1, -2)"]),
    ("padding-string", lambda: backward(dy4, x4, w4, padding="reflect"), "padding",
     ["unknown padding string", "given 'reflect'"]),
    ("padding-form", lambda: backward(dy4, x4, w4, padding=(1, 1, 1, 1)), "padding",
     ["unrecognized padding", "given (1, 1, 1, 1)"]),
    ("same-transposed", lambda: backward(Z((2, 4, 10, 10), np.float32), Z((2, 6, 8, 8), np.float32),
                                         Z((6, 4, 3, 3), np.float32), transposed=True, padding="same"), "padding",
     ["direct convolution only"]),
    ("groups-zero", lambda: backward(dy4, x4, w4, groups=0), "groups", ["expected >= 1, given 0"]),
    ("groups-not-dividing-input", lambda: backward(Z((2, 6, 6, 6), np.float32), x4, Z((6, 1, 3, 3), np.float32),
                                                   groups=3), "groups",
     ["must divide input's channel count", "expected a divisor of 4, given 3"]),
    ("groups-not-dividing-output", lambda: backward(Z((2, 5, 6, 6), np.float32), x4, Z((5, 2, 3, 3), np.float32),
                                                    groups=2), "groups",
     ["must divide weight's dim 0", "expected a divisor of 5, given 2"]),
    ("weight-channels", lambda: backward(dy4, x4, Z((6, 3, 3, 3), np.float32)), "weight",
     ["dim 1 must be C_in / groups", "expected 4, given 3"]),
    ("weight-channels-groups", lambda: backward(dy4, x4, Z((6, 4, 3, 3), np.float32), groups=2), "weight",
     ["dim 1 must be C_in / groups", "expected 2, given 4"]),
    ("transposed-weight-channels", lambda: backward(Z((2, 6, 10, 10), np.float32), x4, Z((3, 6, 3, 3), np.float32),
                                                    transposed=True), "weight",
     ["dim 0 must equal input's channels", "expected 4, given 3"]),
    ("output-padding-too-large", lambda: backward(Z((2, 6, 18, 18), np.float32), x4, Z((4, 6, 3, 3), np.float32),
                                                  transposed=True, stride=2, output_padding=2), "output_padding",
     ["smaller than stride or dilation", "spatial dim 0 (H)", "expected < 2, given 2"]),
    ("output-padding-direct", lambda: backward(dy4, x4, w4, output_padding=1), "output_padding",
     ["must be 0 when transposed=False", "expected 0, given 1"]),
    ("transposed-empty-output", lambda: backward(Z((2, 6, 1, 1), np.float32), Z((2, 4, 1, 1), np.float32),
                                                 Z((4, 6, 1, 1), np.float32), transposed=True, padding=1), "padding",
     ["makes the transposed output empty"]),
    ("grad-output-spatial", lambda: backward(Z((2, 6, 6, 5), np.float32), x4, w4), "grad_output",
     ["dim 3 (W)", "expected 6, given 5"]),
    ("grad-output-channels", lambda: backward(Z((2, 5, 6, 6), np.float32), x4, w4), "grad_output",
     ["dim 1 (C_out)", "expected 6, given 5"]),
    ("grad-output-batch", lambda: backward(Z((3, 6, 6, 6), np.float32), x4, w4), "grad_output",
     ["dim 0 (N)", "expected 2, given 3"]),
    ("bias-sizes", lambda: backward(dy4, x4, w4, bias_sizes=[4]), "bias_sizes",
     ["must be [weight.shape[0]]", "expected [6], given [4]"]),
    ("bias-sizes-transposed", lambda: backward(Z((2, 4, 10, 10), np.float32), Z((2, 6, 8, 8), np.float32),
                                               Z((6, 2, 3, 3), np.float32), transposed=True, groups=2,
                                               bias_sizes=[2]), "bias_sizes",
     ["weight.shape[1] * groups", "expected [4], given [2]"]),
    ("dtype-mismatch", lambda: backward(dy4, x4.astype(np.float64), w4), "input",
     ["dtype differs from grad_output's", "expected float32, given float64"]),
    ("dtype-integer", lambda: backward(dy4.astype(np.int32), x4, w4), "grad_output",
     ["dtype must be float16, bfloat16, float32 or float64", "given int32"]),
    ("mask-length", lambda: backward(dy4, x4, w4, output_mask=(True, True)), "output_mask",
     ["three booleans", "given (True, True)"]),
    ("mask-ints", lambda: backward(dy4, x4, w4, output_mask=(1, 1, 0)), "output_mask", ["given (1, 1, 0)"]),
    ("math", lambda: backward(dy4, x4, w4, math="fast"), "math", ["unknown math mode", "given 'fast'"]),
    ("deterministic", lambda: backward(dy4, x4, w4, deterministic="yes"), "deterministic", ["unknown determinism level", "given 'yes'"]),
    ("not-an-array", lambda: backward(dy4, [[1.0]], w4), "input", ["must be an array", "given list"]),
    ("spatial-zero", lambda: backward(dy4, Z((2, 4, 0, 8), np.float32), w4), "input",
     ["dim 2 (H)", "spatial size must be >= 1"]),
    ("kernel-zero", lambda: backward(dy4, x4, Z((6, 4, 0, 3), np.float32)), "weight", ["kernel size must be >= 1"]),
    ("fprop-bias-shape", lambda: xconv.conv_fprop(x4, w4, bias=Z((4,), np.float32), backend="spy"), "bias",
     ["expected (6,), given (4,)"]),
    ("fprop-bias-dtype", lambda: xconv.conv_fprop(x4, w4, bias=Z((6,), np.float16), backend="spy"), "bias",
     ["dtype differs", "expected float32, given float16"]),
    ("dgrad-input-shape", lambda: xconv.conv_dgrad(dy4, w4, (2, 4, "8", 8), backend="spy"), "input_shape",
     ["must be a sequence of ints"]),
    ("dgrad-input-shape", lambda: xconv.conv_dgrad(dy4, w4, (2, 4, 9, 8), backend="spy"), "input_shape",
     ["dim 2 (H)", "grad_output's shape", "expected 6, given 7"]),
    ("wgrad-weight-shape", lambda: xconv.conv_wgrad(x4, dy4, (6, 4, 3), backend="spy"), "weight_shape",
     ["rank must equal input's rank"]),
]


@pytest.fixture(autouse=True)
def spy():
    with registered(SpyBackend()) as backend:
        yield backend


@pytest.mark.parametrize("call, argument, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_argument_raises_shape_error_before_backend_work(spy, call, argument, fragments):
    with pytest.raises(xconv.ShapeError) as info:
        call()
    message = str(info.value)
    assert message.startswith(argument), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError) and isinstance(info.value, xconv.XconvError)
    assert spy.calls == [], "the backend was called before validation failed"


def test_valid_call_reaches_backend(spy):
    backward(dy4, x4, w4)
    assert [c[0] for c in spy.calls] == ["dgrad", "wgrad", "bgrad"]


def test_output_shape_validates():
    assert xconv.output_shape((1, 3, 10), (4, 3, 3), stride=2, padding=((2, 1),)) == (1, 4, 6)
    with pytest.raises(xconv.ShapeError, match="groups"):
        xconv.output_shape((1, 3, 10), (4, 3, 3), groups=2)


def test_shape_error_attributes():
    with pytest.raises(xconv.ShapeError) as info:
        xconv.output_shape((1, 4, 8, 8), (6, 4, 3, 3), stride=(1, 0))
    err = info.value
    assert (err.argument, err.expected, err.given) == ("stride", ">= 1", 0)
    assert err.dim == "spatial dim 1 (W)"
