"""The JAX backends: xconv's primitives on ``jax.lax.conv_general_dilated`` and ``jax.vjp``, jitted.

One backend per platform JAX reaches (:data:`PLATFORMS`), named ``jax-<platform>``: ``jax-cpu``
(XLA's CPU convolutions), ``jax-gpu`` (cuDNN or MIOpen under XLA, through a CUDA or ROCm jaxlib),
``jax-tpu``. Each is available only where ``jax.devices(platform)`` finds a device.

Capabilities, as XLA has them: 1-D to 3-D, groups, dilation, asymmetric padding on every rank,
transposed convolution with any output_padding, strided inputs (they are copied to the device
anyway); the dtypes, precisions and determinism of :mod:`.platforms`. ``batch_invariant`` is
refused (the core does that), and so is ``workspace_limit`` (XLA picks its own scratch).
Compiled functions (:mod:`.kernels`) are kept per configuration, so a configuration compiles once
per process; that first call pays XLA's compile time.
"""

from __future__ import annotations

from xconv import Backend, Capabilities, UnsupportedError, tracing

from . import kernels, platforms
from .arrays import place

PLATFORMS = ("cpu", "gpu", "tpu")


class JaxBackend(Backend):
    """xconv's primitives on JAX platform ``platform`` ("cpu", "gpu" or "tpu")."""

    def __init__(self, platform: str):
        self.platform = platform
        self.kind = platforms.PLATFORMS[platform]
        self.name = f"jax-{platform}"
        # NumPy first: the conformance kit builds its inputs in the first family (strided and channels-last
        # NumPy layouts reach the backend as they are); "jaxlib" is the family of jax.Array objects
        self.array_families = ("numpy", "jaxlib")
        self.priority = -10          # NumPy arrays go elsewhere unless this backend is named
        self.capabilities = Capabilities(spatial_dims=frozenset({1, 2, 3}), dtypes=self.kind.dtypes,
                                         asymmetric_padding=frozenset({1, 2, 3}), transposed=True, strided=True,
                                         deterministic=self.kind.deterministic)
        self._probe = None
        self._deterministic_flag = None

    # -- description

    def availability(self):
        if self._probe is None:
            self._probe = platforms.probe(self.platform)
            self._deterministic_flag = platforms.deterministic_flag_set()   # read once, when the backend starts
        return self._probe

    def version(self) -> str:
        return platforms.version_text(self.platform) if self.availability()[0] else ""

    def devices(self) -> tuple[str, ...]:
        return platforms.device_names(self.platform)

    # -- the checks every primitive makes before any device work

    def _precision(self, p) -> str:
        if p.workspace_limit is not None:
            raise UnsupportedError(f"backend {self.name!r} cannot bound XLA's scratch memory: workspace_limit="
                                   f"{p.workspace_limit} is refused (pass workspace_limit=None)")
        if p.deterministic and self.platform == "gpu":
            self.availability()
            if not self._deterministic_flag:
                raise UnsupportedError(
                    f"backend {self.name!r}: deterministic=True needs XLA_FLAGS={platforms.DETERMINISTIC_FLAGS[0]} "
                    "set before JAX starts (it was not set when this backend started)")
        if p.deterministic and not self.kind.deterministic:
            raise UnsupportedError(f"backend {self.name!r}: deterministic=True is refused: "
                                   f"{self.kind.why_not_deterministic}")
        return "HIGHEST" if p.math == "keep_dtype" else self.kind.fast_precision

    def _run(self, p, build, arrays, path: str):
        precision = self._precision(p)
        jax = platforms.jax_module()
        x64 = p.dtype == "float64"
        if x64 and not hasattr(jax, "enable_x64"):
            raise UnsupportedError(f"backend {self.name!r}: float64 needs jax.enable_x64, which JAX "
                                   f"{jax.__version__} lacks")
        scope = jax.enable_x64(True) if x64 else _Nothing()
        with scope:
            placed, placement = place(jax, self.platform, self.name, arrays)
            fn = build(kernels.cache_key(p), precision)
            results = fn(*[a for a in placed if a is not None])
            results = results if isinstance(results, tuple) else (results,)
            out = tuple(placement.out(r) for r in results)
        tracing.note(f"jax {path} on {self.platform} (XLA, precision {precision})", math=p.math,
                     deterministic="run_to_run" if p.deterministic else "none")
        return out

    # -- primitives

    def fprop(self, x, w, bias, p):
        (y,) = self._run(p, lambda key, prec: kernels.fprop_fn(key, prec, bias is not None), (x, w, bias),
                         "lax.conv_general_dilated")
        return y

    def dgrad(self, dy, w, p):
        return self.backward(dy, None, w, p, (True, False, False))[0]

    def wgrad(self, x, dy, p):
        return self.backward(dy, x, None, p, (False, True, False))[1]

    def bgrad(self, dy, p):
        return self.backward(dy, None, None, p, (False, False, True))[2]

    def backward(self, dy, x, w, p, mask):
        mask = tuple(bool(m) for m in mask)
        if not any(mask):
            return None, None, None
        # the jitted function takes (dy, x, w) with the unneeded ones left out, in the order of kernels.backward_fn
        ordered = (dy,) + ((x, w) if mask[0] and mask[1] else (w,) if mask[0] else (x,) if mask[1] else ())
        what = "vjp of lax.conv_general_dilated" if mask[0] or mask[1] else "sum"
        results = iter(self._run(p, lambda key, prec: kernels.backward_fn(key, prec, mask), ordered, what))
        return tuple(next(results) if bit else None for bit in mask)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
