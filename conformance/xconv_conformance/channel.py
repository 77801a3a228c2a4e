"""The channel between the kit and its worker processes: length-prefixed pickles over a pair of pipes.

It never uses stdin or stdout: whatever a backend prints (Python ``print``, C ``printf``, a
library's logging) goes to the worker's stdout/stderr, which the kit sends to a log file, and
cannot corrupt a reply. Both ends are this kit (the same code, the same interpreter), so the
frames are pickles; nothing read from a bundle or from another machine ever passes here.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time

_HEADER = struct.Struct("<Q")


class ChannelClosed(Exception):
    """The other end closed its pipe (the worker exited or was killed)."""


class ChannelTimeout(Exception):
    """No complete frame arrived before the deadline."""


class Channel:
    """Send and receive Python objects over two file descriptors (one to read, one to write)."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_HEADER.pack(len(data)) + data)
        try:
            while view:
                view = view[os.write(self.write_fd, view):]
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self, deadline: float | None = None):
        """The next object; ``deadline`` is a ``time.monotonic()`` value (None: wait for ever)."""
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        return pickle.loads(self._read(size, deadline))

    def _read(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelTimeout()
                ready, _, _ = select.select([self.read_fd], [], [], remaining)
                if not ready:
                    continue
            try:
                chunk = os.read(self.read_fd, min(n - len(buf), 1 << 22))
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                raise ChannelClosed("end of file")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
