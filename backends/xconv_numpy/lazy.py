"""A value loaded once, on first use (the compiled library of the NumPy backend)."""

from __future__ import annotations

import threading


class Lazy:
    """``load()`` run once (thread-safe) on first use; its value, or why it failed. A failed load is not
    retried (the NumPy paths serve instead)."""

    def __init__(self, load):
        self._load = load
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
