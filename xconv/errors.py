"""The exceptions xconv raises. All derive from :class:`XconvError`."""

from __future__ import annotations


class XconvError(Exception):
    """Base class of every error xconv raises on purpose."""


class ShapeError(XconvError, ValueError):
    """An invalid argument, or an invalid relation between shapes, dtypes or parameters.

    Raised by the core before any backend work. The message names the argument, the
    dimension (where there is one), the expected and the given value.
    """

    def __init__(self, argument: str, problem: str, *, expected=None, given=None, dim: str | None = None):
        self.argument = argument
        self.dim = dim
        self.expected = expected
        self.given = given
        where = f"{argument}" + (f" {dim}" if dim else "")
        text = f"{where}: {problem}"
        if expected is not None or given is not None:
            text += f" (expected {expected}, given {given})"
        super().__init__(text)


class ConfigError(XconvError, ValueError):
    """A bad setting: an ``XCONV_*`` environment variable or a command-line option whose text is not a value it
    takes. The message names ``what`` (the variable or option), the expected form and the given text; raised
    when the setting is read (:mod:`xconv.settings`), before any work."""

    def __init__(self, what: str, problem: str, *, expected, given):
        self.what = what
        self.expected = expected
        self.given = given
        super().__init__(f"{what}: {problem} (expected {expected}, given {given})")


class DTypeError(ShapeError, TypeError):
    """A dtype mistake: a tensor whose dtype is not a supported floating type, or differs from another's.

    A :class:`ShapeError` (same message form, same ``argument``) that is also a ``TypeError``.
    """


class ResourceError(XconvError, MemoryError):
    """A call whose outputs or scratch would not fit: ``needed`` bytes against a ``limit`` (see
    :mod:`xconv.limits`), or sizes beyond int64. Raised before anything is allocated."""

    def __init__(self, what: str, needed: int, limit: int | None, detail: str = ""):
        self.what = what
        self.needed = needed
        self.limit = limit
        text = f"{what} would need {needed:,} bytes ({_human(needed)})"
        if limit is not None:
            text += f", more than the memory limit of {limit:,} bytes ({_human(limit)})"
        if detail:
            text += f"; {detail}"
        super().__init__(text)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"


class UnsupportedError(XconvError):
    """A valid configuration that the chosen backend cannot run (it names the backend and the rule)."""


class BackendUnavailableError(XconvError):
    """The chosen backend cannot run on this machine; ``reason`` says why."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"backend {name!r} is unavailable: {reason}")


class UnknownBackendError(XconvError, KeyError):
    """No backend of that name is registered; ``registered`` lists the names that are (a ``KeyError`` too)."""

    def __init__(self, name: str, registered, broken=()):
        self.name = name
        self.registered = tuple(registered)
        text = f"no backend named {name!r} is registered (registered: {', '.join(self.registered) or 'none'})"
        if broken:
            text += f"; plugins that failed to load: {', '.join(broken)}"
        super().__init__(text)

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0])


class BackendError(XconvError):
    """A vendor library reported a failure: ``status`` code, its ``status_name`` and the vendor ``message``."""

    def __init__(self, backend: str, status: int, status_name: str, message: str = "", call: str = ""):
        self.backend = backend
        self.status = status
        self.status_name = status_name
        self.vendor_message = message
        self.call = call
        where = f" in {call}" if call else ""
        super().__init__(f"{backend}{where}: {status_name} ({status}): {message or 'no message'}")


class BackendFailedError(XconvError, RuntimeError):
    """A backend's primitive raised something that is not an XconvError (a bug, a third-party library's
    exception). Names the backend, the operation and the cause; the original is chained (``__cause__``)."""

    def __init__(self, backend: str, operation: str, cause: BaseException):
        self.backend = backend
        self.operation = operation
        self.cause = cause
        super().__init__(f"backend {backend!r} failed in {operation}: {type(cause).__module__}."
                         f"{type(cause).__qualname__}: {cause}")


class BackendOutOfMemoryError(BackendFailedError, MemoryError):
    """A backend ran out of memory (it raised MemoryError) in ``operation``."""
