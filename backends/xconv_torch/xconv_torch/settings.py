"""Determinism and math settings for one call, without leaving torch's global state changed.

PyTorch keeps these settings process-wide (``torch.use_deterministic_algorithms``,
``torch.backends.cudnn.deterministic`` / ``benchmark`` / TF32, oneDNN's fp32 precision, torch_npu's
HF32 switch). :func:`scoped` sets what one xconv call needs, runs it, and puts back exactly what
it found, under one process-wide lock: xconv calls on torch backends from several threads run
their host side one at a time, so one call's settings never leak into another's. Code outside
xconv that changes or relies on these globals from another thread at the same moment is not
covered by the lock (documented in docs/backends.md).

What a call needs:

- ``deterministic=True``: ``torch.use_deterministic_algorithms(True)`` (torch then raises for an
  operation without a deterministic implementation: :class:`xconv.UnsupportedError`), and on CUDA
  ``cudnn.deterministic=True``, ``cudnn.benchmark=False`` (no autotuning), on the CPU oneDNN's
  deterministic mode. ``deterministic=False`` leaves the caller's settings as they are.
- ``math="keep_dtype"``: float32 convolutions at float32 precision (cuDNN / oneDNN fp32 precision
  "ieee", torch_npu HF32 off); ``"allow_tf32"`` and ``"allow_fp16"``: TF32 (HF32 on Ascend)
  permitted ("tf32"; torch offers no float16 compute for float32 convolutions).
"""

from __future__ import annotations

import contextlib
import threading

LOCK = threading.RLock()


class _Saved:
    """Sets attributes and remembers the old values, to put back in reverse order."""

    def __init__(self):
        self.undo = []

    def put(self, obj, attr: str, value) -> None:
        if obj is None or not hasattr(obj, attr):
            return
        old = getattr(obj, attr)
        if old == value:
            return
        setattr(obj, attr, value)
        self.undo.append(lambda: setattr(obj, attr, old))

    def call(self, set_fn, value, old) -> None:
        if value == old:
            return
        set_fn(*value)
        self.undo.append(lambda: set_fn(*old))

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()


def _precision_target(torch, device_type: str):
    """The object whose ``fp32_precision`` governs float32 convolutions on ``device_type`` (or None)."""
    if device_type == "cuda":
        return getattr(torch.backends.cudnn, "conv", None)
    if device_type in ("cpu", "xpu"):
        return getattr(torch.backends.mkldnn, "conv", None)
    return None


@contextlib.contextmanager
def scoped(torch, device_type: str, deterministic: bool, math: str):
    """Run the body with the settings one call needs (see the module docstring); restore them after."""
    with LOCK:
        saved = _Saved()
        try:
            if deterministic:
                saved.call(lambda on, warn: torch.use_deterministic_algorithms(on, warn_only=warn), (True, False),
                           (torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled()))
                if device_type == "cuda":
                    saved.put(torch.backends.cudnn, "deterministic", True)
                    saved.put(torch.backends.cudnn, "benchmark", False)
                if device_type == "cpu":
                    saved.put(torch.backends.mkldnn, "deterministic", True)
            precision = "ieee" if math == "keep_dtype" else "tf32"
            target = _precision_target(torch, device_type)
            if target is not None and hasattr(target, "fp32_precision"):
                saved.put(target, "fp32_precision", precision)
            elif device_type == "cuda":
                saved.put(torch.backends.cudnn, "allow_tf32", precision == "tf32")
            if device_type == "npu":
                saved.put(getattr(getattr(torch, "npu", None), "conv", None), "allow_hf32", precision == "tf32")
            yield
        finally:
            saved.restore()
