"""What the kit shows on stderr before and while cases run: preparation phases, the warm-up, the progress bar."""

from __future__ import annotations

import sys
import time

import xconv

from .runner import resolve


def phase(text: str, stream=None):
    """Report one preparation phase as one line on stderr, terminal or not: "text ... 1.2 s" (a context manager)."""
    return _Phase(text, stream)


class _Phase:
    def __init__(self, text: str, stream=None):
        self.text, self.stream = text, stream

    def __enter__(self):
        self.stream = self.stream or sys.stderr
        self.start = time.perf_counter()
        self.stream.write(f"xconv conformance: {self.text} ... ")
        self.stream.flush()
        return self

    def __exit__(self, kind, exc, tb):
        took = time.perf_counter() - self.start
        self.stream.write(f"{'failed' if kind else 'done'} ({took:.1f} s)\n")
        self.stream.flush()
        return False


# small convolutions that make a backend build or load what its first real call would (JIT, C loops,
# vendor plans): a dense one with 32 channels, a depthwise one, a strided 1-D one
_WARM_UP = (((1, 32, 6, 6), (32, 32, 3, 3), dict(padding=1)),
            ((1, 16, 6, 6), (16, 1, 3, 3), dict(padding=1, groups=16)),
            ((2, 4, 9), (8, 4, 3), dict(stride=2)))


def prepare(name: str, quiet: bool = False, isolate: bool = True) -> None:
    """Run the warm-up convolutions on backend ``name`` in this process (errors ignored: the cases report
    them). Not when the cases run in worker processes: a backend that crashes must not take this
    process down before its first case, and the workers load their own kernels (one line says so)."""
    import numpy as np

    if isolate:
        if not quiet:
            print(f"xconv conformance: backend {name} runs in worker processes (the first case starts one)",
                  file=sys.stderr, flush=True)
        return

    from .families import family
    try:
        b = resolve(name)
        fam = family(b.array_families[0] if b.array_families else "numpy")
    except Exception:  # noqa: BLE001
        return
    with phase(f"preparing backend {name} (first calls build or load its kernels)") if not quiet else _nothing():
        for xs, ws, kw in _WARM_UP:
            try:
                x, w = (fam.from_numpy(np.ones(s, np.float32)) for s in (xs, ws))
                dy = fam.from_numpy(np.ones(xconv.output_shape(xs, ws, **kw), np.float32))
                xconv.convolution_backward(dy, x, w, backend=name, **kw)
            except Exception:  # noqa: BLE001
                continue


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, unless forced)."""

    def __init__(self, total: int, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.done, self.start = max(total, 1), 0, time.perf_counter()
        self.failed = 0

    def step(self, label: str, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        text = (f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.1f}s {'failed ' + str(self.failed) + ' ' if self.failed else ''}{label[:60]}")
        self.stream.write(text.ljust(120)[:120])
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
