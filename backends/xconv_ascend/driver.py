"""The CANN runtime under the Ascend backend: loading the libraries, lifecycle, threads, memory, options.

Nothing is loaded at import. :class:`Driver` finds the CANN libraries (:mod:`.loader`, :mod:`.discovery`: the
runtime ``libascendcl.so`` or ``libacl_rt.so``, ``libnnopbase.so``, and the operator libraries
``libopapi_*.so`` or else ``libopapi.so``) in one directory named by an absolute path:

1. ``$XCONV_ASCEND_LIB_DIR`` (the directory itself), else
2. ``$ASCEND_HOME_PATH/lib64``, else
3. ``$ASCEND_TOOLKIT_HOME/lib64`` (both set by CANN's ``set_env.sh``).

The first variable that is set decides; a relative path is refused: nothing is resolved against the
current directory, and the dynamic linker never searches for the libraries or their dependencies. They
are loaded with RTLD_GLOBAL in the order runtime, nnopbase, operators, and every function used has
its ``argtypes``/``restype`` declared as in CANN's public headers (:mod:`.abi`).

Lifecycle: ``aclInit`` once per process (100002 "repeat initialize" counts as success);
``aclrtSetDevice`` on each calling thread with the device from ``$XCONV_ASCEND_DEVICE`` (default 0):
the device's default context is shared by all threads, only which context is current is per
thread; one stream per thread. :meth:`Driver.release_thread` (or the thread's end) destroys the
thread's stream and drops its device reference, except the last one while DeviceArrays live.

Device arrays live in :mod:`.device_array`.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from ctypes import byref, c_int32, c_int64, c_uint32, c_void_p

from xconv.errors import BackendError, BackendUnavailableError

from . import discovery, loader
from .abi import (  # noqa: F401  (re-exported: driver.X stays the public spelling)
    ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_RT_SYSPARAMOPT_NOT_SET, ACL_ERROR_UNINITIALIZE, ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_OPT_DETERMINISTIC, ACL_SUCCESS, LIBRARIES, SIGNATURES,
    STATUS_NAMES, describe_status, status_name,
)
from .loader import LIB_DIR_VARS, LoadError, environ_value as _environ_value  # noqa: F401  (re-exported)

BACKEND = "ascend"

DEVICE_VAR = "XCONV_ASCEND_DEVICE"


class Driver:
    """One CANN runtime as seen by xconv: the three libraries, aclInit, per-thread device and stream.

    ``lib_dir`` overrides the environment lookup; ``environ`` (default ``os.environ``, read at
    each lookup) is where the variables are read from. A process loads CANN once: create one
    Driver per library directory (the backend uses :func:`default_driver`).
    """

    def __init__(self, lib_dir: str | os.PathLike | None = None, environ=None):
        self._lib_dir = None if lib_dir is None else os.fspath(lib_dir)
        self._environ = environ
        self._lock = threading.RLock()
        self._local = threading.local()
        self.fn = None            # _Functions once loaded
        self.libs: dict[str, ctypes.CDLL] = {}
        self.lib_dir: str | None = None
        self.source = ""
        self.emulation = ""       # what the loaded libraries are when they are an emulator (see loader)
        self.inventory: discovery.Inventory | None = None
        self._initialized = False
        self._device: int | None = None
        # Device references: one per thread that set the device (released by release_thread() or
        # when the thread ends), plus "parked" ones kept for DeviceArrays still alive when the last
        # thread let go (the device's default context is shared: resetting its last reference
        # destroys every buffer in it). Guarded by self._lock.
        self._thread_refs = 0
        self._live_buffers = 0
        self._parked = 0

    # -----------------------------------------------------------------------------------------
    # Discovery and loading

    @property
    def environ(self):
        return os.environ if self._environ is None else self._environ

    def locate(self) -> tuple[str, str]:
        """(directory, where it came from). LoadError with the reason when there is none (see :mod:`.loader`)."""
        return loader.locate(self._lib_dir, self.environ)

    def load(self) -> None:
        """Find and load the libraries once (LoadError with the reason, naming what was found and what is missing).

        See :mod:`.discovery` and :mod:`.loader`: the runtime (``libascendcl.so`` or ``libacl_rt.so``),
        ``libnnopbase.so`` and the operator libraries (per-repository ``libopapi_*.so``, else
        ``libopapi.so``), each opened by absolute path after its dependencies; every operator symbol is
        taken from the first operator library that has it.
        """
        with self._lock:
            if self.fn is not None:
                return
            path, source = self.locate()
            self.inventory = discovery.inventory(path, self.environ)
            bound = loader.bind(path, source, self.inventory, self.environ)
            self.libs, self.fn, self.lib_dir, self.source = bound.libs, bound.fn, bound.lib_dir, bound.source
            self.emulation = bound.emulation

    def report(self) -> str:
        """What discovery found (after load()): the libraries and ASCEND_OPP_PATH's state, or ""."""
        inv = self.inventory
        return f"{inv.lib_dir}: {inv.describe()}" if inv is not None else ""

    def same_runtime(self, other: "Driver") -> bool:
        """Whether ``other`` drives the same loaded libraries (device pointers are valid in both)."""
        if other is self:
            return True
        mine, theirs = self.libs.get("ascendcl"), other.libs.get("ascendcl")
        return mine is not None and theirs is not None and mine._handle == theirs._handle

    def device_id(self) -> int:
        value = _environ_value(self.environ, DEVICE_VAR)
        if value is None:
            return 0
        try:
            device = int(value)
        except ValueError:
            raise LoadError(f"{DEVICE_VAR}={value!r} is not a device number") from None
        if device < 0:
            raise LoadError(f"{DEVICE_VAR}={value!r} is not a device number")
        return device

    def initialize(self) -> None:
        """load(), aclInit, device count and SoC name, once (LoadError with the reason; retried next time)."""
        if self._device is not None:
            return
        with self._lock:
            if self._device is not None:
                return
            self.load()
            device = self.device_id()
            if not self._initialized:
                self._acl_init()
                self._initialized = True
            count = c_uint32(0)
            status = self.fn.aclrtGetDeviceCount(byref(count))
            if status != ACL_SUCCESS:
                raise LoadError(f"no device: aclrtGetDeviceCount failed with {describe_status(status)}"
                                f"{self._message_suffix()}")
            if count.value == 0:
                raise LoadError("no device: aclrtGetDeviceCount reports 0 Ascend devices")
            if device >= count.value:
                raise LoadError(f"no device: {DEVICE_VAR}={device} but aclrtGetDeviceCount reports "
                                f"{count.value} device(s)")
            self._device = device

    def _acl_init(self) -> None:
        status = self.fn.aclInit(None)
        if status not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
            raise LoadError(f"aclInit failed with {describe_status(status)}{self._message_suffix()}")
        self.take_message()  # 100002 leaves a message; it is not an error here

    def availability(self) -> tuple[bool, str]:
        """(available, reason); never raises."""
        try:
            self.initialize()
        except LoadError as exc:
            return False, str(exc)
        except Exception as exc:  # noqa: BLE001 - an availability check must not raise
            return False, f"{type(exc).__name__}: {exc}"
        return True, ""

    @property
    def soc_name(self) -> str | None:
        """aclrtGetSocName() (after initialize()), None when CANN does not report one."""
        if self.fn is None or self._device is None:
            return None
        soc = self.fn.aclrtGetSocName()
        if not soc:
            self.take_message()
            return None
        return soc.decode(errors="replace")

    @property
    def device(self) -> int | None:
        return self._device

    def device_label(self) -> str | None:
        """"ascend:0 (Ascend910B2)", "ascend:0 (Ascend910B2, on the CANN emulator)"; None before initialize()."""
        if self._device is None:
            return None
        on = ", on the CANN emulator" if self.emulation else ""
        return f"ascend:{self._device} ({self.soc_name or 'unknown SoC'}{on})"

    # -----------------------------------------------------------------------------------------
    # Errors

    def take_message(self) -> str:
        """aclGetRecentErrMsg(): the pending messages of this thread (cleared), or ""."""
        if self.fn is None:
            return ""
        msg = self.fn.aclGetRecentErrMsg()
        return msg.decode(errors="replace").strip() if msg else ""

    def _message_suffix(self) -> str:
        msg = self.take_message()
        return f": {msg}" if msg else ""

    def error(self, call: str, status: int) -> BackendError:
        """BackendError for ``status`` returned by ``call``, with aclGetRecentErrMsg()'s text."""
        message = self.take_message()
        if int(status) == 561107 and self.inventory is not None:   # ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND
            message = f"{message} ({self.inventory.opp_state()})".strip()
        return BackendError(BACKEND, int(status), status_name(status), message, call=call)

    def check(self, call: str, status: int) -> None:
        if status != ACL_SUCCESS:
            raise self.error(call, status)

    # -----------------------------------------------------------------------------------------
    # Per-thread context and stream
    #
    # CANN contexts are per device (the device's default context is shared by every thread); what
    # is per thread is which context is current, and xconv's stream. Each thread's state is a dict
    # in a threading.local; a sentinel next to it runs _thread_ended() on that thread when it ends
    # (CPython clears a thread's locals on the exiting thread), so a thread that never called
    # release_thread() still gives its stream and device reference back.

    def _thread_state(self) -> dict:
        local = self._local
        state = getattr(local, "state", None)
        if state is None:
            state = local.state = {"stream": None, "device_set": False, "device": None}
            local.sentinel = sentinel = _ThreadSentinel()
            fin = weakref.finalize(sentinel, _thread_ended, weakref.ref(self), state)
            fin.atexit = False  # at interpreter exit the runtime is torn down by CANN itself
        return state

    def stream(self) -> int:
        """The calling thread's stream, setting its device and creating the stream on first use."""
        state = self._thread_state()
        stream = state["stream"]
        if stream is not None:
            return stream
        try:
            self.initialize()
        except LoadError as exc:
            raise BackendUnavailableError(BACKEND, str(exc)) from None
        device = self._device
        if not state["device_set"]:
            status = self.fn.aclrtSetDevice(device)
            if status == ACL_ERROR_UNINITIALIZE:  # someone called aclFinalize: initialize again
                self.take_message()
                with self._lock:
                    try:
                        self._acl_init()
                    except LoadError as exc:
                        raise BackendUnavailableError(BACKEND, str(exc)) from None
                status = self.fn.aclrtSetDevice(device)
            self.check("aclrtSetDevice", status)
            state["device_set"], state["device"] = True, device
            with self._lock:
                self._thread_refs += 1
        handle = c_void_p()
        status = self.fn.aclrtCreateStream(byref(handle))
        if status != ACL_SUCCESS:
            err = self.error("aclrtCreateStream", status)
            self._release_device(state)
            self.take_message()
            raise err
        state["stream"] = handle.value
        return state["stream"]

    def ensure_context(self) -> None:
        """Make sure the calling thread has a current context (and stream)."""
        self.stream()

    def _release_device(self, state: dict) -> int:
        """Drop this thread's device reference: aclrtResetDevice, unless it is the last one while
        DeviceArrays are alive (then it is parked until they are freed). Returns the status."""
        if not state["device_set"]:
            return ACL_SUCCESS
        state["device_set"] = False
        with self._lock:
            self._thread_refs -= 1
            if self._thread_refs == 0 and self._live_buffers > 0:
                self._parked += 1
                return ACL_SUCCESS
            resets = 1
            if self._thread_refs == 0 and self._parked:   # no array left: the parked references go too
                resets, self._parked = 1 + self._parked, 0
        status = ACL_SUCCESS
        for _ in range(resets):
            result = self.fn.aclrtResetDevice(state["device"])
            status = result if status == ACL_SUCCESS else status
        return status

    def release_thread(self) -> None:
        """Destroy the calling thread's stream and drop its device reference (idempotent; errors raise
        BackendError). The last reference is kept while DeviceArrays are alive, and dropped when the
        last of them is freed: resetting it would destroy their memory with the device's context."""
        if self.fn is None:
            return
        self._release_state(self._thread_state(), raise_errors=True)

    def _release_state(self, state: dict, raise_errors: bool) -> None:
        stream, state["stream"] = state["stream"], None
        err = None
        if stream is not None:
            status = self.fn.aclrtDestroyStream(stream)
            if status != ACL_SUCCESS:
                err = self.error("aclrtDestroyStream", status)
        status = self._release_device(state)
        if status != ACL_SUCCESS and err is None:
            err = self.error("aclrtResetDevice", status)
        if err is not None and raise_errors:
            raise err
        self.take_message()

    # DeviceArray buffers ---------------------------------------------------------------------
    def buffer_opened(self) -> None:
        with self._lock:
            self._live_buffers += 1

    def buffer_closed(self) -> None:
        """One DeviceArray buffer fewer; the last one lets parked device references go."""
        with self._lock:
            self._live_buffers -= 1
            resets = 0
            if self._live_buffers == 0 and self._thread_refs == 0 and self._parked:
                resets, self._parked = self._parked, 0
            device = self._device
        for _ in range(resets):
            self.fn.aclrtResetDevice(device)
        if resets:
            self.take_message()

    def free_from_any_thread(self, ptr: int) -> int:
        """aclrtFree(ptr) from a thread that may have no current context (a GC finalizer): the free
        needs one, so such a thread binds the device for the free and unbinds it after. Returns the status."""
        state = getattr(self._local, "state", None)
        if state is not None and state["device_set"]:
            return self.fn.aclrtFree(ptr)
        current = c_int32(-1)
        if self.fn.aclrtGetDevice(byref(current)) == ACL_SUCCESS:   # the host made a context current here
            return self.fn.aclrtFree(ptr)
        self.take_message()
        status = self.fn.aclrtSetDevice(self._device)
        if status != ACL_SUCCESS:
            return status
        try:
            return self.fn.aclrtFree(ptr)
        finally:
            self.fn.aclrtResetDevice(self._device)

    def synchronize(self) -> None:
        self.check("aclrtSynchronizeStream", self.fn.aclrtSynchronizeStream(self.stream()))

    # -----------------------------------------------------------------------------------------
    # Memory (the calling thread must have a context: call stream() first)

    def malloc(self, nbytes: int) -> int:
        ptr = c_void_p()
        self.check("aclrtMalloc", self.fn.aclrtMalloc(byref(ptr), max(int(nbytes), 1), ACL_MEM_MALLOC_HUGE_FIRST))
        return ptr.value

    def free(self, ptr: int) -> int:
        """aclrtFree(ptr); returns the status (callers decide whether it raises)."""
        return self.fn.aclrtFree(ptr)

    def memset(self, ptr: int, capacity: int, nbytes: int, value: int = 0) -> None:
        if nbytes:
            self.check("aclrtMemset", self.fn.aclrtMemset(ptr, capacity, value, nbytes))

    def upload(self, dst: int, capacity: int, src_address: int, nbytes: int) -> None:
        if nbytes:
            self.check("aclrtMemcpy", self.fn.aclrtMemcpy(dst, capacity, src_address, nbytes,
                                                          ACL_MEMCPY_HOST_TO_DEVICE))

    def download(self, dst_address: int, capacity: int, src: int, nbytes: int) -> None:
        if nbytes:
            self.check("aclrtMemcpy", self.fn.aclrtMemcpy(dst_address, capacity, src, nbytes,
                                                          ACL_MEMCPY_DEVICE_TO_HOST))

    # -----------------------------------------------------------------------------------------
    # The deterministic option
    #
    # aclnn reads the PROCESS-level ACL_OPT_DETERMINISTIC at phase 1 (aclrtGetSysParamOpt), and
    # aclrtCtxSetSysParamOpt writes that slot too (CANN runtime rtCtxSetSysParamOpt); the default
    # context of a device is shared by every thread. So the option is one value per process: the
    # backend changes it only under DETERMINISM_LOCK (set -> phase 1 -> restore, see
    # backend._Call.deterministic), at both levels, and restores what the host had.

    def get_process_deterministic(self) -> int:
        """aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC): the process-level value (0 when never set)."""
        value = c_int64(0)
        self.check("aclrtGetSysParamOpt", self.fn.aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, byref(value)))
        return int(value.value)

    def set_process_deterministic(self, value: int) -> int:
        """aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, value); returns the status."""
        return self.fn.aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, int(value))

    def get_deterministic(self) -> int | None:
        """ACL_OPT_DETERMINISTIC of this thread's context; None when it was never set (107021)."""
        self.ensure_context()
        value = c_int64(0)
        status = self.fn.aclrtCtxGetSysParamOpt(ACL_OPT_DETERMINISTIC, byref(value))
        if status == ACL_ERROR_RT_SYSPARAMOPT_NOT_SET:
            self.take_message()
            return None
        self.check("aclrtCtxGetSysParamOpt", status)
        return int(value.value)

    def set_deterministic(self, value: int) -> int:
        """aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, value) (context and process level); returns the status."""
        return self.fn.aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, int(value))


#: Serializes every change of ACL_OPT_DETERMINISTIC in this process (one slot per process, whatever
#: the Driver or thread): held from the set, through phase 1, to the restore.
DETERMINISM_LOCK = threading.Lock()


class _ThreadSentinel:
    """Lives in a thread's locals; its finalizer releases the thread's stream and device when it ends."""


def _thread_ended(driver_ref, state: dict) -> None:
    driver = driver_ref()
    if driver is None or driver.fn is None or (state["stream"] is None and not state["device_set"]):
        return
    if sys.is_finalizing():  # CANN's own exit handlers release the process's resources
        return
    try:
        driver._release_state(state, raise_errors=False)
    except Exception:  # noqa: BLE001 - a thread's exit must not raise
        pass


_default: Driver | None = None
_default_lock = threading.Lock()


def default_driver() -> Driver:
    """The process's driver (environment lookup), created on first use; loads nothing by itself."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Driver()
        return _default
