"""Cases, operands and digests for the determinism properties (tests/test_determinism_properties.py).

A :class:`Case` is one convolution (rank, shapes, stride, padding, dilation, groups, transposed, dtype);
its operands are a function of the case and a seed alone, so a subprocess rebuilds them bit for bit from
the case's JSON. :func:`outputs` runs a case's forward and full backward and returns every output;
:func:`digests` hashes them, so that processes can compare bits without moving arrays.
Also runnable: ``python tests/determinism_worker.py`` (see that module) uses these to compute digests in a
fresh process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading

import numpy as np

import xconv
from xconv.dtypes import DTYPES

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
#: (backend, deterministic) pairs that promise bits independent of thread, mask, layout, limit and process.
PROMISED = [(b, d) for b in ("numpy", "numpy-exact") for d in (True, "batch_invariant")]
MASKS = [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True) if a or b or c]
LAYOUTS = ("C", "F", "channels_last", "sliced", "reversed")
OUTPUT_NAMES = ("y", "dx", "dw", "db")


@dataclasses.dataclass(frozen=True)
class Case:
    """One convolution: ``x`` is ``(N, C_in, *spatial)``; ``weight`` is ``(C_out, C_in/groups, *kernel)``
    (``(C_in, C_out/groups, *kernel)`` when transposed)."""
    N: int
    C_in: int
    C_out: int
    groups: int
    spatial: tuple
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    transposed: bool
    output_padding: tuple
    dtype: str
    seed: int = 0

    @property
    def nd(self) -> int:
        return len(self.spatial)

    def out_spatial(self) -> tuple:
        out = []
        for i, k, s, p, d, op in zip(self.spatial, self.kernel, self.stride, self.padding, self.dilation,
                                     self.output_padding):
            if self.transposed:
                out.append((i - 1) * s - 2 * p + d * (k - 1) + op + 1)
            else:
                out.append((i + 2 * p - d * (k - 1) - 1) // s + 1)
        return tuple(out)

    def valid(self) -> bool:
        if self.transposed and any(op >= max(s, d) for op, s, d in zip(self.output_padding, self.stride,
                                                                        self.dilation)):
            return False
        if not self.transposed and any(i + 2 * p < d * (k - 1) + 1 for i, k, p, d in
                                       zip(self.spatial, self.kernel, self.padding, self.dilation)):
            return False
        return all(o >= 1 for o in self.out_spatial())

    def weight_shape(self) -> tuple:
        if self.transposed:
            return (self.C_in, self.C_out // self.groups) + self.kernel
        return (self.C_out, self.C_in // self.groups) + self.kernel

    def kwargs(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    transposed=self.transposed, output_padding=self.output_padding)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Case":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def label(self) -> str:
        return (f"{self.nd}-D N{self.N} {self.C_in}->{self.C_out} g{self.groups} in{self.spatial} k{self.kernel} "
                f"s{self.stride} p{self.padding} d{self.dilation}{' T' if self.transposed else ''} {self.dtype}")


def operands(case: Case) -> dict:
    """x, w, bias and dy of ``case``: values from the case's seed alone, in the case's dtype (C order)."""
    rng = np.random.default_rng(case.seed)
    dt = DTYPES[case.dtype]

    def draw(shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dt)

    x = draw((case.N, case.C_in) + case.spatial)
    w = draw(case.weight_shape())
    bias = draw((case.C_out,))
    dy = draw((case.N, case.C_out) + case.out_spatial())
    return dict(x=x, w=w, bias=bias, dy=dy)


def relayout(a: np.ndarray, layout: str) -> np.ndarray:
    """``a``'s values in another memory layout: C order, Fortran order, channels-last (axis 1 innermost),
    a view with gaps (every other element of a larger array), or negative strides (a reversed copy, reversed)."""
    if layout == "C":
        return np.ascontiguousarray(a)
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "channels_last":
        if a.ndim < 3:
            return np.asfortranarray(a)
        return np.ascontiguousarray(np.moveaxis(a, 1, -1)).transpose((0, a.ndim - 1) + tuple(range(1, a.ndim - 1)))
    if layout == "sliced":
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 1,), a.dtype)
        view = big[..., 1::2]
        view[...] = a
        return view
    if layout == "reversed":
        rev = (slice(None, None, -1),) * a.ndim
        return np.ascontiguousarray(a[rev])[rev]
    raise ValueError(layout)


def outputs(case: Case, ops: dict, backend: str, deterministic, *, mask=(True, True, True), fprop: bool = True,
            workspace_limit=None) -> dict:
    """The forward output (with bias; when ``fprop``) and the backward outputs the mask asks for."""
    kw = dict(case.kwargs(), backend=backend, deterministic=deterministic, workspace_limit=workspace_limit)
    out = {}
    if fprop:
        out["y"] = xconv.conv_fprop(ops["x"], ops["w"], bias=ops["bias"], **kw)
    dx, dw, db = xconv.convolution_backward(ops["dy"], ops["x"], ops["w"], bias_sizes=[case.C_out],
                                            output_mask=tuple(mask), **kw)
    for name, arr in zip(("dx", "dw", "db"), (dx, dw, db)):
        if arr is not None:
            out[name] = arr
    return out


def digest(a: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:24]


def digests(case: Case, backend: str, deterministic) -> dict:
    return {k: digest(v) for k, v in outputs(case, operands(case), backend, deterministic).items()}


def on_threads(fn, n: int) -> list:
    """``fn()`` on ``n`` new threads started together (a barrier), their results in thread order."""
    results = [None] * n
    errors = []
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:     # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def differences(got: dict, want: dict) -> dict:
    """Per output name: how many elements differ bitwise (only names that differ; shapes must agree)."""
    out = {}
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        gb = np.ascontiguousarray(g).view(np.uint8).reshape(g.size, -1)
        wb = np.ascontiguousarray(w).view(np.uint8).reshape(w.size, -1)
        n = int((gb != wb).any(axis=1).sum())
        if n:
            out[k] = n
    return out


def dump_cases(cases) -> str:
    return json.dumps([c.to_json() for c in cases])


def load_cases(text: str) -> list:
    return [Case.from_json(d) for d in json.loads(text)]
