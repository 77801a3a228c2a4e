"""Array families: making a case's inputs as a backend's arrays (with the case's memory layout) and reading results back.

A backend declares the array libraries it takes in ``array_families``; the kit builds inputs
in the first one. NumPy, CuPy and PyTorch are known; any other family is tried through its
module's ``asarray`` and read back with ``numpy.asarray`` / DLPack.
"""

from __future__ import annotations

import importlib

import numpy as np

from xconv.dtypes import DTYPES, dtype_name

from .cases import apply_view, storage_and_view


class FamilyError(Exception):
    """The kit cannot express a case's inputs in this array family (e.g. a dtype it lacks)."""


class Family:
    name = "numpy"

    def from_numpy(self, storage: np.ndarray):
        return storage

    def moveaxis(self, a, src, dst):
        return np.moveaxis(a, src, dst)

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def make(self, vals: np.ndarray, layout: str):
        """``vals`` as an array of this family laid out in memory as ``layout`` says."""
        storage, view = storage_and_view(vals, layout)
        return apply_view(self.from_numpy(storage), view, self.moveaxis)


class CupyFamily(Family):
    name = "cupy"

    def __init__(self):
        self.cp = importlib.import_module("cupy")

    def from_numpy(self, storage):
        if dtype_name(storage.dtype) == "bfloat16":
            raise FamilyError("CuPy has no bfloat16 arrays")
        return self.cp.asarray(storage)

    def moveaxis(self, a, src, dst):
        return self.cp.moveaxis(a, src, dst)

    def to_numpy(self, a):
        return self.cp.asnumpy(a)


class TorchFamily(Family):
    name = "torch"

    def __init__(self):
        self.torch = importlib.import_module("torch")

    def from_numpy(self, storage):
        torch = self.torch
        if dtype_name(storage.dtype) == "bfloat16":
            return torch.from_numpy(np.ascontiguousarray(storage).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(storage))

    def moveaxis(self, a, src, dst):
        return self.torch.movedim(a, src, dst)

    def to_numpy(self, a):
        torch = self.torch
        a = a.detach().cpu()
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).numpy().view(DTYPES["bfloat16"])
        return a.numpy()


class GenericFamily(Family):
    def __init__(self, name: str):
        self.name = name
        self.module = importlib.import_module(name)

    def from_numpy(self, storage):
        return self.module.asarray(storage)

    def moveaxis(self, a, src, dst):
        return self.module.moveaxis(a, src, dst)

    def to_numpy(self, a):
        try:
            return np.asarray(a)
        except Exception:  # noqa: BLE001 - fall back to DLPack
            return np.from_dlpack(a)


def family(name: str) -> Family:
    """The adapter of array family ``name``; ImportError when its library is not installed."""
    if name == "numpy":
        return Family()
    if name == "cupy":
        return CupyFamily()
    if name == "torch":
        return TorchFamily()
    return GenericFamily(name)
