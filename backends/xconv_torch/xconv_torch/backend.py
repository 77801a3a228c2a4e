"""The torch backends: xconv's primitives on ``torch.ops.aten.convolution`` and ``convolution_backward``.

One backend per torch device type (:data:`DEVICE_TYPES`), named ``torch-<type>``. Each runs the
kernels PyTorch itself runs on that device (oneDNN on the CPU, cuDNN/MIOpen through CUDA/ROCm,
MPS, oneDNN on Intel GPUs, aclnn through torch_npu), so one backend puts every device PyTorch
reaches under xconv's conformance kit, and gives a second route to cuDNN next to ``cudnn``.

Capabilities are declared as aten has them: 1-D to 3-D, groups, dilation, transposed
convolution (natively, except where aten's rule ``output_padding < stride or < dilation`` does not
hold: the core then maps it onto direct primitives), strided inputs; symmetric padding only (the
core pads asymmetric and "same" padding explicitly); the dtypes of :mod:`.devices`.
"""

from __future__ import annotations

import dataclasses

from xconv import Backend, BackendError, BackendUnavailableError, Capabilities, UnsupportedError, tracing

from . import devices
from .settings import scoped
from .tensors import place

DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu")
_NOT_DETERMINISTIC = ("deterministic implementation", "does not have a deterministic")


class TorchBackend(Backend):
    """xconv's primitives on torch device type ``device_type`` ("cpu", "cuda", "mps", "xpu", "npu")."""

    def __init__(self, device_type: str):
        kind = devices.KINDS[device_type]
        self.kind = kind
        self.device_type = device_type
        self.name = f"torch-{device_type}"
        # host arrays (NumPy) or the device's own tensors first: the first family is what the
        # conformance kit builds its inputs in (CPU tensors for torch-cpu, NumPy copied over for the rest)
        self.array_families = ("torch", "numpy") if device_type == "cpu" else ("numpy", "torch") + (
            ("cupy",) if device_type == "cuda" else ())
        self.priority = -10          # NumPy arrays and torch tensors go elsewhere unless this backend is named
        self.capabilities = Capabilities(spatial_dims=frozenset({1, 2, 3}), dtypes=kind.dtypes,
                                         asymmetric_padding=frozenset(), transposed=True, strided=True,
                                         deterministic=kind.deterministic)
        self._probe = None

    # -- description

    def availability(self):
        if self._probe is None:
            self._probe = devices.probe(self.device_type)
        return self._probe

    def version(self) -> str:
        return devices.version_text(self.device_type) if self.availability()[0] else ""

    def devices(self) -> tuple[str, ...]:
        return devices.device_names(self.device_type)

    def capabilities_for(self, p, op: str) -> Capabilities:
        """aten runs a transposed convolution only when each output_padding < stride or < dilation."""
        if p.transposed and any(o >= s and o >= d for o, s, d in zip(p.output_padding, p.stride, p.dilation)):
            return dataclasses.replace(self.capabilities, transposed=False)
        return self.capabilities

    # -- primitives

    def fprop(self, x, w, bias, p):
        def run(torch, x, w, bias):
            return (torch.ops.aten.convolution(x, w, bias, *_geometry(p)),)
        return self._run("fprop", p, run, x, w, bias)[0]

    def dgrad(self, dy, w, p):
        return self.backward(dy, None, w, p, (True, False, False))[0]

    def wgrad(self, x, dy, p):
        return self.backward(dy, x, None, p, (False, True, False))[1]

    def bgrad(self, dy, p):
        def run(torch, dy):
            return (dy.sum(dim=[0, *range(2, dy.dim())]),)
        return self._run("bgrad", p, run, dy)[0]

    def backward(self, dy, x, w, p, mask):
        def run(torch, dy, x, w):
            # aten reads only the shape of the input it is not differentiating for: an empty stand-in
            x = x if x is not None else torch.empty(p.input_shape, dtype=dy.dtype, device=dy.device)
            w = w if w is not None else torch.empty(p.weight_shape, dtype=dy.dtype, device=dy.device)
            return torch.ops.aten.convolution_backward(dy, x, w, [p.bias_size] if mask[2] else None, *_geometry(p),
                                                       list(mask))
        results = self._run("backward", p, run, dy, x, w)
        return tuple(r if bit else None for r, bit in zip(results, mask))

    def _run(self, op: str, p, run, *arrays):
        if p.workspace_limit is not None:
            raise UnsupportedError(f"backend {self.name!r} cannot bound the scratch memory of PyTorch's kernels "
                                   f"(workspace_limit={p.workspace_limit}); unset it for this backend")
        try:
            torch = devices.torch_module()
        except Exception as exc:  # noqa: BLE001 - a torch that is installed but cannot be imported
            why = f"PyTorch cannot be imported: {type(exc).__name__}: {exc}"
            raise BackendUnavailableError(self.name, why) from exc
        tensors, placement = place(torch, self.device_type, self.name, arrays)
        widen = p.dtype in self.kind.widen
        if widen:   # the device's own kernels for this dtype accumulate in it: run them in float32 instead
            tensors = [None if t is None else t.float() for t in tensors]
        try:
            with scoped(torch, self.device_type, p.deterministic, p.math), torch.no_grad():
                results = run(torch, *tensors)
                if widen:
                    results = tuple(None if r is None else r.to(getattr(torch, p.dtype)) for r in results)
        except RuntimeError as exc:
            text = str(exc)
            if p.deterministic and any(s in text for s in _NOT_DETERMINISTIC):
                raise UnsupportedError(f"backend {self.name!r} cannot promise deterministic results for this "
                                       f"{op}: {text.splitlines()[0]}") from exc
            raise BackendError(self.name, -1, type(exc).__name__, text.splitlines()[0] if text else "",
                               f"torch {op}") from exc
        if tracing.active():   # what ran: the aten op on the device, fp32 precision, determinism (xconv.trace)
            aten = {"fprop": "aten.convolution", "bgrad": "sum"}.get(op, "aten.convolution_backward")
            tf32 = p.dtype == "float32" and p.math != "keep_dtype"
            tracing.note(f"torch {aten} on {self.device_type}" + (" (computed in float32)" if widen else ""),
                         math="allow_tf32" if tf32 else "keep_dtype",
                         deterministic="run_to_run" if p.deterministic else "none")
        return tuple(placement.out(r) for r in results)


def _geometry(p):
    """aten's (stride, padding, dilation, transposed, output_padding, groups) of symmetric ``p``."""
    return (list(p.stride), [pre for pre, _ in p.padding], list(p.dilation), bool(p.transposed),
            list(p.output_padding), p.groups)
