"""Every ``XCONV_*`` environment variable xconv reads, read and validated in one place.

:func:`current` returns a :class:`Settings` snapshot of the environment as it is now; a variable
whose text is not a value it takes raises :class:`~xconv.errors.ConfigError` naming the variable,
the expected form and the given text (on every call while it stays bad). Unset and empty mean the
default. The variables:

====================================  ===============================  ==========================================
variable                              field (default)                  values
====================================  ===============================  ==========================================
``XCONV_BACKEND``                     ``backend`` (None: by family)    a backend name (checked at selection)
``XCONV_MEMORY_LIMIT``                ``memory_limit`` (None)          bytes (:mod:`xconv.units`); None: available memory
``XCONV_WORKSPACE_LIMIT``             ``workspace_limit`` (None)       bytes, or ``none``; None: no limit
``XCONV_NUMPY_C``                     ``numpy_c`` (True)               a switch (below): the dense C loops and small-call copies
``XCONV_NUMPY_DIRECT``                ``numpy_direct`` (True)          a switch: the depthwise C loops
``XCONV_NUMPY_ISA``                   ``numpy_isa`` (None: the best)   ``baseline``, ``avx2`` or ``avx512`` (any case): the highest build loaded
``XCONV_NUMPY_OPENMP``                ``numpy_openmp`` (True)          a switch: run loops on torch's OpenMP team
``XCONV_NUMPY_CPU``                   ``numpy_cpu`` (None: detected)   ``zen4``, ``avx2``, ``intel-avx512`` (any case): the cost model's rates
``XCONV_CUDNN_BENCHMARK``             ``cudnn_benchmark`` (False)      a switch: autotune cuDNN plans
``XCONV_CUDNN_PLAN_CACHE_SIZE``       ``cudnn_plan_cache_size`` (512)  a whole number >= 1
====================================  ===============================  ==========================================

A switch is ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case). Not here:
``XCONV_ASCEND_LIB_DIR`` and ``XCONV_ASCEND_DEVICE``, read by the Ascend driver from the environ
it is given (:mod:`xconv_ascend.discovery`, injectable for its tests), and ``XCONV_CONFORMANCE_ROLE``,
which the conformance kit sets for its own worker processes.

:func:`current` is cheap (it reads ``os.environ``'s own storage and keeps one snapshot per distinct
set of raw values), so callers ask it on every call rather than keeping a copy; :func:`key` is the
snapshot's hashable identity, part of every plan's key (:mod:`xconv.plan_cache`).
"""

from __future__ import annotations

import dataclasses
import os
import threading

from .errors import ConfigError
from .units import FORM as BYTES_FORM
from .units import parse_bytes, parse_limit

#: The variables :func:`current` reads, in the order of :func:`key`.
NAMES = ("XCONV_BACKEND", "XCONV_MEMORY_LIMIT", "XCONV_WORKSPACE_LIMIT", "XCONV_NUMPY_C", "XCONV_NUMPY_DIRECT",
         "XCONV_NUMPY_ISA", "XCONV_NUMPY_OPENMP", "XCONV_NUMPY_CPU", "XCONV_CUDNN_BENCHMARK",
         "XCONV_CUDNN_PLAN_CACHE_SIZE")
#: Read by the Ascend driver from the environ it is given (documented here, read there).
ASCEND_NAMES = ("XCONV_ASCEND_LIB_DIR", "XCONV_ASCEND_DEVICE")
#: The NumPy backend's builds, lowest first (``xconv_numpy.native.ISAS`` is the same tuple; a test checks).
NUMPY_ISAS = ("baseline", "avx2", "avx512")
#: The NumPy backend's cost-model rates, per kind of CPU they were measured on (``xconv_numpy.cost.RATES`` has the
#: same keys; a test checks).
NUMPY_CPUS = ("zen4", "avx2", "intel-avx512")
DEFAULT_CUDNN_PLAN_CACHE_SIZE = 512
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated values of the ``XCONV_*`` variables at one moment (see the module docstring)."""

    backend: str | None = None
    memory_limit: int | None = None
    workspace_limit: int | None = None
    numpy_c: bool = True
    numpy_direct: bool = True
    numpy_isa: str | None = None
    numpy_openmp: bool = True
    cudnn_benchmark: bool = False
    cudnn_plan_cache_size: int = DEFAULT_CUDNN_PLAN_CACHE_SIZE
    numpy_cpu: str | None = None


def _switch(name: str, text: str, default: bool) -> bool:
    t = text.strip().lower()
    if t == "":
        return default
    if t in _ON or t in _OFF:
        return t in _ON
    raise ConfigError(name, "is not a switch", expected="/".join(_ON) + " or " + "/".join(_OFF), given=repr(text))


def _choice(name: str, text: str, choices: tuple, what: str) -> str | None:
    """One of ``choices`` (any case, like the switches), None for empty; else ConfigError saying ``what`` it is not."""
    t = text.strip().lower()
    if t == "":
        return None
    if t not in choices:
        raise ConfigError(name, f"is not {what}", expected=" or ".join(choices), given=repr(text))
    return t


def _count(name: str, text: str, default: int) -> int:
    t = text.strip()
    if t == "":
        return default
    if not (t.isascii() and t.isdigit()) or int(t) < 1:
        raise ConfigError(name, "is not a whole number >= 1", expected="e.g. 512", given=repr(text))
    return int(t)


def _memory(name: str, text: str) -> int | None:
    return parse_bytes(text, name) if text.strip() else None


def from_environ(environ) -> Settings:
    """The settings ``environ`` (a mapping of str to str, such as ``os.environ``) holds; ConfigError if one is bad."""
    v = {name: environ.get(name) or "" for name in NAMES}
    return Settings(
        backend=v["XCONV_BACKEND"] or None,
        memory_limit=_memory("XCONV_MEMORY_LIMIT", v["XCONV_MEMORY_LIMIT"]),
        workspace_limit=parse_limit(v["XCONV_WORKSPACE_LIMIT"], "XCONV_WORKSPACE_LIMIT"),
        numpy_c=_switch("XCONV_NUMPY_C", v["XCONV_NUMPY_C"], True),
        numpy_direct=_switch("XCONV_NUMPY_DIRECT", v["XCONV_NUMPY_DIRECT"], True),
        numpy_isa=_choice("XCONV_NUMPY_ISA", v["XCONV_NUMPY_ISA"], NUMPY_ISAS,
                          "a build of the NumPy backend's compiled loops"),
        numpy_openmp=_switch("XCONV_NUMPY_OPENMP", v["XCONV_NUMPY_OPENMP"], True),
        numpy_cpu=_choice("XCONV_NUMPY_CPU", v["XCONV_NUMPY_CPU"], NUMPY_CPUS,
                          "a kind of CPU the NumPy backend's cost model has rates for"),
        cudnn_benchmark=_switch("XCONV_CUDNN_BENCHMARK", v["XCONV_CUDNN_BENCHMARK"], False),
        cudnn_plan_cache_size=_count("XCONV_CUDNN_PLAN_CACHE_SIZE", v["XCONV_CUDNN_PLAN_CACHE_SIZE"],
                                     DEFAULT_CUDNN_PLAN_CACHE_SIZE),
    )


# os.environ keeps its contents in ``_data`` (on POSIX: bytes keys and values); reading it there costs a tenth
# of os.environ.get, which decodes each value. Anything else (another platform, os.environ replaced) reads
# through the mapping.
_BYTE_NAMES = tuple(os.fsencode(n) for n in NAMES) if os.name == "posix" else None
_FIELD_BYTES = {n[len("XCONV_"):].lower(): os.fsencode(n) for n in NAMES} if os.name == "posix" else None
_snapshots: dict = {}                 # raw values -> Settings
_lock = threading.Lock()
_MAX_SNAPSHOTS = 64


def _raw() -> tuple:
    env = os.environ
    data = getattr(env, "_data", None)
    if _BYTE_NAMES is not None and type(data) is dict:
        return tuple(map(data.get, _BYTE_NAMES))
    return tuple(map(env.get, NAMES))


def _snapshot(raw: tuple) -> Settings:
    s = _snapshots.get(raw)
    if s is None:
        text = tuple(None if r is None else (os.fsdecode(r) if isinstance(r, bytes) else r) for r in raw)
        s = from_environ(dict(zip(NAMES, text)))            # raises ConfigError: nothing is kept
        with _lock:
            if len(_snapshots) >= _MAX_SNAPSHOTS:
                _snapshots.clear()
            _snapshots[raw] = s
    return s


def current() -> Settings:
    """The settings of the environment now (validated; ConfigError naming the first bad variable)."""
    return _snapshot(_raw())


_one_seen: dict = {}                  # field -> (its variable's raw value last read, the field's value for it)


def one(field: str):
    """``current().<field>`` (a :class:`Settings` field: ``numpy_openmp`` is ``$XCONV_NUMPY_OPENMP``'s), reading that
    one variable: for the hot paths inside a call, whose settings were validated where it entered xconv. Reading all
    of them costs a few µs a call inside a model, caches cold. ConfigError naming the variable for a bad value."""
    data = getattr(os.environ, "_data", None)
    if _BYTE_NAMES is None or type(data) is not dict:
        return getattr(current(), field)
    raw = data.get(_FIELD_BYTES[field])
    seen = _one_seen.get(field)
    if seen is None or raw is not seen[0]:
        seen = _one_seen[field] = (raw, getattr(read(["XCONV_" + field.upper()]), field))
    return seen[1]


def problems(environ=None, names=NAMES) -> list[str]:
    """The message of every bad variable of ``names`` (default: all) in ``environ`` (default: ``os.environ``), []
    when all are good: for a report that lists them all (``xconv backends``) where :func:`current` stops at the
    first, or for a plugin that reports only its own variables."""
    environ = os.environ if environ is None else environ
    found = []
    for name in names:
        try:
            from_environ({name: environ.get(name)})
        except ConfigError as exc:
            found.append(str(exc))
    return found


def read(names, environ=None) -> Settings:
    """The settings with only the variables ``names`` read from ``environ`` (default: ``os.environ``), the others at
    their defaults: for a plugin that reads its own variables, at use, and must not fail for another's bad value
    (ConfigError naming one of ``names`` if one of them is bad)."""
    environ = os.environ if environ is None else environ
    return from_environ({name: environ.get(name) for name in names})


def key() -> tuple:
    """A hashable identity of :func:`current`'s snapshot (the variables' raw values), validated first: two
    environments with the same key have the same settings."""
    raw = _raw()
    if raw not in _snapshots:
        _snapshot(raw)
    return raw


__all__ = ["ASCEND_NAMES", "BYTES_FORM", "NAMES", "NUMPY_CPUS", "NUMPY_ISAS", "Settings", "current", "from_environ",
           "key", "problems", "read"]
