"""The backend registry: plugins found through entry points, and backend selection.

Backends come from modules named in the entry-point group ``xconv.backends`` (see
:mod:`xconv.hookspec`) and from :func:`register_backend`. The same rules hold for xconv's own
plugins and outside ones (docs/backends.md, "The contract, enforced"):

- a plugin that fails to import, or whose hook raises, is listed as an unavailable backend carrying
  the error, never breaking xconv itself;
- a backend object missing a member of :data:`xconv.backend.REQUIRED` is refused and listed with
  "missing fprop" and so on; one missing members of :data:`xconv.backend.DEFAULTS` gets those
  defaults, and its row in :func:`list_backends` says which;
- a name claimed twice goes to one claim, the others are refused and listed as ``NAME@DISTRIBUTION``
  naming both distributions. The claim that wins: the plugin whose entry-point name is the backend's
  name or its prefix (entry point ``numpy`` owns ``numpy`` and ``numpy-exact``), else the first in
  the order of distribution name, then entry-point name (two entry points of one name both load;
  their backends' names are settled the same way).
"""

from __future__ import annotations

import importlib.metadata
import threading

import pluggy

from . import hookspec, settings
from .backend import (Backend, BackendInfo, availability_of, complete, contract_problems, info_of)
from .errors import BackendUnavailableError, ShapeError, UnknownBackendError

_lock = threading.RLock()
_backends: dict[str, Backend] | None = None
_broken: dict[str, str] = {}  # entry-point name -> why its plugin could not be loaded
_refused: list[BackendInfo] = []  # backends a plugin offered that broke the contract or reused a name
_origins: dict[str, tuple[str, str]] = {}  # plugin name -> (entry-point name, distribution name)
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
    points = [(ep.dist.name if getattr(ep, "dist", None) is not None else "?", ep)
              for ep in importlib.metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP)]
    for dist, ep in sorted(points, key=lambda de: (de[0], de[1].name)):     # never the order of sys.path
        name = ep.name if pm.get_plugin(ep.name) is None else f"{ep.name}@{dist}"  # two with one name: both load
        _origins[name] = (ep.name, dist)
        try:
            pm.register(ep.load(), name=name)
        except Exception as exc:  # a broken third-party plugin must not break xconv
            _broken[name] = f"plugin {ep.value!r} failed to load: {type(exc).__name__}: {exc}"
    return pm


def _claims(pm: pluggy.PluginManager) -> list[tuple]:
    """(backend object, entry-point name, distribution) of every backend the plugins offer, winners first."""
    claims = []
    for impl in pm.hook.xconv_backends.get_hookimpls():
        plugin = impl.plugin_name
        try:
            offered = list(impl.function() or ())
        except Exception as exc:  # a plugin's hook must not break xconv either
            _broken[plugin] = f"plugin {plugin!r}: xconv_backends() raised {type(exc).__name__}: {exc}"
            continue
        entry_point, dist = _origins.get(plugin, (plugin, "?"))
        claims += [(backend, entry_point, dist) for backend in offered]

    def order(claim):
        name, plugin, dist = getattr(claim[0], "name", None), claim[1], claim[2]
        owner = isinstance(name, str) and (name == plugin or name.startswith(plugin + "-"))
        return (not owner, dist, plugin)
    return sorted(claims, key=order)


def _registry() -> dict[str, Backend]:
    global _backends
    with _lock:
        if _backends is None:
            found: dict[str, Backend] = {}
            origin: dict[str, str] = {}
            for backend, plugin, dist in _claims(plugin_manager()):
                problems = contract_problems(backend)
                where = f"plugin {plugin!r} of distribution {dist}"
                if problems:
                    name = getattr(backend, "name", None)
                    label = name if isinstance(name, str) and name else f"{plugin}:{type(backend).__name__}"
                    _refused.append(BackendInfo(f"{label}@{dist}", False,
                                                f"refused: {'; '.join(problems)} ({where})", "", (), ()))
                elif backend.name in found:
                    _refused.append(BackendInfo(f"{backend.name}@{dist}", False,
                                                f"refused: the name {backend.name!r} is already claimed by "
                                                f"{origin[backend.name]}; this claim is from {where}", "", (),
                                                tuple(backend.array_families)))
                else:
                    found[backend.name] = complete(backend)
                    origin[backend.name] = where
            _backends = found
            _changed()
        return _backends


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Add a backend object at run time (tests, embedding). Its name must be new unless ``replace``; it must meet
    the contract (:func:`xconv.backend.contract_problems`, a ShapeError naming what is missing otherwise)."""
    problems = contract_problems(backend)
    if problems:
        raise ShapeError("backend", f"does not meet the backend contract: {'; '.join(problems)}",
                         expected="the members of xconv.Backend (docs/backends.md)", given=repr(backend))
    with _lock:
        registry = _registry()
        if backend.name in registry and not replace:
            raise ValueError(f"a backend named {backend.name!r} is already registered")
        registry[backend.name] = complete(backend)
        _changed()


def unregister_backend(name: str) -> None:
    with _lock:
        _registry().pop(name, None)
        _changed()


def list_backends() -> list[BackendInfo]:
    """One record per registered backend, per plugin that failed to load and per backend refused (a
    contract broken, a name claimed twice), sorted by name. Never raises for a plugin's sake."""
    rows = [info_of(b) for b in _registry().values()]
    rows += [BackendInfo(name, False, reason, "", (), ()) for name, reason in _broken.items()
             if name not in _registry()]
    rows += _refused
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
    if not isinstance(backend, str):
        problems = contract_problems(backend)
        if problems:
            raise ShapeError("backend", f"must be a backend name or a backend object ({'; '.join(problems)})",
                             expected="a str such as 'numpy', or an object with the members of xconv.Backend",
                             given=f"{type(backend).__name__} {backend!r}")
    chosen = get_backend(backend) if isinstance(backend, str) else complete(backend)
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
