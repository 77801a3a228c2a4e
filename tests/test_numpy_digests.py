"""The NumPy backends' results are bitwise those of the commit the manifest was generated from.

``tests/data/numpy_digests_ce77a11.json`` holds, per build (numpy version, compiled loops' instruction set, BLAS
kernel: the bits depend on all three), a digest of every call of :mod:`numpy_digests` (the conformance corpus and
a seeded random set of configurations) as computed at commit ce77a11, before the backend was split into a table
of paths. On a build the manifest does not list, the test skips and says which build it found: add one by
running ``python tests/numpy_digests.py OUT.json --manifest tests/data/numpy_digests_ce77a11.json`` on a
checkout of ce77a11 on that machine.
"""

import json
from pathlib import Path

import pytest

import numpy_digests

MANIFEST = Path(__file__).parent / "data" / "numpy_digests_ce77a11.json"


def test_numpy_backends_are_bitwise_as_before_the_split():
    builds = json.loads(MANIFEST.read_text())["builds"]
    key = numpy_digests.build_key()
    if key not in builds:
        pytest.skip(f"digests depend on the build; the manifest has {sorted(builds)}, this machine is {key!r}")
    want = builds[key]
    got = numpy_digests.compact(numpy_digests.compute())
    assert set(got) == set(want)
    differ = sorted(k for k in want if got[k] != want[k])
    assert not differ, f"{len(differ)} of {len(want)} calls changed bits, e.g. {differ[:5]}"
