"""examples/train_digits.py, shortened: torch.nn and xconv training runs agree within the error bounds."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

from core_helpers import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install scikit-learn)")

from xconv_numpy import NumpyBackend  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_short_run_agrees_within_the_bounds(example):
    out = io.StringIO()
    rows, problems = example.main(["--epochs", "2", "--batch-size", "64"], out=out)
    text = out.getvalue()
    assert problems == [], text
    assert "agreement: the two runs agree within the bounds" in text
    assert len(rows) == 2 and rows[0]["steps"] == 23
    for r in rows:
        assert 0 < r["max_ratio"] <= 1.0  # the convolutions were checked, and within their bounds
        assert r["step_loss_diff"] <= r["step_loss_allowed"]
        assert r["unexplained_flips"] == 0
        assert abs(r["loss_xconv"] - r["loss_torch"]) <= r["step_loss_allowed"]
    assert rows[1]["loss_torch"] < rows[0]["loss_torch"]  # it does learn
    assert rows[1]["acc_torch"] > 0.5


def test_the_model_really_runs_on_xconv(example):
    import xconv.torch as xt

    _, _, converted = example.make_models(0, "numpy")
    convs = [m for m in converted.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    assert len(convs) == 3 and all(type(m) in xt._EQUIVALENT.values() for m in convs)
    assert [m.groups for m in convs] == [1, 4, 1] and convs[2].transposed


class Skewed(NumpyBackend):
    """The NumPy backend with weight gradients off by one part in 10**4: far beyond float32 rounding."""

    def __init__(self):
        super().__init__()
        self.name = "skewed"

    def wgrad(self, x, dy, p):
        return super().wgrad(x, dy, p) * (1 + 1e-4)

    def backward(self, dy, x, w, p, mask):
        dx, dw, db = super().backward(dy, x, w, p, mask)
        return dx, None if dw is None else dw * (1 + 1e-4), db


def test_a_wrong_weight_gradient_is_caught(example):
    rows = example.run(epochs=1, batch_size=64, max_batches=3, backend=Skewed(), out=None)
    problems = example.agree(rows)
    assert rows[0]["max_ratio"] > 1.0
    assert any("differs from torch by" in p for p in problems), problems
