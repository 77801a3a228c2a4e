"""Determinism as a property of values (issue 24, docs/semantics.md "Determinism").

Under ``deterministic=True`` and ``"batch_invariant"`` on ``numpy`` and ``numpy-exact``, each output's bits are
a function of the input values, the parameters, dtype, math mode and level (on one build), and of nothing
else. Hypothesis draws convolutions (1-D/2-D/3-D, strides 1-3, dilation, groups, depthwise, transposed,
every dtype, small and BLAS-sized) and checks bitwise equality across: the calling thread and concurrent
threads; fresh processes with other BLAS/OpenMP thread counts (and torch imported first); every output
mask; C, Fortran, channels-last, gapped and reversed operands; tracing; a workspace limit that constrains
nothing; forked children; and the xconv.torch modules (threads, channels-last, torch.set_num_threads,
torch.compile). Fresh processes also run under CPU affinity to one CPU. No run may print an OpenBLAS warning.
Bounded (derandomized, few examples) to run in a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import xconv
from determinism_cases import (DTYPE_NAMES, LAYOUTS, MASKS, PROMISED, Case, differences, digests, dump_cases,
                               on_threads, operands, outputs, relayout)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "determinism_worker.py")
BACKENDS = ("numpy", "numpy-exact")
LEVELS = st.sampled_from([True, "batch_invariant"])

FEW = settings(max_examples=25, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


@st.composite
def cases(draw, size=None):
    nd = draw(st.sampled_from([1, 2, 3]))
    size = size or draw(st.sampled_from(["small", "small", "blas", "blas", "large"]))
    kind = draw(st.sampled_from(["dense", "dense", "grouped", "depthwise"]))
    transposed = draw(st.booleans())
    dims = lambda lo, hi: tuple(draw(st.integers(lo, hi)) for _ in range(nd))  # noqa: E731
    kernel = dims(1, 3)
    stride = dims(1, 3)
    dilation = dims(1, 2)
    padding = tuple(draw(st.integers(0, max(0, (d * (k - 1)) // 2 + (not transposed)))) for k, d in
                    zip(kernel, dilation))
    output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) if transposed else 0 for s, d in
                           zip(stride, dilation))
    if size == "small":
        N, cin, cout = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
        spatial = dims(*{1: (4, 12), 2: (3, 8), 3: (3, 5)}[nd])
    elif size == "blas":
        N, cin, cout = draw(st.integers(2, 4)), draw(st.integers(12, 40)), draw(st.integers(12, 40))
        spatial = dims(*{1: (48, 160), 2: (10, 20), 3: (5, 8)}[nd])
    else:                                    # past the small-call path: the chunked grid, threads, big GEMMs
        N, cin, cout = draw(st.integers(2, 4)), draw(st.integers(24, 72)), draw(st.integers(24, 72))
        spatial = dims(*{1: (256, 1024), 2: (24, 40), 3: (8, 12)}[nd])
    if kind == "dense":
        groups = 1
    elif kind == "grouped":
        groups = draw(st.integers(2, 3))
    else:
        groups, cin = cin, cin
        cout = cin * draw(st.integers(1, 2))
    case = Case(N=N, C_in=cin * (groups if kind == "grouped" else 1), C_out=cout * (groups if kind == "grouped"
                                                                                   else 1),
                groups=groups, spatial=spatial, kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                transposed=transposed, output_padding=output_padding, dtype=draw(st.sampled_from(DTYPE_NAMES)),
                seed=draw(st.integers(0, 2 ** 16)))
    assume(case.valid())
    return case


def _case(spatial, cin, cout, kernel, stride, padding, dtype, *, N=2, groups=1, dilation=None, transposed=False,
          seed=0):
    nd = len(spatial)
    return Case(N=N, C_in=cin, C_out=cout, groups=groups, spatial=tuple(spatial), kernel=(kernel,) * nd,
                stride=(stride,) * nd, padding=(padding,) * nd, dilation=dilation or (1,) * nd, transposed=transposed,
                output_padding=(0,) * nd, dtype=dtype, seed=seed)


#: Calls that broke a property before issue 24 (found by this suite or the issue's measurements):
#: threaded BLAS on a worker thread (OpenBLAS's direct small-GEMM kernel runs single-threaded only),
THREAD_SENSITIVE = [_case((817,), 69, 29, 3, 2, 1, "float32", N=3, transposed=True),
                    _case((6, 5, 5), 12, 34, 3, 1, 1, "float16", N=4)]
#: a path chosen from the mask (the small-call path's size counted dy's columns only with grad_input;
#: strategy A or B by which gradients are asked for),
MASK_SENSITIVE = [_case((40, 40), 24, 40, 3, 2, 1, "float32", N=4), _case((40, 40), 24, 40, 3, 1, 1, "float32", N=4)]
#: a path excluded under any workspace limit (the small-call path, the depthwise loops),
LIMIT_SENSITIVE = [_case((11, 8, 8), 31, 24, 2, 1, 1, "float32", N=3, dilation=(2, 1, 1)),
                   _case((4,), 1, 1, 1, 1, 0, "float32", N=1), _case((24, 24), 32, 32, 3, 1, 1, "float32", N=2,
                                                                    groups=32)]
#: BLAS given operands in the inputs' layout (numpy-exact's column products).
LAYOUT_SENSITIVE = [(_case((117,), 33, 20, 1, 2, 1, "float64"), ("C", "F", "F", "channels_last"))]


def _assert_same(got: dict, want: dict, what: str, case: Case):
    assert set(got) == set(want), (what, sorted(got), sorted(want))
    diff = differences(got, want)
    assert not diff, f"{what}: elements that differ per output {diff} ({case.label()})"


# ---------------------------------------------------------------------------------------------------------
# In one process


@pytest.mark.parametrize("backend", BACKENDS)
@FEW
@given(case=cases(), level=LEVELS)
@example(case=THREAD_SENSITIVE[0], level=True)
@example(case=THREAD_SENSITIVE[1], level="batch_invariant")
def test_same_bits_on_any_thread_and_under_concurrency(backend, case, level):
    ops = operands(case)
    want = outputs(case, ops, backend, level)                    # the main thread first
    got = on_threads(lambda: outputs(case, ops, backend, level), 1)[0]
    _assert_same(got, want, "another thread", case)
    for i, got in enumerate(on_threads(lambda: outputs(case, ops, backend, level), 8)):
        _assert_same(got, want, f"thread {i} of 8 concurrent", case)


@pytest.mark.parametrize("backend", BACKENDS)
@FEW
@given(case=cases(), level=LEVELS)
@example(case=MASK_SENSITIVE[0], level=True)
@example(case=MASK_SENSITIVE[1], level="batch_invariant")
def test_each_output_independent_of_the_mask(backend, case, level):
    ops = operands(case)
    full = outputs(case, ops, backend, level, fprop=False)
    for mask in MASKS[:-1]:
        got = outputs(case, ops, backend, level, mask=mask, fprop=False)
        want = {k: v for k, v in full.items() if mask[("dx", "dw", "db").index(k)]}
        _assert_same(got, want, f"mask {mask}", case)


@pytest.mark.parametrize("backend", BACKENDS)
@FEW
@given(case=cases(), level=LEVELS, layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 4))
@example(case=LAYOUT_SENSITIVE[0][0], level=True, layouts=LAYOUT_SENSITIVE[0][1])
def test_outputs_independent_of_operand_layout(backend, case, level, layouts):
    ops = operands(case)
    want = outputs(case, ops, backend, level)
    moved = {name: relayout(a, lay) for (name, a), lay in zip(sorted(ops.items()), layouts)}
    assert all(np.array_equal(moved[k], ops[k], equal_nan=True) for k in ops)
    _assert_same(outputs(case, moved, backend, level), want, f"layouts {dict(zip(sorted(ops), layouts))}", case)


@pytest.mark.parametrize("backend", BACKENDS)
@FEW
@given(case=cases(), level=LEVELS)
@example(case=LIMIT_SENSITIVE[0], level=True)
@example(case=LIMIT_SENSITIVE[1], level=True)
@example(case=LIMIT_SENSITIVE[2], level="batch_invariant")
def test_tracing_and_a_limit_that_constrains_nothing_change_no_bits(backend, case, level):
    ops = operands(case)
    want = outputs(case, ops, backend, level)
    with xconv.trace():
        _assert_same(outputs(case, ops, backend, level), want, "traced", case)
    _assert_same(outputs(case, ops, backend, level, workspace_limit=1 << 40), want, "workspace_limit=1<<40", case)


# ---------------------------------------------------------------------------------------------------------
# Fresh processes: BLAS and OpenMP thread counts, torch first, fork


def _worker(args, env_changes: dict, tmp_path, cases_, timeout=300):
    path = tmp_path / "cases.json"
    path.write_text(dump_cases(cases_))
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    proc = subprocess.run([sys.executable, WORKER, args[0], str(path), *args[1:]], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OpenBLAS" not in proc.stderr, f"OpenBLAS printed warnings ({env_changes}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _here(cases_):
    return {f"{i}|{b}|{d}": digests(c, b, d) for i, c in enumerate(cases_) for b, d in PROMISED}


def _compare(result: dict, want: dict, what: str, cases_):
    for where in ("main", "thread"):
        bad = {k: [n for n in v if result[where][k].get(n) != v[n]] for k, v in want.items()}
        bad = {k: v for k, v in bad.items() if v}
        assert not bad, f"{what}, {where}: {bad} in " + "; ".join(cases_[int(k.split('|')[0])].label() for k in bad)
    for i, one in enumerate(result["concurrent"]):
        bad = {k for k, v in want.items() if one[k] != v}
        assert not bad, f"{what}, concurrent thread {i}: {sorted(bad)}"


ENVIRONMENTS = [
    {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    {"OPENBLAS_NUM_THREADS": "4", "OMP_NUM_THREADS": None},
    {"OPENBLAS_NUM_THREADS": None, "OMP_NUM_THREADS": None},
    {"OPENBLAS_NUM_THREADS": None, "OMP_NUM_THREADS": "3"},
    {"XCONV_TEST_TORCH_FIRST": "1", "OPENBLAS_NUM_THREADS": None, "OMP_NUM_THREADS": None},
    {"XCONV_TEST_AFFINITY": "0", "OPENBLAS_NUM_THREADS": None, "OMP_NUM_THREADS": None},
]


@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(cases_=st.lists(cases(size="blas"), min_size=3, max_size=3) | st.lists(cases(), min_size=3, max_size=3))
@example(cases_=THREAD_SENSITIVE + MASK_SENSITIVE[:1])
def test_same_bits_across_processes_and_thread_counts(tmp_path, cases_):
    want = _here(cases_)
    for env in ENVIRONMENTS:
        _compare(_worker(["digests"], env, tmp_path, cases_), want, f"environment {env}", cases_)


#: Calls that run on several workers (and so, with torch loaded, on torch's OpenMP team): the dense C loops, the
#: depthwise loops, the BLAS grid; and small ones on the calling thread.
FORK_CASES = [_case((32, 32), 32, 32, 3, 1, 1, "float32", N=4), _case((32, 32), 64, 64, 3, 1, 1, "float32", N=4,
                                                                      groups=64),
              _case((40, 40), 24, 40, 3, 2, 1, "float32", N=4), _case((9, 9), 20, 20, 3, 1, 1, "float64", groups=20),
              _case((40,), 32, 32, 3, 1, 1, "float16", N=3, transposed=True)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
@pytest.mark.parametrize("parent", ["torch", "xconv"])
def test_forked_child_computes_the_same_bits(tmp_path, parent):
    """The parent ran torch's OpenMP work (and, for "xconv", every case on xconv's OpenMP team) before
    forking; the child must neither hang (killed after 60 s) nor compute other bits."""
    pytest.importorskip("torch")
    result = _worker(["fork", "torch" if parent == "torch" else "xconv", "60"], {}, tmp_path, FORK_CASES)
    assert not result["hung"], "the forked child's first xconv call hung (killed after 60 s)"
    want = _here(FORK_CASES)
    _compare(result, want, f"forked child of a parent that ran {parent}", FORK_CASES)
    if result["parent"] is not None:
        assert result["parent"] == want


# ---------------------------------------------------------------------------------------------------------
# Through the torch modules


def _torch_layer(torch, xt, case: Case, backend, level):
    cls = {(False, 1): xt.XConv1d, (False, 2): xt.XConv2d, (False, 3): xt.XConv3d,
           (True, 1): xt.XConvTranspose1d, (True, 2): xt.XConvTranspose2d, (True, 3): xt.XConvTranspose3d}
    kw = dict(stride=case.stride, padding=case.padding, dilation=case.dilation, groups=case.groups,
              backend=backend, deterministic=level)
    if case.transposed:
        kw["output_padding"] = case.output_padding
    layer = cls[(case.transposed, case.nd)](case.C_in, case.C_out, case.kernel, **kw).double()
    ops = operands(case)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(ops["w"].astype(np.float64)))
        layer.bias.copy_(torch.from_numpy(ops["bias"].astype(np.float64)))
    return layer, torch.from_numpy(ops["x"].astype(np.float64))


def _torch_step(torch, layer, x, channels_last=False, model=None):
    """y, x.grad, weight.grad and bias.grad of one forward and backward (loss: sum of y * a fixed ramp)."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone()
    if channels_last and x.dim() in (4, 5):
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    x.requires_grad_(True)
    y = (model or layer)(x)
    ramp = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    (y * ramp).sum().backward()
    return {"y": y.detach().numpy().copy(), "dx": x.grad.numpy().copy(),
            "dw": layer.weight.grad.numpy().copy(), "db": layer.bias.grad.numpy().copy()}


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(), level=LEVELS)
def test_torch_modules_same_bits_on_threads_and_in_channels_last(backend, case, level):
    torch = pytest.importorskip("torch")
    import xconv.torch as xt
    assume(case.dtype == "float64")          # the modules run in float64 here; dtypes are covered above
    layer, x = _torch_layer(torch, xt, case, backend, level)
    want = _torch_step(torch, layer, x)
    lock = threading.Lock()                  # the module's .grad fields are shared: one step at a time

    def step(channels_last=False):
        with lock:
            return _torch_step(torch, layer, x, channels_last)

    _assert_same(on_threads(step, 1)[0], want, "torch module on another thread", case)
    for got in on_threads(step, 4):
        _assert_same(got, want, "torch module, 4 threads", case)
    _assert_same(step(channels_last=True), want, "torch module, channels-last input", case)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _assert_same(step(), want, "torch module under torch.set_num_threads(1)", case)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_matches_eager_bitwise_in_channels_last(backend):
    torch = pytest.importorskip("torch")
    import xconv.torch as xt
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 24, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(24, 20, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(20, 8, 1))
    model = xt.convert(model, backend=backend, deterministic=True).to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 16, 16).contiguous(memory_format=torch.channels_last)

    def step(m):
        model.zero_grad(set_to_none=True)
        y = m(x)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        return [y.detach().clone()] + [p.grad.clone() for p in model.parameters()]

    eager = step(model)
    compiled = step(torch.compile(model, fullgraph=True, backend="aot_eager"))
    for i, (a, b) in enumerate(zip(eager, compiled)):
        assert torch.equal(a, b), f"tensor {i} (0: y, then parameters' gradients) differs between compile and eager"
