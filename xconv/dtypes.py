"""The floating-point dtypes xconv accepts, by name, and their accumulation dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: Every dtype xconv accepts, by canonical name.
DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16,
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}

#: Unit roundoff (half an ulp of 1.0) of each dtype; also of the reduced-precision math modes.
UNIT_ROUNDOFF: dict[str, float] = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
    "tf32": 2.0**-11,
}


def dtype_name(dtype) -> str | None:
    """Canonical name of a supported dtype, or None when it is not one of :data:`DTYPES`.

    Accepts anything with a ``dtype``-like value: a NumPy dtype, a CuPy or torch dtype whose
    string form names the type, or a name.
    """
    try:
        d = np.dtype(dtype)
    except TypeError:
        text = str(dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32
        return text if text in DTYPES else None
    if not d.isnative:  # byte-swapped: the same type (the core converts it to native order)
        d = d.newbyteorder("=")
    for name, known in DTYPES.items():
        if d == known:
            return name
    return None


def accumulation_dtype(name: str, exact: bool = False) -> np.dtype:
    """The dtype a reduction over ``name`` inputs accumulates in: float64 when exact or float64, else float32."""
    if exact or name == "float64":
        return np.dtype(np.float64)
    return np.dtype(np.float32)
