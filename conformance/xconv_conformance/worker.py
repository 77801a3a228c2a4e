"""The fresh-process half of the determinism check: ``python -m xconv_conformance.worker``.

Reads ``{"backend": NAME, "cases": [ids], "imports": [modules]}`` as JSON on stdin, runs each
case on the backend in this new process and prints ``{id: [sha256 per output or null]}`` (or a
string saying why not) as JSON on stdout.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    request = json.loads(sys.stdin.read())
    for module in request.get("imports", []):
        importlib.import_module(module)
    import xconv
    from xconv import BackendUnavailableError, UnknownBackendError, UnsupportedError

    from . import cases as corpus
    from .families import family
    from .runner import _backend_arrays, _call, digest, inputs_of

    by_id = {c.id: c for c in corpus.load_corpus()}
    name = request["backend"]
    out: dict = {}
    try:
        b = xconv.get_backend(name)
    except (BackendUnavailableError, UnknownBackendError) as exc:
        text = f"unregistered: backend {name!r} is not registered in a fresh process ({getattr(exc, 'reason', exc)})"
        print(json.dumps({cid: text for cid in request["cases"]}))
        return 0
    fam = family(b.array_families[0] if b.array_families else "numpy")
    for cid in request["cases"]:
        case = by_id.get(cid)
        if case is None:
            out[cid] = f"error: unknown case {cid!r}"
            continue
        try:
            results = _call(case, name, _backend_arrays(case, inputs_of(case), fam))
            out[cid] = [digest(fam.to_numpy(r)) if r is not None else None for r in results]
        except UnsupportedError as exc:
            out[cid] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            out[cid] = f"error: {type(exc).__name__}: {exc}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
