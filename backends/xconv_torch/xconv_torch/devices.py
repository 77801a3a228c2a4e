"""The torch device types xconv registers a backend for: what each takes, and how to find one.

Every function here imports torch (and, for "npu", Ascend's ``torch_npu``) only when called, and
never raises: a probe that fails is a reason, not an error.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys

ALL = frozenset({"float16", "bfloat16", "float32", "float64"})


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    """One torch device type: the dtypes its convolutions take and whether it can promise determinism."""

    type: str
    dtypes: frozenset
    deterministic: bool
    why_not_deterministic: str = ""
    why_dtypes: str = ""
    widen: frozenset = frozenset()     # dtypes computed in float32 (then rounded): the device's kernels for
                                       # them accumulate in the dtype itself, outside xconv's error bound


KINDS = {
    # bfloat16 too: `xconv conformance fuzz --backend torch-cpu` found a transposed 1-D bfloat16 case (kernel 1,
    # dilation 2, output_padding 1) whose grad_weight torch 2.13 rounds in bfloat16 (8.8x the bound)
    "cpu": DeviceKind("cpu", ALL, True, widen=frozenset({"float16", "bfloat16"})),
    "cuda": DeviceKind("cuda", ALL, True),
    "mps": DeviceKind("mps", frozenset({"float16", "float32"}), False,
                      "PyTorch documents no deterministic mode for MPS convolutions",
                      "MPS has no float64; bfloat16 needs macOS 14 and is not taken"),
    "xpu": DeviceKind("xpu", frozenset({"float16", "bfloat16", "float32"}), False,
                      "PyTorch documents no deterministic mode for XPU (oneDNN GPU) convolutions",
                      "float64 is missing on many Intel GPUs and is not taken"),
    "npu": DeviceKind("npu", frozenset({"float16", "bfloat16", "float32"}), True,
                      why_dtypes="Ascend's convolution kernels take no float64"),
}


def torch_module():
    """The torch module, imported on first use (ImportError when torch is not installed)."""
    return importlib.import_module("torch")


def _attach_npu():
    """Import torch_npu, which registers the "npu" device type with torch."""
    return importlib.import_module("torch_npu")


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _without_import(device_type: str) -> tuple[bool, str] | None:
    """The answer where the installed files settle it, so that listing backends imports no torch:
    torch missing, a "+cpu" build (no accelerator support), no MPS off macOS, no torch_npu."""
    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed (pip install -e backends/xconv_torch)"
    if device_type == "cpu":
        return True, ""
    version = _installed_version("torch") or ""
    if device_type in ("cuda", "xpu") and version.endswith("+cpu"):
        return False, f"this PyTorch build ({version}) is CPU-only"
    if device_type == "mps" and sys.platform != "darwin":
        return False, "MPS exists only on macOS (Apple silicon)"
    if device_type == "npu" and importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu (Ascend's PyTorch adapter) is not installed"
    return None


def probe(device_type: str) -> tuple[bool, str]:
    """(available, reason) of torch device type ``device_type`` here. Never raises; imports torch
    only where the installed files do not settle it."""
    try:
        settled = _without_import(device_type)
    except Exception:  # noqa: BLE001
        settled = None
    if settled is not None:
        return settled
    try:
        torch = torch_module()
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install
        return False, f"PyTorch cannot be imported ({type(exc).__name__}: {exc}); pip install -e backends/xconv_torch"
    try:
        if device_type == "cpu":
            return True, ""
        if device_type == "cuda":
            if torch.cuda.is_available():
                return True, ""
            if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
                return False, f"this PyTorch build ({torch.__version__}) has no CUDA or ROCm support"
            return False, f"PyTorch {torch.__version__} finds no CUDA device"
        if device_type == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is not None and mps.is_available():
                return True, ""
            built = mps is not None and mps.is_built()
            return False, ("PyTorch finds no MPS device (Apple silicon, macOS 12.3 or later)" if built
                           else f"this PyTorch build ({torch.__version__}) has no MPS support (macOS only)")
        if device_type == "xpu":
            xpu = getattr(torch, "xpu", None)
            if xpu is not None and xpu.is_available():
                return True, ""
            return False, f"PyTorch {torch.__version__} finds no XPU (Intel GPU) device"
        if device_type == "npu":
            try:
                _attach_npu()
            except Exception as exc:  # noqa: BLE001
                return False, f"torch_npu (Ascend's PyTorch adapter) cannot be imported ({type(exc).__name__}: {exc})"
            if torch.npu.is_available():
                return True, ""
            return False, "torch_npu finds no Ascend NPU"
    except Exception as exc:  # noqa: BLE001
        return False, f"probing torch device type {device_type!r} raised {type(exc).__name__}: {exc}"
    return False, f"unknown torch device type {device_type!r}"


def device_names(device_type: str) -> tuple[str, ...]:
    """Names of the devices of this type (their index order); () when none or unknown."""
    if device_type == "cpu":
        return ("cpu",)
    torch = torch_module()
    module = getattr(torch, device_type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 0
    names = []
    for i in range(count):
        get_name = getattr(module, "get_device_name", None)
        names.append(f"{device_type}:{i} {get_name(i)}" if get_name else f"{device_type}:{i}")
    return tuple(names) or (device_type,)


def version_text(device_type: str) -> str:
    """"torch 2.13.0" plus the device library's version where torch reports one (torch-cpu: from
    the installed metadata, without importing torch)."""
    if device_type == "cpu":
        version = _installed_version("torch")
        return f"torch {version}" if version else ""
    try:
        torch = torch_module()
    except Exception:  # noqa: BLE001
        return ""
    text = f"torch {torch.__version__}"
    try:
        if device_type == "cuda" and torch.version.cuda:
            text += f", CUDA {torch.version.cuda}"
            if torch.backends.cudnn.is_available():
                text += f", cuDNN {torch.backends.cudnn.version()}"
        elif device_type == "cuda" and getattr(torch.version, "hip", None):
            text += f", ROCm/HIP {torch.version.hip}"
        elif device_type == "npu":
            text += f", torch_npu {getattr(_attach_npu(), '__version__', '?')}"
    except Exception:  # noqa: BLE001
        pass
    return text
