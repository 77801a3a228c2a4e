"""The bundle manifest's schema, and reading a manifest that came from another machine.

:func:`parse_manifest` turns the bytes of ``manifest.json`` into a dict that holds exactly the
types the kit reads, or raises :class:`ManifestError` naming the field (``cases[3].message
12345 (int) is not a string``). Before ``json.loads`` sees the text, its nesting depth and
its number of values are counted (strings blanked out, the brackets counted with NumPy), so a
100,000-deep nesting or a file of a million empty lists is refused without recursion and without
building it. Duplicate keys, NaN and Infinity literals are refused too.

The schema is a few combinators (:class:`Str`, :class:`Int`, :class:`Num`, :class:`Bool`,
:class:`Null`, :class:`AnyOf`, :class:`List`, :class:`Map`, :class:`Obj`). An object's listed
keys are checked; keys the schema does not list are ignored (no code reads them), so a newer kit
may add fields without breaking an older one's compare.

The case statuses a bundle may record are :data:`STATUSES`: the one place to extend them.
"""

from __future__ import annotations

import json
import re

import numpy as np

from xconv.errors import XconvError

from .status import STATUSES  # every status a case record may hold  # noqa: F401

FORMAT = "xconv-conformance-bundle"
FORMAT_VERSION = 1
OUTPUT_NAMES = ("grad_input", "grad_weight", "grad_bias")
STORED_DTYPES = {"float16": "float16", "bfloat16": "uint16", "float32": "float32", "float64": "float64"}
MAX_CASES = 20_000                  # cases in one bundle (the corpus holds a few hundred)
MAX_JSON_DEPTH = 32                 # nesting of arrays and objects (a manifest needs 6)
MAX_JSON_VALUES = 2_000_000         # arrays, objects and separated values (a manifest needs ~70 per case)
MAX_RANK = 8                        # dimensions of a stored result
MAX_DIM = 1 << 40                   # extent of one dimension

_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[0-9]{5}\.(grad_input|grad_weight|grad_bias)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SHOWN = 60


class ManifestError(XconvError, ValueError):
    """A manifest is not JSON, or does not fit the schema; the message names the field and what is wrong."""


# ---------------------------------------------------------------------------------------------
# The schema language


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "int", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


class Schema:
    """Checks a JSON value: ``check(value, path)`` raises ManifestError naming ``path`` when it does not fit."""

    expected = "a value"

    def fits(self, value) -> bool:
        raise NotImplementedError

    def check(self, value, path: str) -> None:
        if not self.fits(value):
            raise ManifestError(f"{path} {_show(value)} ({_kind(value)}) is not {self.expected}")


class Str(Schema):
    """A string; ``plain``: without control characters (a name printed on a terminal cannot hold escapes)."""

    def __init__(self, pattern: re.Pattern | None = None, choices: tuple | None = None, nonempty: bool = False,
                 plain: bool = False, expected: str | None = None):
        self.pattern, self.choices, self.nonempty, self.plain = pattern, choices, nonempty, plain
        self.expected = expected or (f"one of {list(choices)}" if choices else
                                     ("a non-empty " if nonempty else "a ")
                                     + ("string without control characters" if plain else "string"))

    def fits(self, value) -> bool:
        return (isinstance(value, str) and (not self.nonempty or bool(value))
                and (not self.plain or _CONTROL.search(value) is None)
                and (self.choices is None or value in self.choices)
                and (self.pattern is None or self.pattern.fullmatch(value) is not None))


class Int(Schema):
    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi
        self.expected = ("an integer" + (f" >= {lo}" if lo is not None else "")
                         + (f" and <= {hi}" if hi is not None else ""))

    def fits(self, value) -> bool:
        return type(value) is int and (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)


class Num(Schema):
    """A number, or one of the strings a kit writes for a non-finite ratio ("inf", "nan")."""

    expected = 'a number (or "inf", "-inf", "nan")'

    def fits(self, value) -> bool:
        return type(value) in (int, float) or value in ("inf", "-inf", "nan")


class Bool(Schema):
    expected = "true or false"

    def fits(self, value) -> bool:
        return type(value) is bool


class Null(Schema):
    expected = "null"

    def fits(self, value) -> bool:
        return value is None


class AnyOf(Schema):
    def __init__(self, *options: Schema):
        self.options = options
        self.expected = " or ".join(o.expected for o in options)

    def fits(self, value) -> bool:
        return any(o.fits(value) for o in self.options)

    def check(self, value, path: str) -> None:
        for o in self.options:
            if o.fits(value):
                o.check(value, path)
                return
        super().check(value, path)


def Optional(schema: Schema) -> Schema:  # noqa: N802 - reads as a type
    return AnyOf(schema, Null())


class List(Schema):
    def __init__(self, item: Schema, max_len: int | None = None):
        self.item, self.max_len = item, max_len
        self.expected = (f"an array (of {item.expected}" + (f", at most {max_len} long" if max_len is not None else "")
                         + ")")

    def fits(self, value) -> bool:
        return isinstance(value, list) and (self.max_len is None or len(value) <= self.max_len)

    def check(self, value, path: str) -> None:
        super().check(value, path)
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


class Map(Schema):
    """An object with any keys (or only ``keys``), every value fitting ``value``."""

    def __init__(self, value: Schema, keys: tuple | None = None):
        self.value, self.keys = value, keys
        self.expected = "an object" + (f" with keys among {list(keys)}" if keys else "")

    def fits(self, value) -> bool:
        return isinstance(value, dict) and (self.keys is None or set(value) <= set(self.keys))

    def check(self, value, path: str) -> None:
        super().check(value, path)
        for k, v in value.items():
            self.value.check(v, _join(path, k))


class Obj(Schema):
    """An object with ``required`` keys and ``optional`` ones; other keys are ignored, or refused if ``closed``."""

    def __init__(self, required: dict, optional: dict | None = None, closed: bool = False):
        self.required, self.optional, self.closed = required, optional or {}, closed
        self.expected = "an object"

    def fits(self, value) -> bool:
        return isinstance(value, dict)

    def check(self, value, path: str) -> None:
        super().check(value, path)
        for key, schema in self.required.items():
            if key not in value:
                raise ManifestError(f"{_join(path, key)} is missing (expected {schema.expected})")
            schema.check(value[key], _join(path, key))
        for key, schema in self.optional.items():
            if key in value:
                schema.check(value[key], _join(path, key))
        if self.closed:
            extra = sorted(set(value) - set(self.required) - set(self.optional))
            if extra:
                raise ManifestError(f"{path or 'the manifest'}: unexpected keys {extra[:5]} (expected only "
                                    f"{sorted(self.required) + sorted(self.optional)})")


# ---------------------------------------------------------------------------------------------
# The manifest

SHA256 = Str(_HEX64, expected="a SHA-256 (64 lowercase hex digits)")
DTYPE = Str(choices=tuple(STORED_DTYPES))
OUTPUT_ENTRY = Obj({"key": Str(_KEY, expected="an array key such as '00012.grad_input'"), "dtype": DTYPE,
                    "shape": List(Int(0, MAX_DIM), MAX_RANK)}, closed=True)
NAME = Str(plain=True)
#: A case's xconv.trace() record (what its call ran); optional, written by kits since the trace records.
RECORD = Obj({"op": NAME, "backend": NAME},
             {"path": Optional(Str()), "math": Optional(NAME), "deterministic": Optional(NAME),
              "legalized": List(Str()), "workspace_bytes": Optional(Int(0)), "plan_cache": Optional(NAME),
              "seconds": Optional(Num()), "shapes": Map(List(Int(0), MAX_RANK)), "error": Optional(Str())})
CASE = Obj(
    required={"id": Str(nonempty=True, plain=True), "status": Str(choices=STATUSES), "spec_digest": SHA256,
              "input_digest": SHA256, "dtype": DTYPE, "outputs": Map(OUTPUT_ENTRY, keys=OUTPUT_NAMES)},
    optional={"message": Str(), "kind": NAME, "ratio": Optional(Num()),
              "ratios": Map(Optional(Num()), keys=OUTPUT_NAMES),
              "worst_index": Map(Optional(List(Int(0), MAX_RANK)), keys=OUTPUT_NAMES),
              "digests": Optional(List(Optional(SHA256), len(OUTPUT_NAMES))), "seconds": Num(),
              "signal": Optional(NAME), "stderr": Str(),       # crashed / timed_out cases
              "record": RECORD})
MANIFEST = Obj(
    required={"xconv_version": NAME, "kit_version": NAME,
              "backend": Obj({"name": Str(nonempty=True, plain=True)},
                             {"version": NAME, "devices": List(NAME), "array_families": List(NAME),
                              "emulated": Bool(), "emulation": Str(),
                              "capabilities": Map(AnyOf(Bool(), NAME, Int(), List(AnyOf(NAME, Int()))))}),
              "libraries": Map(NAME), "device": NAME, "platform": Map(NAME), "created": NAME,
              "corpus": Obj({"hash": SHA256, "case_ids": List(NAME, MAX_CASES)},
                            {"full_hash": SHA256, "count": Int(0)}),
              "cases": List(CASE, MAX_CASES),
              "members": Obj({"outputs.npz": Obj({"sha256": SHA256, "size": Int(0)}, closed=True)}, closed=True)},
    optional={"command": List(Str()),
              "interrupted": Obj({"after": Int(0), "of": Int(0)})})     # a partial bundle: Ctrl-C after N of M


def parse_manifest(data: bytes) -> dict:
    """The manifest in ``data`` (UTF-8 JSON), checked against the schema; ManifestError otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not valid JSON: not UTF-8 ({exc})") from None
    _check_size(data)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:  # the depth check above should make this unreachable
        raise ManifestError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ManifestError:
        raise
    except ValueError as exc:  # JSONDecodeError, and int() refusing a number of thousands of digits
        raise ManifestError(f"not valid JSON: {exc}") from None
    check_manifest(value)
    return value


def _check_size(data: bytes) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and more than MAX_JSON_VALUES values, before parsing."""
    skeleton = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    opens = (skeleton == ord("[")) | (skeleton == ord("{"))
    closes = (skeleton == ord("]")) | (skeleton == ord("}"))
    n_opens, n_closes = int(np.count_nonzero(opens)), int(np.count_nonzero(closes))
    values = n_opens + int(np.count_nonzero(skeleton == ord(",")))
    if values > MAX_JSON_VALUES:
        raise ManifestError(f"holds about {values} JSON values (at most {MAX_JSON_VALUES} are read)")
    if n_closes > n_opens:
        raise ManifestError(f"not valid JSON: {n_closes} closing brackets for {n_opens} opening ones")
    brackets = np.flatnonzero(opens | closes)          # at most 2 * MAX_JSON_VALUES positions
    if brackets.size:
        depth = int(np.cumsum(np.where(opens[brackets], 1, -1).astype(np.int32)).max())
        if depth > MAX_JSON_DEPTH:
            raise ManifestError(f"nests {depth} levels deep (at most {MAX_JSON_DEPTH})")


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``): safe to print on a terminal."""
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ManifestError(f"ambiguous: key {_show(k)} appears twice in one object")
        out[k] = v
    return out


def _no_constant(name: str):
    raise ManifestError(f"not valid JSON: {name} is not a JSON number")


def check_manifest(m) -> None:
    """``m`` against the schema and the relations between fields; ManifestError naming what is wrong."""
    if not isinstance(m, dict):
        raise ManifestError(f"not a JSON object (it is {_kind(m)})")
    if m.get("format") != FORMAT:
        raise ManifestError(f"format is {_show(m.get('format'))}, not {FORMAT!r} (not an xconv conformance bundle)")
    if m.get("format_version") != FORMAT_VERSION or type(m.get("format_version")) is not int:
        raise ManifestError(f"format_version {_show(m.get('format_version'))} is not supported (this kit reads "
                            f"{FORMAT_VERSION})")
    MANIFEST.check(m, "")
    ids, keys = [], set()
    for n, rec in enumerate(m["cases"]):
        for name, entry in rec["outputs"].items():
            where = f"cases[{n}].outputs.{name}"
            if entry["dtype"] != rec["dtype"]:
                raise ManifestError(f"{where}.dtype: {entry['dtype']!r} differs from the case's {rec['dtype']!r}")
            if not entry["key"].endswith("." + name):
                raise ManifestError(f"{where}.key: {entry['key']!r} does not name {name}")
            if entry["key"] in keys:
                raise ManifestError(f"{where}.key: {entry['key']!r} is used twice")
            keys.add(entry["key"])
        ids.append(rec["id"])
    if len(set(ids)) != len(ids):
        raise ManifestError("cases: case ids repeat")
    if ids != m["corpus"]["case_ids"]:
        raise ManifestError("cases: the case records do not match corpus.case_ids")


def array_bytes(m: dict) -> int:
    """The bytes the manifest's arrays take (a valid manifest), from their dtypes and shapes."""
    total = 0
    for rec in m["cases"]:
        for entry in rec["outputs"].values():
            total += int(np.prod(entry["shape"], dtype=object)) * np.dtype(STORED_DTYPES[entry["dtype"]]).itemsize
    return total
