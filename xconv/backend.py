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

    #: Whether :meth:`lane` serves op ``"dgrad"``: set True next to the ``lane`` that does (in the class that defines
    #: it; a subclass overriding ``lane`` does not inherit it), else that op is never asked (an older ``lane`` knows two).
    lane_dgrad: bool = False

    def lane(self, p: ConvParams, op: str, mask: tuple[bool, bool, bool] | None = None):
        """Optional: a runner for the repeated calls of one configuration that :mod:`xconv.lanes` makes (op
        ``"fprop"``: ``runner(x, w, bias)``; ``"backward"``: ``runner(dy, x, w)`` for ``mask``; ``"dgrad"``, where
        :attr:`lane_dgrad`: ``runner(dy, w)`` in place of ``dgrad``, for a transposed forward that legalization runs
        as one), asked once when a lane opens on ``p`` and called with arrays of the signatures the lane was opened
        for, in place of ``fprop``/``backward`` (which the lane reaches only where legalization rewrites nothing). It
        returns what the primitive returns (the same values, bits and errors), or ``NotImplemented`` to decline that
        call (the lane then calls the primitive). None (the default): no runner."""
        return None

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


# The contract, as the registry enforces it (docs/backends.md, "The contract, enforced").
#: Members a backend object must have; one missing is reported by name and the backend is refused.
REQUIRED = ("name", "capabilities", "array_families", "fprop", "dgrad", "wgrad", "bgrad")
#: Members a backend object may leave out, and what the core uses then (the :class:`Backend` defaults).
DEFAULTS = {"priority": "0", "availability": "always available", "capabilities_for": "capabilities everywhere",
            "version": '""', "devices": "()", "backward": "the primitives composed", "info": "built by the core"}


def contract_problems(backend) -> list[str]:
    """What keeps ``backend`` from being registered: "missing fprop", "name must be a non-empty str", ...
    (empty when it meets the contract; members in :data:`DEFAULTS` may be missing)."""
    problems = [f"missing {attr}" for attr in REQUIRED if not _has(backend, attr)]
    name = _get(backend, "name")
    if _has(backend, "name") and not (isinstance(name, str) and name.strip()):
        problems.append(f"name must be a non-empty str, not {name!r}")
    families = _get(backend, "array_families")
    if _has(backend, "array_families") and (isinstance(families, str) or not isinstance(families, (tuple, list, frozenset, set))
                                            or not all(isinstance(f, str) for f in families)):
        problems.append(f"array_families must be a tuple of str, not {families!r}")
    capabilities = _get(backend, "capabilities")
    if _has(backend, "capabilities") and not isinstance(capabilities, Capabilities):
        problems.append(f"capabilities must be an xconv.Capabilities, not {type(capabilities).__name__} "
                        f"{capabilities!r}")
    priority = _get(backend, "priority")
    if _has(backend, "priority") and (isinstance(priority, bool) or not isinstance(priority, (int, float))):
        problems.append(f"priority must be a number, not {priority!r}")
    problems += [f"{attr} is not callable" for attr in (*REQUIRED[3:], *DEFAULTS) if attr != "priority"
                 and _has(backend, attr) and not callable(_get(backend, attr))]
    return problems


def missing_optional(backend) -> tuple[str, ...]:
    """The members of :data:`DEFAULTS` that ``backend`` leaves out (the core supplies them)."""
    return tuple(attr for attr in DEFAULTS if not _has(backend, attr))


def _has(obj, attr: str) -> bool:
    try:
        getattr(obj, attr)
    except Exception:           # a property that raises counts as missing
        return False
    return True


def _get(obj, attr: str):
    try:
        return getattr(obj, attr)
    except Exception:
        return None


def complete(backend):
    """``backend`` itself when it has every member, else a :class:`Completed` view supplying the defaults."""
    return Completed(backend) if missing_optional(backend) else backend


class Completed:
    """A backend object that leaves out members of :data:`DEFAULTS`, with the :class:`Backend` defaults
    for those; everything else (reads and writes) goes to the object itself (``inner``)."""

    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "defaulted", missing_optional(inner))

    def __getattr__(self, attr):
        try:
            return getattr(self.inner, attr)
        except AttributeError:
            if attr not in DEFAULTS:
                raise
        if attr == "priority":
            return Backend.priority
        return getattr(Backend, attr).__get__(self)

    def __setattr__(self, attr, value):
        setattr(self.inner, attr, value)

    def info(self) -> BackendInfo:
        row = Backend.info(self) if "info" in self.defaulted else _info_of(self.inner)
        note = f"contract: missing {', '.join(self.defaulted)} (defaults used)"
        return dataclasses.replace(row, reason=f"{row.reason}; {note}" if row.reason else note)

    def __repr__(self) -> str:
        return f"<{self.inner!r} with defaults for {', '.join(self.defaulted)}>"


def _info_of(backend) -> BackendInfo:
    row = backend.info()
    if not isinstance(row, BackendInfo):
        raise TypeError(f"info() returned {type(row).__name__}, not BackendInfo")
    return row


def info_of(backend) -> BackendInfo:
    """``backend.info()``; a row saying what went wrong when it raises or returns something else (never raises)."""
    try:
        return _info_of(backend)
    except Exception as exc:
        return BackendInfo(str(_get(backend, "name")), False, f"info() raised {type(exc).__name__}: {exc}", "", (),
                           tuple(_get(backend, "array_families") or ()))
