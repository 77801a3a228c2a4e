"""The cuDNN backend's graphs through NVIDIA's real cuDNN frontend and library, on the CPU.

Every valid case of the conformance corpus (its backward, and the forward of the same
convolution with a bias where the case asks grad_bias) is run through the public API (the core's
validation, normalization and legalization) onto the real :class:`CudnnBackend`. Its build
step (``CudnnBackend._build``) is replaced by :func:`xconv_cudnn.compiler.declare_graph` on the
real ``cudnn`` module plus ``validate()``: exactly the graph the backend builds on a GPU, up to
the first step that needs the device (``build_operation_graph``). Outputs are left as zeros;
numerics are checked elsewhere (test_cudnn_translation, test_cudnn_gpu).

Each case runs twice: once with every graph accepted, once with every fused, strided or
asymmetrically padded graph refused as "not supported", so that the fallback graphs the
backend then emits (unfused parts, contiguous copies, the core's explicit padding) are
validated too.

Beyond ``validate()``, which checks little in the 1.x frontends, the frontend's own shape
inference is the independent truth for dims: an fprop graph left without output dims must
infer the compiler's; dgrad's dx and wgrad's dw, run forward through an fprop twin, must
infer dy's dims. Node attributes are compared against the graph's JSON as the frontend
serializes it.

Needs ``nvidia-cudnn-frontend`` (1.8 to 1.29; 1.30+ lower the graph through the CUDA driver in
``validate()``) and ``libcudnn.so.9`` (``nvidia-cudnn-cu12``): the ``test`` extra installs both.
Skips, with the reason, only when either is missing.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest

import xconv
from xconv_conformance import cases as corpus
from xconv_conformance.families import Family
from xconv_conformance.runner import call_kwargs
from xconv_cudnn import compiler, driver
from xconv_cudnn.backend import CUDNN_STATUS, NOT_SUPPORTED_CODES, CudnnBackend, is_not_supported, vendor_error
from xconv_cudnn.cache import PlanCache

_RUNTIME = driver._load_cudnn_runtime()
if _RUNTIME is None:
    pytest.skip("libcudnn.so.9 not found (pip install nvidia-cudnn-cu12)", allow_module_level=True)
cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend not installed")

FE_VERSION = driver.parse_version(cudnn.__version__)
if not (driver.MIN_FRONTEND <= FE_VERSION < (1, 30)):
    pytest.skip(f"cuDNN frontend {cudnn.__version__}: validate() runs without a driver only in 1.8 to 1.29",
                allow_module_level=True)

# deterministic="batch_invariant" cases are refused by the core before any graph (tests/test_cudnn_provenance.py)
VALID = [c for c in corpus.load_corpus() if c.kind == "valid" and c.deterministic != "batch_invariant"]


class HostRuntime:
    """CupyRuntime's interface over NumPy arrays, with the real frontend as ``fe``; nothing executes."""

    fe = cudnn

    def device_of(self, a):
        return 0

    def ptr(self, a):
        return a.__array_interface__["data"][0]

    def is_c_contiguous(self, a):
        return a.flags.c_contiguous

    def element_strides(self, a):
        return tuple(s // a.itemsize for s in a.strides)

    def contiguous(self, a):
        return self.copy(a)

    def copy(self, a):
        raw = np.empty(a.nbytes + 64, np.uint8)
        offset = (-raw.__array_interface__["data"][0]) % 64
        out = raw[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    def empty(self, shape, like):
        return np.zeros(shape, dtype=like.dtype)

    def on_device(self, device):
        import contextlib  # noqa: PLC0415
        return contextlib.nullcontext()

    def workspace(self, nbytes):
        return None, 0

    def handle(self, device):
        return None  # no device: graphs are declared without a handle

    def add_bias(self, y, bias):
        return y

    def sum_bias(self, dy, dtype):
        return np.zeros(dy.shape[1], dy.dtype)


class _Unrun:
    """Stands for a built graph: the device steps cannot run here."""

    def execute(self, pack, workspace, handle=None):
        pass

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        pass


def _refused(spec: compiler.GraphSpec) -> bool:
    """The graphs the refusing pass declares "not supported": fused, strided, or asymmetrically padded."""
    if spec.op in compiler.UNFUSED:
        return True
    if any(t.strides != compiler.packed_strides(t.dims, range(len(t.dims))) for t in spec.inputs
           if len(t.dims) == len(t.shape)):
        return True
    return spec.pre_padding != spec.post_padding


class ValidatingBackend(CudnnBackend):
    """The real backend whose build step is the real frontend's declare + validate()."""

    array_families = ("numpy",)

    def __init__(self, refuse: bool):
        super().__init__(runtime=HostRuntime(), cache=PlanCache(4096))
        self.refuse = refuse
        self.specs: list[compiler.GraphSpec] = []

    def _build(self, rt, spec, device):
        g, tensors = compiler.declare_graph(cudnn, spec)
        g.validate()
        self.specs.append(spec)
        check_against_frontend(spec, g)
        if self.refuse and _refused(spec):
            raise cudnn.cudnnGraphNotSupportedError(f"refused by the test: {spec.op}")
        return compiler.BuiltGraph(graph=_Unrun(), uids={name: i for i, name in enumerate(tensors)},
                                   workspace=0, plan_count=1)


# ---------------------------------------------------------------------------------------------
# Independent checks through the frontend's own inference


def _graph(spec):
    dt = cudnn.data_type
    return cudnn.pygraph(io_data_type=getattr(dt, spec.io_type),
                         intermediate_data_type=getattr(dt, spec.intermediate_type),
                         compute_data_type=getattr(dt, spec.compute_type))


def _inferred_fprop_dims(spec, image, weight) -> list[int]:
    """The output dims the real frontend infers for an fprop of ``image`` x ``weight`` dims under ``spec``."""
    g = _graph(spec)
    dt = getattr(cudnn.data_type, spec.io_type)
    x = g.tensor(name="x", dim=list(image), stride=list(compiler.packed_strides(image, range(len(image)))),
                 data_type=dt)
    w = g.tensor(name="w", dim=list(weight), stride=list(compiler.packed_strides(weight, range(len(weight)))),
                 data_type=dt)
    y = g.conv_fprop(image=x, weight=w, pre_padding=list(spec.pre_padding), post_padding=list(spec.post_padding),
                     stride=list(spec.stride), dilation=list(spec.dilation),
                     compute_data_type=getattr(cudnn.data_type, spec.compute_type))
    y.set_output(True)
    g.validate()
    return list(y.get_dim())


def check_against_frontend(spec: compiler.GraphSpec, g) -> None:
    """The declared graph, as the frontend serialized it, and its dims against the frontend's inference."""
    doc = json.loads(str(g))
    tensors = doc["tensors"]
    entries = list(tensors.values()) if isinstance(tensors, dict) else list(tensors)   # a list from 1.28
    by_name = {e.get("name"): e for e in entries}
    for ts in spec.inputs:
        entry = by_name.get(ts.name)
        assert entry is not None, (spec.op, ts.name, list(by_name))
        assert entry["dim"] == list(ts.dims) and entry["stride"] == list(ts.strides), (spec.op, ts.name, entry)
        assert entry["data_type"] == ts.data_type, (spec.op, ts.name, entry)
    inputs = {t.name for t in spec.inputs}
    outputs = [e for e in entries if not e["is_virtual"] and e.get("name") not in inputs]
    assert sorted(tuple(e["dim"]) for e in outputs) == sorted(t.dims for t in spec.outputs), (spec.op, outputs)
    convs = [n for n in doc["nodes"] if n["tag"].startswith("CONV_")]
    for node in convs:
        assert node["pre_padding"] == list(spec.pre_padding) and node["post_padding"] == list(spec.post_padding)
        assert node["stride"] == list(spec.stride) and node["dilation"] == list(spec.dilation)
        assert node["math_mode"] == "CROSS_CORRELATION"
        assert node["compute_data_type"] == spec.compute_type
    if spec.op in ("fprop", "fprop_bias"):
        x, w = spec.tensor("x"), spec.tensor("w")
        assert _inferred_fprop_dims(spec, x.dims, w.dims) == list(spec.tensor("y").dims), spec
    elif spec.op == "dgrad":
        dx, w = spec.tensor("dx"), spec.tensor("w")
        assert _inferred_fprop_dims(spec, dx.dims, w.dims) == list(spec.tensor("dy").dims), spec
    elif spec.op in ("wgrad", "wgrad_bgrad"):
        x, dw = spec.tensor("x"), spec.tensor("dw")
        assert _inferred_fprop_dims(spec, x.dims, dw.dims) == list(spec.tensor("dy").dims), spec
        assert x.dims[1] % dw.dims[1] == 0 and dw.dims[0] % (x.dims[1] // dw.dims[1]) == 0  # groups
    if spec.op in ("wgrad_bgrad", "bgrad"):
        db = spec.tensor("db")
        assert db.dims == (1, spec.tensor("dy").dims[1]) + (1,) * (len(db.dims) - 2)


# ---------------------------------------------------------------------------------------------
# Every corpus case


def _run_corpus(refuse: bool) -> tuple[ValidatingBackend, dict]:
    backend = ValidatingBackend(refuse)
    per_case = {}
    fam = Family()
    for case in VALID:
        inputs = corpus.make_inputs(case)
        arrays = tuple(fam.make(a, case.layout) for a in (inputs.grad_output, inputs.input, inputs.weight))
        before = len(backend.specs)
        backend.cache.clear()
        xconv.convolution_backward(*arrays, backend=backend, **call_kwargs(case))
        backward = backend.specs[before:]
        # The forward of the same case, with a bias where the case has grad_bias: fprop and fprop_bias.
        bias = fam.make(corpus.values(case.id, "bias", (case.c_out,), case.dtype), "contiguous") \
            if case.mask[2] else None
        xconv.conv_fprop(arrays[1], arrays[2], bias=bias, backend=backend, math=case.math,
                         deterministic=case.deterministic, **case.conv_kwargs())
        per_case[case.id] = (backward, backend.specs[before + len(backward):])
    return backend, per_case


@pytest.fixture(scope="module")
def accepted():
    return _run_corpus(refuse=False)


@pytest.fixture(scope="module")
def refusing():
    return _run_corpus(refuse=True)


def test_every_valid_corpus_case_validates_on_the_real_frontend(accepted, refusing):
    """Every valid case's graphs pass the real validate() and the frontend's inference checks."""
    for backend, per_case in (accepted, refusing):
        assert set(per_case) == {c.id for c in VALID}
        cases = {c.id: c for c in VALID}
        missing = [cid for cid, (bwd, _) in per_case.items() if not bwd and not _no_graph(cases[cid])]
        assert not missing, missing
        needless = [cid for cid, (bwd, _) in per_case.items() if bwd and _no_graph(cases[cid])]
        assert not needless, needless
        no_forward = [cid for cid, (_, fwd) in per_case.items()
                      if not fwd and 0 not in (cases[cid].n, cases[cid].c_in, cases[cid].c_out)]
        assert not no_forward, no_forward
        zero_sized = [(cid, s.op) for cid, pair in per_case.items() for specs in pair for s in specs
                      if any(0 in t.dims for t in s.inputs + s.outputs)]
        assert not zero_sized, zero_sized   # the core answers empty tensors itself
    distinct = {dataclasses.replace(s, autotune=False) for b, _ in (accepted, refusing) for s in b.specs}
    graphs = len(accepted[0].specs) + len(refusing[0].specs)
    print(f"\ncuDNN frontend {cudnn.__version__}: {len(VALID)} valid corpus cases, {graphs} graphs "
          f"validated ({len(distinct)} distinct)")
    stated = f"({len(VALID)} cases: the backward with its mask and the forward with a bias; {graphs:,} graphs, " \
             f"{len(distinct):,} distinct"
    doc = " ".join(pathlib.Path(__file__).resolve().parent.parent.joinpath("docs", "cudnn-backend.md").read_text()
                   .replace("> ", " ").split())
    assert stated in doc, f"docs/cudnn-backend.md should state {stated!r}"


def _no_graph(case) -> bool:
    """A case that needs no cuDNN graph: nothing asked, an empty grad_output (the core answers both), or only
    grad_bias asked deterministically (a CuPy reduction). With C_in = 0 only grad_bias has elements."""
    mask = tuple(bool(m) for m in case.mask)
    empty = 0 in (case.n, case.c_out)
    return not any(mask) or empty or (mask == (False, False, True) and case.deterministic)


def test_corpus_covers_every_graph_kind(accepted, refusing):
    """The corpus reaches every op, dtype, rank, layout, group count and padding kind of the compiler."""
    specs = accepted[0].specs + refusing[0].specs
    assert {s.op for s in specs} == set(compiler.OPS)
    assert {s.inputs[0].dtype for s in specs} == {"float16", "bfloat16", "float32", "float64"}
    assert {len(s.inputs[0].dims) for s in specs} == {4, 5}
    assert {s.math for s in specs} >= {"keep_dtype", "allow_tf32"}
    assert any(s.deterministic for s in specs) and any(not s.deterministic for s in specs)
    strided = [s for s in specs if any(t.strides != compiler.packed_strides(t.dims, range(len(t.dims)))
                                       for t in s.inputs if len(t.dims) == len(t.shape))]
    assert strided, "no channels-last or strided operand described to cuDNN"
    assert any(s.pre_padding != s.post_padding for s in specs)
    grouped = [s for s in specs if s.op in ("fprop", "dgrad") and s.tensor("w").dims[1] != s.inputs[0].dims[1]
               and s.op == "fprop"]
    assert grouped, "no grouped convolution"


def test_refusing_pass_emits_the_fallback_graphs(accepted, refusing):
    """Refused fused/strided/asymmetric graphs are followed by their unfused, contiguous, symmetric forms."""
    refused = [s for s in refusing[0].specs if _refused(s)]
    assert refused
    after = [s for s in refusing[0].specs if not _refused(s)]
    assert {"fprop", "wgrad", "bgrad", "dgrad"} <= {s.op for s in after}
    assert all(s.pre_padding == s.post_padding for s in after)


# ---------------------------------------------------------------------------------------------
# Real failures: vendor_error and "not supported" detection on what this frontend raises


def _fprop_spec():
    p = xconv.params.make_params((2, 4, 9, 9), (4, 4, 3, 3), dtype="float32")
    return compiler.graph_spec("fprop", p)


#: The recorded real failures of every frontend version checked (see the file's "source").
RECORDED = json.loads((pathlib.Path(__file__).with_name("cudnn_frontend_failures.json")).read_text())
#: Which recorded steps mean "no engine for this graph" (True), and which are failures (False). The
#: create_execution_plans and check_support steps depend on the version (see the test).
EXPECT_UNSUPPORTED = {
    "validate (dgrad output dims unset)": False,
    "build_operation_graph (no device)": False,
    "create_handle (no device)": False,
}


class _RecordedFrontend:
    """The parts of ``cudnn`` vendor_error reads, answering one recorded get_last_error_string()."""

    cudnnGraphNotSupportedError = cudnn.cudnnGraphNotSupportedError

    def __init__(self, last: str | None, length: int | None):
        self._last = None if last is None else last + "\x00" * max((length or 0) - len(last), 0)

    def get_last_error_string(self):
        return self._last


def _recorded_exception(failure):
    kinds = {"RuntimeError": RuntimeError, "ValueError": ValueError,
             "cudnnGraphNotSupportedError": cudnn.cudnnGraphNotSupportedError}
    return kinds[failure["type"]](failure["message"])


@pytest.mark.parametrize("version", sorted(RECORDED["versions"], key=driver.parse_version))
def test_recorded_failures_of_each_frontend_version(version):
    """Each version's real messages: clean BackendErrors, statuses by code, 'not supported' only when it is."""
    failures = [f for f in RECORDED["versions"][version] if f.get("type")]
    assert failures
    for failure in failures:
        exc = _recorded_exception(failure)
        fe = _RecordedFrontend(failure["last_error"], failure["last_error_len"])
        err = vendor_error(exc, fe, call=failure["step"])
        assert "\x00" not in err.vendor_message and len(err.vendor_message) < 1000, failure["step"]
        assert failure["message"].strip() in err.vendor_message
        if failure["last_error"]:
            assert failure["last_error"] in err.vendor_message
        named = compiler_status(failure["message"])
        if named:
            assert (err.status_name, err.status) == (named, CUDNN_STATUS[named])
        else:
            assert err.status == -1 and err.status_name == f"cudnn_frontend.{failure['type']}"
        step = failure["step"]
        if step.startswith("create_execution_plans"):
            expected = named is None or CUDNN_STATUS[named] in NOT_SUPPORTED_CODES
        elif step.startswith("check_support"):
            # "No execution plans support the graph" (1.8 to 1.18); 1.20+ first ask the CUDA
            # driver for the device, and that failure is the environment's.
            expected = "No execution plans support the graph" in failure["message"]
        else:
            expected = EXPECT_UNSUPPORTED[step]
        assert is_not_supported(exc, fe) is expected, (version, step, failure["message"])


def compiler_status(message: str) -> str | None:
    import re  # noqa: PLC0415
    names = re.findall(r"CUDNN_STATUS_[A-Z0-9_]+", message)
    return names[-1] if names else None


def test_frontend_1_8_pads_its_last_error_and_names_no_status():
    """The recorded 1.8 facts the backend's error handling is built for."""
    failures = RECORDED["versions"]["1.8.0"]
    assert all(f["last_error_len"] == 65535 for f in failures if f.get("type"))
    bog = next(f for f in failures if f["step"].startswith("build_operation_graph"))
    assert bog["type"] == "RuntimeError" and "CUDNN_STATUS" not in bog["message"]


def test_frontend_1_8_not_supported_runtime_errors_are_detected():
    """1.8's bindings raise heuristics' "no engine" as RuntimeError (the text is in its compiled module)."""
    fe = _RecordedFrontend("", 65535)
    exc = RuntimeError("[cudnn_frontend] Error: No valid engine configs returned from heuristics.")
    assert is_not_supported(exc, fe)
    assert not is_not_supported(RuntimeError("ptrDesc->finalize()"), fe)
    wrapped = cudnn.cudnnGraphNotSupportedError("no plan (the backend declined: cudnn_status: "
                                                "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)")
    assert not is_not_supported(wrapped, fe)      # the environment, not the graph
    shape = RuntimeError("cudnnFinalize failed cudnn_status: CUDNN_STATUS_NOT_SUPPORTED_SHAPE")
    assert is_not_supported(shape, fe)


# Live: the installed frontend's own failures, now.

def test_live_build_operation_graph_without_device_is_a_vendor_error_not_unsupported():
    """build_operation_graph() with no GPU fails in libcudnn; the error names the status, and is no 'unsupported'."""
    g, _ = compiler.declare_graph(cudnn, _fprop_spec())
    g.validate()
    with pytest.raises(Exception) as info:
        g.build_operation_graph()
    err = vendor_error(info.value, cudnn, call="fprop build")
    assert not is_not_supported(info.value, cudnn)
    assert err.backend == "cudnn" and err.call == "fprop build"
    assert "\x00" not in err.vendor_message and len(err.vendor_message) < 2000
    if FE_VERSION >= (1, 9):   # 1.8 names no status: "ptrDesc->finalize()"
        assert err.status_name.startswith("CUDNN_STATUS_") and err.status != -1


def test_live_backend_build_failure_without_device_raises_backend_error():
    """The backend's own build path (real frontend, no device) raises a BackendError, and caches nothing."""
    class NoDeviceBackend(CudnnBackend):
        array_families = ("numpy",)

        def _build(self, rt, spec, device):
            return compiler.build_graph(cudnn, spec, None)

    backend = NoDeviceBackend(runtime=HostRuntime(), cache=PlanCache(8))
    x = np.ones((2, 4, 9, 9), np.float32)
    w = np.ones((4, 4, 3, 3), np.float32)
    with pytest.raises(xconv.errors.BackendError) as info:
        xconv.conv_fprop(x, w, backend=backend)
    assert info.value.backend == "cudnn" and "\x00" not in str(info.value)
    assert len(backend.cache) == 0


def test_live_check_support_after_failed_build_names_what_happened():
    g, _ = compiler.declare_graph(cudnn, _fprop_spec())
    g.validate()
    with pytest.raises(Exception):
        g.build_operation_graph()
    with pytest.raises(Exception) as info:
        g.check_support()
    err = vendor_error(info.value, cudnn, call="check_support")
    assert "\x00" not in err.vendor_message


def test_not_supported_error_of_this_frontend_is_detected():
    """The frontend's own cudnnGraphNotSupportedError is 'not supported'; a plain RuntimeError is not."""
    assert is_not_supported(cudnn.cudnnGraphNotSupportedError("No valid engine configs"), cudnn)
    assert not is_not_supported(RuntimeError("ptrDesc->finalize()"), cudnn)
