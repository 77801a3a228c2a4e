"""The backend registry: plugins found through entry points, and backend selection.

Backends come from modules named in the entry-point group ``xconv.backends`` (see
:mod:`xconv.hookspec`) and from :func:`register_backend`. A plugin that fails to import is
listed as an unavailable backend carrying the import error, never breaking xconv itself.
"""

from __future__ import annotations

import importlib.metadata
import threading

import pluggy

from . import hookspec, settings
from .backend import Backend, BackendInfo, availability_of
from .errors import BackendUnavailableError, ShapeError, UnknownBackendError

_lock = threading.RLock()
_backends: dict[str, Backend] | None = None
_broken: dict[str, str] = {}  # entry-point name -> why its plugin could not be loaded
_generation = 0  # bumped whenever the set of backends changes (keys of xconv.plan_cache)


def generation() -> int:
    """A number that changes whenever a backend is registered or unregistered."""
    return _generation


def _changed() -> None:
    global _generation
    _generation += 1


def plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with xconv's hookspec and every installed ``xconv.backends`` plugin registered."""
    pm = pluggy.PluginManager(hookspec.PROJECT)
    pm.add_hookspecs(hookspec)
    for ep in importlib.metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not break xconv
            _broken[ep.name] = f"plugin {ep.value!r} failed to load: {type(exc).__name__}: {exc}"
    return pm


def _registry() -> dict[str, Backend]:
    global _backends
    with _lock:
        if _backends is None:
            found: dict[str, Backend] = {}
            for result in plugin_manager().hook.xconv_backends():
                for backend in result or ():
                    found.setdefault(backend.name, backend)
            _backends = found
            _changed()
        return _backends


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Add a backend object at run time (tests, embedding). Its name must be new unless ``replace``."""
    with _lock:
        registry = _registry()
        if backend.name in registry and not replace:
            raise ValueError(f"a backend named {backend.name!r} is already registered")
        registry[backend.name] = backend
        _changed()


def unregister_backend(name: str) -> None:
    with _lock:
        _registry().pop(name, None)
        _changed()


def list_backends() -> list[BackendInfo]:
    """One record per registered backend (and per plugin that failed to load), sorted by name."""
    rows = [b.info() for b in _registry().values()]
    rows += [BackendInfo(name, False, reason, "", (), ()) for name, reason in _broken.items()
             if name not in _registry()]
    return sorted(rows, key=lambda r: r.name)


def get_backend(name: str) -> Backend:
    """The registered backend object called ``name``, available on this machine or not.

    An unavailable backend is returned without complaint (its ``info()`` and ``availability()``
    say why); the first convolution call on it raises :class:`BackendUnavailableError` with that
    reason. Raises :class:`BackendUnavailableError` when the plugin registering ``name`` failed to
    load, and :class:`UnknownBackendError` (a ``KeyError``) listing the registered names when no
    backend of that name exists.
    """
    registry = _registry()
    if name in registry:
        return registry[name]
    if name in _broken:
        raise BackendUnavailableError(name, _broken[name])
    raise UnknownBackendError(name, sorted(registry), sorted(_broken))


def select_backend(backend, family: str) -> Backend:
    """The backend a call runs on: ``backend=`` (a name or object), else ``$XCONV_BACKEND``, else by array family.

    Raises BackendUnavailableError when the choice cannot run here, UnknownBackendError when no
    backend has that name, ShapeError when it does not take arrays of ``family``.
    """
    if backend is None:
        backend = settings.current().backend
    if backend is None:
        return _by_family(family)
    if not isinstance(backend, str) and not all(hasattr(backend, a) for a in ("name", "capabilities",
                                                                                  "array_families")):
        raise ShapeError("backend", "must be a backend name or a backend object",
                         expected="a str such as 'numpy', or an object with name, capabilities, array_families",
                         given=f"{type(backend).__name__} {backend!r}")
    chosen = get_backend(backend) if isinstance(backend, str) else backend
    available, reason = availability_of(chosen)
    if not available:
        raise BackendUnavailableError(chosen.name, reason)
    if family not in chosen.array_families:
        raise ShapeError("backend", f"{chosen.name!r} does not take {family} arrays",
                         expected=" or ".join(chosen.array_families) or "(none declared)", given=family)
    return chosen


def _by_family(family: str) -> Backend:
    candidates = sorted((b for b in _registry().values() if family in b.array_families),
                        key=lambda b: -b.priority)
    reasons = []
    for b in candidates:
        available, reason = availability_of(b)
        if available:
            return b
        reasons.append(f"{b.name}: {reason}")
    detail = "; ".join(reasons) if reasons else "no registered backend takes them"
    raise BackendUnavailableError("auto", f"no available backend for {family} arrays ({detail})")
