"""Which compiled parts of the NumPy backend run, on which build, and why any other is off (``xconv backends``)."""

from __future__ import annotations

from xconv import settings
from xconv.errors import ConfigError

from . import blas, cost, dense, depthwise, native, small


def describe() -> str:
    """One line: the build and the parts it runs, or why none runs (or which of its variables is bad)."""
    try:
        on = settings.current()
    except ConfigError:   # `xconv backends` lists every bad variable; here only this backend's own are named
        own = [n for n in settings.NAMES if n.startswith("XCONV_NUMPY_") and settings.problems(names=(n,))]
        bad = f"{' and '.join(own)} {'is' if len(own) == 1 else 'are'} bad" if own else "an XCONV_* variable is bad"
        return f"compiled loops: not known while {bad} (xconv backends lists the settings problems)"

    def why(switch, error):
        return f"{native.switch_variable(switch)}=0" if not getattr(on, switch) else (error or "not loaded")

    states = [("depthwise", depthwise.available(), lambda: why(depthwise.SWITCH, native.load_error())),
              ("dense C loops", dense.available(), lambda: why(dense.SWITCH, dense.build_error())),
              ("small calls", small.compiled_available(), lambda: why(small.SWITCH, native.load_error()))]
    parts = [name for name, on, _ in states if on]
    chosen = "XCONV_NUMPY_CPU" if on.numpy_cpu else "detected"
    model = f"{cost.cpu_kind()} rates ({chosen})" if small.compiled_available() else "off (no compiled loops)"
    return _loops(parts, states) + f"; BLAS: {blas.control()}; cost model: {model}"


def _loops(parts, states) -> str:
    if parts:
        off = "; ".join(f"{name} off: {reason()}" for name, on, reason in states if not on)
        build = native.isa(native.library())
        return f"compiled loops ({build} build): {', '.join(parts)}" + (f"; {off}" if off else "")
    why_none = dense.build_error() or native.load_error() or "disabled (XCONV_NUMPY_C=0, XCONV_NUMPY_DIRECT=0)"
    return f"compiled loops: none, NumPy paths only ({why_none})"
