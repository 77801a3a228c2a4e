"""Device arrays of the Ascend backend: data kept in device memory across xconv calls.

:class:`DeviceArray` is a device buffer (``aclrtMalloc``) plus shape, element strides, element
offset and dtype. It is the ``xconv_ascend`` array family, so this package offers the few array
functions the core's legalization uses (``zeros``, ``ascontiguousarray``).
"""

from __future__ import annotations

import math
import sys
import weakref

import numpy as np

from xconv.dtypes import DTYPES, dtype_name

from .compiler import contiguous_strides
from .driver import Driver, default_driver


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a supported dtype (name or dtype); TypeError otherwise."""
    name = dtype_name(dtype)
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"unsupported dtype {dtype!r}")
    return DTYPES[name]


class _Buffer:
    """One aclrtMalloc allocation, freed by :meth:`free` or, failing that, when garbage collected."""

    def __init__(self, driver: Driver, nbytes: int):
        driver.ensure_context()
        self.driver = driver
        self.nbytes = int(nbytes)
        self.ptr = driver.malloc(nbytes)
        driver.buffer_opened()
        self._finalizer = weakref.finalize(self, _free_quietly, driver, self.ptr)
        self._finalizer.atexit = False  # at interpreter exit CANN reclaims device memory itself

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def free(self) -> None:
        if self._finalizer.alive:
            self.driver.ensure_context()  # the freeing thread needs a context too
            self._finalizer.detach()
            try:
                self.driver.check("aclrtFree", self.driver.free(self.ptr))
            finally:
                self.driver.buffer_closed()


def _free_quietly(driver: Driver, ptr: int) -> None:
    """The GC's free: on whatever thread the last reference died, with or without a current context."""
    if sys.is_finalizing():  # interpreter exit: CANN reclaims device memory itself
        return
    try:
        driver.free_from_any_thread(ptr)
        driver.take_message()
    except Exception:  # noqa: BLE001 - a finalizer must not raise
        pass
    finally:
        try:
            driver.buffer_closed()
        except Exception:  # noqa: BLE001
            pass


class DeviceArray:
    """An array in Ascend device memory: a buffer plus shape, element strides, element offset and dtype.

    Made by :meth:`from_numpy`, :meth:`empty`, :func:`zeros`, or returned by xconv calls given
    DeviceArrays. Its array family is ``"xconv_ascend"``; :meth:`to_numpy` copies it back to the host.
    Release its memory with :meth:`free` or a ``with`` block (garbage collection frees it otherwise).
    Basic slicing (``a[:, :, 1:3]``, ``None``, ints) gives views of the same buffer.
    """

    __array_priority__ = -1

    def __init__(self, buffer: _Buffer | None, shape, dtype, strides=None, offset: int = 0):
        self._buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(int(s) for s in strides) if strides is not None else contiguous_strides(self.shape)
        self.offset = int(offset)

    # construction ------------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, dtype, driver: Driver | None = None) -> "DeviceArray":
        driver = driver or default_driver()
        dtype = numpy_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape)
        return cls(_Buffer(driver, n * dtype.itemsize) if n else None, shape, dtype)

    @classmethod
    def from_numpy(cls, array, driver: Driver | None = None) -> "DeviceArray":
        host = np.ascontiguousarray(array)
        out = cls.empty(host.shape, host.dtype, driver)
        if out._buffer is not None:
            try:
                out._buffer.driver.upload(out._buffer.ptr, out._buffer.nbytes, host.ctypes.data, host.nbytes)
            except BaseException:
                out.free()
                raise
        return out

    # properties ---------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def driver(self) -> Driver | None:
        return None if self._buffer is None else self._buffer.driver

    @property
    def data_ptr(self) -> int | None:
        """The device address of the buffer (the aclTensor's tensorData); None for an empty array."""
        return None if self._buffer is None else self._buffer.ptr

    @property
    def storage_elements(self) -> int:
        return 0 if self._buffer is None else self._buffer.nbytes // self.dtype.itemsize

    @property
    def freed(self) -> bool:
        return self._buffer is not None and not self._buffer.alive

    @property
    def is_contiguous(self) -> bool:
        return all(n == 1 or s == c for n, s, c in zip(self.shape, self.strides, contiguous_strides(self.shape)))

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype.name},"
                f" strides={self.strides}, offset={self.offset}{', freed' if self.freed else ''})")

    # host copies -------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.freed:
            raise ValueError("this DeviceArray's device memory was freed")

    def _storage_to_host(self) -> np.ndarray:
        """The whole buffer as a 1-D host array of this dtype."""
        self._check_alive()
        host = np.empty(self.storage_elements, dtype=self.dtype)
        buf = self._buffer
        buf.driver.ensure_context()
        buf.driver.download(host.ctypes.data, host.nbytes, buf.ptr, host.nbytes)
        return host

    def to_numpy(self) -> np.ndarray:
        """A new C-contiguous host copy of this array."""
        if self.size == 0 or self._buffer is None:
            return np.zeros(self.shape, dtype=self.dtype)
        self._check_alive()
        if self.is_contiguous:
            host = np.empty(self.shape, dtype=self.dtype)
            buf = self._buffer
            buf.driver.ensure_context()
            start = self.offset * self.itemsize
            buf.driver.download(host.ctypes.data, host.nbytes, buf.ptr + start, host.nbytes)
            return host
        storage = self._storage_to_host()
        view = np.lib.stride_tricks.as_strided(storage[self.offset:], self.shape,
                                               [s * self.itemsize for s in self.strides])
        return np.ascontiguousarray(view)

    def __array__(self, dtype=None, copy=None):
        host = self.to_numpy()
        return host if dtype is None else host.astype(dtype)

    # release -----------------------------------------------------------------------------------
    def free(self) -> None:
        """Free the device buffer (shared by every view of it). Idempotent."""
        if self._buffer is not None:
            self._buffer.free()

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    # views ---------------------------------------------------------------------------------------
    def _view(self, shape, strides, offset) -> "DeviceArray":
        return DeviceArray(self._buffer, shape, self.dtype, strides, offset)

    def __getitem__(self, key) -> "DeviceArray":
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1 - sum(k is None for k in key))
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        shape, strides, offset, axis = [], [], self.offset, 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            if axis >= self.ndim:
                raise IndexError(f"too many indices for a {self.ndim}-D DeviceArray")
            n, s = self.shape[axis], self.strides[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step < 1:
                    raise IndexError("DeviceArray views take positive slice steps only")
                length = max(0, -(-(stop - start) // step))
                shape.append(length)
                strides.append(s * step)
                if length:
                    offset += start * s
            elif isinstance(k, (int, np.integer)):
                i = int(k) + (n if k < 0 else 0)
                if not 0 <= i < n:
                    raise IndexError(f"index {k} out of range for dim {axis} of size {n}")
                offset += i * s
            else:
                raise IndexError(f"DeviceArray supports basic indexing only, not {type(k).__name__}")
            axis += 1
        shape += self.shape[axis:]
        strides += self.strides[axis:]
        return self._view(shape, strides, offset)

    def __setitem__(self, key, value) -> None:
        """Assign through a host round trip of the buffer (used by the core's explicit zero padding)."""
        self._check_alive()
        storage = self._storage_to_host()
        whole = np.lib.stride_tricks.as_strided(storage[self.offset:], self.shape,
                                                [s * self.itemsize for s in self.strides])
        whole[key] = value.to_numpy() if isinstance(value, DeviceArray) else value
        buf = self._buffer
        buf.driver.upload(buf.ptr, buf.nbytes, storage.ctypes.data, storage.nbytes)

    def reshape(self, *shape) -> "DeviceArray":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if not self.is_contiguous:
            raise ValueError("only contiguous DeviceArrays can be reshaped")
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // max(known, 1)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
        return self._view(shape, contiguous_strides(shape), self.offset)

    def transpose(self, *axes) -> "DeviceArray":
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        axes = tuple(axes) or tuple(reversed(range(self.ndim)))
        return self._view([self.shape[a] for a in axes], [self.strides[a] for a in axes], self.offset)


# Module-level functions for xconv.arrays (array_module of the "xconv_ascend" family)


def empty(shape, dtype="float32") -> DeviceArray:
    return DeviceArray.empty(shape, dtype)


def zeros(shape, dtype="float32") -> DeviceArray:
    """Zeros on the device (aclrtMemset)."""
    out = DeviceArray.empty(shape, dtype)
    if out._buffer is not None:
        try:
            out._buffer.driver.memset(out._buffer.ptr, out._buffer.nbytes, out._buffer.nbytes, 0)
        except BaseException:
            out.free()
            raise
    return out


def asarray(array, dtype=None) -> DeviceArray:
    if isinstance(array, DeviceArray) and dtype is None:
        return array
    host = array.to_numpy() if isinstance(array, DeviceArray) else np.asarray(array)
    return DeviceArray.from_numpy(host if dtype is None else host.astype(dtype))


def ascontiguousarray(array) -> DeviceArray:
    """``array`` itself when contiguous, else a contiguous copy (through the host)."""
    if isinstance(array, DeviceArray):
        if array.is_contiguous:
            return array
        return DeviceArray.from_numpy(array.to_numpy(), array.driver)
    return DeviceArray.from_numpy(array)


def moveaxis(array: DeviceArray, source, destination) -> DeviceArray:
    order = [a for a in range(array.ndim) if a != source % array.ndim]
    order.insert(destination % array.ndim, source % array.ndim)
    return array.transpose(order)
