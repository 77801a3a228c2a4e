"""Exact mode (xconv_conformance.exact): the fill rule keeps every partial sum exact, and every correct
backend here agrees with the reference, and with each other, bit for bit on every exact case."""

import itertools
import math

import numpy as np
import pytest

import xconv
from xconv_conformance import exact
from xconv_conformance.cases import CorpusError, _make_case, load_corpus, make_inputs
from xconv_conformance.runner import inputs_of, reference_of, run_case
from xconv_conformance.tolerance import reduction_lengths

EXACT = [c for c in load_corpus() if c.fill == "exact"]


def test_the_exact_group_covers_every_dtype_rank_and_kind():
    assert {c.dtype for c in EXACT} == {"float16", "bfloat16", "float32", "float64"}
    assert {c.nd for c in EXACT} == {1, 2, 3}
    assert any(c.transposed for c in EXACT) and any(c.groups == c.c_in > 1 for c in EXACT)
    assert {c.layout for c in EXACT} == {"contiguous", "channels_last", "strided"}


@pytest.mark.parametrize("case", EXACT, ids=[c.id for c in EXACT])
def test_every_partial_sum_is_an_exact_integer(case):
    """The rule's premise, checked on the values: integers within [-m, m], and K * m**2 <= 2**p."""
    m = exact.magnitude(case.params)
    p = exact.significand_bits(case.dtype, case.math)
    assert m >= 1 and max(reduction_lengths(case.params).values()) * m * m <= 2 ** p
    inputs = make_inputs(case)
    for a in (inputs.grad_output, inputs.input, inputs.weight):
        v = a.astype(np.float64)
        assert np.array_equal(v, np.round(v)) and np.abs(v).max() <= m
        assert len(np.unique(v)) > 1                              # not all one value
    # the largest partial sum any order can form: the reference on |inputs| (all terms positive)
    ref = reference_of(case)
    for total in ref.abs_sum:
        assert np.abs(total).max() <= 2 ** p


def test_the_rule_per_dtype():
    assert [exact.significand_bits(d) for d in ("float16", "bfloat16", "float32", "float64")] == [11, 8, 24, 53]
    assert exact.significand_bits("float32", "allow_tf32") == 11
    raw = dict(n=2, c_in=4, c_out=4, dims=2, spatial=[7, 7], kernel=[3, 3], stride=[1, 1], padding=1,
               dilation=[1, 1], groups=1, transposed=False, output_padding=[0, 0], dtype="bfloat16",
               math="keep_dtype", mask="111", layout="contiguous", deterministic=False, bias_sizes=False)
    case = _make_case("t/bf16", "t", dict(raw, fill="exact"))
    assert exact.magnitude(case.params) == math.isqrt(256 // 98)       # K = 2*7*7 = 98: m = 1
    with pytest.raises(CorpusError, match="too large for an exact fill"):
        _make_case("t/big", "t", dict(raw, spatial=[12, 12], fill="exact"))     # K = 288 > 2**8
    assert exact.magnitude(_make_case("t/f32", "t", dict(raw, dtype="float32", fill="exact")).params) == 413


def test_numpy_numpy_exact_torch_jax_agree_bitwise_on_every_exact_case():
    rows = {r.name: r for r in xconv.list_backends()}
    backends = [b for b in ("numpy", "numpy-exact", "torch-cpu", "jax-cpu") if b in rows and rows[b].available]
    assert "numpy" in backends and "numpy-exact" in backends
    checked = 0
    for case in EXACT:
        results = {}
        for b in backends:
            out = run_case(case, b, keep_outputs=True)
            if out.status == "refused":
                continue
            assert out.status == "passed", (case.id, b, out.message)
            results[b] = out.outputs
        want = tuple(None if e is None else e for e in reference_of(case).exact)
        for b, outs in results.items():
            for name, got, ref, bit in zip(("grad_input", "grad_weight", "grad_bias"), outs, want, case.mask):
                if bit:
                    assert exact.mismatches(got, ref)[0] == 0, (case.id, b, name)
        for (a, oa), (b, ob) in itertools.combinations(results.items(), 2):
            for x, y in zip(oa, ob):
                if x is not None:
                    assert exact.pair_problems("", x, y) == 0, (case.id, a, b)
        checked += len(results)
    assert checked >= 4 * len(EXACT) - 8


def test_an_exact_case_round_trips_through_its_spec():
    from xconv_conformance.cases import case_from_spec
    for case in EXACT[:4] + [c for c in load_corpus() if c.kind == "valid"][:20]:
        again = case_from_spec(case.spec())
        assert again.digest == case.digest and again.fill == case.fill
        assert inputs_of(again).digest() == inputs_of(case).digest()
