"""The error-bound tolerance model (see docs/conformance.md for the derivation).

Every gradient element is a sum of K products. For each element the kit knows the exact
value ``exact`` (the float64 oracle on the case's inputs) and the sum of the absolute values
of its products ``A`` (the same oracle on |grad_output|, |input|, |weight|). A result ``got``
passes when

    |got - exact| <= gamma(K + 2, u_c) * A * (1 + u_out) + u_out * |exact|      (computation, final cast)
                     + gamma(K + 1, 2**-53) * A                              (the oracle's own rounding)
                     + (K + 2) * eta_c + eta_out                            (underflow floor)

with ``gamma(n, u) = min(n*u/(1 - n*u), exp(LAMBDA*sqrt(n)*u + n*u**2/(1 - u)) - 1)``: the smaller
of the worst-case bound of any summation order (Higham 2002, Lemma 3.1) and Higham and Mary's
probabilistic bound (2019, Theorem 3.1: it holds for any summation order with probability at
least 1 - 2n exp(-LAMBDA**2 (1-u)**2 / 2) when rounding errors are independent and of mean zero),
``u_c`` the unit roundoff of the compute precision (float32 for 16-bit and float32 inputs, float64
for float64, 2**-11 for float32 under math="allow_tf32" or "allow_fp16"), ``u_out`` that of the
output dtype (the one final rounding) and ``eta`` the smallest subnormal. So the constant of the issue, c, is min(K + 2, LAMBDA*sqrt(K + 2))
(to first order): the worst case up to K = 62, LAMBDA*sqrt(K + 2) beyond.
"""

from __future__ import annotations

import math

import numpy as np

from xconv.dtypes import UNIT_ROUNDOFF, accumulation_dtype

#: The probabilistic bound's lambda: failure probability <= 2n exp(-32) ~ 2.5e-14 n per element.
LAMBDA = 8.0

#: Unit roundoff of the precision that products and sums may be computed in, per math mode.
MATH_ROUNDOFF = {"keep_dtype": 0.0, "allow_tf32": UNIT_ROUNDOFF["tf32"], "allow_fp16": UNIT_ROUNDOFF["float16"]}

#: Smallest positive subnormal of each dtype: the absolute error of an underflowing operation.
ETA = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 2.0**-1074}
_MATH_ETA = {"keep_dtype": 0.0, "allow_tf32": ETA["float32"], "allow_fp16": ETA["float16"]}

U_REFERENCE = UNIT_ROUNDOFF["float64"]

OUTPUTS = ("grad_input", "grad_weight", "grad_bias")


def compute_roundoff(dtype: str, math_mode: str = "keep_dtype") -> float:
    """u_c: the unit roundoff of the precision the products are summed in.

    xconv's semantics (docs/semantics.md): 16-bit and float32 inputs accumulate in float32,
    float64 in float64, and the result is rounded once to the dtype of the inputs; ``math``
    lets a backend lower the precision of float32 work only (TF32/HF32 or float16, both with
    unit roundoff 2**-11), and changes nothing for other dtypes.
    """
    u = UNIT_ROUNDOFF[accumulation_dtype(dtype).name]
    if dtype == "float32":
        u = max(u, MATH_ROUNDOFF[math_mode])
    return u


def _compute_eta(dtype: str, math_mode: str) -> float:
    eta = ETA[accumulation_dtype(dtype).name]
    if dtype == "float32":
        eta = max(eta, _MATH_ETA[math_mode])
    return eta


def gamma_probabilistic(n, u: float, lam: float = LAMBDA):
    """exp(lam*sqrt(n)*u + n*u^2/(1-u)) - 1 (Higham and Mary 2019, Theorem 3.1)."""
    n = np.asarray(n, dtype=np.float64)
    return np.expm1(lam * np.sqrt(n) * u + n * u * u / (1.0 - u))


def gamma_deterministic(n, u: float):
    """n*u / (1 - n*u) (Higham 2002, Lemma 3.1): the worst case over every summation order; inf when n*u >= 1."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(n * u < 1.0, n * u / np.maximum(1.0 - n * u, 0.0), np.inf)


def gamma(n, u: float, lam: float = LAMBDA):
    """The relative error bound of an n-factor sum of products: the smaller of the worst-case and probabilistic bounds.

    The worst-case bound is the smaller one up to n ~ lam**2 = 64, so short reductions get a
    rigorous bound and long ones the probabilistic one (which does not grow like n).
    """
    return np.minimum(gamma_deterministic(n, u), gamma_probabilistic(n, u, lam))


def c_constant(k: int, u: float = UNIT_ROUNDOFF["float32"]) -> float:
    """The constant c of ``|error| <= c * u * A`` for a K-term reduction: ~ min(K + 2, LAMBDA * sqrt(K + 2))."""
    return float(gamma(k + 2, u)) / u


def reduction_lengths(params) -> dict[str, int]:
    """K, the number of products summed into one element of each gradient (at most), for ConvParams ``params``.

    grad_input: C_out/groups * prod(kernel); grad_weight: N * prod(the spatial dims that dy and
    the weight's window slide over: the output for direct, the input for transposed);
    grad_bias: N * prod(output spatial).
    """
    n = params.input_shape[0]
    c_out_per_group = params.output_shape[1] // params.groups
    k_in = c_out_per_group * math.prod(params.kernel)
    slide = params.input_shape[2:] if params.transposed else params.output_shape[2:]
    return {"grad_input": max(k_in, 1), "grad_weight": max(n * math.prod(slide), 1),
            "grad_bias": max(n * math.prod(params.output_shape[2:]), 1)}


def bound(exact: np.ndarray, abs_sum: np.ndarray, k: int, dtype: str, math_mode: str = "keep_dtype") -> np.ndarray:
    """The per-element error bound (float64 array shaped like ``exact``); see the module docstring."""
    u_c = compute_roundoff(dtype, math_mode)
    u_out = UNIT_ROUNDOFF[dtype]
    eta_c = _compute_eta(dtype, math_mode)
    a = np.asarray(abs_sum, dtype=np.float64)
    e = np.abs(np.asarray(exact, dtype=np.float64))
    computed = float(gamma(k + 2, u_c)) * a * (1.0 + u_out) + u_out * e
    reference = float(gamma(k + 1, U_REFERENCE)) * a
    floor = (k + 2) * eta_c + ETA[dtype]
    return computed + reference + floor


def error_ratio(got: np.ndarray, exact: np.ndarray, bnd: np.ndarray) -> np.ndarray:
    """|got - exact| / bound per element (inf where got is not finite)."""
    g = np.asarray(got).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        r = np.abs(g - exact) / bnd
    return np.where(np.isfinite(g), r, np.inf)


def rounding_floor(exact: np.ndarray, bnd: np.ndarray, dtype: str) -> float:
    """The worst error/bound of the exactly rounded result (``exact`` rounded once to ``dtype``): what a
    perfect backend scores. For float16/bfloat16 the final rounding alone reaches ~1 where a result lies
    just above a power of two; a worst ratio at or below this floor is that rounding and nothing else."""
    from xconv.dtypes import DTYPES

    exact = np.asarray(exact, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = exact.astype(DTYPES[dtype])
    return worst(error_ratio(rounded, exact, bnd))[0]


def at_rounding_limit(ratio: float | None, floor: float | None) -> bool:
    """Whether a worst ratio is the final rounding's alone: no more than the floor, and the floor not negligible."""
    return ratio is not None and floor is not None and floor >= 0.05 and ratio <= floor * (1 + 1e-9)


def worst(ratio: np.ndarray) -> tuple[float, tuple | None]:
    """(max ratio, index of the worst element); (0.0, None) for an empty array."""
    if ratio.size == 0:
        return 0.0, None
    flat = int(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)))
    idx = np.unravel_index(flat, ratio.shape)
    return float(ratio[idx]) if not np.isnan(ratio[idx]) else math.inf, tuple(int(i) for i in idx)
