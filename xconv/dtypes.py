"""The floating-point dtypes xconv accepts, by name, and their accumulation dtypes.

bfloat16 is ml_dtypes' dtype, imported the first time it is asked for (``DTYPES["bfloat16"]`` or the
module attribute ``bfloat16``): importing ml_dtypes takes 0.2-1.2 s, and an array can only hold that
dtype once ml_dtypes is imported, so recognizing the other dtypes never needs it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

_EAGER = {"float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
_NAMES = ("float16", "bfloat16", "float32", "float64")


class _Dtypes(Mapping):
    """name -> NumPy dtype for every dtype xconv accepts; bfloat16 resolved (ml_dtypes imported) on first use."""

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return _EAGER[name]

    def __iter__(self):
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


#: Every dtype xconv accepts, by canonical name.
DTYPES: Mapping[str, np.dtype] = _Dtypes()

#: Unit roundoff (half an ulp of 1.0) of each dtype; also of the reduced-precision math modes.
UNIT_ROUNDOFF: dict[str, float] = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
    "tf32": 2.0**-11,
}


def __getattr__(name: str):
    if name == "bfloat16":                 # ``from xconv.dtypes import bfloat16``: ml_dtypes' dtype
        return DTYPES["bfloat16"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype) -> str | None:
    """Canonical name of a supported dtype, or None when it is not one of :data:`DTYPES`.

    Accepts anything with a ``dtype``-like value: a NumPy dtype (either byte order), a CuPy or torch
    dtype whose string form names the type, or a name.
    """
    try:
        d = np.dtype(dtype)
    except TypeError:
        text = str(dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32; "bfloat16" before ml_dtypes is imported
        return text if text in _NAMES else None
    if d.byteorder not in "=|":
        d = d.newbyteorder("=")
    for name, known in _EAGER.items():
        if d == known:
            return name
    if "ml_dtypes" in sys.modules and d == DTYPES["bfloat16"]:   # no array has it before ml_dtypes is imported
        return "bfloat16"
    return None


def accumulation_dtype(name: str, exact: bool = False) -> np.dtype:
    """The dtype a reduction over ``name`` inputs accumulates in: float64 when exact or float64, else float32."""
    if exact or name == "float64":
        return np.dtype(np.float64)
    return np.dtype(np.float32)
