"""xconv.lanes: a repeated configuration skips the public call's per-call checks, with the public call's results,
bits and errors, and steps back to the public call whenever something it resolved could have changed."""

from __future__ import annotations

import numpy as np
import pytest

import xconv
from core_helpers import SpyBackend, registered
from xconv import lanes, torch_ops
from xconv.errors import BackendFailedError, XconvError


def _conf(padding=((1, 1), (1, 1)), stride=(1, 1), groups=1, transposed=False, backend="numpy", out_pad=(0, 0)):
    return torch_ops.Conf(stride, padding, (1, 1), groups, transposed, out_pad, False, "keep_dtype", backend)


def _arrays(n=2, c=4, h=6, co=8, k=3, groups=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, h), dtype=np.float32)
    w = rng.standard_normal((co, c // groups, k, k), dtype=np.float32)
    return x, w


MASKS = [(True, True, True), (False, True, True), (True, True, False), (True, False, False)]


def _opened(public_calls):
    """(conf, x, w) of a forward whose lane is open: called twice, one public call."""
    conf = _conf()
    x, w = _arrays()
    lanes.fprop(conf, x, w, None, conf.kwargs)
    lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop"]
    return conf, x, w


@pytest.fixture
def public_calls(monkeypatch):
    """Count the public calls the lanes make (a miss runs the public call; a hit does not)."""
    lanes.clear()
    calls = []
    for name in ("conv_fprop", "convolution_backward"):
        real = getattr(xconv, name)
        monkeypatch.setattr(xconv, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    yield calls
    lanes.clear()


def test_a_repeated_forward_runs_by_its_lane_with_the_public_bits(public_calls):
    conf = _conf()
    x, w = _arrays()
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    want = xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
    public_calls.clear()
    got = [lanes.fprop(conf, x, w, b, conf.kwargs) for _ in range(3)]
    assert public_calls == ["conv_fprop"]                # the first call only
    for y in got:
        assert y.dtype == want.dtype and np.array_equal(y, want)
    x2 = x * 2                                           # new values, same signature: still the lane
    assert np.array_equal(lanes.fprop(conf, x2, w, b, conf.kwargs), xconv.conv_fprop(x2, w, bias=b, **conf.kwargs()))


@pytest.mark.parametrize("mask", MASKS)
def test_a_repeated_backward_runs_by_its_lane_with_the_public_bits(mask, public_calls):
    conf = _conf(stride=(2, 2), groups=2)
    x, w = _arrays(groups=2)
    dy = np.random.default_rng(1).standard_normal((2, 8, 3, 3), dtype=np.float32)
    sizes = [8] if mask[2] else None
    want = xconv.convolution_backward(dy, x, w, bias_sizes=sizes, output_mask=mask, **conf.kwargs())
    public_calls.clear()
    for _ in range(3):
        got = lanes.backward(conf, dy, x, w, sizes, mask, conf.kwargs)
        for g, e in zip(got, want):
            assert (g is None) == (e is None) and (g is None or np.array_equal(g, e))
    assert public_calls == ["convolution_backward"]


def test_what_could_change_sends_the_call_back_through_the_public_call(public_calls, monkeypatch):
    conf, x, w = _opened(public_calls)
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "64MiB")           # the settings
    lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop"] * 2
    lanes.fprop(conf, x, w, None, conf.kwargs)                     # the lane opened again, for these settings
    assert public_calls == ["conv_fprop"] * 2
    with registered(SpyBackend("lanespy")):                        # the registry (registered, then unregistered)
        lanes.fprop(conf, x, w, None, conf.kwargs)
    lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop"] * 4
    lanes.fprop(conf, x[:1], w, None, conf.kwargs)                 # another input shape: its own lane
    assert public_calls == ["conv_fprop"] * 5
    other = _conf(padding=((2, 2), (2, 2)))                        # another configuration: its own lane
    lanes.fprop(other, x, w, None, other.kwargs)
    assert public_calls == ["conv_fprop"] * 6
    same = _conf()                                                 # an equal Conf made anew: the same lane
    lanes.fprop(same, x, w, None, same.kwargs)
    assert public_calls == ["conv_fprop"] * 6


def test_the_oldest_lane_makes_room(public_calls, monkeypatch):
    monkeypatch.setattr(lanes, "MAX_LANES", 2)
    x, w = _arrays()
    confs = [_conf(padding=((k, k), (k, k))) for k in range(3)]
    for conf in confs:                                             # three lanes opened: the first is dropped
        lanes.fprop(conf, x, w, None, conf.kwargs)
    assert len(lanes._lanes) == 2 and public_calls == ["conv_fprop"] * 3
    for conf in confs[1:]:
        lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop"] * 3
    lanes.fprop(confs[0], x, w, None, confs[0].kwargs)
    assert public_calls == ["conv_fprop"] * 4


def test_a_lowered_memory_guard_threshold_reaches_the_next_call(public_calls, monkeypatch):
    """The plan key holds limits.UNCHECKED_BYTES (tests and tools lower it to guard small calls): so do lanes."""
    from xconv import limits

    conf, x, w = _opened(public_calls)
    monkeypatch.setattr(limits, "UNCHECKED_BYTES", 0)
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1KiB")      # the guard refuses now, by name
    with pytest.raises(xconv.ResourceError):
        lanes.fprop(conf, x, w, None, conf.kwargs)
    monkeypatch.delenv("XCONV_MEMORY_LIMIT")
    lanes.fprop(conf, x, w, None, conf.kwargs)
    lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop"] * 4                 # guarded on every call while the threshold is 0


def test_an_open_trace_records_every_call(public_calls):
    conf = _conf()
    x, w = _arrays()
    lanes.fprop(conf, x, w, None, conf.kwargs)
    with xconv.trace() as tr:
        lanes.fprop(conf, x, w, None, conf.kwargs)
        lanes.fprop(conf, x, w, None, conf.kwargs)
    assert len(tr.records) == 2 and all(r.op == "fprop" for r in tr.records)


#: A backend that needs the core's rewrites: 1-D lifted, asymmetric padding made explicit, strided inputs copied.
NARROW = xconv.Capabilities(spatial_dims=frozenset({2, 3}), asymmetric_padding=frozenset(), strided=False)


@pytest.mark.parametrize("case", ["transposed", "asymmetric", "one-d", "strided-copy", "strided"])
def test_a_lane_legalizes_as_the_public_call(case, public_calls):
    """Where the core rewrites the call (the NumPy backend's transposed mapping; a narrow backend's 1-D lift,
    explicit padding, strided copy), the lane runs the same legalization: the public call's bits, forward and
    backward, for every mask."""
    x, w = _arrays()
    backend = "numpy" if case in ("transposed", "strided") else "narrow"
    conf = _conf(backend=backend)
    if case == "transposed":
        conf = _conf(transposed=True, stride=(2, 2), out_pad=(1, 1))
        w = np.ascontiguousarray(w.transpose(1, 0, 2, 3))
    elif case == "asymmetric":
        conf = _conf(padding=((0, 1), (1, 0)), backend=backend)
    elif case == "one-d":
        conf = torch_ops.Conf((1,), ((1, 1),), (1,), 1, False, (0,), False, "keep_dtype", backend)
        x, w = x[:, :, 0], w[:, :, 0]
    else:
        x = np.random.default_rng(2).standard_normal((2, 4, 6, 12), dtype=np.float32)[..., ::2]
    b = np.linspace(-1, 1, w.shape[1] * conf.groups if conf.transposed else w.shape[0], dtype=np.float32)
    with registered(SpyBackend("narrow", NARROW)):
        y = xconv.conv_fprop(x, w, bias=b, **conf.kwargs())
        dy = np.cos(np.arange(y.size, dtype=np.float32)).reshape(y.shape)
        want = {m: xconv.convolution_backward(dy, x, w, bias_sizes=[b.size], output_mask=m, **conf.kwargs())
                for m in MASKS}
        public_calls.clear()
        for _ in range(2):
            assert np.array_equal(lanes.fprop(conf, x, w, b, conf.kwargs), y)
            for m in MASKS:
                got = lanes.backward(conf, dy, x, w, [b.size], m, conf.kwargs)
                assert all((g is None and e is None) or np.array_equal(g, e) for g, e in zip(got, want[m]))
    assert public_calls == ["conv_fprop"] + ["convolution_backward"] * len(MASKS)     # the first calls only


@pytest.mark.parametrize("case", ["byte-swapped", "unaligned", "memory-limit"])
def test_no_lane_where_the_public_call_converts_or_guards(case, public_calls, monkeypatch):
    conf = _conf()
    x, w = _arrays()
    if case == "byte-swapped":      # host_ready converts it
        x = x.astype(x.dtype.newbyteorder(">"))
    elif case == "unaligned":
        raw = np.zeros(x.nbytes + 1, np.uint8)[1:]
        x = np.frombuffer(raw, np.float32).reshape(x.shape)
        assert not x.flags.aligned
    else:                           # the memory guard runs on every call
        monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1GiB")
    want = xconv.conv_fprop(x, w, **conf.kwargs())
    public_calls.clear()
    for _ in range(2):
        assert np.array_equal(lanes.fprop(conf, x, w, None, conf.kwargs), want)
    assert public_calls == ["conv_fprop"] * 2


class _Broken(SpyBackend):
    """Fine on the first call, then fails or returns a wrong shape: a lane's errors must be the public call's."""

    def __init__(self, name, failure):
        super().__init__(name)
        self.failure, self.n = failure, 0

    def fprop(self, x, w, bias, p):
        self.n += 1
        if self.n == 1:
            return super().fprop(x, w, bias, p)
        if self.failure == "raises":
            raise RuntimeError("device lost")
        return np.zeros((1,), x.dtype)


@pytest.mark.parametrize("failure", ["raises", "shape"])
def test_a_lane_raises_the_public_calls_error(failure, public_calls):
    x, w = _arrays()
    for route in ("public", "lane"):
        backend = _Broken(f"broken-{failure}", failure)
        conf = _conf(backend=backend.name)
        with registered(backend):
            lanes.fprop(conf, x, w, None, conf.kwargs)               # opens the lane
            with pytest.raises(XconvError) as info:
                if route == "public":
                    xconv.conv_fprop(x, w, **conf.kwargs())
                else:
                    lanes.fprop(conf, x, w, None, conf.kwargs)
        if route == "public":
            want = (type(info.value), str(info.value))
        else:
            assert (type(info.value), str(info.value)) == want
    if failure == "raises":
        assert want[0] is BackendFailedError


def test_an_unavailable_backend_is_refused_by_the_public_call(public_calls):
    class Flaky(SpyBackend):
        up = True

        def availability(self):
            return (self.up, "" if self.up else "the card went away")

    backend = Flaky("flaky")
    conf = _conf(backend="flaky")
    x, w = _arrays()
    with registered(backend):
        lanes.fprop(conf, x, w, None, conf.kwargs)
        lanes.fprop(conf, x, w, None, conf.kwargs)
        assert public_calls == ["conv_fprop"]
        backend.up = False
        with pytest.raises(XconvError, match="the card went away"):
            lanes.fprop(conf, x, w, None, conf.kwargs)


def test_an_availability_replaced_on_the_backend_object_is_asked_again(public_calls, monkeypatch):
    """A backend that keeps the base class's availability (always available) is not asked on a lane's calls, but one
    whose availability is then replaced on the object itself (a maintenance switch, a test's patch) is: its lane
    refuses, and the public call raises as it would for any call."""
    from xconv import registry

    conf, x, w = _opened(public_calls)
    backend = registry.get_backend("numpy")
    monkeypatch.setattr(backend, "availability", lambda: (False, "switched off for maintenance"), raising=False)
    with pytest.raises(XconvError, match="switched off for maintenance"):
        lanes.fprop(conf, x, w, None, conf.kwargs)
    assert public_calls == ["conv_fprop", "conv_fprop"]


def test_a_module_the_public_call_refuses_does_not_borrow_an_equal_valid_modules_lane():
    """groups=True and a float stride equal the valid values (and hash alike), but the public call refuses them: a
    Conf holding them is not exact, takes no lane, and its module is refused on every call, whatever ran before."""
    torch = pytest.importorskip("torch")
    import torch.nn as nn

    import xconv.torch as xt

    x = torch.randn(2, 4, 6, 6)
    good = xt.convert(nn.Conv2d(4, 4, 3, padding=1), backend="numpy")
    with torch.no_grad():
        good(x)
        good(x)                                            # its lane is open
        for attr, value in (("groups", True), ("stride", (1.0, 1.0)), ("dilation", (True, True))):
            bad = xt.convert(nn.Conv2d(4, 4, 3, padding=1), backend="numpy")
            setattr(bad, attr, value)
            for _ in range(2):
                with pytest.raises(xconv.ShapeError, match=attr):
                    bad(x)
    assert torch_ops.Conf((1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0), False, "keep_dtype", "numpy").exact
    assert not torch_ops.Conf((1, 1), ((1, 1), (1, 1)), (1, 1), True, False, (0, 0), False, "keep_dtype",
                              "numpy").exact


def test_the_numpy_backends_lane_runs_its_runner_with_the_primitives_bits(public_calls, monkeypatch):
    """A lane on the NumPy backend keeps the backend's runner (Backend.lane: the fast path on the paths chosen when the
    lane opened) and calls it instead of the primitive: the public call's bits, forward and backward; inside
    paths.force (another choice) the runner declines and the primitive runs, with the forced path's bits."""
    from xconv_numpy import backend as numpy_backend, paths

    conf = _conf()
    x, w = _arrays(c=32, co=32)
    dy = np.random.default_rng(3).standard_normal((2, 32, 6, 6), dtype=np.float32)
    primitive = []
    real_fprop, real_backward = numpy_backend.NumpyBackend.fprop, numpy_backend.NumpyBackend.backward
    monkeypatch.setattr(numpy_backend.NumpyBackend, "fprop", lambda *a: primitive.append("fprop") or real_fprop(*a))
    monkeypatch.setattr(numpy_backend.NumpyBackend, "backward",
                        lambda *a: primitive.append("backward") or real_backward(*a))
    want_y = xconv.conv_fprop(x, w, **conf.kwargs())
    want_g = xconv.convolution_backward(dy, x, w, output_mask=(True, True, False), **conf.kwargs())
    public_calls.clear()
    for _ in range(3):
        assert lanes.fprop(conf, x, w, None, conf.kwargs).tobytes() == want_y.tobytes()
        got = lanes.backward(conf, dy, x, w, None, (True, True, False), conf.kwargs)
        assert [g.tobytes() for g in got[:2]] == [g.tobytes() for g in want_g[:2]] and got[2] is None
    assert public_calls == ["conv_fprop", "convolution_backward"]
    # want's calls validate (the primitives run); the lanes' opening public calls repeat them, so they run by the
    # plan's runner (plan_cache.runner), and the lanes by theirs: no primitive again
    assert primitive == ["fprop", "backward"]
    assert all(lane.runner is not None for lane in lanes._lanes.values())
    with paths.force("columns"):
        y = lanes.fprop(conf, x, w, None, conf.kwargs)
        with xconv.trace() as t:
            forced = xconv.conv_fprop(x, w, **conf.kwargs())
    assert primitive[-1] == "fprop" and "columns" in t.records[-1].path and y.tobytes() == forced.tobytes()


def test_a_backend_whose_lane_fails_or_declines_gets_its_primitive(public_calls):
    """Backend.lane raising when a lane opens leaves the lane without a runner (the call that opened it succeeded);
    a runner returning NotImplemented hands that call to the primitive; one raising is reported as the primitive's
    error would be (BackendFailedError naming the backend)."""
    x, w = _arrays()

    class Laned(SpyBackend):
        mode = "raise-at-open"

        def lane(self, p, op, mask=None):
            if self.mode == "raise-at-open":
                raise RuntimeError("no lane today")
            if self.mode == "decline":
                return lambda *arrays: NotImplemented
            return lambda *arrays: (_ for _ in ()).throw(RuntimeError("runner broke"))

    for mode in ("raise-at-open", "decline", "raise-in-runner"):
        lanes.clear()
        backend = Laned(f"laned-{mode}")
        backend.mode = mode
        conf = _conf(backend=backend.name)
        with registered(backend):
            want = xconv.conv_fprop(x, w, **conf.kwargs())           # validated: the primitive
            if mode == "raise-in-runner":          # the repeated public call runs the plan's runner: its error
                for call in (lambda: xconv.conv_fprop(x, w, **conf.kwargs()),
                             lambda: lanes.fprop(conf, x, w, None, conf.kwargs)):
                    with pytest.raises(BackendFailedError, match="runner broke"):
                        call()
                continue
            lanes.fprop(conf, x, w, None, conf.kwargs)               # opens the lane (the public call)
            assert np.array_equal(lanes.fprop(conf, x, w, None, conf.kwargs), want)
            runner = next(iter(lanes._lanes.values())).runner
            assert (runner is None) == (mode == "raise-at-open")


def test_a_numpy_backend_subclass_keeps_its_overrides_on_every_call(public_calls):
    """A NumpyBackend subclass (or instance) that overrides a primitive gets no runner: the lane calls its override on
    every call (a runner would run the fast path and skip it)."""
    from xconv_numpy.backend import NumpyBackend

    class Skewed(NumpyBackend):
        def __init__(self):
            super().__init__()
            self.name = "numpy-skewed"
            self.calls = 0

        def fprop(self, x, w, bias, p):
            self.calls += 1
            return super().fprop(x, w, bias, p) + 1

    backend = Skewed()
    conf = _conf(backend=backend.name)
    x, w = _arrays(c=32, co=32)
    with registered(backend):
        got = [lanes.fprop(conf, x, w, None, conf.kwargs) for _ in range(4)]
        assert backend.calls == 4
        assert all(np.array_equal(y, got[0]) for y in got)
        assert all(lane.runner is None for lane in lanes._lanes.values())
    plain = NumpyBackend()
    plain.fprop = lambda *a: NumpyBackend.fprop(plain, *a)         # an instance override
    assert plain._overridden() and not NumpyBackend()._overridden()


def test_a_numpy_backend_subclass_keeps_its_dgrad_override_under_a_transposed_lane(public_calls):
    """The transposed forward's lane runs the backend's dgrad runner: a subclass overriding ``_dgrad`` (what that
    runner stands in for) gets none, and its override runs on every call."""
    from xconv_numpy.backend import NumpyBackend

    class Sevens(NumpyBackend):
        def __init__(self):
            super().__init__()
            self.name = "numpy-sevens"

        def _dgrad(self, dy, w, p):
            return np.full(p.input_shape, 7, np.float32)

    backend = Sevens()
    x, w = _arrays(c=32, co=32)
    conf = _conf(transposed=True, backend=backend.name)
    with registered(backend):
        got = [lanes.fprop(conf, x, w, None, conf.kwargs) for _ in range(3)]
    assert all(np.all(y == 7) for y in got)


TRANSPOSED = [  # (x shape, w shape, stride, padding, output_padding, groups, dilation, a runner expected)
    ((4, 32, 8, 8), (32, 16, 2, 2), (2, 2), ((0, 0), (0, 0)), (0, 0), 1, (1, 1), True),        # U-Net's up-sampling
    ((2, 32, 6, 6), (32, 32, 3, 3), (1, 1), ((1, 1), (1, 1)), (0, 0), 1, (1, 1), True),        # the dense template
    ((2, 32, 6, 6), (32, 16, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 2, (1, 1), True),        # output_padding
    ((2, 8, 5, 5), (8, 4, 3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, (2, 2), False),          # x extended: legalized
    ((2, 8, 5, 7), (8, 3, 3, 2), (2, 1), ((1, 1), (0, 0)), (0, 0), 2, (2, 1), True),           # grouped, dilated
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=range(len(TRANSPOSED)))
def test_a_transposed_forward_runs_the_backends_dgrad_runner_with_the_public_bits(case, public_calls, monkeypatch):
    """A transposed forward that legalization runs as one data gradient (the NumPy backend has no transposed
    primitive) gets the backend's dgrad runner (Backend.lane(q, "dgrad")) where x needs no extension: the public call's
    bits with and without bias, non-finite weights included, the primitive no longer called; where x is extended, no
    runner (the legalization runs); inside paths.force the runner declines and the forced path's bits come back."""
    from xconv_numpy import backend as numpy_backend, paths

    xs, ws, stride, padding, out_pad, groups, dilation, expect_runner = case
    conf = torch_ops.Conf(stride, padding, dilation, groups, True, out_pad, False, "keep_dtype", "numpy")
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    bias = rng.standard_normal(ws[1] * groups, dtype=np.float32)
    dgrads = []
    real = numpy_backend.NumpyBackend.dgrad
    monkeypatch.setattr(numpy_backend.NumpyBackend, "dgrad", lambda *a: dgrads.append(1) or real(*a))
    bad = w.copy()
    bad[0, 0, 0, 0], bad[-1, -1, -1, -1] = np.inf, np.nan
    for weights in (w, bad):
        for b in (None, bias):
            lanes.clear()
            want = xconv.conv_fprop(x, weights, bias=b, **conf.kwargs())
            got = [lanes.fprop(conf, x, weights, b, conf.kwargs) for _ in range(3)]
            assert all(g.dtype == want.dtype and g.tobytes() == want.tobytes() for g in got)
            assert (next(iter(lanes._lanes.values())).runner is not None) == expect_runner
    dgrads.clear()
    lanes.fprop(conf, x, w, bias, conf.kwargs)
    assert dgrads == ([] if expect_runner else [1])                # the runner stands in for the primitive
    with paths.force("columns"):
        y = lanes.fprop(conf, x, w, bias, conf.kwargs)
        with xconv.trace() as t:
            forced = xconv.conv_fprop(x, w, bias=bias, **conf.kwargs())
    assert "columns" in t.records[-1].path and y.tobytes() == forced.tobytes()


def test_a_backends_dgrad_runner_serves_its_transposed_lane_or_declines():
    """The core asks ``lane(q, "dgrad")`` of a backend without a transposed primitive, q the direct convolution;
    its runner's result gets the bias as the legalization adds it; NotImplemented sends the call to the legalization
    (the dgrad primitive); a runner raising is the backend's failure, named."""
    x, w = _arrays(c=4, co=6)
    w = np.ascontiguousarray(w.transpose(1, 0, 2, 3))                 # (C_in, C_out, k, k): transposed weights
    conf = _conf(transposed=True, padding=((1, 1), (1, 1)))
    b = np.linspace(-1, 1, 6, dtype=np.float32)

    class Laned(SpyBackend):
        mode = "serve"
        asked = ()
        lane_dgrad = True

        def lane(self, p, op, mask=None):
            self.asked += ((op, p.transposed),)
            if op != "dgrad":
                return None
            if self.mode == "serve":                 # the reference's dgrad, not the recorded primitive
                return lambda dy, w: SpyBackend.__mro__[1].dgrad(self, dy, w, p)
            if self.mode == "decline":
                return lambda dy, w: NotImplemented
            return lambda dy, w: (_ for _ in ()).throw(RuntimeError("dgrad runner broke"))

    for mode in ("serve", "decline", "raise"):
        lanes.clear()
        backend = Laned(f"laned-dgrad-{mode}")
        backend.mode = mode
        kw = dict(conf.kwargs(), backend=backend.name)
        with registered(backend):
            want = xconv.conv_fprop(x, w, bias=b, **kw)
            c = torch_ops.Conf(conf.stride, conf.padding, conf.dilation, 1, True, conf.output_padding, False,
                               "keep_dtype", backend.name)
            lanes.fprop(c, x, w, b, c.kwargs)                          # opens the lane
            assert ("dgrad", False) in backend.asked
            if mode == "raise":
                with pytest.raises(BackendFailedError, match="dgrad runner broke"):
                    lanes.fprop(c, x, w, b, c.kwargs)
                continue
            backend.calls.clear()
            assert np.array_equal(lanes.fprop(c, x, w, b, c.kwargs), want)
            assert [call[0] for call in backend.calls] == ([] if mode == "serve" else ["dgrad"])   # the primitive


def test_a_backend_whose_lane_knows_two_ops_is_never_asked_for_dgrad(public_calls):
    """``lane(q, "dgrad")`` is asked only of a backend declaring ``lane_dgrad = True``: a plugin's ``lane`` written
    for fprop and backward alone (here: a backward runner for any other op) keeps working on transposed calls."""
    x, w = _arrays(c=4, co=6)
    w = np.ascontiguousarray(w.transpose(1, 0, 2, 3))

    class Older(SpyBackend):
        asked = ()

        def lane(self, p, op, mask=None):
            self.asked += (op,)
            return None if op == "fprop" else (lambda dy, x, w: self.backward(dy, x, w, p, mask))

    backend = Older("older-lane")
    conf = torch_ops.Conf((1, 1), ((1, 1), (1, 1)), (1, 1), 1, True, (0, 0), False, "keep_dtype", backend.name)
    with registered(backend):
        want = xconv.conv_fprop(x, w, **conf.kwargs())
        got = [lanes.fprop(conf, x, w, None, conf.kwargs) for _ in range(3)]
    assert all(np.array_equal(y, want) for y in got) and "dgrad" not in backend.asked
