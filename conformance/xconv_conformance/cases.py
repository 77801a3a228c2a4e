"""The case corpus: a declarative spec (``corpus.toml``) expanded into cases with stable ids, and their inputs.

A case is data. ``corpus.toml`` holds ``[defaults]``, ``[[grid]]`` entries (a cartesian product
of the values listed under ``vary``), hand-picked ``[[case]]`` entries and ``[[invalid]]``
entries (a valid base plus argument overrides that must raise :class:`xconv.ShapeError`).

Inputs are a function of the case id alone: each tensor is drawn from PCG64 seeded with the
SHA-256 of ``"xconv-conformance/v1/<case id>/<tensor name>"``, using only the raw 64-bit
stream (which NumPy guarantees bit for bit across versions and platforms) and correctly
rounded IEEE arithmetic: the sum of four uniforms, centred and scaled to unit variance,
rounded to float32, then to the case dtype. So every machine builds bit-identical inputs,
and the reference is computed from exactly these (cast) values.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import itertools
import json
import math
import tomllib
from importlib import resources

import numpy as np

import xconv
from xconv.dtypes import DTYPES, dtype_name

CORPUS_FILE = "corpus.toml"
FILLS = ("normal", "exact")
LAYOUTS = ("contiguous", "channels_last", "strided")
_SQRT3 = 1.7320508075688772  # sqrt(3): the sum of 4 uniforms minus 2 has variance 1/3
_KEYS = ("n", "c_in", "c_out", "dims", "spatial", "kernel", "stride", "padding", "dilation", "groups",
         "transposed", "output_padding", "dtype", "math", "mask", "layout", "deterministic", "bias_sizes")
_ABBREV = {"kernel": "k", "stride": "s", "dilation": "d", "padding": "p", "groups": "g", "n": "n",
           "c_in": "ci", "c_out": "co", "spatial": "x", "output_padding": "op", "mask": "m"}
_DTYPE_LABEL = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


class CorpusError(ValueError):
    """The corpus spec is malformed or describes an invalid 'valid' case."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One conformance case, fully expanded. ``kind`` is "valid" or "invalid"."""

    id: str
    group: str
    kind: str
    n: int
    c_in: int
    c_out: int
    spatial: tuple
    kernel: tuple
    stride: tuple
    padding: object          # int, "same"/"valid"/"same_lower", or ((pre, post), ...) per spatial dim
    dilation: tuple
    groups: int
    transposed: bool
    output_padding: tuple
    dtype: str
    math: str
    mask: tuple
    layout: str
    deterministic: bool | str    # False, True or "batch_invariant"
    bias_sizes: bool
    call: tuple = ()         # invalid cases: (argument, value) overrides of the call's keyword arguments
    tensors: tuple = ()      # invalid cases: (key, value) overrides such as ("weight_shape", [...])
    argument: str = ""       # invalid cases: the ShapeError.argument expected
    fill: str = "normal"     # "normal" (the error-bound inputs) or "exact" (integers: bitwise agreement; exact.py)

    @property
    def nd(self) -> int:
        return len(self.spatial)

    @property
    def input_shape(self) -> tuple:
        return (self.n, self.c_in, *self.spatial)

    @property
    def weight_shape(self) -> tuple:
        if self.transposed:
            return (self.c_in, self.c_out // self.groups, *self.kernel)
        return (self.c_out, self.c_in // self.groups, *self.kernel)

    def conv_kwargs(self) -> dict:
        """The convolution parameters as keyword arguments of xconv's functions."""
        padding = self.padding if isinstance(self.padding, (int, str)) else [tuple(p) for p in self.padding]
        return dict(stride=list(self.stride), padding=padding, dilation=list(self.dilation), groups=self.groups,
                    transposed=self.transposed, output_padding=list(self.output_padding))

    @functools.cached_property
    def params(self):
        """The validated :class:`xconv.ConvParams` (valid cases only)."""
        from xconv.params import make_params
        return make_params(self.input_shape, self.weight_shape, dtype=self.dtype, math=self.math,
                           deterministic=self.deterministic, **self.conv_kwargs())

    @property
    def output_shape(self) -> tuple:
        return self.params.output_shape

    def spec(self) -> dict:
        """The case as plain JSON data (what the corpus hash covers)."""
        d = dataclasses.asdict(self)
        d["call"] = [list(kv) for kv in self.call]
        d["tensors"] = [list(kv) for kv in self.tensors]
        if d["fill"] == "normal":
            del d["fill"]    # absent unless exact: the digests of the cases from before exact mode stay as they were
        return json.loads(json.dumps(d))

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 of the case's canonical JSON: two machines agree on a case iff this agrees."""
        return hashlib.sha256(_canonical(self.spec()).encode()).hexdigest()

    def tags(self) -> list[str]:
        t = [f"{self.nd}d", self.dtype, self.layout]
        if self.transposed:
            t.append("transposed")
        if self.deterministic:
            t.append("batch_invariant" if self.deterministic == "batch_invariant" else "deterministic")
        if self.math != "keep_dtype":
            t.append(self.math)
        if self.fill == "exact":
            t.append("exact")
        return t


def _canonical(data) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Expansion of the declarative spec


def _label(key: str, value) -> str:
    if key == "dtype":
        return _DTYPE_LABEL.get(value, str(value))
    if key == "dims":
        return f"{value}d"
    if key == "layout":
        return {"contiguous": "contig", "channels_last": "cl", "strided": "strided"}.get(value, value)
    if key == "transposed":
        return "T" if value else "direct"
    if key == "deterministic":
        return "batchinv" if value == "batch_invariant" else "det" if value else "nondet"
    if key == "math":
        return value
    if key == "padding" and isinstance(value, str):
        return value
    if isinstance(value, list):
        flat = list(itertools.chain.from_iterable(v if isinstance(v, list) else [v] for v in value))
        return _ABBREV.get(key, key) + "x".join(str(v) for v in flat)
    if isinstance(value, bool):
        return key if value else f"no_{key}"
    return f"{_ABBREV.get(key, key)}{value}"


def _per_dim(value, nd: int, name: str, where: str) -> tuple:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * nd
    if isinstance(value, list) and len(value) == nd and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise CorpusError(f"{where}: {name} must be an int or {nd} ints, not {value!r}")


def _padding(value, nd: int, where: str):
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple((value[0], value[1]) for _ in range(nd))       # one (pre, post) pair for every dim
    if (isinstance(value, list) and len(value) == nd
            and all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v) for v in value)):
        return tuple((v[0], v[1]) for v in value)
    raise CorpusError(f"{where}: padding must be an int, a string, [pre, post] or {nd} such pairs, not {value!r}")


def _determinism(value, where: str):
    if value == "batch_invariant" or isinstance(value, bool):
        return value
    raise CorpusError(f"{where}: deterministic must be true, false or \"batch_invariant\", not {value!r}")


def _mask(value, where: str) -> tuple:
    if isinstance(value, str) and len(value) == 3 and set(value) <= {"0", "1"}:
        return tuple(c == "1" for c in value)
    raise CorpusError(f"{where}: mask must be three 0/1 digits such as \"101\", not {value!r}")


def _make_case(case_id: str, group: str, raw: dict, kind: str = "valid", call=None, tensors=None,
               argument: str = "") -> Case:
    raw = dict(raw)
    fill = raw.pop("fill", "normal")
    if fill not in FILLS:
        raise CorpusError(f"case {case_id}: fill must be one of {FILLS}, not {fill!r}")
    unknown = set(raw) - set(_KEYS)
    if unknown:
        raise CorpusError(f"case {case_id}: unknown keys {sorted(unknown)}")
    nd = raw["dims"]
    if nd not in (1, 2, 3):
        raise CorpusError(f"case {case_id}: dims must be 1, 2 or 3")
    if raw["dtype"] not in DTYPES:
        raise CorpusError(f"case {case_id}: unknown dtype {raw['dtype']!r}")
    if raw["layout"] not in LAYOUTS:
        raise CorpusError(f"case {case_id}: unknown layout {raw['layout']!r}")
    case = Case(
        id=case_id, group=group, kind=kind, n=raw["n"], c_in=raw["c_in"], c_out=raw["c_out"],
        spatial=_per_dim(raw["spatial"], nd, "spatial", case_id), kernel=_per_dim(raw["kernel"], nd, "kernel", case_id),
        stride=_per_dim(raw["stride"], nd, "stride", case_id), padding=_padding(raw["padding"], nd, case_id),
        dilation=_per_dim(raw["dilation"], nd, "dilation", case_id), groups=raw["groups"],
        transposed=bool(raw["transposed"]), output_padding=_per_dim(raw["output_padding"], nd, "output_padding", case_id),
        dtype=raw["dtype"], math=raw["math"], mask=_mask(raw["mask"], case_id), layout=raw["layout"],
        deterministic=_determinism(raw["deterministic"], case_id), bias_sizes=bool(raw["bias_sizes"]),
        call=tuple(sorted((call or {}).items())), tensors=tuple(sorted((tensors or {}).items())), argument=argument,
        fill=fill)
    if case.c_in % case.groups or case.c_out % case.groups:
        raise CorpusError(f"case {case_id}: groups={case.groups} must divide c_in={case.c_in} and c_out={case.c_out}")
    try:
        case.params  # noqa: B018 - validate now: a 'valid' case (or an invalid case's base) must be valid
    except xconv.ShapeError as exc:
        raise CorpusError(f"case {case_id}: its parameters are invalid: {exc}") from None
    if fill == "exact":
        from .exact import check_fillable
        check_fillable(case)
    return case


def case_from_spec(spec: dict) -> Case:
    """The Case of one ``xconv conformance cases --json`` line (a spec from :meth:`Case.spec`, also what
    ``xconv conformance fuzz`` prints); CorpusError when it is not one."""
    if not isinstance(spec, dict) or not isinstance(spec.get("id"), str):
        raise CorpusError(f"not a case spec (a JSON object with an id): {str(spec)[:200]}")
    fields = {f.name for f in dataclasses.fields(Case)}
    unknown = set(spec) - fields
    if unknown:
        raise CorpusError(f"case {spec['id']}: unknown keys {sorted(unknown)}")
    raw = {k: spec[k] for k in _KEYS if k in spec and k != "dims"}
    missing = (set(_KEYS) - {"dims"}) - set(raw)
    if missing:
        raise CorpusError(f"case {spec['id']}: lacks {sorted(missing)}")
    raw["dims"] = len(spec["spatial"])
    raw["mask"] = "".join("1" if m else "0" for m in spec["mask"])
    if spec.get("fill", "normal") != "normal":
        raw["fill"] = spec["fill"]
    kind = spec.get("kind", "valid")
    return _make_case(spec["id"], spec.get("group", spec["id"].split("/", 1)[0]), raw, kind=kind,
                      call=dict(spec.get("call") or []), tensors=dict(spec.get("tensors") or []),
                      argument=spec.get("argument", ""))


def _axis_items(key: str, value) -> tuple[str, dict]:
    """One value of a ``vary`` axis as (label, parameters): a scalar, or a table (with an optional label)."""
    if isinstance(value, dict):
        params = {k: v for k, v in value.items() if k != "label"}
        label = value.get("label") or "-".join(_label(k, v) for k, v in params.items())
        return str(label), params
    return _label(key, value), {key: value}


def expand(spec: dict) -> list[Case]:
    """All cases of a parsed corpus spec, in spec order; CorpusError on anything malformed."""
    defaults = dict(spec.get("defaults", {}))
    missing = set(_KEYS) - set(defaults)
    if missing:
        raise CorpusError(f"[defaults] lacks {sorted(missing)}")
    cases: list[Case] = []
    for grid in spec.get("grid", []):
        name = grid["name"]
        base = dict(defaults, **grid.get("base", {}))
        axes = [[_axis_items(key, v) for v in values] for key, values in grid.get("vary", {}).items()]
        for combo in itertools.product(*axes):
            raw = dict(base)
            for _, params in combo:
                raw.update(params)
            labels = [label for label, _ in combo]
            case_id = name + ("/" + "-".join(labels) if labels else "")
            cases.append(_make_case(case_id, name, raw))
    for entry in spec.get("case", []):
        entry = dict(entry)
        case_id = entry.pop("id")
        group = entry.pop("group", case_id.split("/", 1)[0])
        entry.pop("doc", None)
        cases.append(_make_case(case_id, group, dict(defaults, **entry)))
    for entry in spec.get("invalid", []):
        entry = dict(entry)
        case_id = entry.pop("id")
        entry.pop("doc", None)
        call, tensors, argument = entry.pop("call", {}), entry.pop("tensors", {}), entry.pop("argument", "")
        if not call and not tensors:
            raise CorpusError(f"invalid case {case_id}: needs call or tensors overrides")
        if not argument:
            raise CorpusError(f"invalid case {case_id}: needs the expected ShapeError argument")
        cases.append(_make_case(case_id, "invalid", dict(defaults, **entry), kind="invalid", call=call,
                                tensors=tensors, argument=argument))
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise CorpusError(f"duplicate case id {case.id!r}")
        seen.add(case.id)
    return cases


@functools.lru_cache(maxsize=None)
def load_corpus() -> tuple[Case, ...]:
    """The packaged corpus, expanded."""
    text = resources.files(__package__).joinpath(CORPUS_FILE).read_text(encoding="utf-8")
    return tuple(expand(tomllib.loads(text)))


def corpus_hash(cases) -> str:
    """SHA-256 over the ids and digests of ``cases`` in order."""
    h = hashlib.sha256()
    for case in cases:
        h.update(f"{case.id}\0{case.digest}\n".encode())
    return h.hexdigest()


def select(cases, patterns=None) -> list[Case]:
    """Cases whose id matches any of ``patterns``: glob patterns, or plain substrings when without * ? [."""
    if not patterns:
        return list(cases)
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for case in cases:
        for pat in patterns:
            if any(ch in pat for ch in "*?[") and fnmatch.fnmatchcase(case.id, pat) or pat in case.id:
                out.append(case)
                break
    return out


# ---------------------------------------------------------------------------------------------
# Inputs


def _seed(case_id: str, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"xconv-conformance/v1/{case_id}/{name}".encode()).digest()[:16], "little")


def values(case_id: str, name: str, shape, dtype: str) -> np.ndarray:
    """The C-contiguous values of tensor ``name`` of case ``case_id``: identical on every machine.

    Approximately standard normal (the centred sum of four uniforms, scaled to unit variance;
    bounded by 2*sqrt(3)), exactly representable in ``dtype``.
    """
    shape = tuple(int(s) for s in shape)
    count = math.prod(shape)
    raw = np.random.PCG64(_seed(case_id, name)).random_raw(4 * count).reshape(4, count)
    uni = (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53
    v = (((uni[0] + uni[1]) + uni[2]) + uni[3] - 2.0) * _SQRT3
    target = np.dtype(DTYPES[dtype]) if dtype in DTYPES else np.dtype(dtype)
    return v.astype(np.float32).astype(target).reshape(shape)


def storage_and_view(vals: np.ndarray, layout: str):
    """(storage, view): a contiguous buffer and how to view it so that the view equals ``vals``.

    ``view`` is ``"moveaxis"`` (channels-last storage seen as N, C, *spatial), ``"step2"``
    (every other element of the last dim; the gaps hold NaN so that reading them shows) or None.
    """
    if layout == "contiguous" or vals.ndim < 3:
        return np.ascontiguousarray(vals), None
    if layout == "channels_last":
        return np.ascontiguousarray(np.moveaxis(vals, 1, -1)), "moveaxis"
    if layout == "strided":
        shape = vals.shape[:-1] + (2 * vals.shape[-1],)
        floating = dtype_name(vals.dtype) is not None
        storage = np.full(shape, np.nan, dtype=vals.dtype) if floating else np.zeros(shape, vals.dtype)
        storage[..., ::2] = vals
        return storage, "step2"
    raise ValueError(f"unknown layout {layout!r}")


def apply_view(storage, view, moveaxis):
    if view == "moveaxis":
        return moveaxis(storage, -1, 1)
    if view == "step2":
        return storage[..., ::2]
    return storage


@dataclasses.dataclass
class Inputs:
    """A case's tensors: logical values (contiguous, case dtype) and their shapes/dtypes as passed."""

    grad_output: np.ndarray
    input: np.ndarray
    weight: np.ndarray

    def digest(self) -> str:
        h = hashlib.sha256()
        for name in ("grad_output", "input", "weight"):
            a = getattr(self, name)
            h.update(f"{name}:{a.dtype}:{a.shape}\n".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def make_inputs(case: Case) -> Inputs:
    """The logical (contiguous) tensors of ``case``; invalid cases apply their tensor overrides."""
    over = dict(case.tensors)
    shapes = {"grad_output": tuple(over.get("grad_output_shape", case.output_shape)),
              "input": tuple(over.get("input_shape", case.input_shape)),
              "weight": tuple(over.get("weight_shape", case.weight_shape))}
    arrays = {}
    if case.fill == "exact" and case.kind == "valid":
        from .exact import exact_values
        for name, shape in shapes.items():
            arrays[name] = exact_values(case, name, shape)
        return Inputs(**arrays)
    for name, shape in shapes.items():
        dtype = over.get(f"{name}_dtype", case.dtype)
        arrays[name] = values(case.id, name, shape, dtype)
    return Inputs(**arrays)
