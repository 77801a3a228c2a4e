"""The NumPy backends' results are bitwise those the manifest records.

``tests/data/numpy_digests.json`` holds, per build (numpy version, compiled loops' instruction set, BLAS kernel:
the bits depend on all three), a digest of every call of :mod:`numpy_digests` (the conformance corpus and a
seeded random set of configurations). History: issue 23 (the table of paths) was checked bitwise against commit
ce77a11; issue 24 then changed bits on purpose and regenerated the manifest: grad_bias has one summation order
(numpy: 519 of 1384 grad_bias outputs changed), and outputs whose path or chunks had depended on the mask, on a
workspace limit that excluded an unleased path, or on a NaN/inf in an input they do not read now take the full
call's (numpy: 264 of 2110 grad_weight, 138 of 1827 grad_input, 41 of 366 forward outputs, nearly all under a
limit or a partial mask); numpy-exact's digests did not change. Issue 25: calls of fewer than 2^24 multiply-adds
run on one worker (fast._share), so two random calls under a 4096-byte limit that two workers could not fit now
return results (whether such a call was refused had depended on the worker count); float32 depthwise calls with planes up to 32 wide
and channels a multiple of 16 run the loops across channels (depthwise_cv.py: 9 calls changed); strided calls count
x's columns, not dy's, for their input gradient on the small path when its compiled copies are built
(``small.elements``: small-cols computes dx as W^T @ dy in x's columns' shape), so 19 entries of 7 strided
configurations moved to small-cols (corpus/large/2d-T-s2-f32, 3d-16-T-bf16, 3d-T-f32; random 98, 109, 161, 233):
their gradients, the weight-gradient-only entries too (an output's path follows the full call's size rule), and
random 233's transposed forward (the dx of its direct call). Then colgemm and small-cols keep a NaN or an infinity
(their terms are the definition's: ``nonfinite="keeps"``, tests/test_numpy_finite.py) instead of detouring to the
columns path: 40 entries of 8 random configurations with a non-finite input changed, no other. The dense loops'
dy grid of interleaved rows (dense_plan.plan; its rows unpadded under a workspace limit, its samples per block counted
as before) holds no more than the channel-major one, often less (no margin per channel), so random 49's input
gradient under a 65536-byte limit (67648 bytes before: refused) now runs: 2 entries, no other (also none under the
AVX2 build, compared with the previous commit's); the corpus gained BLOCKED's weight gradients, whose samples the
dense loops take in blocks (4 entries, the previous commit's bits on both builds). Issue 25's fifteenth session: the
dense loops serve stride 2 at 16 and 48 input channels per group too (dense.serves: they lead the columns there), so
13 entries of 7 such configurations, all stride 2 with C_in/g = 16 or 48, moved to them (corpus batch_invariant/1d-s2,
s2, T-s2, large/2d-T-s2, 3d-16-T-bf16; random 6 and 290's gradients); no other entry changed. After an intended change,
regenerate with
``python tests/numpy_digests.py OUT.json --manifest tests/data/numpy_digests.json`` (it replaces this build's
entry) and say why in the commit. On a build the manifest does not list, the test skips and names the build.
"""

import json
from pathlib import Path

import pytest

import numpy_digests
from xconv_numpy import paths

MANIFEST = Path(__file__).parent / "data" / "numpy_digests.json"


def test_numpy_backends_are_bitwise_as_recorded():
    builds = json.loads(MANIFEST.read_text())["builds"]
    key = numpy_digests.build_key()
    if key not in builds:
        pytest.skip(f"digests depend on the build; the manifest has {sorted(builds)}, this machine is {key!r}")
    want = builds[key]
    with paths.without_cost_model():       # the cost model's picks (issue 25) change bits by design
        full = numpy_digests.compute()
    got = numpy_digests.compact(full)
    missing = sorted(set(want) - set(got))
    assert not missing, f"{len(missing)} calls of the manifest no longer run, e.g. {missing[:5]}"
    # calls added since (corpus cases added after ce77a11) have no digest to hold them to: only the manifest's count
    differ = sorted(k for k in want if got[k] != want[k])
    # Known, and not a change of bits: under a tight workspace_limit whether a call is refused depends on whether a
    # second worker thread got a chunk (and leased its scratch) before the first finished; ce77a11 does the same.
    racy = [k for k in differ if full["digests"][k] == ["raised UnsupportedError"] and k.split("|")[1].startswith(
        "random/") and numpy_digests.random_configs(400)[int(k.split("/")[1])]["workspace_limit"] is not None]
    differ = [k for k in differ if k not in racy]
    assert not differ, f"{len(differ)} of {len(want)} calls changed bits, e.g. {differ[:5]}"
