"""Conformance: bundles keep each case's trace record; compare and the HTML report say what ran; the
batch_invariant corpus cases catch a backend whose samples depend on the batch."""

import json
import zipfile

import numpy as np
import pytest

import xconv
from xconv_conformance import cli, runner
from xconv_conformance.cases import load_corpus
from xconv_numpy import NumpyBackend

CASES = {c.id: c for c in load_corpus()}


class BatchLeaky(NumpyBackend):
    """Claims batch invariance, but perturbs sample 0's grad_input in batches of more than one."""

    capabilities = xconv.Capabilities(transposed=False, batch_invariant=True)

    def __init__(self):
        super().__init__()
        self.name = "batch-leaky"

    def backward(self, dy, x, w, p, mask):
        dx, dw, db = super().backward(dy, x, w, p, mask)
        if dx is not None and dx.shape[0] > 1:
            dx[0].flat[0] = np.nextafter(dx[0].flat[0], np.inf)
        return dx, dw, db


@pytest.fixture
def leaky():
    b = BatchLeaky()
    xconv.register_backend(b)
    yield b.name
    xconv.unregister_backend(b.name)


def test_batch_invariant_cases_pass_on_numpy_and_catch_a_leak(leaky):
    case = CASES["batch_invariant/s2-f32"]
    good = runner.run_case(case, "numpy")
    assert good.status == "passed", good.message
    assert good.record["deterministic"] == "batch_invariant" and "per-sample" in good.record["path"]
    bad = runner.run_case(case, leaky)
    assert bad.status == "failed" and "grad_input of sample 0: differs from its batch-of-one result" in bad.message
    refused = runner.run_case(case, "cudnn")
    assert refused.status in ("refused", "unavailable")


def test_bundle_keeps_records_and_compare_names_the_path(tmp_path, capsys, leaky):
    a, b = str(tmp_path / "numpy.xcr"), str(tmp_path / "leaky.xcr")
    assert cli.main(["run", "--backend", "numpy", "--out", a, "--cases", "batch_invariant/s2-f32", "--no-progress"]) == 0
    assert cli.main(["run", "--backend", leaky, "--out", b, "--cases", "batch_invariant/s2-f32", "--no-progress"]) == 1
    with zipfile.ZipFile(a) as zf:
        (rec,) = json.loads(zf.read("manifest.json"))["cases"]
    assert rec["record"]["backend"] == "numpy" and rec["record"]["op"] == "backward"
    assert rec["record"]["path"].startswith("per-sample (batch_invariant)")
    capsys.readouterr()
    html = str(tmp_path / "cmp.html")
    cli.main(["compare", a, b, "--all", "--report", html])
    text = capsys.readouterr().out
    assert "ran: [A] numpy: per-sample (batch_invariant)" in text and "[B] batch-leaky:" in text
    page = open(html, encoding="utf-8").read()
    assert "ran (path / engine)" in page and "per-sample (batch_invariant)" in page
