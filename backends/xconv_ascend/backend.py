"""The Ascend backend object: aclnnConvolution / aclnnConvolutionBackward through the ctypes driver.

Every primitive is one call of the two-phase aclnn API:

1. the SoC capability table (:mod:`.compiler`) is checked: UnsupportedError before any device work;
2. operands become aclTensors: host NumPy arrays are copied to device memory (aclrtMalloc +
   aclrtMemcpy) with their real element strides, so non-contiguous inputs need no host copy;
   :class:`~xconv_ascend.device_array.DeviceArray` operands are used in place (dims, strides, offset);
3. ``...GetWorkspaceSize`` (phase 1), workspace allocation, phase 2 on the thread's stream, then
   ``aclrtSynchronizeStream``;
4. results are copied back to new NumPy arrays, or returned as new DeviceArrays.

Everything created along the way (aclTensor, aclIntArray, aclBoolArray, device buffers, workspace,
the deterministic option) is registered on a :class:`contextlib.ExitStack` the moment it exists
and released in reverse order on every path. The executor belongs to phase 2, which consumes it
(also when it fails); if phase 2 is never reached after a successful phase 1, it is called with a
null workspace and the requested size, which CANN answers by deleting the executor without running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from ctypes import byref, c_bool, c_int64, c_uint64, c_void_p

import numpy as np

from xconv import Backend, Capabilities, tracing
from xconv.errors import BackendError, UnsupportedError
from xconv.params import ConvParams
from xconv.workspace import check_request

from . import compiler, driver as _driver
from .compiler import OP_BACKWARD, OP_CONVOLUTION
from .device_array import DeviceArray, _Buffer, numpy_dtype
from .driver import Driver


def _i64(values):
    values = [int(v) for v in values]
    return (c_int64 * max(len(values), 1))(*values)


def _null_handle(drv: Driver, call: str) -> BackendError:
    """BackendError for an aclCreate* call that returned NULL (these return no status code: status -1)."""
    return BackendError(_driver.BACKEND, -1, "NULL handle", drv.take_message(), call=call)


def _release_callback(drv: Driver, call: str, fn, handle):
    """An ExitStack exit callback running ``fn(handle)``; a failure raises only when nothing else is failing."""
    def _exit(exc_type, exc, tb):
        status = fn(handle)
        if status != 0:
            err = drv.error(call, status)
            if exc is None:
                raise err
            exc.add_note(f"while releasing after this error: {err}")
        return False
    return _exit


class _Call:
    """The objects of one aclnn call, each released by ``stack`` in reverse order of creation."""

    def __init__(self, drv: Driver, stack: contextlib.ExitStack, device_results: bool):
        self.drv = drv
        self.fn = drv.fn
        self.stack = stack
        self.device_results = device_results
        self.stream = drv.stream()
        self.fetch = []  # callables producing the results, run after synchronization
        self.limit = None  # workspace_limit: phase 1 asking for more is refused before phase 2
        self._restore_deterministic = None  # set by deterministic(), called right after phase 1

    # memory and tensors --------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        ptr = self.drv.malloc(nbytes)
        self.stack.push(_release_callback(self.drv, "aclrtFree", self.fn.aclrtFree, ptr))
        return ptr

    def tensor(self, shape, strides, offset, dtype: int, fmt: int, storage_elements: int, ptr: int) -> int:
        handle = self.fn.aclCreateTensor(_i64(shape), len(shape), dtype, _i64(strides), int(offset), fmt,
                                         _i64([storage_elements]), 1, ptr)
        if not handle:
            raise _null_handle(self.drv, "aclCreateTensor")
        self.stack.push(_release_callback(self.drv, "aclDestroyTensor", self.fn.aclDestroyTensor, handle))
        return handle

    def int_array(self, values) -> int:
        values = list(values)
        handle = self.fn.aclCreateIntArray(_i64(values), len(values))
        if not handle:
            raise _null_handle(self.drv, "aclCreateIntArray")
        self.stack.push(_release_callback(self.drv, "aclDestroyIntArray", self.fn.aclDestroyIntArray, handle))
        return handle

    def bool_array(self, values) -> int:
        values = [bool(v) for v in values]
        handle = self.fn.aclCreateBoolArray((c_bool * len(values))(*values), len(values))
        if not handle:
            raise _null_handle(self.drv, "aclCreateBoolArray")
        self.stack.push(_release_callback(self.drv, "aclDestroyBoolArray", self.fn.aclDestroyBoolArray, handle))
        return handle

    def operand(self, a, dtype: int, fmt: int) -> int:
        """An aclTensor over ``a`` (NumPy: copied to the device with its strides; DeviceArray: in place)."""
        if isinstance(a, DeviceArray):
            if a.freed:
                raise ValueError("a DeviceArray operand's device memory was freed")
            if a.driver is not None and not a.driver.same_runtime(self.drv):
                raise ValueError("a DeviceArray operand belongs to another CANN runtime")
            if a.data_ptr is None:  # empty: any valid device address will do
                return self.tensor(a.shape, a.strides, 0, dtype, fmt, 0, self.malloc(1))
            return self.tensor(a.shape, a.strides, a.offset, dtype, fmt, a.storage_elements, a.data_ptr)
        a = np.asarray(a)
        itemsize = a.itemsize
        if any(s < 0 or s % itemsize or (s == 0 and n > 1) for s, n in zip(a.strides, a.shape)):
            a = np.ascontiguousarray(a)  # negative, unaligned or overlapping strides: not an aclTensor view
        strides = [s // itemsize for s in a.strides]
        for i in reversed(range(a.ndim)):  # size-1 dims: any stride is right; give the natural one
            if a.shape[i] == 1:
                strides[i] = strides[i + 1] * a.shape[i + 1] if i + 1 < a.ndim else 1
        span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides)) if a.size else 0
        nbytes = span * itemsize
        ptr = self.malloc(nbytes)
        self.drv.upload(ptr, max(nbytes, 1), a.ctypes.data, nbytes)
        return self.tensor(a.shape, strides, 0, dtype, fmt, span, ptr)

    def scratch(self, shape, dtype: int, np_dtype, fmt: int) -> int:
        """A contiguous device tensor that is passed to aclnn but never read back (masked outputs, unused inputs)."""
        n = math.prod(shape)
        ptr = self.malloc(n * np_dtype.itemsize)
        return self.tensor(shape, compiler.contiguous_strides(shape), 0, dtype, fmt, n, ptr)

    def output(self, shape, dtype: int, np_dtype, fmt: int) -> int:
        """A contiguous device tensor whose contents become one result (NumPy copy or DeviceArray)."""
        shape = tuple(shape)
        n = math.prod(shape)
        nbytes = n * np_dtype.itemsize
        if self.device_results:
            buf = _Buffer(self.drv, nbytes)

            def _exit(exc_type, exc, tb):  # the caller owns the buffer once the call succeeded
                if exc is not None:
                    buf.free()
                return False
            self.stack.push(_exit)
            self.fetch.append(lambda: DeviceArray(buf, shape, np_dtype))
            ptr = buf.ptr
        else:
            ptr = self.malloc(nbytes)

            def _download():
                host = np.empty(shape, dtype=np_dtype)
                self.drv.download(host.ctypes.data, host.nbytes, ptr, host.nbytes)
                return host
            self.fetch.append(_download)
        return self.tensor(shape, compiler.contiguous_strides(shape), 0, dtype, fmt, n, ptr)

    # options --------------------------------------------------------------------------------------
    def deterministic(self) -> None:
        """ACL_OPT_DETERMINISTIC = 1 for this call's phase 1, then the host's values back.

        Under the process-wide :data:`~xconv_ascend.driver.DETERMINISM_LOCK`: read the process
        value (aclrtGetSysParamOpt) and the context's, set both to 1; :meth:`run` restores both
        right after phase 1 (the option is read there) and releases the lock. The context is
        restored first, since aclrtCtxSetSysParamOpt also writes the process slot. An error on
        the way restores and releases through the stack.
        """
        drv = self.drv
        lock = _driver.DETERMINISM_LOCK
        lock.acquire()
        try:
            previous_process = drv.get_process_deterministic()
            previous_context = drv.get_deterministic()
        except BaseException:
            lock.release()
            raise
        previous_context = previous_process if previous_context is None else previous_context
        state = {"held": True, "set": []}

        def restore() -> None:
            if not state["held"]:
                return
            state["held"] = False
            try:
                errors = []
                if "context" in state["set"]:
                    status = drv.set_deterministic(previous_context)
                    if status != 0:
                        errors.append(drv.error("aclrtCtxSetSysParamOpt", status))
                if state["set"]:   # the context call wrote the process slot too: always put the host's back
                    status = drv.set_process_deterministic(previous_process)
                    if status != 0:
                        errors.append(drv.error("aclrtSetSysParamOpt", status))
                if errors:
                    raise errors[0]
            finally:
                lock.release()

        def _exit(exc_type, exc, tb):
            try:
                restore()
            except BackendError as err:
                if exc is None:
                    raise
                exc.add_note(f"while restoring ACL_OPT_DETERMINISTIC after this error: {err}")
            return False

        self.stack.push(_exit)
        state["set"].append("context")
        drv.check("aclrtCtxSetSysParamOpt", drv.set_deterministic(1))
        state["set"].append("process")
        drv.check("aclrtSetSysParamOpt", drv.set_process_deterministic(1))
        self._restore_deterministic = restore

    # the two phases --------------------------------------------------------------------------------
    def run(self, name: str, phase1, args: list, phase2) -> list:
        """Phase 1 (``phase1(*args, &workspaceSize, &executor)``), workspace, phase 2, synchronize; the results."""
        size, executor = c_uint64(0), c_void_p()
        if self._restore_deterministic is None:
            # a deterministic call on another thread restores the context slot, which also writes the process
            # slot, before the process value: a phase 1 in that window would read a transient value
            with _driver.DETERMINISM_LOCK:
                status = phase1(*args, byref(size), byref(executor))
        else:                                          # deterministic(): the lock is held until restore()
            status = phase1(*args, byref(size), byref(executor))
        if self._restore_deterministic is not None:   # the option is read at phase 1: restore it now
            restore, self._restore_deterministic = self._restore_deterministic, None
            try:
                restore()
            except BackendError:
                if status != 0:
                    raise self.drv.error(f"{name}GetWorkspaceSize", status) from None
                if executor.value:   # phase 1 made an executor: phase 2 deletes it without running
                    phase2(None, max(size.value, 1), executor.value, self.stream)
                    self.drv.take_message()
                raise
        if status != 0:
            raise self.drv.error(f"{name}GetWorkspaceSize", status)
        pending = [executor.value]

        def _drain(exc_type, exc, tb):
            # Phase 1 succeeded but phase 2 was never called: hand the executor to phase 2 with a null
            # workspace and a non-zero size, which deletes it without running (opbase CommonOpExecutorRun).
            if pending:
                phase2(None, max(size.value, 1), pending.pop(), self.stream)
                self.drv.take_message()
            return False
        self.stack.push(_drain)
        tracing.workspace(size.value)
        check_request("ascend", size.value, self.limit, f"{name} workspace")      # the executor is drained
        workspace = self.malloc(size.value) if size.value else None
        status = phase2(workspace, size.value, pending.pop(), self.stream)
        if status != 0:
            err = self.drv.error(name, status)
            self.fn.aclrtSynchronizeStream(self.stream)  # let anything launched finish before memory is freed
            self.drv.take_message()
            raise err
        self.drv.check("aclrtSynchronizeStream", self.fn.aclrtSynchronizeStream(self.stream))
        return [f() for f in self.fetch]


#: Ranks whose (pre, post) padding aclnn takes: 2-D, as [top, bottom, left, right].
NATIVE_ASYMMETRIC_PADDING = frozenset({2})


def _bias_only_params(p: ConvParams) -> ConvParams:
    """A direct 1x1 depthwise convolution whose output has ``p``'s output shape: its bias gradient is ``p``'s.

    Also for an empty ``p`` (C_in = 0: aclnn rejects a weight dim of 0), as the core asks for grad_bias there."""
    nd, channels = p.nd, p.output_shape[1]
    return p.replace(input_shape=p.output_shape, weight_shape=(channels, 1) + (1,) * nd, stride=(1,) * nd,
                     padding=((0, 0),) * nd, dilation=(1,) * nd, groups=channels, transposed=False,
                     output_padding=(0,) * nd)


class AscendBackend(Backend):
    """Huawei Ascend NPUs through CANN's aclnnConvolution and aclnnConvolutionBackward (ctypes).

    Takes NumPy arrays (copied to the device and back per call) and
    :class:`~xconv_ascend.device_array.DeviceArray` (kept on the device). ``driver`` replaces the
    process's default :class:`~xconv_ascend.driver.Driver` (tests).
    """

    name = "ascend"
    array_families = ("numpy", "xconv_ascend")
    priority = -5  # NumPy arrays keep going to the numpy backend unless backend="ascend" is asked for
    capabilities = Capabilities(
        spatial_dims=frozenset({1, 2, 3}),          # NCL, NCHW, NCDHW natively
        dtypes=frozenset({"float16", "bfloat16", "float32"}),
        asymmetric_padding=NATIVE_ASYMMETRIC_PADDING,  # 2-D as [top, bottom, left, right]; others: the core pads
        transposed=True,                            # aclnn's transposed flag
        strided=True,                               # aclTensors carry element strides and offset
        deterministic=True,                         # ACL_OPT_DETERMINISTIC for the call
        math=frozenset({"keep_dtype", "allow_tf32", "allow_fp16"}),
    )

    def __init__(self, driver: Driver | None = None):
        self._driver_override = driver

    @property
    def driver(self) -> Driver:
        return self._driver_override if self._driver_override is not None else _driver.default_driver()

    # availability -----------------------------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        return self.driver.availability()

    def version(self) -> str:
        drv = self.driver
        return f"CANN libraries in {drv.report()}" if drv.lib_dir else ""

    def effective_math(self, dtype: str = "float32", math: str = "keep_dtype", op: str = OP_BACKWARD) -> dict:
        """What a call with this dtype and ``math`` really computes in on this device's SoC.

        ``{"soc", "family", "cube_math_type", "cube_math_name", "computes_in"}``: the cubeMathType
        xconv sends, and what the cube unit computes the inputs in there ("float32", "hfloat32",
        "float16", "bfloat16", "unsupported", or "unknown" for a SoC the table does not know).
        ``op`` is ``"backward"`` (every gradient) or ``"convolution"`` (fprop). Accumulation is float32.
        """
        if op not in (OP_BACKWARD, OP_CONVOLUTION):
            raise ValueError(f"op must be {OP_BACKWARD!r} or {OP_CONVOLUTION!r}, not {op!r}")
        if math not in compiler.MATH_TO_CUBE:
            raise ValueError(f"math must be one of {sorted(compiler.MATH_TO_CUBE)}, not {math!r}")
        drv = self.driver
        try:
            drv.initialize()
            soc = drv.soc_name
        except _driver.LoadError:
            soc = None
        fam = compiler.soc_family(soc)
        cube = compiler.MATH_TO_CUBE[math] if dtype == "float32" else compiler.KEEP_DTYPE
        return {"soc": soc, "family": fam.key if fam else None, "cube_math_type": cube,
                "cube_math_name": compiler.CUBE_MATH_NAMES[cube],
                "computes_in": compiler.computes_in(dtype, cube, fam.key if fam else None, op)}

    def devices(self) -> tuple[str, ...]:
        label = self.driver.device_label()
        return (label,) if label else ()

    def emulation(self) -> str:
        """"" on real CANN, else what the emulator says it is (:data:`.loader.EMULATOR_MARKER`)."""
        self.driver.availability()          # loads the libraries when it can (never raises)
        return self.driver.emulation

    # helpers ------------------------------------------------------------------------------------------
    def _begin(self, p: ConvParams, op: str):
        """Driver and aclnn arguments, after the capability table (no device work before this passes)."""
        drv = self.driver
        try:
            drv.initialize()
        except _driver.LoadError as exc:
            raise _driver.BackendUnavailableError(self.name, str(exc)) from None
        return drv, compiler.check(p, drv.soc_name, op, backend=self.name)

    def capabilities_for(self, p: ConvParams, op: str) -> Capabilities:
        """Without transposed convolution for a transposed ``p`` that breaks a rule of aclnn which running it
        as direct convolutions avoids (outputPadding >= stride for the backward op): the core maps it."""
        if p.transposed:
            drv = self.driver
            try:
                drv.initialize()
            except _driver.LoadError as exc:
                raise _driver.BackendUnavailableError(self.name, str(exc)) from None
            aclnn_op = OP_CONVOLUTION if op == "fprop" else OP_BACKWARD
            if compiler.direct_fallback(p, drv.soc_name, aclnn_op) is not None:
                return dataclasses.replace(self.capabilities, transposed=False)
        return self.capabilities

    @staticmethod
    def _on_device(*arrays) -> bool:
        return any(isinstance(a, DeviceArray) for a in arrays)

    # primitives -------------------------------------------------------------------------------------------
    def fprop(self, x, w, bias, p: ConvParams):
        if self._forward_through_backward(p):
            return self._fprop_as_transposed_dgrad(x, w, bias, p)
        drv, a = self._begin(p, OP_CONVOLUTION)
        np_dtype = np.dtype(numpy_dtype(p.dtype))
        with contextlib.ExitStack() as stack:
            call = _Call(drv, stack, self._on_device(x, w, bias))
            call.limit = p.workspace_limit
            t_x = call.operand(x, a.dtype, a.format)
            t_w = call.operand(w, a.dtype, a.format)
            t_b = call.operand(bias, a.dtype, compiler.ACL_FORMAT_ND) if bias is not None else None
            t_y = call.output(p.output_shape, a.dtype, np_dtype, a.format)
            arrays = [call.int_array(v) for v in (a.stride, a.padding, a.dilation, a.output_padding)]
            if p.deterministic:
                call.deterministic()
            (y,) = call.run("aclnnConvolution", drv.fn.aclnnConvolutionGetWorkspaceSize,
                            [t_x, t_w, t_b, arrays[0], arrays[1], arrays[2], a.transposed, arrays[3], a.groups, t_y,
                             a.cube_math_type], drv.fn.aclnnConvolution)
        _note("aclnnConvolution", a, p)
        return y

    def _forward_through_backward(self, p: ConvParams) -> bool:
        """Whether this SoC's aclnnConvolution refuses ``p`` where aclnnConvolutionBackward computes it
        (Atlas A2/A3: float32 with KEEP_DTYPE)."""
        drv = self.driver
        try:
            drv.initialize()
        except _driver.LoadError:
            return False  # _begin reports it
        if drv.soc_name is None:   # e.g. after an aclFinalize elsewhere: initialize again to learn the SoC
            drv.ensure_context()
        return compiler.backward_fallback(p, drv.soc_name) is not None

    def _fprop_as_transposed_dgrad(self, x, w, bias, p: ConvParams):
        """conv(x, w) as the data gradient of the transposed convolution with the same weight, then the bias."""
        y = self.dgrad(x, w, compiler.as_transposed(p))
        if bias is None:
            return y
        on_device = isinstance(y, DeviceArray)
        host_y = y.to_numpy() if on_device else y
        host_b = bias.to_numpy() if isinstance(bias, DeviceArray) else np.asarray(bias)
        acc = np.float64 if host_y.dtype == np.float64 else np.float32
        total = (host_y.astype(acc) + host_b.astype(acc).reshape((1, -1) + (1,) * (host_y.ndim - 2))).astype(
            host_y.dtype)
        if not on_device:
            return np.ascontiguousarray(total)
        out = DeviceArray.from_numpy(total, y.driver)
        y.free()
        return out

    def backward(self, dy, x, w, p: ConvParams, mask):
        mask = tuple(bool(m) for m in mask)
        if not any(mask):
            return None, None, None
        if mask == (False, False, True):
            return None, None, self.bgrad(dy, p)
        return self._backward(dy, x, w, p, mask)

    def dgrad(self, dy, w, p: ConvParams):
        return self._backward(dy, None, w, p, (True, False, False))[0]

    def wgrad(self, x, dy, p: ConvParams):
        return self._backward(dy, x, None, p, (False, True, False))[1]

    def bgrad(self, dy, p: ConvParams):
        # Only dy matters: run the 1x1 depthwise convolution with dy's shape (small scratch operands, no
        # constraint of p's kernel, padding or transposition, no empty input) unless its groups would exceed
        # aclnn's 65535.
        q = _bias_only_params(p)
        if q.groups > 65535:
            native = ((p.symmetric or p.nd in NATIVE_ASYMMETRIC_PADDING)
                      and (not p.transposed or self.capabilities_for(p, "bgrad").transposed))
            if not native:
                raise UnsupportedError(f"backend {self.name!r}: grad_bias alone of this configuration "
                                       f"({p.output_shape[1]} channels) has no aclnn form")
            q = p
        return self._backward(dy, None, None, q, (False, False, True))[2]

    def _backward(self, dy, x, w, p: ConvParams, mask):
        """aclnnConvolutionBackward with ``mask``. ``x``/``w`` None: scratch tensors of the right shape stand in
        (the masked computations do not read them). Masked gradients get scratch outputs and come back None."""
        drv, a = self._begin(p, OP_BACKWARD)
        np_dtype = np.dtype(numpy_dtype(p.dtype))
        with contextlib.ExitStack() as stack:
            call = _Call(drv, stack, self._on_device(dy, x, w))
            call.limit = p.workspace_limit
            t_dy = call.operand(dy, a.dtype, a.format)
            t_x = call.operand(x, a.dtype, a.format) if x is not None else \
                call.scratch(p.input_shape, a.dtype, np_dtype, a.format)
            t_w = call.operand(w, a.dtype, a.format) if w is not None else \
                call.scratch(p.weight_shape, a.dtype, np_dtype, a.format)
            outs = []
            for bit, shape in zip(mask[:2], (p.input_shape, p.weight_shape)):
                outs.append(call.output(shape, a.dtype, np_dtype, a.format) if bit else
                            call.scratch(shape, a.dtype, np_dtype, a.format))
            t_db = call.output((p.bias_size,), a.dtype, np_dtype, compiler.ACL_FORMAT_ND) if mask[2] else None
            bias_sizes, stride, padding, dilation, output_padding = (
                call.int_array(v) for v in (a.bias_sizes, a.stride, a.padding, a.dilation, a.output_padding))
            t_mask = call.bool_array(mask)
            if p.deterministic:
                call.deterministic()
            results = iter(call.run(
                "aclnnConvolutionBackward", drv.fn.aclnnConvolutionBackwardGetWorkspaceSize,
                [t_dy, t_x, t_w, bias_sizes, stride, padding, dilation, a.transposed, output_padding, a.groups,
                 t_mask, a.cube_math_type, outs[0], outs[1], t_db], drv.fn.aclnnConvolutionBackward))
        _note("aclnnConvolutionBackward", a, p, mask)
        return tuple(next(results) if bit else None for bit in mask)


#: cubeMathType -> the xconv math mode it delivers (16-bit inputs always run KEEP_DTYPE).
_CUBE_TO_MATH = {compiler.KEEP_DTYPE: "keep_dtype", compiler.USE_HF32: "allow_tf32",
                 compiler.ALLOW_FP32_DOWN_PRECISION: "allow_fp16"}


def _note(op: str, a, p: ConvParams, mask=None) -> None:
    """The running call's trace record: the aclnn op, its cubeMathType (and the effective math), determinism."""
    if not tracing.active():
        return
    bits = "" if mask is None else f" outputMask={''.join('1' if m else '0' for m in mask)}"
    tracing.note(f"{op} cubeMathType={a.cube_math_type} ({compiler.CUBE_MATH_NAMES[a.cube_math_type]}){bits}",
                 math=_CUBE_TO_MATH.get(a.cube_math_type, p.math),
                 deterministic="run_to_run" if p.deterministic else "none")
