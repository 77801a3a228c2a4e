"""xconv_numpy.definition, the four sums written out (pad, then one einsum per kernel tap), as an oracle.

Truths: hand-worked sums; PyTorch CPU (float64 functional convolutions and autograd); and numpy-exact,
which must agree with the definition to ~1e-12 over a seeded sweep and the corpus's small cases.
"""

import numpy as np
import pytest

import xconv
from xconv.params import make_params
from xconv_numpy import definition as D


def _p(x, w, **kw):
    return make_params(np.shape(x), np.shape(w), dtype="float64", **kw)


def test_hand_worked_1d():
    x, w = np.array([[[1.0, 2, 3, 4]]]), np.array([[[1.0, -1]]])
    p = _p(x, w)
    assert D.fprop(x, w, None, p).tolist() == [[[-1, -1, -1]]]
    assert D.fprop(x, w, np.array([10.0]), p).tolist() == [[[9, 9, 9]]]
    dy = np.ones((1, 1, 3))
    assert D.dgrad(dy, w, p).tolist() == [[[1, 0, 0, -1]]]          # dx[c] = sum over the taps touching it
    assert D.wgrad(x, dy, p).tolist() == [[[1 + 2 + 3, 2 + 3 + 4]]]
    assert D.bgrad(dy, p).tolist() == [3]
    # stride 2, dilation 2, padding (1, 2): x_pad = [0, 1, 2, 3, 4, 0, 0]; taps read x_pad[2i] and x_pad[2i+2]
    p = _p(x, w, stride=2, dilation=2, padding=((1, 2),))
    assert D.fprop(x, w, None, p).tolist() == [[[0 - 2, 2 - 4, 4 - 0]]]
    assert D.dgrad(np.array([[[1.0, 10, 100]]]), w, p).tolist() == [[[0, -1 + 10, 0, -10 + 100]]]
    assert D.wgrad(x, np.array([[[1.0, 10, 100]]]), p).tolist() == [[[0 + 20 + 400, 2 + 40 + 0]]]


def test_hand_worked_groups_and_transposed():
    x = np.array([[[1.0, 2], [3, 4]]])                             # 2 channels, 2 groups: each its own weight
    w = np.array([[[10.0]], [[100.0]]])
    assert D.fprop(x, w, None, _p(x, w, groups=2)).tolist() == [[[10, 20], [300, 400]]]
    x, w = np.array([[[1.0, 2]]]), np.array([[[1.0, 10]]])          # transposed, stride 2: the windows placed
    p = _p(x, w, stride=2, transposed=True)
    assert D.fprop(x, w, None, p).tolist() == [[[1, 10, 2, 20]]]
    p = _p(x, w, stride=2, transposed=True, padding=((1, 0),), output_padding=1)   # crop 1 in front, 1 more behind
    assert D.fprop(x, w, None, p).tolist() == [[[10, 2, 20, 0]]]
    dy = np.array([[[1.0, 2, 3, 4]]])
    assert D.dgrad(dy, w, p).tolist() == [[[0 * 1 + 1 * 10, 2 * 1 + 3 * 10]]]   # dy_pad = [0, 1, 2, 3, 4]
    assert D.wgrad(x, dy, p).tolist() == [[[1 * 0 + 2 * 2, 1 * 1 + 2 * 3]]]


def _random_case(rng):
    nd = int(rng.integers(1, 4))
    g = int(rng.integers(1, 3))
    c_in, c_out = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
    k, s, d = (tuple(int(v) for v in rng.integers(lo, hi, nd)) for lo, hi in ((1, 4), (1, 3), (1, 3)))
    transposed = bool(rng.integers(0, 2))
    conv = dict(stride=s, dilation=d, groups=g, transposed=transposed,
                padding=tuple((int(a), int(b)) for a, b in rng.integers(0, 3, (nd, 2))),
                output_padding=tuple(int(rng.integers(0, max(a, b))) for a, b in zip(s, d)) if transposed else 0)
    x = rng.standard_normal((2, c_in, *rng.integers(4, 8, nd)))
    w = rng.standard_normal((c_in, c_out // g, *k) if transposed else (c_out, c_in // g, *k))
    return x, w, conv


def _definition(x, w, dy, bias, p):
    return D.fprop(x, w, bias, p), D.dgrad(dy, w, p), D.wgrad(x, dy, p), D.bgrad(dy, p)


def _numpy_exact(x, w, dy, bias, conv):
    y = xconv.conv_fprop(x, w, bias=bias, backend="numpy-exact", **conv)
    return (y, *xconv.convolution_backward(dy, x, w, bias_sizes=(bias.size,), backend="numpy-exact", **conv))


def _close(got, want, tol=1e-12):
    for name, a, b in zip(("y", "dx", "dw", "db"), got, want):
        assert a.shape == b.shape and a.dtype == np.float64, name
        scale = max(1.0, float(np.abs(b).max(initial=0)))
        assert float(np.abs(a - b).max(initial=0)) <= tol * scale, name


def test_agrees_with_numpy_exact_over_a_seeded_sweep():
    rng = np.random.default_rng(23)
    checked = 0
    while checked < 80:
        x, w, conv = _random_case(rng)
        try:
            p = _p(x, w, **conv)
        except xconv.ShapeError:                       # an empty output: draw again
            continue
        dy, bias = rng.standard_normal(p.output_shape), rng.standard_normal(p.bias_size)
        _close(_definition(x, w, dy, bias, p), _numpy_exact(x, w, dy, bias, conv))
        checked += 1


def test_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    checked = 0
    while checked < 40:
        x, w, conv = _random_case(rng)
        conv["padding"] = tuple(max(a) for a in conv["padding"])        # torch pads symmetrically
        try:
            p = _p(x, w, **conv)
        except xconv.ShapeError:
            continue
        dy, bias = rng.standard_normal(p.output_shape), rng.standard_normal(p.bias_size)
        tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
        if conv["transposed"]:
            fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[p.nd - 1]
            ty = fn(tx, tw, tb, stride=conv["stride"], padding=conv["padding"], dilation=conv["dilation"],
                    groups=conv["groups"], output_padding=conv["output_padding"])
        else:
            fn = (F.conv1d, F.conv2d, F.conv3d)[p.nd - 1]
            ty = fn(tx, tw, tb, stride=conv["stride"], padding=conv["padding"], dilation=conv["dilation"],
                    groups=conv["groups"])
        ty.backward(torch.tensor(dy))
        want = [t.detach().numpy() for t in (ty, tx.grad, tw.grad, tb.grad)]
        _close(_definition(x, w, dy, bias, p), want)
        checked += 1


def _small_corpus_geometries():
    cases = pytest.importorskip("xconv_conformance.cases")
    seen = {}
    for case in cases.load_corpus():
        if case.kind != "valid" or np.prod(case.input_shape) * np.prod(case.kernel) > 20000:
            continue
        kw = case.conv_kwargs()
        geometry = (case.input_shape, case.weight_shape, repr(kw))
        seen.setdefault(geometry, case)
    return list(seen.values())


def test_agrees_with_numpy_exact_on_the_corpus_small_cases():
    geometries = _small_corpus_geometries()
    assert len(geometries) >= 20
    rng = np.random.default_rng(7)
    for case in geometries:
        conv = case.conv_kwargs()
        x, w = rng.standard_normal(case.input_shape), rng.standard_normal(case.weight_shape)
        p = make_params(x.shape, w.shape, dtype="float64", **conv)
        dy, bias = rng.standard_normal(p.output_shape), rng.standard_normal(p.bias_size)
        _close(_definition(x, w, dy, bias, p), _numpy_exact(x, w, dy, bias, conv))


def test_not_a_backend():
    assert all("definition" not in r.name for r in xconv.list_backends())


def test_semantics_quotes_the_module_as_it_is():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "semantics.md").read_text()
    source = (root / "backends" / "xconv_numpy" / "definition.py").read_text()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    quoted = [line.split("  #")[0].rstrip() for line in block.splitlines() if line.strip() not in ("", "...")]
    assert len(quoted) >= 10
    for line in quoted:
        assert line.strip() in source, line
