"""Optional compiled parts of the NumPy backend (built at install), loaded once, on first use."""

from __future__ import annotations

import os
import threading


class Lazy:
    """``load()`` run once (thread-safe) on first use; its value, or why it failed.

    The part is off when the environment variable ``disable_env`` is "0"; a failed load is not
    retried (the BLAS path serves instead).
    """

    def __init__(self, load, disable_env: str):
        self._load = load
        self._env = disable_env
        self._lock = threading.Lock()
        self._value = None
        self.error: str | None = None

    def get(self):
        """The loaded value, or None if loading failed."""
        value = self._value
        if value is not None:                   # loaded: no lock needed to read it
            return value
        with self._lock:
            if self._value is None and self.error is None:
                try:
                    self._value = self._load()
                except Exception as e:  # a build missing (installed without a compiler) or refused
                    self.error = f"{type(e).__name__}: {e}"
        return self._value

    def available(self) -> bool:
        """Whether the part can run: not disabled, and loaded."""
        return os.environ.get(self._env, "1") != "0" and self.get() is not None
