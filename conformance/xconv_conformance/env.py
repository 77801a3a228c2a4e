"""What a bundle records about the machine: library versions, device and platform (importing nothing heavy)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys

_LIBRARIES = ("numpy", "ml_dtypes", "pluggy", "threadpoolctl", "torch")
_CUPY_DISTS = ("cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x", "cupy-rocm-5-0", "cupy-rocm-6-0")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Installed versions of xconv's libraries (from package metadata: nothing is imported)."""
    out = {"xconv": _version("xconv") or "unknown"}
    for dist in _LIBRARIES:
        v = _version(dist)
        if v:
            out[dist] = v
    for dist in _CUPY_DISTS:
        v = _version(dist)
        if v:
            out[dist] = v
    for dist in importlib.metadata.distributions():  # vendor wheels: nvidia-cudnn-*, torch_npu, ...
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("nvidia-cudnn", "nvidia-cudnn-frontend", "torch-npu", "torch_npu")):
            out[name] = dist.version
    return dict(sorted(out.items()))


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            import subprocess
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.processor()
        except Exception:  # noqa: BLE001
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(devices) -> str:
    """The device a backend ran on: its declared devices, with "cpu" spelled out as the CPU model."""
    names = [cpu_name() if str(d).lower() == "cpu" else str(d) for d in devices or ()]
    return ", ".join(names) if names else cpu_name()


def emulation(backend) -> str:
    """What ``backend`` runs on when that is an emulator or fake, in words; "" on the real stack.

    A backend that can tell (the Ascend backend on xconv's CANN emulator, the cuDNN backend on an
    injected runtime or stand-in modules) says so through its optional ``emulation()`` method;
    one without it is taken to run on what it names. Never raises.
    """
    method = getattr(backend, "emulation", None)
    if not callable(method):
        return ""
    try:
        text = method()
    except Exception as exc:  # noqa: BLE001 - a label must not end the run
        return f"unknown (emulation() raised {type(exc).__name__}: {exc})"
    return str(text or "").strip()


def emulated_words(text: str) -> str:
    """The label shown wherever results appear: "EMULATED, not the vendor's hardware: …", or ""."""
    return f"EMULATED, not the vendor's hardware: {text}" if text else ""


def platform_info() -> dict[str, str]:
    return {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "implementation": platform.python_implementation(), "cpu_count": str(os.cpu_count() or "")}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
