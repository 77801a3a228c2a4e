"""Output paths (``--out``, ``--report``) checked before any work, and written with one-line failures.

:func:`problem` says why a path cannot be written (its folder is missing, is not a folder or is
not writable; the path is a directory, or an existing file that is not writable), or None. The
front ends check every output path before the first case runs and exit 2 with one line naming
the path; :class:`WriteFailed` carries a failure that still happens when writing (the disk filled
up meanwhile) as one line too.
"""

from __future__ import annotations

import os


class WriteFailed(Exception):
    """An output could not be written; ``str()`` is the one line to print."""


def problem(path: str) -> str | None:
    """Why ``path`` cannot be written as an output file, or None when it can (nothing is created)."""
    if not path:
        return "is empty"
    if os.path.isdir(path):
        return "is a directory (name a file in it)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return f"its folder {parent} does not exist"
    if not os.path.isdir(parent):
        return f"its parent {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its folder {parent} is not writable"
    if os.path.exists(path) and not (os.path.isfile(path) and os.access(path, os.W_OK)):
        return "exists and cannot be overwritten"
    return None


def check(outputs: dict) -> str | None:
    """``outputs``: {option: path or None} -> the first problem as one line ("--out PATH: ..."), or None."""
    for option, path in outputs.items():
        if path is None:
            continue
        why = problem(path)
        if why:
            return f"{option} {path}: {why}"
    return None


def writing(option: str, path: str, write) -> None:
    """``write()``, turning an OSError into :class:`WriteFailed` naming ``option`` and ``path``."""
    try:
        write()
    except OSError as exc:
        raise WriteFailed(f"{option} {path}: not written: {exc.strerror or exc}") from None
