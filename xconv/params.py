"""Validation and normalization of convolution parameters: the core's single point of checking.

Every public entry point turns its arguments into one :class:`ConvParams` here, before any
backend work. Backends receive only ConvParams, already checked and in canonical form.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np

from . import workspace
from .dtypes import DTYPES, dtype_name
from .errors import DTypeError, ResourceError, ShapeError

MATH_MODES = ("keep_dtype", "allow_tf32", "allow_fp16")
PADDING_STRINGS = ("valid", "same", "same_lower", "full")

_SPATIAL_NAMES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def spatial_names(nd: int) -> tuple[str, ...]:
    """Names of the spatial dims of an nd-dimensional convolution: L; H, W; D, H, W."""
    return _SPATIAL_NAMES[nd]


def _dim_label(axis: int, nd: int, channel: str) -> str:
    if axis == 0:
        return "dim 0 (N)"
    if axis == 1:
        return f"dim 1 ({channel})"
    return f"dim {axis} ({spatial_names(nd)[axis - 2]})"


#: Every size and parameter must fit a signed 64-bit integer (what the vendor libraries take).
INT64_MAX = 2**63 - 1


def _is_int(v) -> bool:
    """A Python or NumPy integer (NumPy 2's np.int64 included), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_bool(v) -> bool:
    """A Python bool or a NumPy bool (np.True_, np.False_)."""
    return isinstance(v, (bool, np.bool_))


def _fits(name: str, v: int, dim=None) -> int:
    if not -INT64_MAX <= v <= INT64_MAX:
        raise ShapeError(name, "must fit in a signed 64-bit integer", dim=dim, expected="|value| <= 2**63-1",
                         given=v)
    return v


def shape_arg(value, name: str) -> tuple[int, ...]:
    """An explicit shape argument (``input_shape``, ``weight_shape``): a sequence of ints (or a 1-D integer
    array), each fitting int64."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = _from_int_array(value)
    if (not isinstance(value, Sequence) or isinstance(value, (str, bytes))
            or not all(_is_int(v) for v in value)):
        raise ShapeError(name, "must be a sequence of ints", expected="(N, C, *spatial) ints", given=repr(value))
    return tuple(_fits(name, int(v), f"dim {i}") for i, v in enumerate(value))


@dataclasses.dataclass(frozen=True)
class ConvParams:
    """One convolution, validated and normalized.

    Direct (``transposed=False``): input ``(N, C_in, *S)``, weight ``(C_out, C_in/groups, *k)``,
    output ``(N, C_out, *O)`` with ``O = floor((S + pre + post - dilation*(k-1) - 1)/stride) + 1``.

    Transposed: input ``(N, C_in, *S)``, weight ``(C_in, C_out/groups, *k)``, output
    ``(N, C_out, *O)`` with ``O = (S-1)*stride - pre - post + dilation*(k-1) + output_padding + 1``.

    ``padding`` is one ``(pre, post)`` pair per spatial dim; every other field has one value per
    spatial dim. ``dtype`` is the canonical dtype name (see :mod:`xconv.dtypes`). ``deterministic``
    is False, True (run to run) or "batch_invariant" (see docs/semantics.md); ``workspace_limit`` the
    most scratch bytes the backend may use (None: no limit).
    """

    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    dtype: str = "float32"
    math: str = "keep_dtype"
    deterministic: bool | str = False
    workspace_limit: int | None = None

    @property
    def nd(self) -> int:
        """Number of spatial dims (1, 2 or 3)."""
        return len(self.input_shape) - 2

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight_shape[2:])

    @property
    def symmetric(self) -> bool:
        """True when every spatial dim is padded equally at both ends."""
        return all(pre == post for pre, post in self.padding)

    @property
    def bias_size(self) -> int:
        """Length of the bias: C_out (direct) or weight.shape[1] * groups (transposed)."""
        return self.output_shape[1]

    def replace(self, **changes) -> "ConvParams":
        return dataclasses.replace(self, **changes)

    def as_direct(self) -> "ConvParams":
        """The direct convolution whose data gradient is this transposed convolution.

        Its input has this convolution's output shape and its output has this input's shape,
        except where ``output_padding >= stride`` (allowed when ``output_padding < dilation``):
        there the direct output is longer, and its extra positions have no counterpart here.
        """
        if not self.transposed:
            return self
        out = self.output_shape
        direct_out = (self.input_shape[0], self.input_shape[1]) + tuple(
            direct_output_size(o, k, s, pad, d)
            for o, k, s, pad, d in zip(out[2:], self.kernel, self.stride, self.padding, self.dilation)
        )
        return self.replace(input_shape=out, output_shape=direct_out, transposed=False,
                            output_padding=(0,) * self.nd)


def direct_output_size(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int) -> int:
    """floor((size + pre + post - dilation*(kernel-1) - 1) / stride) + 1."""
    return (size + pad[0] + pad[1] - dilation * (kernel - 1) - 1) // stride + 1


def transposed_output_size(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int,
                           output_padding: int) -> int:
    """(size-1)*stride - pre - post + dilation*(kernel-1) + output_padding + 1."""
    return (size - 1) * stride - pad[0] - pad[1] + dilation * (kernel - 1) + output_padding + 1


# ---------------------------------------------------------------------------------------------
# Argument parsing


def _from_int_array(value):
    """An integer NumPy array as Python ints (nested lists); anything else unchanged."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value.tolist()
    return value


def per_dim(value, nd: int, name: str, minimum: int) -> tuple[int, ...]:
    """An int, or one int per spatial dim (a sequence or an integer array), each at least ``minimum``."""
    value = _from_int_array(value)
    if _is_int(value):
        values = (int(value),) * nd
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != nd or not all(_is_int(v) for v in value):
            raise ShapeError(name, f"must be an int or {nd} ints, one per spatial dim",
                             expected=f"{nd} ints", given=repr(value))
        values = tuple(int(v) for v in value)
    else:
        raise ShapeError(name, "must be an int or a sequence of ints", expected=f"int or {nd} ints",
                         given=repr(value))
    for axis, v in enumerate(values):
        _fits(name, v, f"spatial dim {axis} ({spatial_names(nd)[axis]})")
        if v < minimum:
            raise ShapeError(name, f"must be >= {minimum}", dim=f"spatial dim {axis} ({spatial_names(nd)[axis]})",
                             expected=f">= {minimum}", given=v)
    return values


def _same_padding(size: int, kernel: int, stride: int, dilation: int, lower: bool) -> tuple[int, int]:
    """ONNX SAME_UPPER (extra at the end) or SAME_LOWER: output = ceil(size / stride)."""
    out = -(-size // stride)
    total = (out - 1) * stride + dilation * (kernel - 1) + 1 - size
    total = total if total > 0 else 0         # max(total, 0), written so that a symbolic size is guarded once
    small, large = total // 2, total - total // 2
    return (large, small) if lower else (small, large)


def string_padding(value: str, spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                   dilation: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The (pre, post) pairs of an already validated padding string ("valid", "full", "same", "same_lower").

    Integer arithmetic only (no int() conversions, no type checks), so the same formulas also run on
    symbolic sizes (PyTorch's SymInt under torch.compile), where a comparison becomes a guard.
    """
    if value == "valid":
        return tuple((0, 0) for _ in kernel)
    if value == "full":
        return tuple((d * (k - 1), d * (k - 1)) for k, d in zip(kernel, dilation))
    return tuple(_same_padding(s, k, st, d, value == "same_lower")
                 for s, k, st, d in zip(spatial, kernel, stride, dilation))


def parse_padding(value, nd: int, spatial: Sequence[int], kernel: Sequence[int], stride, dilation,
                  transposed: bool) -> tuple[tuple[int, int], ...]:
    """Normalize ``padding`` to one (pre, post) pair per spatial dim.

    Accepted: an int; one int per dim (symmetric); one (pre, post) pair per dim; "valid";
    "same" / "same_lower" (direct convolution only: output = ceil(input / stride)); "full"
    (each side ``dilation*(k-1)``: every position where the kernel overlaps the input).
    """
    value = _from_int_array(value)
    if isinstance(value, str):
        if value not in PADDING_STRINGS:
            raise ShapeError("padding", "unknown padding string", expected=" or ".join(map(repr, PADDING_STRINGS)),
                             given=repr(value))
        if transposed and value.startswith("same"):
            raise ShapeError("padding", f"{value!r} is defined for direct convolution only; give explicit padding "
                                        "for transposed=True", expected="int, ints or (pre, post) pairs",
                             given=repr(value))
        return string_padding(value, spatial, kernel, stride, dilation)
    if _is_int(value):
        pairs = ((int(value), int(value)),) * nd
    elif isinstance(value, Sequence) and len(value) == nd and all(_is_int(v) for v in value):
        pairs = tuple((int(v), int(v)) for v in value)
    elif (isinstance(value, Sequence) and len(value) == nd
          and all(isinstance(v, Sequence) and len(v) == 2 and all(_is_int(x) for x in v) for v in value)):
        pairs = tuple((int(v[0]), int(v[1])) for v in value)
    else:
        raise ShapeError("padding", "unrecognized padding",
                         expected=f"an int, {nd} ints, {nd} (pre, post) pairs, or one of {PADDING_STRINGS}",
                         given=repr(value))
    for axis, (pre, post) in enumerate(pairs):
        _fits("padding", pre, f"spatial dim {axis} ({spatial_names(nd)[axis]})")
        _fits("padding", post, f"spatial dim {axis} ({spatial_names(nd)[axis]})")
        if pre < 0 or post < 0:
            raise ShapeError("padding", "must be >= 0", dim=f"spatial dim {axis} ({spatial_names(nd)[axis]})",
                             expected=">= 0", given=(pre, post))
    return pairs


# ---------------------------------------------------------------------------------------------
# Tensors


def tensor_shape(array, name: str) -> tuple[int, ...]:
    """The shape of an array argument, checked to be that of a 1-D to 3-D convolution tensor."""
    shape = getattr(array, "shape", None)
    if shape is None or getattr(array, "dtype", None) is None:
        raise ShapeError(name, "must be an array with .shape and .dtype", expected="an array",
                         given=type(array).__name__)
    shape = tuple(int(s) for s in shape)
    if not 3 <= len(shape) <= 5:
        raise ShapeError(name, "rank must be 3, 4 or 5 (N, C, then 1 to 3 spatial dims)", expected="3, 4 or 5",
                         given=len(shape))
    return shape


def common_dtype(arrays: dict) -> str:
    """The one supported floating dtype shared by all named arrays (None entries skipped)."""
    first_name, first = None, None
    for name, array in arrays.items():
        if array is None:
            continue
        if getattr(array, "dtype", None) is None or getattr(array, "shape", None) is None:
            raise ShapeError(name, "must be an array with .shape and .dtype", expected="an array",
                             given=type(array).__name__)
        dname = dtype_name(array.dtype)
        if dname is None:
            raise DTypeError(name, "dtype must be float16, bfloat16, float32 or float64",
                             expected="a floating dtype", given=str(array.dtype))
        if first is None:
            first_name, first = name, dname
        elif dname != first:
            raise DTypeError(name, f"dtype differs from {first_name}'s", expected=first, given=dname)
    return first


def check_output_mask(mask) -> tuple[bool, bool, bool]:
    if type(mask) is tuple and len(mask) == 3 and all(type(b) is bool for b in mask):
        return mask                                         # already what the checks below return
    if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.ndim == 1:
        mask = mask.tolist()
    if (not isinstance(mask, Sequence) or isinstance(mask, str) or len(mask) != 3
            or not all(_is_bool(b) for b in mask)):
        raise ShapeError("output_mask", "must be three booleans (grad_input, grad_weight, grad_bias)",
                         expected="(bool, bool, bool)", given=repr(mask))
    return tuple(bool(b) for b in mask)


def check_math(math: str) -> str:
    if math not in MATH_MODES:
        raise ShapeError("math", "unknown math mode", expected=" or ".join(map(repr, MATH_MODES)), given=repr(math))
    return math


def check_deterministic(value) -> bool | str:
    """False, True or "batch_invariant" (numpy bools accepted as bools)."""
    if isinstance(value, str):
        if value == "batch_invariant":
            return value
        raise ShapeError("deterministic", "unknown determinism level", expected="False, True or 'batch_invariant'",
                         given=repr(value))
    if not _is_bool(value):
        raise ShapeError("deterministic", "must be a bool or 'batch_invariant'",
                         expected="False, True or 'batch_invariant'", given=repr(value))
    return bool(value)


def check_flag(value, name: str) -> bool:
    if not _is_bool(value):
        raise ShapeError(name, "must be a bool", expected="True or False", given=repr(value))
    return bool(value)


# ---------------------------------------------------------------------------------------------
# The convolution


def make_params(input_shape, weight_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
                output_padding=0, dtype="float32", math="keep_dtype", deterministic=False, workspace_limit=None,
                input_name="input", weight_name="weight") -> ConvParams:
    """Check one convolution's shapes and parameters and return them normalized.

    ``input_shape`` is the convolution's input (for transposed, the transposed convolution's
    input), ``weight_shape`` its weight. Raises :class:`ShapeError` naming the first problem.
    """
    input_shape = shape_arg(input_shape, input_name)
    weight_shape = shape_arg(weight_shape, weight_name)
    transposed = check_flag(transposed, "transposed")
    if not 3 <= len(input_shape) <= 5:
        raise ShapeError(input_name, "rank must be 3, 4 or 5 (N, C, then 1 to 3 spatial dims)",
                         expected="3, 4 or 5", given=len(input_shape))
    nd = len(input_shape) - 2
    if len(weight_shape) == len(input_shape) + 1 and len(weight_shape) <= 5:
        raise ShapeError(input_name, f"lacks its batch dimension: rank {len(input_shape)} against "
                                     f"{weight_name}'s rank {len(weight_shape)} (add one, e.g. x[None])",
                         expected=f"rank {len(weight_shape)} (N, C, *spatial)", given=f"shape {input_shape}")
    if len(weight_shape) != len(input_shape):
        raise ShapeError(weight_name, f"rank must equal {input_name}'s rank", expected=len(input_shape),
                         given=len(weight_shape))
    for axis, size in enumerate(input_shape):
        if size < 0 or (axis >= 2 and size == 0):
            raise ShapeError(input_name, "spatial size must be >= 1 (only N and C may be 0)" if axis >= 2
                             else "size must be >= 0", dim=_dim_label(axis, nd, "C_in"),
                             expected=">= 1" if axis >= 2 else ">= 0", given=size)
    for axis, size in enumerate(weight_shape):
        if size < 0 or (axis >= 2 and size == 0):
            raise ShapeError(weight_name, "kernel size must be >= 1" if axis >= 2 else "size must be >= 0",
                             dim=f"dim {axis}", expected=">= 1" if axis >= 2 else ">= 0", given=size)
    if not _is_int(groups) or groups < 1:
        raise ShapeError("groups", "must be an int >= 1", expected=">= 1", given=repr(groups))
    groups = _fits("groups", int(groups))
    stride = per_dim(stride, nd, "stride", 1)
    dilation = per_dim(dilation, nd, "dilation", 1)
    output_padding = per_dim(output_padding, nd, "output_padding", 0)
    kernel = weight_shape[2:]
    spatial = input_shape[2:]
    padding = parse_padding(padding, nd, spatial, kernel, stride, dilation, transposed)

    c_in = input_shape[1]
    if c_in % groups:
        raise ShapeError("groups", f"must divide {input_name}'s channel count (dim 1)",
                         expected=f"a divisor of {c_in}", given=groups)
    if weight_shape[0] % groups:
        raise ShapeError("groups", f"must divide {weight_name}'s dim 0", expected=f"a divisor of {weight_shape[0]}",
                         given=groups)
    blame_input = input_name.endswith("_shape") and not weight_name.endswith("_shape")  # the one the user spelled
    if transposed:
        if weight_shape[0] != c_in:
            if blame_input:
                raise ShapeError(input_name, f"dim 1 (C_in) must equal {weight_name}'s dim 0 for transposed=True "
                                             "(weight is (C_in, C_out/groups, *k))", expected=weight_shape[0], given=c_in)
            raise ShapeError(weight_name, f"dim 0 must equal {input_name}'s channels for transposed=True "
                                          "(weight is (C_in, C_out/groups, *k))", expected=c_in, given=weight_shape[0])
        c_out = weight_shape[1] * groups
    else:
        if weight_shape[1] * groups != c_in:
            if blame_input:
                raise ShapeError(input_name, f"dim 1 (C_in) must be {weight_name}'s dim 1 times groups "
                                             "(weight is (C_out, C_in/groups, *k))",
                                 expected=weight_shape[1] * groups, given=c_in)
            raise ShapeError(weight_name, "dim 1 must be C_in / groups (weight is (C_out, C_in/groups, *k))",
                             expected=c_in // groups, given=weight_shape[1])
        c_out = weight_shape[0]

    out_spatial = []
    for axis in range(nd):
        name = spatial_names(nd)[axis]
        s, k, d, pad, op, size = stride[axis], kernel[axis], dilation[axis], padding[axis], \
            output_padding[axis], spatial[axis]
        if not transposed:
            if op != 0:
                raise ShapeError("output_padding", "must be 0 when transposed=False", dim=f"spatial dim {axis} ({name})",
                                 expected=0, given=op)
            if size + pad[0] + pad[1] < d * (k - 1) + 1:
                raise ShapeError(input_name, "padded size is smaller than the dilated kernel",
                                 dim=f"{_dim_label(axis + 2, nd, 'C_in')}",
                                 expected=f"{name} + pre + post >= dilation*(k-1)+1 = {d * (k - 1) + 1}",
                                 given=f"{size} + {pad[0]} + {pad[1]} = {size + pad[0] + pad[1]}")
            out_spatial.append(direct_output_size(size, k, s, pad, d))
        else:
            if op >= s and op >= d:
                raise ShapeError("output_padding", "must be smaller than stride or dilation",
                                 dim=f"spatial dim {axis} ({name})", expected=f"< {max(s, d)}", given=op)
            out = transposed_output_size(size, k, s, pad, d, op)
            if out < 1:
                raise ShapeError("padding", "makes the transposed output empty", dim=f"spatial dim {axis} ({name})",
                                 expected=f"pre + post <= {out + pad[0] + pad[1] - 1}", given=pad)
            out_spatial.append(out)
    output_shape = (input_shape[0], c_out, *out_spatial)
    _check_sizes(input_name, input_shape, weight_name, weight_shape, output_shape, padding, dtype)
    return ConvParams(input_shape=input_shape, weight_shape=weight_shape, output_shape=output_shape, stride=stride,
                      padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                      output_padding=output_padding, dtype=dtype, math=check_math(math),
                      deterministic=check_deterministic(deterministic),
                      workspace_limit=workspace.resolve_limit(workspace_limit))


def _check_sizes(input_name, input_shape, weight_name, weight_shape, output_shape, padding, dtype) -> None:
    """Every tensor's element and byte count must fit int64, and so must every padded size (the padded
    input is a size vendor libraries compute; its product is never materialized unless the memory
    guard allows it). Else ResourceError."""
    itemsize = DTYPES[dtype].itemsize if dtype in DTYPES else 8
    for what, shape in ((input_name, input_shape), (weight_name, weight_shape), ("output", output_shape)):
        if max(shape) > INT64_MAX or math.prod(shape) * itemsize > INT64_MAX:
            raise ResourceError(f"{what} of shape {shape}", math.prod(shape) * itemsize, None,
                                "its size does not fit a signed 64-bit integer")
    for axis, (n, (a, b)) in enumerate(zip(input_shape[2:], padding)):
        _fits("padding", n + a + b, f"spatial dim {axis}: {input_name} size + pre + post")


def check_grad_output(params: ConvParams, shape: tuple[int, ...], name: str = "grad_output",
                      blame=None) -> None:
    """Raise ShapeError at the first dim where ``shape`` differs from the convolution's output.

    ``blame(axis)``, when given, names the argument held responsible for a mismatch at ``axis`` (say
    ``input_shape`` for conv_dgrad, whose output shape follows from it); by default ``name``.
    """
    if len(shape) != len(params.output_shape):
        raise ShapeError(name, "rank must equal input's rank", expected=len(params.output_shape), given=len(shape))
    for axis, (want, got) in enumerate(zip(params.output_shape, shape)):
        if want != got:
            culprit = blame(axis) if blame is not None else name
            if culprit == name:
                raise ShapeError(name, "does not match the convolution's output shape "
                                       f"{params.output_shape}", dim=_dim_label(axis, params.nd, "C_out"),
                                 expected=want, given=got)
            raise ShapeError(culprit, f"gives the output shape {params.output_shape}, which {name}'s shape "
                                      f"{tuple(shape)} contradicts", dim=_dim_label(axis, params.nd, "C_out"),
                             expected=got, given=want)


def check_bias_sizes(params: ConvParams, bias_sizes) -> None:
    if bias_sizes is None:
        return
    bias_sizes = _from_int_array(bias_sizes)
    if (not isinstance(bias_sizes, Sequence) or isinstance(bias_sizes, str) or len(bias_sizes) != 1
            or not _is_int(bias_sizes[0]) or int(bias_sizes[0]) != params.bias_size):
        what = "[weight.shape[1] * groups]" if params.transposed else "[weight.shape[0]]"
        raise ShapeError("bias_sizes", f"must be {what}", expected=[params.bias_size], given=repr(bias_sizes))


def output_shape(input_shape, weight_shape, *, stride=1, padding=0, dilation=1, groups=1, transposed=False,
                 output_padding=0) -> tuple[int, ...]:
    """The output shape of a convolution (or transposed convolution) as a tuple; raises ShapeError if invalid."""
    return make_params(input_shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
                       transposed=transposed, output_padding=output_padding).output_shape
