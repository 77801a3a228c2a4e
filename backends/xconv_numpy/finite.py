"""Whether an array holds only finite values (no NaN, no infinity): what the paths' non-finite detours ask.

The compiled check (csrc/finite.c: one branch-free pass over the exponent bits) for C-contiguous float32 and float64
arrays in native byte order, of COMPILED_MIN elements or more, where the compiled loops are on (``XCONV_NUMPY_C=0``
keeps NumPy's, as for every compiled part); otherwise NumPy: ``numpy.isfinite``, or (given a compute dtype) one
summing pass in it, then an exact check only when the sum is not finite (a NaN or an infinity is there, or finite
values overflowed it). The same answer either way, so no path choice, hence no bit, depends on which one ran
(tests/test_numpy_finite.py; timings in docs/numpy-backend.md, "Non-finite inputs")."""

from __future__ import annotations

import numpy as np

from . import native

_COMPILED = {np.dtype(np.float32): "xconv_all_finite_f32", np.dtype(np.float64): "xconv_all_finite_f64"}
#: The switch of the compiled check (the settings field of ``$XCONV_NUMPY_C``), as the other compiled parts'.
SWITCH = "numpy_c"
#: Fewest elements the compiled check takes (below, reading the switch costs more than NumPy's check: 2.1 against 1.2
#: µs on a 1x1 digits weight).
COMPILED_MIN = 4096


def all_finite(a, cdt=None) -> bool:
    """Whether ``a`` (an array or a NumPy scalar; None: nothing to check) holds no NaN and no infinity. ``cdt``: the
    dtype of NumPy's summing pass, at least as wide as ``a``'s (:func:`xconv.dtypes.accumulation_dtype`; a narrower
    one is not used: the sum could overflow where the values do not); None: ``numpy.isfinite`` element by element."""
    if a is None:
        return True
    a = np.asarray(a)
    if a.size == 0:
        return True
    name = _COMPILED.get(a.dtype)
    if name is not None and a.size >= COMPILED_MIN and a.flags.c_contiguous and native.part_on(SWITCH):
        return bool(getattr(native.LIBRARY._value or native.library(), name)(native.address(a), a.size))
    if cdt is None or np.dtype(cdt).itemsize < a.dtype.itemsize:
        return bool(np.isfinite(a).all())
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.add.reduce(a, axis=None, dtype=cdt)):
            return True
    rows = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    step = max(1, (8 << 20) // max(rows.shape[1] * a.itemsize, 1))
    return all(np.isfinite(rows[i:i + step].astype(cdt, copy=False)).all() for i in range(0, rows.shape[0], step))
