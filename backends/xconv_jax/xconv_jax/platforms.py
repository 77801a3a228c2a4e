"""The platforms JAX reaches (cpu, gpu, tpu): whether each is here, what it takes and promises.

Each platform is settled from the installed files where they suffice (no jax; a jaxlib without a
GPU plugin; no libtpu), so that ``xconv backends`` on a plain CPU machine imports jax only for
``jax-cpu``; the rest asks ``jax.devices(platform)``.

What each platform promises (docs/jax.md):

- dtypes: float16, bfloat16 and float32 everywhere; float64 on cpu and gpu only, and only inside
  ``jax.enable_x64(True)`` for the call (the caller's global setting is left as it is); TPUs have
  no float64.
- precision (``lax.Precision`` of the convolutions) per math mode: ``keep_dtype`` -> HIGHEST
  everywhere. ``allow_tf32`` / ``allow_fp16``: DEFAULT on cpu (which computes float32 anyway) and
  gpu (where XLA then lets cuDNN use TF32 on Ampere and later, unit roundoff 2**-11); HIGH on TPU
  (three bfloat16 passes), because DEFAULT there is one bfloat16 pass (unit roundoff 2**-9), coarser
  than either mode allows.
- determinism: cpu run to run (XLA's CPU convolutions split work statically); gpu only when
  ``--xla_gpu_deterministic_ops=true`` (or ``--xla_gpu_exclude_nondeterministic_ops=true``) is in
  ``$XLA_FLAGS`` when the backend first starts, otherwise ``deterministic=True`` is refused by name;
  tpu refused (not proven here). ``batch_invariant`` is refused everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys

INSTALL = "pip install -e backends/xconv_jax"
DETERMINISTIC_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_exclude_nondeterministic_ops=true")
_HALF_AND_SINGLE = frozenset({"float16", "bfloat16", "float32"})


@dataclasses.dataclass(frozen=True)
class Platform:
    name: str                      # JAX's platform name: "cpu", "gpu", "tpu"
    dtypes: frozenset
    deterministic: bool            # can deterministic=True be honoured at all (gpu: also needs the flag)
    fast_precision: str            # lax.Precision name for allow_tf32 / allow_fp16
    why_not_deterministic: str = ""


PLATFORMS = {
    "cpu": Platform("cpu", _HALF_AND_SINGLE | {"float64"}, True, "DEFAULT"),
    "gpu": Platform("gpu", _HALF_AND_SINGLE | {"float64"}, True, "DEFAULT"),
    "tpu": Platform("tpu", _HALF_AND_SINGLE, False, "HIGH",
                    "run-to-run determinism of XLA's TPU convolutions has not been proven by this backend"),
}


def jax_module():
    """The jax module, imported on first use."""
    return importlib.import_module("jax")


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_plugins() -> list[str]:
    """Installed GPU plugin distributions of jaxlib (jax-cuda12-plugin, jax-cuda13-plugin, jax-rocm*-plugin ...)."""
    names = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if re.fullmatch(r"jax-(cuda|rocm)\d*-(plugin|pjrt)", name):
            names.add(f"{name} {dist.version}")
    return sorted(names)


def _without_import(platform: str) -> tuple[bool, str] | None:
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("jaxlib") is None:
        return False, f"JAX is not installed ({INSTALL}, or pip install jax jaxlib)"
    if platform == "cpu":
        return True, ""
    if platform == "gpu" and not gpu_plugins():
        return False, (f"this jaxlib ({_installed('jaxlib')}) has no GPU plugin "
                       "(pip install 'jax[cuda12]', or a ROCm build of jaxlib)")
    if platform == "tpu" and importlib.util.find_spec("libtpu") is None:
        return False, "libtpu is not installed (pip install 'jax[tpu]'; TPUs are reached from Cloud TPU VMs)"
    return None


def probe(platform: str) -> tuple[bool, str]:
    """(available, reason) of JAX platform ``platform`` here. Never raises."""
    try:
        settled = _without_import(platform)
    except Exception:  # noqa: BLE001
        settled = None
    if settled is not None:
        return settled
    try:
        jax = jax_module()
    except Exception as exc:  # noqa: BLE001
        return False, f"JAX cannot be imported ({type(exc).__name__}: {exc}); {INSTALL}"
    try:
        found = jax.devices(platform)
    except Exception as exc:  # noqa: BLE001 - RuntimeError "Unknown backend ..." when the platform is absent
        return False, f"JAX {jax.__version__} finds no {platform} device ({type(exc).__name__}: {str(exc)[:200]})"
    if not found:
        return False, f"JAX {jax.__version__} finds no {platform} device"
    return True, ""


def deterministic_flag_set() -> bool:
    """Whether $XLA_FLAGS asks XLA for deterministic GPU operations (read once, when a backend starts)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return any(f in flags for f in DETERMINISTIC_FLAGS)


def version_text(platform: str) -> str:
    """"jax 0.10.2, jaxlib 0.10.2" (plus the GPU plugins), from the installed metadata."""
    jax, jaxlib = _installed("jax"), _installed("jaxlib")
    if not jax:
        return ""
    text = f"jax {jax}, jaxlib {jaxlib}"
    if platform == "gpu":
        plugins = gpu_plugins()
        if plugins:
            text += ", " + ", ".join(plugins)
    return text


def device_names(platform: str) -> tuple[str, ...]:
    """"cpu:0 cpu", "gpu:0 NVIDIA H100 80GB HBM3", ...; for the CPU without importing jax (listing backends
    must not cost jax's import, ~1-2 s) unless it is imported already."""
    if platform == "cpu" and "jax" not in sys.modules:
        return ("cpu",)
    try:
        return tuple(f"{platform}:{d.id} {getattr(d, 'device_kind', '')}".rstrip()
                     for d in jax_module().devices(platform))
    except Exception:  # noqa: BLE001
        return ()
