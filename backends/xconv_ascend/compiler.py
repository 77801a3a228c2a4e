"""Pure-Python translation of :class:`~xconv.params.ConvParams` into aclnn argument values, and the
SoC capability table (data) checked before any device call.

Nothing here touches CANN: it is unit-tested without the libraries (tests/test_ascend_translation.py).
Enum values and constraints are those of CANN's public headers and op docs (see
``shared/reference/cann-abi.md`` and docs/ascend-backend.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from xconv.errors import UnsupportedError
from xconv.params import ConvParams

# aclDataType (acl_base.h)
ACL_FLOAT, ACL_FLOAT16, ACL_BF16 = 0, 1, 27
DTYPES = {"float32": ACL_FLOAT, "float16": ACL_FLOAT16, "bfloat16": ACL_BF16}

# aclFormat (acl_base.h)
ACL_FORMAT_NCHW, ACL_FORMAT_ND, ACL_FORMAT_NCDHW, ACL_FORMAT_NCL = 0, 2, 30, 47
FORMATS = {1: ACL_FORMAT_NCL, 2: ACL_FORMAT_NCHW, 3: ACL_FORMAT_NCDHW}  # by number of spatial dims

# cubeMathType (int8_t argument of the aclnn convolution ops)
KEEP_DTYPE, ALLOW_FP32_DOWN_PRECISION, USE_FP16, USE_HF32 = 0, 1, 2, 3
CUBE_MATH_NAMES = {KEEP_DTYPE: "KEEP_DTYPE", ALLOW_FP32_DOWN_PRECISION: "ALLOW_FP32_DOWN_PRECISION",
                   USE_FP16: "USE_FP16", USE_HF32: "USE_HF32"}

#: xconv ``math`` -> cubeMathType for float32 inputs (docs/semantics.md). 16-bit inputs always use KEEP_DTYPE.
#: allow_fp16 is USE_FP16 (2), which computes float32 inputs in float16 on every product; 1
#: (ALLOW_FP32_DOWN_PRECISION) would mean HFLOAT32 on Atlas A2/A3, 950 and 200I/500 A2 but float16
#: on the older series, so xconv never sends it.
MATH_TO_CUBE = {"keep_dtype": KEEP_DTYPE, "allow_tf32": USE_HF32, "allow_fp16": USE_FP16}

#: The two aclnn operators: fprop runs on "convolution", every gradient on "backward".
OP_CONVOLUTION = "convolution"           # aclnnConvolution
OP_BACKWARD = "backward"                 # aclnnConvolutionBackward
OP_FUNCTIONS = {OP_CONVOLUTION: "aclnnConvolution", OP_BACKWARD: "aclnnConvolutionBackward"}


def computes_in(dtype: str, cube: int, family: str | None, op: str) -> str:
    """What the cube unit computes ``dtype`` inputs in under ``cube`` on a product ``family`` (a
    :data:`SOC_FAMILIES` key; None: unknown SoC), per the cubeMathType rows of the op docs.

    One of "float32", "hfloat32", "float16", "bfloat16", "unsupported" or "unknown" (unknown SoC).
    Accumulation is float32 in every mode (the cube unit's accumulators).
    """
    if dtype != "float32":
        return dtype if not (dtype == "bfloat16" and cube == USE_FP16) else "unsupported"
    if family is None:
        return "unknown"
    older = family in OLDER_SERIES
    if cube == USE_FP16:
        return "float16"
    if cube == ALLOW_FP32_DOWN_PRECISION:
        return "float16" if older else "hfloat32"
    if cube == USE_HF32:
        return "unsupported" if older else "hfloat32"
    # KEEP_DTYPE (an A2/A3 fprop runs through aclnnConvolutionBackward, which accepts it)
    if older or (op == OP_CONVOLUTION and family == "atlas-200i-500-a2"):
        return "unsupported"
    return "float32"


def cube_math_type(p: ConvParams) -> int:
    """cubeMathType for ``p``: from ``math`` for float32, KEEP_DTYPE (0) for float16/bfloat16."""
    if p.dtype != "float32":
        return KEEP_DTYPE
    return MATH_TO_CUBE[p.math]


def padding_values(p: ConvParams) -> list[int]:
    """aclnn's padding list: one value per spatial dim (symmetric), or ``[top, bottom, left, right]`` (2-D).

    Other asymmetric padding is legalized by the core (the backend declares asymmetric padding for
    2-D only), so it never arrives here; ValueError if it does.
    """
    if p.symmetric:
        return [pre for pre, _ in p.padding]
    if p.nd == 2:
        (top, bottom), (left, right) = p.padding
        return [top, bottom, left, right]
    raise ValueError(f"asymmetric padding {p.padding} of a {p.nd}-D convolution has no aclnn form "
                     "(the core should have made it symmetric)")


@dataclasses.dataclass(frozen=True)
class ConvArgs:
    """The scalar and list arguments of aclnnConvolution(Backward)GetWorkspaceSize for one call."""

    dtype: int                   # aclDataType of every tensor
    format: int                  # aclFormat of the activation and weight tensors (NCL/NCHW/NCDHW)
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    bias_sizes: tuple[int]       # [C_out] (direct) or [weight.shape[1] * groups] (transposed)
    cube_math_type: int


def translate(p: ConvParams, strict: bool = True) -> ConvArgs:
    """The aclnn argument values of the convolution ``p`` (normalized, validated by the core).

    ``strict=False`` (for the capability table, which reads ``p`` itself) leaves ``padding`` empty
    where aclnn has no form for it instead of raising ValueError.
    """
    if p.dtype not in DTYPES:
        raise ValueError(f"dtype {p.dtype} has no aclnn convolution type")
    native = p.symmetric or p.nd == 2
    return ConvArgs(dtype=DTYPES[p.dtype], format=FORMATS[p.nd], stride=tuple(p.stride),
                    padding=tuple(padding_values(p)) if strict or native else (), dilation=tuple(p.dilation),
                    transposed=bool(p.transposed),
                    output_padding=tuple(p.output_padding) if p.transposed else (0,) * p.nd,
                    groups=int(p.groups), bias_sizes=(int(p.bias_size),), cube_math_type=cube_math_type(p))


def contiguous_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------------------------
# SoC families (aclrtGetSocName) and the capability table


@dataclasses.dataclass(frozen=True)
class SocFamily:
    """A product family of the CANN op docs, recognised by its aclrtGetSocName pattern."""

    key: str
    title: str
    pattern: str  # a regular expression matched at the start of the SoC name

    def matches(self, soc: str) -> bool:
        return re.match(self.pattern, soc or "") is not None


#: Order matters: the first matching family is the SoC's.
SOC_FAMILIES = (
    SocFamily("atlas-a2-a3", "Atlas A2/A3 training and inference series", r"Ascend910B|Ascend910_93"),
    SocFamily("ascend950", "Ascend 950PR/950DT", r"Ascend950|Ascend910_95"),
    SocFamily("atlas-training", "Atlas training series", r"Ascend910(?!B|_93|_95)"),
    SocFamily("atlas-inference", "Atlas inference series", r"Ascend310P"),
    SocFamily("atlas-200i-500-a2", "Atlas 200I/500 A2 inference products", r"Ascend310B"),
)

OLDER_SERIES = ("atlas-training", "atlas-inference")
ALL_FAMILIES = tuple(f.key for f in SOC_FAMILIES)


def soc_family(soc: str | None) -> SocFamily | None:
    """The product family of a SoC name, or None when the name is not one the table knows."""
    for fam in SOC_FAMILIES:
        if fam.matches(soc or ""):
            return fam
    return None


def _hw(p: ConvParams) -> tuple[int, ...]:
    """Indices (into the spatial dims) of H and W; the L dim for 1-D."""
    return {1: (0,), 2: (0, 1), 3: (1, 2)}[p.nd]


def _over(values, limit, dims) -> list[int]:
    return [i for i in dims if values[i] > limit]


def _pads(p: ConvParams, dims) -> list[int]:
    return [i for i in dims if max(p.padding[i]) > 255]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One published constraint: where it holds (SoC families, operator) and when it is violated."""

    name: str
    families: tuple[str, ...]
    ops: tuple[str, ...]
    violated: Callable[[ConvParams, ConvArgs], bool]
    message: str
    #: "direct": a transposed convolution breaking this rule runs as the core's mapping onto direct
    #: convolutions (aclnn's transposed=False) instead of being refused. "backward": a direct fprop
    #: breaking it runs as the data gradient of the transposed convolution (aclnnConvolutionBackward,
    #: transposed=True, outputMask [1, 0, 0]), which computes the same correlation.
    fallback: str = ""

    def applies_to(self, family: str | None, op: str) -> bool:
        return family in self.families and op in self.ops


_B, _C = (OP_BACKWARD,), (OP_CONVOLUTION,)
_BOTH = (OP_BACKWARD, OP_CONVOLUTION)
_FWD_FAMILIES = ("atlas-a2-a3", "atlas-inference", "atlas-200i-500-a2")

#: The capability table. Sources: hicann/ops-nn conv/convolution_backward/docs/aclnnConvolutionBackward.md and
#: conv/convolution_forward/docs/aclnnConvolution.md (constraint tables per product), cann-abi.md.
RULES: tuple[Rule, ...] = (
    # --- aclnnConvolutionBackward --------------------------------------------------------------
    Rule("backward-unsupported-product", ("atlas-200i-500-a2",), _B, lambda p, a: True,
         "aclnnConvolutionBackward is not supported on this product"),
    Rule("backward-output-padding-below-stride", ALL_FAMILIES, _B,
         lambda p, a: p.transposed and any(op >= s for op, s in zip(p.output_padding, p.stride)),
         "outputPadding must lie in [0, stride) in every spatial dim", fallback="direct"),
    Rule("a2a3-backward-kernel-hw-max-255", ("atlas-a2-a3",), _B,
         lambda p, a: not p.transposed and bool(_over(p.kernel, 255, _hw(p))),
         "kernel H and W (L for 1-D) must lie in [1, 255] (transposed=False)"),
    Rule("a2a3-backward-padding-max-255", ("atlas-a2-a3",), _B,
         lambda p, a: not p.transposed and bool(_pads(p, _hw(p) if p.nd == 3 else range(p.nd))),
         "padding must lie in [0, 255] (H and W for 3-D; transposed=False)"),
    Rule("a2a3-backward-dilation-max-255", ("atlas-a2-a3",), _B,
         lambda p, a: not p.transposed and bool(_over(p.dilation, 255, range(p.nd))),
         "dilation must lie in [1, 255] (transposed=False)"),
    Rule("a2a3-backward-3d-stride-hw-max-63", ("atlas-a2-a3",), _B,
         lambda p, a: not p.transposed and p.nd == 3 and bool(_over(p.stride, 63, _hw(p))),
         "3-D stride H and W must lie in [1, 63] (transposed=False)"),
    Rule("ascend950-backward-transposed-kernel-hw-max-255", ("ascend950",), _B,
         lambda p, a: p.transposed and bool(_over(p.kernel, 255, _hw(p))),
         "kernel H and W must lie in [1, 255] (transposed=True)"),
    Rule("older-series-backward-no-3d", OLDER_SERIES, _B, lambda p, a: p.nd == 3,
         "only 1-D and 2-D convolution backward is supported (no 3-D)"),
    # --- both operators ------------------------------------------------------------------------
    Rule("older-series-no-bfloat16", OLDER_SERIES, _BOTH, lambda p, a: p.dtype == "bfloat16",
         "bfloat16 is not supported"),
    Rule("older-series-float32-keep-dtype", OLDER_SERIES + ("atlas-200i-500-a2",), _BOTH,
         lambda p, a: p.dtype == "float32" and a.cube_math_type == KEEP_DTYPE,
         "float32 with cubeMathType KEEP_DTYPE (math='keep_dtype') is not supported by the cube unit; "
         "math='allow_fp16' (USE_FP16, computed in float16) is"),
    Rule("a2a3-convolution-float32-keep-dtype", ("atlas-a2-a3",), _C,
         lambda p, a: p.dtype == "float32" and a.cube_math_type == KEEP_DTYPE and not p.transposed,
         "float32 with cubeMathType KEEP_DTYPE (math='keep_dtype') is not supported by aclnnConvolution on "
         "this product (its backward op accepts it)", fallback="backward"),
    Rule("a2a3-convolution-transposed-float32-keep-dtype", ("atlas-a2-a3",), _C,
         lambda p, a: p.dtype == "float32" and a.cube_math_type == KEEP_DTYPE and p.transposed,
         "float32 with cubeMathType KEEP_DTYPE (math='keep_dtype') is not supported by aclnnConvolution on "
         "this product (its backward op accepts it)", fallback="direct"),
    Rule("older-series-float32-hf32", OLDER_SERIES, _BOTH,
         lambda p, a: p.dtype == "float32" and a.cube_math_type == USE_HF32,
         "float32 with cubeMathType USE_HF32 (math='allow_tf32') is not supported by the cube unit"),
    # --- aclnnConvolution ----------------------------------------------------------------------
    Rule("training-convolution-unsupported", ("atlas-training",), _C, lambda p, a: True,
         "aclnnConvolution is not supported on this product"),
    Rule("200i500a2-convolution-2d-direct-only", ("atlas-200i-500-a2",), _C,
         lambda p, a: p.nd != 2 or p.transposed, "only 2-D convolution with transposed=False is supported"),
    Rule("inference-convolution-3d-float16-only", ("atlas-inference",), _C,
         lambda p, a: p.nd == 3 and p.dtype != "float16", "3-D convolution supports float16 only"),
    Rule("inference-convolution-input-hw-max-4096", ("atlas-inference",), _C,
         lambda p, a: bool(_over(p.input_shape[2:], 4096, _hw(p))), "input H and W must be at most 4096"),
    Rule("inference-convolution-kernel-max-255", ("atlas-inference",), _C,
         lambda p, a: bool(_over(p.kernel, 255, range(p.nd))), "kernel D, H and W must be at most 255"),
    Rule("a2a3-convolution-transposed-kernel-hw-max-255", ("atlas-a2-a3",), _C,
         lambda p, a: p.transposed and bool(_over(p.kernel, 255, _hw(p))),
         "kernel H and W (L for 1-D) must lie in [1, 255] (transposed=True)"),
    Rule("a2a3-convolution-3d-kernel-hw-max-511", ("atlas-a2-a3",), _C,
         lambda p, a: not p.transposed and p.nd == 3 and bool(_over(p.kernel, 511, _hw(p))),
         "3-D kernel H and W must lie in [1, 511] (transposed=False)"),
    Rule("convolution-3d-stride-hw-max-63", _FWD_FAMILIES, _C,
         lambda p, a: p.nd == 3 and bool(_over(p.stride, 63, _hw(p))), "3-D stride H and W must lie in [1, 63]"),
    Rule("convolution-padding-max-255", _FWD_FAMILIES, _C,
         lambda p, a: bool(_pads(p, _hw(p) if p.nd == 3 else (() if p.transposed else range(p.nd)))),
         "padding must lie in [0, 255] (1-D/2-D with transposed=False; H and W for 3-D)"),
    Rule("convolution-dilation-max-255", _FWD_FAMILIES, _C,
         lambda p, a: bool(_over(p.dilation, 255, range(p.nd) if p.transposed else (_hw(p) if p.nd == 3 else ()))),
         "dilation must lie in [1, 255] (every dim for transposed=True; H and W for 3-D)"),
    Rule("convolution-dims-max-1000000", _FWD_FAMILIES, _C,
         lambda p, a: max(p.input_shape + p.weight_shape) > 1_000_000,
         "every dim of input and weight must be at most 1000000"),
)


def violations(p: ConvParams, soc: str | None, op: str, rules=None) -> list[Rule]:
    """The rules of ``soc``'s family that the call ``p`` on operator ``op`` violates (none for unknown SoCs).

    ``rules`` defaults to :data:`RULES` (looked up at call time)."""
    rules = RULES if rules is None else rules
    fam = soc_family(soc)
    if fam is None:
        return []
    args = translate(p, strict=False)
    return [r for r in rules if r.applies_to(fam.key, op) and r.violated(p, args)]


def direct_fallback(p: ConvParams, soc: str | None, op: str, rules=None) -> Rule | None:
    """The first violated rule of a transposed ``p`` that running it as direct convolutions avoids, else None."""
    if not p.transposed:
        return None
    return next((r for r in violations(p, soc, op, rules) if r.fallback == "direct"), None)


def backward_fallback(p: ConvParams, soc: str | None, rules=None) -> Rule | None:
    """The first violated rule of a direct fprop ``p`` that running it through the backward op avoids, else None."""
    if p.transposed:
        return None
    return next((r for r in violations(p, soc, OP_CONVOLUTION, rules) if r.fallback == "backward"), None)


def as_transposed(p: ConvParams) -> ConvParams:
    """The transposed convolution whose data gradient is the direct convolution ``p`` (inverse of ``as_direct``).

    Its input has ``p``'s output shape, its output ``p``'s input shape; output_padding takes up
    what the direct convolution's floor division dropped, always in [0, stride).
    """
    out_pad = tuple((s_in + pre + post - d * (k - 1) - 1) % st
                    for s_in, (pre, post), d, k, st in zip(p.input_shape[2:], p.padding, p.dilation, p.kernel,
                                                           p.stride))
    return p.replace(input_shape=p.output_shape, output_shape=p.input_shape, transposed=True,
                     output_padding=out_pad)


def check(p: ConvParams, soc: str | None, op: str, backend: str = "ascend", rules=None) -> ConvArgs:
    """The aclnn arguments of ``p``; UnsupportedError naming the first violated rule of ``soc``'s family."""
    args = translate(p)
    broken = violations(p, soc, op, rules)
    if broken:
        rule = broken[0]
        fam = soc_family(soc)
        raise UnsupportedError(
            f"backend {backend!r} cannot run this {p.nd}-D {p.dtype} {'transposed ' if p.transposed else ''}"
            f"convolution on {soc} ({fam.title}): rule {rule.name!r} of {OP_FUNCTIONS[op]}: {rule.message}"
            f" (stride={p.stride}, padding={p.padding}, dilation={p.dilation}, kernel={p.kernel}, "
            f"output_padding={p.output_padding}, math={p.math!r} -> cubeMathType "
            f"{args.cube_math_type} {CUBE_MATH_NAMES[args.cube_math_type]})")
    return args

