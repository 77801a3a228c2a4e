"""Exact mode: integer inputs for which every correct backend must agree bit for bit with the reference.

The idea is oneDNN benchdnn's: fill the tensors with small integers, so that every product and
every partial sum of every gradient element is an integer small enough to be represented exactly.
Then no summation order, blocking, algorithm choice (GEMM, direct loops, lowering to another
primitive) or accumulator width that the semantics allow changes a single bit: a backend that is
off by one unit anywhere is wrong, not "within the bound".

The fill rule. Let ``p`` be the significand bits (the implicit one included) of the narrowest
format the case's arithmetic may use:

    float16 11, bfloat16 8, float32 24 (11 under math="allow_tf32" or "allow_fp16": TF32 and
    float16 carry 11), float64 53.

Every integer of magnitude <= 2**p is exact in that format, and in every wider one. Each gradient
element is a sum of at most ``K`` products (:func:`.tolerance.reduction_lengths`: grad_input
C_out/groups * prod(kernel), grad_weight and grad_bias N * prod(the spatial dims the window slides
over)). With every input an integer in [-m, m], every partial sum, in any order, is an integer of
magnitude at most ``K * m**2``. So

    m = floor(sqrt(2**p / K_max)),   K_max the largest of the three K,

keeps every product, partial sum and result exact, even for a backend that accumulates in the
16-bit output format itself, and the one final rounding to the output dtype is exact too. A case
with ``K_max > 2**p`` cannot be filled this way (m would be 0) and is refused as a corpus error: for
bfloat16 that is K <= 256, for float16 K <= 2048, for float32 K <= 2**24.

The values come from the case's PCG64 stream like every input (:func:`.cases.values`): the raw
64-bit words modulo 2m+1, minus m, so every machine builds the same integers.

Agreement is judged on values: every element must equal the reference exactly, except that +0.0 and
-0.0 are equal (a sum of signed zeros legitimately depends on the order; benchdnn ignores the sign
of zero too). Bundles in exact mode must also agree with each other exactly.
"""

from __future__ import annotations

import math

import numpy as np

from xconv.dtypes import DTYPES

from . import tolerance

#: significand bits, the implicit one included, of each format a case's arithmetic may use
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53, "tf32": 11}


def significand_bits(dtype: str, math_mode: str = "keep_dtype") -> int:
    """p of the fill rule: the narrowest format the case's products and sums may be held in."""
    if dtype == "float32" and math_mode != "keep_dtype":
        return SIGNIFICAND_BITS["tf32"]
    return SIGNIFICAND_BITS[dtype]


def magnitude(params) -> int:
    """m: the largest input magnitude for which every partial sum stays exact (0: the case cannot be filled)."""
    k_max = max(tolerance.reduction_lengths(params).values())
    return math.isqrt((1 << significand_bits(params.dtype, params.math)) // k_max)


def check_fillable(case) -> None:
    """CorpusError when ``case`` is too large for an exact fill (its K exceeds 2**p)."""
    if case.kind != "valid":
        return
    if magnitude(case.params) < 1:
        from .cases import CorpusError
        k = tolerance.reduction_lengths(case.params)
        raise CorpusError(f"case {case.id}: too large for an exact fill in {case.dtype} (math {case.math}): "
                          f"the longest sum has {max(k.values())} terms, more than 2**"
                          f"{significand_bits(case.dtype, case.math)}")


def exact_values(case, name: str, shape) -> np.ndarray:
    """Tensor ``name`` of exact case ``case``: integers in [-m, m] from the case's PCG64 stream, in its dtype."""
    from .cases import _seed
    shape = tuple(int(s) for s in shape)
    m = max(magnitude(case.params), 1)
    raw = np.random.PCG64(_seed(case.id, name)).random_raw(math.prod(shape))
    ints = (raw % np.uint64(2 * m + 1)).astype(np.int64) - m
    return ints.astype(np.float64).astype(DTYPES[case.dtype]).reshape(shape)


def mismatches(got: np.ndarray, exact: np.ndarray) -> tuple[int, tuple | None]:
    """(how many elements of ``got`` differ in value from ``exact`` (float64; +0 == -0, NaN never equal), the
    index of the first)."""
    g = np.asarray(got).astype(np.float64)
    bad = ~(g == np.asarray(exact, dtype=np.float64))
    count = int(np.count_nonzero(bad))
    if not count:
        return 0, None
    return count, tuple(int(i) for i in np.argwhere(bad)[0])


def problems(name: str, got: np.ndarray, exact: np.ndarray) -> list[str]:
    """The exact-mode verdict on one output, as problem lines (none when it agrees)."""
    count, idx = mismatches(got, exact)
    if not count:
        return []
    g = float(np.asarray(got).astype(np.float64)[idx])
    e = float(np.asarray(exact, dtype=np.float64)[idx])
    return [f"{name}: exact mode: {count} of {np.asarray(got).size} elements differ from the exact integer result; "
            f"first at {idx}: got {g!r}, exact {e!r}"]


def pair_problems(name: str, a: np.ndarray, b: np.ndarray) -> int:
    """How many elements two results of an exact case differ in (value, +0 == -0)."""
    return int(np.count_nonzero(~(np.asarray(a).astype(np.float64) == np.asarray(b).astype(np.float64))))
