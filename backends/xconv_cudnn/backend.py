"""The cuDNN backend object: cuDNN frontend graphs on CuPy arrays.

Per call: operands are checked (strides describable to cuDNN, 16-byte aligned; otherwise copied),
the plan key is formed, the cached graph is found or built, outputs and workspace come from CuPy's
memory pool, and the graph runs on CuPy's current stream. Nothing synchronizes the device except
autotuning, once per key. The first call for a key decides, once, how that configuration runs
(see :mod:`xconv_cudnn.cache`): a cuDNN plan, a fallback, or an UnsupportedError raised before any
work.
"""

from __future__ import annotations

import dataclasses
import re
import threading

from xconv import Backend, Capabilities, legalize, tracing
from xconv.errors import BackendError, BackendUnavailableError, UnsupportedError
from xconv.params import ConvParams
from xconv.workspace import check_request

from . import compiler, driver
from .cache import Entry, PlanCache, autotune, benchmark_enabled
from .compiler import ALIGNMENT, OPERANDS, describe_strides, graph_spec, is_packed_nchw, plan_key

#: cuDNN 9 status codes by name (cudnn_graph.h), for BackendError.status.
CUDNN_STATUS = {
    "CUDNN_STATUS_SUCCESS": 0,
    "CUDNN_STATUS_NOT_INITIALIZED": 1001,
    "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH": 1002,
    "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH": 1003,
    "CUDNN_STATUS_DEPRECATED": 1004,
    "CUDNN_STATUS_LICENSE_ERROR": 1005,
    "CUDNN_STATUS_RUNTIME_IN_PROGRESS": 1006,
    "CUDNN_STATUS_RUNTIME_FP_OVERFLOW": 1007,
    "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED": 1008,
    "CUDNN_STATUS_BAD_PARAM": 2000,
    "CUDNN_STATUS_INVALID_VALUE": 2001,
    "CUDNN_STATUS_BAD_PARAM_NULL_POINTER": 2002,
    "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER": 2003,
    "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED": 2004,
    "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND": 2005,
    "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT": 2006,
    "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH": 2007,
    "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH": 2008,
    "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES": 2009,
    "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE": 2010,
    "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH": 2011,
    "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE": 2012,
    "CUDNN_STATUS_NOT_SUPPORTED": 3000,
    "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN": 3001,
    "CUDNN_STATUS_NOT_SUPPORTED_SHAPE": 3002,
    "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE": 3003,
    "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT": 3004,
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER": 3005,
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART": 3006,
    "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH": 3007,
    "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING": 3008,
    "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE": 3009,
    "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT": 3010,
    "CUDNN_STATUS_NOT_SUPPORTED_PADDING": 3011,
    "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM": 3012,
    "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API": 3013,
    "CUDNN_STATUS_INTERNAL_ERROR": 4000,
    "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED": 4001,
    "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE": 4002,
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED": 4003,
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED": 4004,
    "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM": 4005,
    "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED": 4006,
    "CUDNN_STATUS_EXECUTION_FAILED": 5000,
    "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER": 5001,
    "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS": 5002,
    "CUDNN_STATUS_EXECUTION_FAILED_CUDART": 5003,
    "CUDNN_STATUS_EXECUTION_FAILED_CURAND": 5004,
}
_STATUS_RE = re.compile(r"CUDNN_STATUS_[A-Z0-9_]+")


#: Status codes that mean "no engine for this graph" (its shape, layout, type, padding, resources).
#: The other NOT_SUPPORTED_* codes name the environment (driver, CUDA runtime, architecture, a
#: missing sub-library): a build failing with them is a vendor error, not a cue to fall back.
NOT_SUPPORTED_CODES = frozenset({3000, 3001, 3002, 3003, 3004, 3010, 3011, 3012})
#: What the frontends (1.8 on) say when no engine serves a graph and they name no status: the
#: texts of cudnn_frontend's own checks (1.8's bindings raise some of these as plain RuntimeError).
_NOT_SUPPORTED_TEXTS = ("No valid engine configs", "No execution plans support the graph",
                        "No valid execution plans built", "proposed a plan for this graph")


def _last_error(fe) -> str:
    """``fe.get_last_error_string()`` without its padding (1.8 returns 65,535 chars, NUL-padded), or ""."""
    try:
        last = fe.get_last_error_string() if fe is not None and hasattr(fe, "get_last_error_string") else ""
    except Exception:  # noqa: BLE001 - diagnostics only
        return ""
    text = last.decode(errors="replace") if isinstance(last, bytes) else str(last or "")
    return text.split("\x00", 1)[0].strip()


def status_of(message: str) -> tuple[str, int] | None:
    """(name, code) of the most specific cuDNN status named in ``message``, or None when it names none.

    A frontend message can chain several (a failed sub-step inside a "not supported" summary):
    the last one named is the cause reported by the library.
    """
    names = _STATUS_RE.findall(message)
    if not names:
        return None
    name = names[-1]
    return name, CUDNN_STATUS.get(name, -1)


def vendor_error(exc: BaseException, fe=None, call: str = "") -> BackendError:
    """A frontend exception as BackendError: the cuDNN status named in its message (and its code), else its type."""
    message = str(exc).split("\x00", 1)[0].strip()
    last = _last_error(fe)
    if last and last not in message:
        message = f"{message} (cuDNN last error: {last})" if message else last
    status = status_of(message)
    name, code = status if status else (f"cudnn_frontend.{type(exc).__name__}", -1)
    return BackendError("cudnn", code, name, message, call)


def is_not_supported(exc: BaseException, fe) -> bool:
    """Whether a build failure means "no engine for this graph" rather than a bug or a failure.

    By status code where the message names one (a ``cudnnGraphNotSupportedError`` carrying
    CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED is a broken install, not an unsupported graph); else
    by the frontend's exception class; else (frontend 1.8, whose bindings raise some of these as
    RuntimeError) by the frontend's own "no engine" texts.
    """
    status = status_of(str(exc))
    if status is not None:
        return status[1] in NOT_SUPPORTED_CODES
    unsupported = getattr(fe, "cudnnGraphNotSupportedError", None)
    if unsupported is not None and isinstance(exc, unsupported):
        return True
    if isinstance(exc, NotImplementedError):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _NOT_SUPPORTED_TEXTS)


def describe(spec: compiler.GraphSpec) -> str:
    """A one-line description of a graph's configuration for error messages."""
    parts = [spec.op, spec.inputs[0].dtype]
    parts += [f"{t.name}{t.dims}" for t in spec.inputs]
    if spec.op != "bgrad":
        parts += [f"stride={spec.stride}", f"padding=pre{spec.pre_padding}/post{spec.post_padding}",
                  f"dilation={spec.dilation}"]
    parts += [f"math={spec.math}", f"deterministic={spec.deterministic}"]
    return " ".join(parts)


class _SymmetricPaddingOnly:
    """The backend as seen by the core when cuDNN has no engine for an asymmetric padding.

    The core then pads the input explicitly and calls back with symmetric padding.
    """

    def __init__(self, backend: "CudnnBackend"):
        self._backend = backend
        self.name = backend.name
        self.capabilities = dataclasses.replace(backend.capabilities, asymmetric_padding=frozenset())

    def fprop(self, x, w, bias, p):
        return self._backend.fprop(x, w, bias, p)

    def dgrad(self, dy, w, p):
        return self._backend.dgrad(dy, w, p)

    def wgrad(self, x, dy, p):
        return self._backend.wgrad(x, dy, p)

    def bgrad(self, dy, p):
        return self._backend.bgrad(dy, p)

    def backward(self, dy, x, w, p, mask):
        return self._backend.backward(dy, x, w, p, mask)


class CudnnBackend(Backend):
    """NVIDIA cuDNN (graph API, through the cuDNN frontend's Python bindings) on CuPy arrays.

    ``runtime`` replaces the CuPy runtime (tests); ``cache`` the plan cache; ``fuse_bias`` tries
    to compute grad_bias (and the fprop bias) inside the convolution's graph first.
    """

    name = "cudnn"
    array_families = ("cupy",)
    priority = 10
    capabilities = Capabilities(
        spatial_dims=frozenset({2, 3}),                     # 1-D arrives as 2-D with a unit H (core)
        dtypes=frozenset({"float16", "bfloat16", "float32", "float64"}),
        asymmetric_padding=frozenset({2, 3}),               # cuDNN pre/post padding
        transposed=False,                                   # the core maps it onto fprop/dgrad/wgrad
        strided=True,                                       # strides are described, not copied
        deterministic=True,                                 # NONDETERMINISTIC engines deselected
        math=frozenset({"keep_dtype", "allow_tf32", "allow_fp16"}),
    )

    def __init__(self, runtime=None, cache: PlanCache | None = None, fuse_bias: bool = True):
        self._runtime = runtime
        self._injected = runtime is not None
        self.cache = cache if cache is not None else PlanCache()
        self.fuse_bias = fuse_bias
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------
    # Availability

    def availability(self) -> tuple[bool, str]:
        if self._injected:
            return True, ""
        status = driver.availability()
        return status.available, status.reason

    def version(self) -> str:
        if self._injected:
            return "injected runtime"
        return driver.availability().version_string

    def devices(self) -> tuple[str, ...]:
        if self._injected:
            return ("injected",)
        return driver.availability().devices

    def emulation(self) -> str:
        """"" on CuPy and cuDNN as installed; else what the backend runs on instead (an injected runtime, or
        stand-in modules: :func:`.driver.stand_ins`)."""
        if self._injected:
            return f"an injected runtime ({type(self._runtime).__name__}), not CuPy and cuDNN on a GPU"
        status = driver.availability()
        return status.emulation if status.available else ""

    def runtime(self):
        rt = self._runtime
        if rt is None:
            with self._lock:
                if self._runtime is None:
                    status = driver.availability()
                    if not status.available:
                        raise BackendUnavailableError(self.name, status.reason)
                    self._runtime = driver.CupyRuntime()
                rt = self._runtime
        return rt

    # ---------------------------------------------------------------------------------------
    # Primitives

    def fprop(self, x, w, bias, p: ConvParams):
        if bias is None:
            return self._run("fprop", p, (x, w))
        if self.fuse_bias:
            return self._run("fprop_bias", p, (x, w, bias))
        return self._unfused("fprop_bias", p, (x, w, bias))

    def dgrad(self, dy, w, p: ConvParams):
        return self._run("dgrad", p, (dy, w))

    def wgrad(self, x, dy, p: ConvParams):
        return self._run("wgrad", p, (x, dy))

    def bgrad(self, dy, p: ConvParams):
        return self._run("bgrad", p, (dy,))

    def backward(self, dy, x, w, p: ConvParams, mask):
        m_in, m_w, m_b = mask
        dx = self._run("dgrad", p, (dy, w)) if m_in else None
        if m_w and m_b and self.fuse_bias:
            dw, db = self._run("wgrad_bgrad", p, (x, dy))
        else:
            dw = self._run("wgrad", p, (x, dy)) if m_w else None
            db = self._run("bgrad", p, (dy,)) if m_b else None
        return dx, dw, db

    # ---------------------------------------------------------------------------------------
    # The call path

    def _prepare(self, rt, a):
        """(operand, strides for cuDNN or None when C-contiguous), copying what cuDNN cannot take as is."""
        if rt.is_c_contiguous(a):
            return (a, None) if rt.ptr(a) % ALIGNMENT == 0 else (rt.copy(a), None)
        if a.ndim >= 3:
            strides = describe_strides(a.shape, rt.element_strides(a))
            if strides is not None and rt.ptr(a) % ALIGNMENT == 0:
                return (a, None) if is_packed_nchw(a.shape, strides) else (a, strides)
        return rt.copy(a), None

    def plan_key_for(self, op: str, p: ConvParams, operands) -> tuple:
        """The cache key a call of ``op`` with these operands uses (after operand preparation)."""
        rt = self.runtime()
        prepared = [self._prepare(rt, a) for a in operands]
        layouts = tuple("C" if s is None else s for _, s in prepared)
        dy_shape = tuple(prepared[0][0].shape) if op == "bgrad" else None
        return plan_key(op, p, layouts, rt.device_of(prepared[0][0]), benchmark_enabled(), dy_shape)

    def _run(self, op: str, p: ConvParams, operands):
        rt = self.runtime()
        arrays, layouts, strides = [], [], {}
        for name, a in zip(OPERANDS[op], operands):
            a, s = self._prepare(rt, a)
            arrays.append(a)
            if s is None:
                layouts.append("C")
            else:
                layouts.append(s)
                strides[name] = s
        device = rt.device_of(arrays[0])
        tune = benchmark_enabled()
        dy_shape = tuple(arrays[0].shape) if op == "bgrad" else None
        key = plan_key(op, p, tuple(layouts), device, tune, dy_shape)
        with rt.on_device(device):
            entry = self.cache.get(key)
            hit = entry is not None
            if entry is None:
                entry = self.cache.put(key, self._compile(rt, op, p, arrays, strides, device, tune, dy_shape))
            if tracing.active():
                _note(entry, op, p, hit)
            if entry.kind == "plan":
                check_request(self.name, entry.workspace, p.workspace_limit)    # a frontend that ignored the cap
                return self._execute(rt, entry, arrays, device)
            if entry.kind == "error":
                raise UnsupportedError(entry.error)
            return self._delegate(entry.delegate, op, p, arrays)

    def _execute(self, rt, entry: Entry, arrays, device: int):
        like = arrays[0]
        outs = [rt.empty(shape, like) for _, shape in entry.outputs]
        pack = {uid: rt.ptr(arrays[i]) for uid, i in entry.inputs}
        for (uid, _), out in zip(entry.outputs, outs):
            pack[uid] = rt.ptr(out)
        workspace, workspace_ptr = rt.workspace(entry.workspace)
        handle = rt.handle(device)
        try:
            if entry.plan_index is None:
                entry.graph.execute(pack, workspace_ptr, handle=handle)
            else:
                entry.graph.execute_plan_at_index(pack, workspace_ptr, index=entry.plan_index, handle=handle)
        except Exception as exc:
            raise vendor_error(exc, rt.fe, call=f"{entry.spec.op} execute") from exc
        del workspace  # returned to the pool; its reuse is ordered on this stream
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _delegate(self, how: str, op: str, p: ConvParams, arrays):
        if how == "contiguous":
            rt = self.runtime()
            return self._run(op, p, [rt.contiguous(a) for a in arrays])
        if how == "unfused":
            return self._unfused(op, p, arrays)
        if how == "cupy":
            return self.runtime().sum_bias(arrays[0], p.dtype)
        if how == "symmetric":
            proxy = _SymmetricPaddingOnly(self)
            if op == "fprop":
                return legalize.fprop(proxy, arrays[0], arrays[1], None, p)
            if op == "dgrad":
                return legalize.dgrad(proxy, arrays[0], arrays[1], p)
            if op == "wgrad":
                return legalize.wgrad(proxy, arrays[0], arrays[1], p)
        raise AssertionError(f"no delegate {how!r} for {op}")

    def _unfused(self, op: str, p: ConvParams, arrays):
        if op == "fprop_bias":
            y = self._run("fprop", p, arrays[:2])
            return self.runtime().add_bias(y, arrays[2])
        if op == "wgrad_bgrad":
            return self._run("wgrad", p, arrays), self._run("bgrad", p, arrays[1:])
        raise AssertionError(f"{op} has no unfused form")

    # ---------------------------------------------------------------------------------------
    # Building plans (once per key)

    def _build(self, rt, spec: compiler.GraphSpec, device: int) -> compiler.BuiltGraph:
        return compiler.build_graph(rt.fe, spec, rt.handle(device))

    def _compile(self, rt, op, p, arrays, strides, device, tune, dy_shape) -> Entry:
        if p.deterministic and op == "bgrad":
            return Entry("delegate", delegate="cupy")          # CuPy reductions are deterministic
        if p.deterministic and op == "wgrad_bgrad":
            return Entry("delegate", delegate="unfused")
        spec = graph_spec(op, p, strides, autotune=tune, dy_shape=dy_shape)
        try:
            built = self._build(rt, spec, device)
        except Exception as exc:
            if not is_not_supported(exc, rt.fe):
                raise vendor_error(exc, rt.fe, call=f"{op} build") from exc
            if op in compiler.UNFUSED:
                return Entry("delegate", delegate="unfused")
            if op == "bgrad":
                return Entry("delegate", delegate="cupy")
            if strides:
                return Entry("delegate", delegate="contiguous")
            if not p.symmetric:
                return Entry("delegate", delegate="symmetric")
            return Entry("error", error=self._diagnose(rt, spec, device, exc))
        entry = Entry("plan", spec=spec, graph=built.graph,
                      inputs=tuple((built.uids[t.name], i) for i, t in enumerate(spec.inputs)),
                      outputs=tuple((built.uids[t.name], t.shape) for t in spec.outputs),
                      workspace=built.workspace)
        if tune and built.plan_count > 1:
            self._autotune(rt, entry, built, arrays, device, p.workspace_limit)
        entry.engine = _plan_name(built.graph, entry.plan_index)
        return entry

    def _diagnose(self, rt, spec: compiler.GraphSpec, device: int, exc: BaseException) -> str:
        """Why no plan exists, found by rebuilding without the note filters (error path only)."""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = describe(spec)
        spec = dataclasses.replace(spec, autotune=False)

        def builds(candidate) -> bool:
            try:
                self._build(rt, candidate, device)
                return True
            except Exception as err:
                if is_not_supported(err, rt.fe):
                    return False
                raise vendor_error(err, rt.fe, call=f"{spec.op} build") from err

        if spec.workspace_limit is not None and builds(dataclasses.replace(spec, workspace_limit=None)):
            return (f"backend 'cudnn': every cuDNN engine for this configuration needs more workspace than "
                    f"workspace_limit={spec.workspace_limit} bytes: {what}")
        if spec.deselect_notes and builds(spec.without_filters()):
            if spec.deterministic and builds(spec.without_filters(math=False, determinism=True)):
                return (f"backend 'cudnn': cuDNN has no deterministic engine for this configuration (every "
                        f"candidate engine carries the NONDETERMINISTIC numerical note): {what}")
            math_notes = [n for n in spec.deselect_notes if n != compiler.NONDETERMINISTIC]
            return (f"backend 'cudnn': no cuDNN engine computes this configuration under math={spec.math!r} "
                    f"(all candidates carry one of the numerical notes {math_notes}"
                    f"{'' if not spec.deterministic else ' or NONDETERMINISTIC'}); "
                    f"{'allow_tf32 may admit one' if spec.math == 'keep_dtype' else 'no mode admits one'}: {what}")
        kind = "float64 " if spec.io_type == "DOUBLE" else ""
        return f"backend 'cudnn': cuDNN has no {kind}engine for this configuration: {what} ({detail})"

    def _autotune(self, rt, entry: Entry, built: compiler.BuiltGraph, arrays, device: int, limit=None) -> None:
        """Time every built candidate on this call's buffers; keep the fastest (once per key)."""
        g = built.graph
        handle = rt.handle(device)
        scratch = [rt.empty(shape, arrays[0]) for _, shape in entry.outputs]
        pack = {uid: rt.ptr(arrays[i]) for uid, i in entry.inputs}
        for (uid, _), out in zip(entry.outputs, scratch):
            pack[uid] = rt.ptr(out)

        def time_plan(index: int, warmup: int, repeats: int):
            try:
                size = int(g.get_workspace_size_plan_at_index(index))
                if limit is not None and size > limit:
                    return None                         # outside workspace_limit: not a candidate
                workspace, ptr = rt.workspace(size)
                return rt.time_calls(lambda: g.execute_plan_at_index(pack, ptr, index=index, handle=handle),
                                     warmup, repeats)
            except Exception:
                return None  # not built, deselected or failing: not a candidate

        try:
            best, timings = autotune(built.plan_count, time_plan)
        except LookupError:
            return  # keep the heuristics' choice
        entry.plan_index = best
        entry.timings = timings
        entry.workspace = int(g.get_workspace_size_plan_at_index(best))


# ---------------------------------------------------------------------------------------------
# Provenance (xconv.trace records)


def _plan_name(graph, index) -> str:
    """The engine name (id and knobs, e.g. "eng1_k2=3") of the autotuned plan; "" for the heuristics' choice or
    a frontend without ``get_plan_name_at_index``."""
    if index is None or not hasattr(graph, "get_plan_name_at_index"):
        return ""
    try:
        return str(graph.get_plan_name_at_index(index))
    except Exception:  # noqa: BLE001 - a name is provenance only
        return ""


def _note(entry: Entry, op: str, p: ConvParams, hit: bool) -> None:
    """Fill the running call's trace record from the cache entry that serves it."""
    cache = "hit" if hit else "miss"
    det = "run_to_run" if p.deterministic else "none"
    if entry.kind == "plan":
        spec = entry.spec
        if entry.plan_index is None:
            engine = "heuristics' first supported plan"
        else:
            engine = f"autotuned plan {entry.plan_index}" + (f" {entry.engine}" if entry.engine else "")
        filters = ",".join(spec.deselect_notes) or "none"
        cap = "" if spec.workspace_limit is None else f", workspace <= {spec.workspace_limit}"
        tracing.note(f"cuDNN {spec.op} graph: {engine} (deselected notes: {filters}{cap}; "
                     f"compute {spec.compute_type})", math=p.math, deterministic=det, plan_cache=cache,
                     workspace_bytes=entry.workspace)
    elif entry.kind == "delegate":
        what = {"cupy": "CuPy reduction (bias gradient)", "contiguous": "operands copied contiguous",
                "symmetric": "explicit padding by the core", "unfused": "unfused graphs"}.get(entry.delegate,
                                                                                             entry.delegate)
        tracing.note(f"cuDNN {op}: {what}", math=p.math, deterministic=det, plan_cache=cache)
    else:
        tracing.note(plan_cache=cache)
