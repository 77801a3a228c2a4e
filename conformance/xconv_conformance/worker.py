"""A worker process of the kit: ``python -m xconv_conformance.worker READ_FD WRITE_FD`` (started by :mod:`.isolation`).

Protocol (frames of :mod:`.channel` on the two inherited pipe descriptors, never stdin/stdout):
first ``{"backend", "role", "imports"}``, answered ``("ready", None)`` or ``("unregistered",
reason)``; then any number of ``("case", case, options)``, each answered ``("result", payload)``
or ``("error", text)``; ``("exit",)`` ends it. Role "judge": the payload is the case's
:class:`~.runner.Outcome` (judged here, against the oracle, with a :class:`~.runner.Watch` over
this worker's earlier results). Role "digest": the SHA-256 of each result of the case, or a
string "refused: …" / "error: …".

The role is also in ``$XCONV_CONFORMANCE_ROLE``. Faulthandler is on (a crash leaves its Python
stack in the worker's stderr) and core dumps are off.
"""

from __future__ import annotations

import faulthandler
import importlib
import sys
import traceback


def _no_core_dumps() -> None:
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass


def digest_case(case, backend: str):
    """[sha256 or None per output] of ``case`` on ``backend``, or "refused: …" / "error: …"."""
    from xconv import UnsupportedError

    from .families import family
    from .runner import _backend_arrays, _call, digest, inputs_of, resolve

    b = resolve(backend)
    fam = family(b.array_families[0] if b.array_families else "numpy")
    try:
        results = _call(case, backend, _backend_arrays(case, inputs_of(case), fam))
        return [digest(fam.to_numpy(r)) if r is not None else None for r in results]
    except UnsupportedError as exc:
        return f"refused: {exc}"
    except Exception as exc:  # noqa: BLE001
        return f"error: {type(exc).__name__}: {exc}"


def serve(channel) -> int:
    from .channel import ChannelClosed

    hello = channel.recv()
    for module in hello.get("imports", ()):
        importlib.import_module(module)
    import xconv

    name, role = hello["backend"], hello["role"]
    try:
        xconv.get_backend(name)
    except (xconv.BackendUnavailableError, xconv.UnknownBackendError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        channel.send(("unregistered", f"backend {name!r} is not registered in a fresh process ({reason})"))
        return 0
    from .runner import Watch, run_case

    watch = Watch()
    channel.send(("ready", None))
    while True:
        message = channel.recv()
        if message[0] == "exit":
            return 0
        _, case, options = message
        try:
            if role == "judge":
                reply = ("result", watch.after(run_case(case, name, **options)))
            else:
                reply = ("result", digest_case(case, name))
        except BaseException as exc:  # noqa: BLE001 - even SystemExit from a backend is that case's failure
            reply = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            channel.send(reply)
        except ChannelClosed:
            raise
        except Exception as exc:  # noqa: BLE001 - a result that cannot be pickled
            channel.send(("error", f"the result could not be sent back: {type(exc).__name__}: {exc}"))


def main(argv: list[str]) -> int:
    faulthandler.enable(all_threads=True)
    _no_core_dumps()
    from .channel import Channel, ChannelClosed

    channel = Channel(int(argv[0]), int(argv[1]))
    try:
        return serve(channel)
    except ChannelClosed:
        return 0          # the kit went away: nothing left to answer


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
