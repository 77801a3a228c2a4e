"""The Ascend backend's pure-Python parts: ConvParams -> aclnn arguments, the SoC capability table,
library discovery reasons. No CANN library (real or emulated) is loaded here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import xconv
from xconv.params import make_params
from xconv_ascend import compiler
from xconv_ascend.backend import AscendBackend
from xconv_ascend.driver import STATUS_NAMES, Driver, status_name


def P(input_shape, weight_shape, dtype="float32", math="keep_dtype", **kw):
    return make_params(input_shape, weight_shape, dtype=dtype, math=math, **kw)


# ---------------------------------------------------------------------------------------------
# Translation


@pytest.mark.parametrize("dtype,math,cube", [
    ("float32", "keep_dtype", 0), ("float32", "allow_tf32", 3), ("float32", "allow_fp16", 2),
    ("float16", "keep_dtype", 0), ("float16", "allow_tf32", 0), ("float16", "allow_fp16", 0),
    ("bfloat16", "keep_dtype", 0), ("bfloat16", "allow_tf32", 0), ("bfloat16", "allow_fp16", 0),
])
def test_cube_math_type(dtype, math, cube):
    assert compiler.cube_math_type(P((1, 2, 5, 5), (3, 2, 3, 3), dtype, math)) == cube


@pytest.mark.parametrize("nd,fmt", [(1, 47), (2, 0), (3, 30)])
def test_formats_and_dtypes(nd, fmt):
    p = P((2, 4) + (6,) * nd, (6, 2) + (3,) * nd, "bfloat16", groups=2, stride=2, dilation=1, padding=1)
    a = compiler.translate(p)
    assert a.format == fmt and a.dtype == 27 and a.groups == 2
    assert a.stride == (2,) * nd and a.dilation == (1,) * nd and a.padding == (1,) * nd
    assert a.output_padding == (0,) * nd and a.transposed is False and a.bias_sizes == (6,)
    assert compiler.translate(p.replace(dtype="float16")).dtype == 1
    assert compiler.translate(p.replace(dtype="float32")).dtype == 0


def test_padding_forms():
    assert compiler.padding_values(P((1, 1, 9, 9), (1, 1, 3, 3), padding=(1, 2))) == [1, 2]
    assert compiler.padding_values(P((1, 1, 9, 9), (1, 1, 3, 3), padding=((1, 2), (3, 0)))) == [1, 2, 3, 0]
    assert compiler.padding_values(P((1, 1, 9, 9), (1, 1, 3, 3), padding="same")) == [1, 1]
    assert compiler.padding_values(P((1, 1, 9, 9, 9), (1, 1, 3, 3, 3), padding=2)) == [2, 2, 2]
    for p in (P((1, 1, 9), (1, 1, 3), padding=((0, 1),)), P((1, 1, 8, 8, 8), (1, 1, 3, 3, 3), padding="same",
                                                            stride=2)):
        with pytest.raises(ValueError, match="asymmetric"):
            compiler.padding_values(p)


def test_transposed_translation():
    p = P((2, 4, 5, 5), (4, 3, 3, 3), transposed=True, stride=(2, 3), output_padding=(1, 2), groups=2,
          padding=((1, 1), (0, 0)), dilation=(1, 2))
    a = compiler.translate(p)
    assert a.transposed is True and a.output_padding == (1, 2) and a.bias_sizes == (6,) and a.groups == 2
    assert a.padding == (1, 0) and a.dilation == (1, 2)


def test_contiguous_strides():
    assert compiler.contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert compiler.contiguous_strides((2, 0, 4)) == (4, 4, 1)


# ---------------------------------------------------------------------------------------------
# The capability table


@pytest.mark.parametrize("soc,family", [
    ("Ascend910B1", "atlas-a2-a3"), ("Ascend910B4", "atlas-a2-a3"), ("Ascend910_9391", "atlas-a2-a3"),
    ("Ascend910A", "atlas-training"), ("Ascend910ProB", "atlas-training"), ("Ascend910PremiumA", "atlas-training"),
    ("Ascend310P3", "atlas-inference"), ("Ascend310B1", "atlas-200i-500-a2"), ("Ascend950PR_9599", "ascend950"),
    ("SomethingElse", None), ("", None), (None, None),
])
def test_soc_families(soc, family):
    fam = compiler.soc_family(soc)
    assert (fam.key if fam else None) == family


def test_table_is_well_formed():
    names = [r.name for r in compiler.RULES]
    assert len(names) == len(set(names))
    keys = {f.key for f in compiler.SOC_FAMILIES}
    for r in compiler.RULES:
        assert r.families and set(r.families) <= keys, r.name
        assert r.ops and set(r.ops) <= {compiler.OP_BACKWARD, compiler.OP_CONVOLUTION}, r.name
        assert r.message


B, C = compiler.OP_BACKWARD, compiler.OP_CONVOLUTION
CONV2 = dict(input_shape=(1, 2, 8, 8), weight_shape=(2, 2, 3, 3))
CONV3 = dict(input_shape=(1, 2, 6, 6, 6), weight_shape=(2, 2, 3, 3, 3))

VIOLATIONS = [
    # (soc, op, params, expected rule)
    ("Ascend910A", B, dict(CONV2), "older-series-float32-keep-dtype"),
    ("Ascend310P3", C, dict(CONV2), "older-series-float32-keep-dtype"),
    ("Ascend910A", B, dict(CONV2, math="allow_tf32"), "older-series-float32-hf32"),
    ("Ascend910A", B, dict(CONV2, dtype="bfloat16"), "older-series-no-bfloat16"),
    ("Ascend310P1", B, dict(CONV3, dtype="float16"), "older-series-backward-no-3d"),
    ("Ascend910A", C, dict(CONV2, dtype="float16"), "training-convolution-unsupported"),
    ("Ascend310B1", B, dict(CONV2, dtype="float16"), "backward-unsupported-product"),
    ("Ascend310B1", C, dict(CONV3, dtype="float16"), "200i500a2-convolution-2d-direct-only"),
    ("Ascend310B1", C, dict(CONV2), "older-series-float32-keep-dtype"),
    ("Ascend310P3", C, dict(CONV3, dtype="float16", math="allow_fp16"), None),
    ("Ascend310P3", C, dict(CONV3, math="allow_fp16"), "inference-convolution-3d-float16-only"),
    ("Ascend310P3", C, dict(input_shape=(1, 1, 4097), weight_shape=(1, 1, 3), dtype="float16"),
     "inference-convolution-input-hw-max-4096"),
    ("Ascend310P3", C, dict(input_shape=(1, 1, 300), weight_shape=(1, 1, 256), dtype="float16"),
     "inference-convolution-kernel-max-255"),
    ("Ascend910B2", B, dict(input_shape=(1, 1, 300), weight_shape=(1, 1, 256)), "a2a3-backward-kernel-hw-max-255"),
    ("Ascend910B2", B, dict(input_shape=(1, 1, 300, 4), weight_shape=(1, 1, 2, 256), padding=(0, 200)),
     "a2a3-backward-kernel-hw-max-255"),
    ("Ascend910B2", B, dict(input_shape=(1, 1, 300, 4, 4), weight_shape=(1, 1, 256, 3, 3)), None),  # D is free
    ("Ascend910B2", B, dict(CONV2, padding=256), "a2a3-backward-padding-max-255"),
    ("Ascend910B2", B, dict(CONV2, padding=((0, 256), (0, 0))), "a2a3-backward-padding-max-255"),
    ("Ascend910B2", B, dict(CONV3, padding=(256, 0, 0)), None),  # padding D is free in 3-D
    ("Ascend910B2", B, dict(CONV3, padding=(0, 0, 256)), "a2a3-backward-padding-max-255"),
    ("Ascend910B2", B, dict(input_shape=(1, 1, 600), weight_shape=(1, 1, 2), dilation=256),
     "a2a3-backward-dilation-max-255"),
    ("Ascend910_9391", B, dict(CONV3, stride=(64, 1, 1)), None),
    ("Ascend910_9391", B, dict(CONV3, stride=(1, 64, 1)), "a2a3-backward-3d-stride-hw-max-63"),
    ("Ascend910B2", B, dict(input_shape=(1, 2, 4, 4), weight_shape=(2, 2, 3, 3), transposed=True, stride=1,
                            dilation=2, output_padding=1), "backward-output-padding-below-stride"),
    ("Ascend910B2", C, dict(dtype="float16", input_shape=(1, 2, 4, 4), weight_shape=(2, 2, 3, 3), transposed=True,
                            stride=1,
                            dilation=2, output_padding=1), None),
    ("Ascend910B2", B, dict(input_shape=(1, 2, 4, 4), weight_shape=(2, 2, 3, 3), transposed=True, stride=2,
                            output_padding=1), None),
    ("Ascend910B2", B, dict(input_shape=(1, 1, 300), weight_shape=(1, 1, 256), transposed=True), None),
    ("Ascend910B2", C, dict(dtype="float16", input_shape=(1, 1, 300), weight_shape=(1, 1, 256), transposed=True),
     "a2a3-convolution-transposed-kernel-hw-max-255"),
    ("Ascend950PR_9599", B, dict(input_shape=(1, 1, 300), weight_shape=(1, 1, 256), transposed=True),
     "ascend950-backward-transposed-kernel-hw-max-255"),
    ("Ascend910B2", C, dict(dtype="float16", input_shape=(1, 1, 4, 600, 4), weight_shape=(1, 1, 1, 512, 1)),
     "a2a3-convolution-3d-kernel-hw-max-511"),
    ("Ascend910B2", C, dict(CONV3, dtype="float16", stride=(1, 1, 64)), "convolution-3d-stride-hw-max-63"),
    ("Ascend910B2", C, dict(CONV2, dtype="float16", padding=(0, 256)), "convolution-padding-max-255"),
    ("Ascend910B2", C, dict(dtype="float16", input_shape=(1, 2, 4, 4), weight_shape=(2, 2, 3, 3), transposed=True,
                            padding=(0, 1),
                            dilation=(1, 256)), "convolution-dilation-max-255"),
    ("Ascend910B2", C, dict(dtype="float16", input_shape=(1, 1, 1_000_001), weight_shape=(1, 1, 1)),
     "convolution-dims-max-1000000"),
    # float32 KEEP_DTYPE: A2/A3's aclnnConvolution refuses it (op doc), its backward op accepts it: a direct fprop
    # runs as the transposed data gradient, a transposed one as the core's mapping onto direct ops
    ("Ascend910B2", C, dict(CONV2), "a2a3-convolution-float32-keep-dtype"),
    ("Ascend910B2", C, dict(CONV2, transposed=True), "a2a3-convolution-transposed-float32-keep-dtype"),
    ("Ascend910B2", C, dict(CONV2, math="allow_fp16"), None),
    ("Ascend910B2", C, dict(CONV2, math="allow_tf32"), None),
    ("Ascend950PR_9599", C, dict(CONV2), None),
    # what the A2/A3 family allows
    ("Ascend910B2", B, dict(CONV2), None),
    ("Ascend910B2", B, dict(CONV2, dtype="bfloat16"), None),
    ("Ascend910B2", C, dict(CONV3, math="allow_tf32"), None),
    ("Ascend910A", B, dict(CONV2, math="allow_fp16"), None),
    ("Ascend910A", B, dict(CONV2, dtype="float16"), None),
    ("UnknownSoC", B, dict(CONV2, padding=1000, dtype="bfloat16"), None),  # unknown SoCs: the library decides
]


@pytest.mark.parametrize("soc,op,kw,rule", VIOLATIONS)
def test_capability_table(soc, op, kw, rule):
    kw = dict(kw)
    p = P(kw.pop("input_shape"), kw.pop("weight_shape"), kw.pop("dtype", "float32"), kw.pop("math", "keep_dtype"),
          **kw)
    broken = compiler.violations(p, soc, op)
    if rule is None:
        assert broken == [], [r.name for r in broken]
        assert compiler.check(p, soc, op) == compiler.translate(p)
        return
    assert broken and broken[0].name == rule, [r.name for r in broken]
    with pytest.raises(xconv.UnsupportedError) as info:
        compiler.check(p, soc, op)
    text = str(info.value)
    assert f"rule {rule!r}" in text and soc in text and "'ascend'" in text
    assert compiler.OP_FUNCTIONS[op] in text
    fallback = compiler.direct_fallback(p, soc, op)
    assert (fallback is not None) == (rule in ("backward-output-padding-below-stride",
                                               "a2a3-convolution-transposed-float32-keep-dtype"))
    through_backward = op == C and compiler.backward_fallback(p, soc) is not None
    assert through_backward == (rule == "a2a3-convolution-float32-keep-dtype")


# ---------------------------------------------------------------------------------------------
# Backend declaration, status names, discovery reasons (no library loaded)


def test_backend_declaration():
    b = AscendBackend()
    caps = b.capabilities
    assert b.name == "ascend" and b.array_families == ("numpy", "xconv_ascend")
    assert caps.spatial_dims == {1, 2, 3} and caps.dtypes == {"float16", "bfloat16", "float32"}
    assert caps.asymmetric_padding == {2} and caps.transposed and caps.strided and caps.deterministic
    assert caps.math == {"keep_dtype", "allow_tf32", "allow_fp16"}


def test_status_names():
    assert status_name(161001) == "ACLNN_ERR_PARAM_NULLPTR"
    assert status_name(161002) == "ACLNN_ERR_PARAM_INVALID"
    assert status_name(561103) == "ACLNN_ERR_INNER_NULLPTR"
    assert status_name(107002) == "ACL_ERROR_RT_CONTEXT_NULL"
    assert status_name(100002) == "ACL_ERROR_REPEAT_INITIALIZE"
    assert status_name(123) == "status 123"
    assert all(isinstance(k, int) and v.startswith("ACL") for k, v in STATUS_NAMES.items())


def _reason(environ, lib_dir=None):
    ok, reason = Driver(lib_dir=lib_dir, environ=environ).availability()
    assert not ok
    return reason


def test_discovery_reasons(tmp_path):
    assert _reason({}) .startswith("ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and XCONV_ASCEND_LIB_DIR are unset")
    assert "not an absolute path" in _reason({"XCONV_ASCEND_LIB_DIR": "lib64"})
    assert "ASCEND_HOME_PATH='cann' is not an absolute path" in _reason({"ASCEND_HOME_PATH": "cann"})
    assert "not an absolute path" in _reason({}, lib_dir="relative/dir")
    missing = tmp_path / "nowhere"
    assert f"{missing}/lib64 ($ASCEND_HOME_PATH) does not exist" in _reason({"ASCEND_HOME_PATH": str(missing)})
    assert f"{missing}/lib64 ($ASCEND_TOOLKIT_HOME)" in _reason({"ASCEND_TOOLKIT_HOME": str(missing)})
    # precedence: XCONV_ASCEND_LIB_DIR, then ASCEND_HOME_PATH, then ASCEND_TOOLKIT_HOME
    env = {"XCONV_ASCEND_LIB_DIR": str(missing), "ASCEND_HOME_PATH": str(tmp_path)}
    assert "($XCONV_ASCEND_LIB_DIR)" in _reason(env)
    assert "($ASCEND_HOME_PATH)" in _reason({"ASCEND_HOME_PATH": str(missing), "ASCEND_TOOLKIT_HOME": str(tmp_path)})
    # a directory without the libraries: nothing is loaded; what is missing and what was found are named
    (tmp_path / "lib64").mkdir()
    assert f"not found in {tmp_path}/lib64 ($ASCEND_HOME_PATH): libascendcl.so (or libacl_rt.so), libnnopbase.so, " \
           "libopapi_*.so (or libopapi.so); found no CANN library" in \
        _reason({"ASCEND_HOME_PATH": str(tmp_path)})
    (tmp_path / "lib64" / "libascendcl.so").write_bytes(b"")
    (tmp_path / "lib64" / "libnnopbase.so").write_bytes(b"")
    reason = _reason({"ASCEND_TOOLKIT_HOME": str(tmp_path), "ASCEND_OPP_PATH": str(tmp_path)})
    assert reason.endswith(": libopapi_*.so (or libopapi.so); found libascendcl.so, libnnopbase.so; "
                           f"ASCEND_OPP_PATH={tmp_path}")
    (tmp_path / "lib64" / "libascendcl.so").unlink()
    (tmp_path / "lib64" / "libacl_rt.so").write_bytes(b"")               # the runtime's other name
    assert "found libacl_rt.so, libnnopbase.so; ASCEND_OPP_PATH='opp' is not an existing absolute directory" in \
        _reason({"ASCEND_TOOLKIT_HOME": str(tmp_path), "ASCEND_OPP_PATH": "opp"})


def test_device_variable_checked(tmp_path):
    d = Driver(environ={"XCONV_ASCEND_DEVICE": "x"})
    with pytest.raises(Exception, match="XCONV_ASCEND_DEVICE='x' is not a device number"):
        d.device_id()
    assert Driver(environ={}).device_id() == 0
    assert Driver(environ={"XCONV_ASCEND_DEVICE": "3"}).device_id() == 3


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("XCONV_ASCEND_LIB_DIR", "ASCEND_HOME_PATH",
                                                             "ASCEND_TOOLKIT_HOME", "XCONV_BACKEND")}
    return env


def test_import_loads_nothing_and_cli_reason():
    """Importing the package and listing backends loads no CANN library; `xconv backends` gives the reason."""
    code = ("import xconv_ascend, xconv_ascend.plugin, xconv\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert 'libascendcl' not in maps and 'libopapi' not in maps\n"
            "row = [r for r in xconv.list_backends() if r.name == 'ascend'][0]\n"
            "assert not row.available, row\n"
            "assert 'libascendcl' not in open('/proc/self/maps').read()\n"
            "print(row.reason)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and XCONV_ASCEND_LIB_DIR are unset")
    cli = subprocess.run([sys.executable, "-m", "xconv", "backends"], capture_output=True, text=True,
                         env=_clean_env())
    line = [ln for ln in cli.stdout.splitlines() if ln.startswith("ascend")]
    assert line and " no " in line[0], cli.stdout + cli.stderr
    assert "ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and XCONV_ASCEND_LIB_DIR are unset" in line[0]


def test_unavailable_through_public_api(monkeypatch):
    """With no library directory configured, a call on backend='ascend' raises BackendUnavailableError."""
    code = ("import numpy as np, xconv\n"
            "x = np.zeros((1, 1, 4, 4), np.float32); w = np.zeros((1, 1, 3, 3), np.float32)\n"
            "try:\n"
            "    xconv.conv_fprop(x, w, backend='ascend')\n"
            "except xconv.BackendUnavailableError as e:\n"
            "    print(e.reason)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(_clean_env(), XCONV_ASCEND_LIB_DIR="relative/lib"))
    assert "XCONV_ASCEND_LIB_DIR='relative/lib' is not an absolute path" in out.stdout, out.stderr


@pytest.mark.parametrize("family,op,cube,want", [
    ("atlas-a2-a3", B, 0, "float32"), ("atlas-a2-a3", C, 0, "float32"),     # forward: through the backward op
    ("atlas-a2-a3", B, 1, "hfloat32"), ("atlas-a2-a3", B, 2, "float16"), ("atlas-a2-a3", B, 3, "hfloat32"),
    ("ascend950", C, 0, "float32"), ("ascend950", C, 1, "hfloat32"),
    ("atlas-200i-500-a2", C, 0, "unsupported"), ("atlas-200i-500-a2", C, 3, "hfloat32"),
    ("atlas-training", B, 0, "unsupported"), ("atlas-training", B, 1, "float16"), ("atlas-training", B, 2, "float16"),
    ("atlas-inference", C, 3, "unsupported"), (None, B, 2, "unknown"),
])
def test_computes_in_follows_the_op_docs(family, op, cube, want):
    """The cubeMathType rows of aclnnConvolution.md / aclnnConvolutionBackward.md, per product family."""
    assert compiler.computes_in("float32", cube, family, op) == want


def test_allow_fp16_is_use_fp16_and_float16_everywhere():
    assert compiler.MATH_TO_CUBE["allow_fp16"] == compiler.USE_FP16
    for fam in compiler.ALL_FAMILIES:
        assert compiler.computes_in("float32", compiler.USE_FP16, fam, B) == "float16"


def test_as_transposed_inverts_as_direct():
    for kw in (dict(), dict(stride=2, padding=1), dict(stride=3, dilation=2), dict(padding=((2, 0), (1, 3)))):
        p = P((2, 4, 9, 8), (6, 4, 3, 3), **kw)
        q = compiler.as_transposed(p)
        assert q.transposed and q.input_shape == p.output_shape and q.output_shape == p.input_shape
        assert all(0 <= op < s for op, s in zip(q.output_padding, q.stride))
        assert xconv.params.make_params(q.input_shape, q.weight_shape, stride=q.stride, padding=list(q.padding),
                                        dilation=q.dilation, transposed=True,
                                        output_padding=q.output_padding).output_shape == p.input_shape
        assert q.as_direct() == p
