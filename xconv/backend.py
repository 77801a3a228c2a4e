"""What a backend is: its declared capabilities and the primitives it implements.

A backend receives only normalized, validated :class:`~xconv.params.ConvParams` and arrays
whose shapes and dtypes match them. The core legalizes what a backend declares it lacks
(1-D, asymmetric padding, transposed, strided inputs) before calling it, so a backend
implements direct convolution on the ranks and paddings it declares, nothing more.
"""

from __future__ import annotations

import dataclasses

from .params import ConvParams


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend runs natively. Anything outside it the core legalizes or refuses.

    - ``spatial_dims``: ranks run natively (1-D is lifted to 2-D when 2 is here and 1 is not).
    - ``dtypes``: canonical dtype names accepted; others raise UnsupportedError.
    - ``asymmetric_padding``: ranks whose (pre, post) padding may differ; elsewhere the core
      pads the input explicitly and passes symmetric padding.
    - ``transposed``: whether ``params.transposed`` may be True; else the core maps the
      transposed convolution onto direct fprop, dgrad and wgrad.
    - ``strided``: whether non-contiguous inputs are accepted; else the core copies them.
    - ``deterministic``: whether ``deterministic=True`` can be honoured at all (a backend may
      still refuse particular configurations with UnsupportedError).
    - ``math``: math modes accepted.
    - ``batch_invariant``: whether ``deterministic="batch_invariant"`` can be honoured (each sample's
      output and grad_input independent of the batch); else the core refuses it.
    - ``mask_invariant``, ``layout_invariant``: under ``deterministic=True``/``"batch_invariant"``, each
      output's bits do not depend on which other outputs the mask asks for / on the operands' memory
      layout (docs/semantics.md, "Determinism"); declared, the conformance kit checks them.
    """

    spatial_dims: frozenset = frozenset({1, 2, 3})
    dtypes: frozenset = frozenset({"float16", "bfloat16", "float32", "float64"})
    asymmetric_padding: frozenset = frozenset({1, 2, 3})
    transposed: bool = False
    strided: bool = True
    deterministic: bool = True
    math: frozenset = frozenset({"keep_dtype", "allow_tf32", "allow_fp16"})
    batch_invariant: bool = False
    mask_invariant: bool = False
    layout_invariant: bool = False


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`xconv.list_backends`."""

    name: str
    available: bool
    reason: str
    version: str
    devices: tuple[str, ...]
    array_families: tuple[str, ...]


class Backend:
    """Base class of backend objects (subclassing is optional; the attributes and methods are the contract).

    Attributes: ``name``; ``capabilities``; ``array_families``, the array libraries whose arrays
    it takes (``"numpy"``, ``"cupy"``, …), used for automatic selection; ``priority``, higher
    wins when two available backends take the same family.

    Primitives (all on direct or, if declared, transposed convolutions described by ``p``;
    each returns new C-contiguous arrays of dtype ``p.dtype``):

    - ``fprop(x, w, bias, p)`` → y of ``p.output_shape`` (bias may be None);
    - ``dgrad(dy, w, p)`` → dx of ``p.input_shape``;
    - ``wgrad(x, dy, p)`` → dw of ``p.weight_shape``;
    - ``bgrad(dy, p)`` → db of ``(p.bias_size,)``: dy summed over N and the spatial dims;
    - ``backward(dy, x, w, p, mask)`` → (dx, dw, db), None where the mask bit is False and
      nothing computed for it. The default composes the primitives.
    """

    name: str = ""
    capabilities: Capabilities = Capabilities()
    array_families: tuple[str, ...] = ()
    priority: int = 0

    def availability(self) -> tuple[bool, str]:
        """(available, reason). Cheap, never raises; reason is "" when available."""
        return True, ""

    def capabilities_for(self, p: ConvParams, op: str) -> Capabilities:
        """What runs natively for this configuration and primitive ("fprop", "dgrad", "wgrad", "bgrad",
        "backward"): ``capabilities`` unless overridden. A backend whose vendor library refuses some
        configurations that the core can legalize (say, a transposed case it can run as direct
        convolutions) narrows its capabilities here; the core then legalizes that call."""
        return self.capabilities

    def version(self) -> str:
        return ""

    def devices(self) -> tuple[str, ...]:
        return ()

    def fprop(self, x, w, bias, p: ConvParams):
        raise NotImplementedError

    def dgrad(self, dy, w, p: ConvParams):
        raise NotImplementedError

    def wgrad(self, x, dy, p: ConvParams):
        raise NotImplementedError

    def bgrad(self, dy, p: ConvParams):
        raise NotImplementedError

    def backward(self, dy, x, w, p: ConvParams, mask: tuple[bool, bool, bool]):
        return (self.dgrad(dy, w, p) if mask[0] else None,
                self.wgrad(x, dy, p) if mask[1] else None,
                self.bgrad(dy, p) if mask[2] else None)

    def info(self) -> BackendInfo:
        """This backend's row for list_backends; never raises."""
        available, reason = availability_of(self)
        try:
            version = str(self.version())
        except Exception:
            version = ""
        try:
            devices = tuple(self.devices()) if available else ()
        except Exception:
            devices = ()
        return BackendInfo(self.name, bool(available), reason, version, devices, tuple(self.array_families))


def availability_of(backend) -> tuple[bool, str]:
    """``backend.availability()``, with an exception it raises turned into (False, its text)."""
    try:
        available, reason = backend.availability()
    except Exception as exc:  # an availability check must never break the caller
        return False, f"availability() raised {type(exc).__name__}: {exc}"
    return bool(available), str(reason or "")
