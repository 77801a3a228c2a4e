"""The argument layout between the NumPy backend and its compiled loops (xconv_numpy.layout, csrc/layout.h): every
build reports the layout Python declares, a build that reports another one is refused by name, and the backend
then runs its NumPy paths."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xconv
from xconv_numpy import layout, native

ROOT = Path(__file__).resolve().parents[1]


def _builds():
    return [isa for isa in native.ISAS if native.library_path(isa) is not None]


class _Reported:
    """A library object reporting what a real build reports, except for the overrides given."""

    def __init__(self, lib, version=None, slots=None, jobs=None):
        self._lib, self._version, self._slots, self._jobs = lib, version, slots or {}, jobs

    def xconv_layout(self, which):
        if which == 0 and self._version is not None:
            return self._version
        if which in self._slots:
            return sum(int(s.split(":")[1]) for s in self._slots[which].split())
        return self._lib.xconv_layout(which)

    def xconv_layout_slots(self, which):
        return self._slots[which].encode() if which in self._slots else self._lib.xconv_layout_slots(which)

    def xconv_jobs_layout(self, which):
        return self._jobs[which] if self._jobs is not None else self._lib.xconv_jobs_layout(which)


@pytest.fixture(scope="module")
def lib():
    if not _builds():
        pytest.skip("the compiled loops are not built here")
    return native.load()


def test_every_build_reports_the_declared_layout():
    """Each build present (all instruction sets, not only the one this CPU picks) passes the check, and reports
    the version and, per vector, the length and slot list layout.py declares."""
    import ctypes

    if not _builds():
        pytest.skip("the compiled loops are not built here")
    for isa in _builds():
        lib = ctypes.CDLL(str(native.library_path(isa)))
        layout.check(lib)
        assert lib.xconv_layout(0) == layout.VERSION
        for v in layout.VECTORS:
            assert lib.xconv_layout(v.which) == v.length
            assert lib.xconv_layout_slots(v.which).decode() == v.text()
        assert lib.xconv_layout(99) == -1 and lib.xconv_layout_slots(99) is None


def test_the_declared_lengths_are_the_c_enums():
    """The lengths hand-checked against csrc/layout.h's enums (a test independent of the library's report)."""
    assert (layout.DEPTHWISE_GEO.length, layout.SMALL_COLS_GEO.length, layout.SMALL_S1_PLAN.length,
            layout.SMALL_S1_STRIDES.length) == (25, 25, 41, 5)
    assert layout.DEPTHWISE_GEO.index("dys") == 18 and layout.SMALL_COLS_GEO.index("xs") == 20
    assert layout.SMALL_S1_PLAN.index("off") == 41 and layout.SMALL_S1_PLAN.index("xcrop") == 38


def test_a_library_of_another_version_is_refused(lib):
    layout.check(_Reported(lib))                                        # the real report passes through
    with pytest.raises(layout.LayoutError, match=rf"version {layout.VERSION + 1}, expected {layout.VERSION}"):
        layout.check(_Reported(lib, version=layout.VERSION + 1))


def test_a_library_with_reordered_or_shorter_slots_is_refused(lib):
    """Same version, same length, two slots swapped: refused, naming the vector; a slot dropped likewise."""
    v = layout.SMALL_COLS_GEO
    names = v.text().split()
    names[0], names[1] = names[1], names[0]
    with pytest.raises(layout.LayoutError, match="small-call column geo is 25 values"):
        layout.check(_Reported(lib, slots={v.which: " ".join(names) + " "}))
    with pytest.raises(layout.LayoutError, match=r"depthwise geo is 24 values .* expected 25"):
        layout.check(_Reported(lib, slots={layout.DEPTHWISE_GEO.which: layout.DEPTHWISE_GEO.text()[5:]}))


def test_a_library_with_another_job_record_is_refused(lib):
    with pytest.raises(layout.LayoutError, match="job record is 16 values and its state 8, expected 24 and 8"):
        layout.check(_Reported(lib, jobs=(16, 8)))

    class NoJobs(_Reported):
        xconv_jobs_layout = None

    with pytest.raises(layout.LayoutError, match="no job lists"):
        layout.check(NoJobs(lib))


def test_a_library_without_a_layout_report_is_refused():
    with pytest.raises(layout.LayoutError, match="does not report its argument layout"):
        layout.check(object())


def test_pack_puts_values_in_slot_order_and_refuses_a_wrong_width():
    v = layout.SMALL_S1_STRIDES
    assert v.pack(w=5, h=4, d=3, c=2, n=1) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="'xs' takes 4 values, given 3"):
        layout.DEPTHWISE_GEO.pack(**{name: (0,) * w if w > 1 else 0 for name, w in layout.DEPTHWISE_GEO.slots
                                     if name != "xs"}, xs=(1, 2, 3))
    with pytest.raises(ValueError, match="no slot"):
        v.pack(n=1, c=2, d=3, h=4, w=5, q=6)


def test_the_vectors_python_builds_have_the_declared_lengths(lib):
    """What the drivers pass to C: the depthwise geometry, the small-call column geometry and stride-1 plan."""
    from xconv import ConvParams
    from xconv_numpy import depthwise, small_c

    p = xconv.api.params_for({"input": (2, 4, 9, 8), "weight": (4, 1, 3, 3)}, "float32", stride=2, padding=1,
                             groups=4)
    assert isinstance(p, ConvParams)
    geo = depthwise._plan(p).geo(True, True, True, (1, 2, 3, 4), (5, 6, 7, 8))
    assert len(geo) == layout.DEPTHWISE_GEO.length and list(geo[18:22]) == [5, 6, 7, 8]
    assert len(small_c._geo(p)) == layout.SMALL_COLS_GEO.length
    q = xconv.api.params_for({"input": (1, 3, 6, 5), "weight": (5, 3, 3, 2)}, "float64", padding=1)
    plan = small_c._s1_plan(q)
    assert len(plan.vector) == layout.SMALL_S1_PLAN.length + 2 * 6 and plan.vector[0] == 1 and plan.vector[6] == 6
    from xconv_numpy import bias

    dy = np.zeros((2, 3, 4, 5), np.float32)[:, :, ::2]
    geo = bias._geo(dy)
    assert len(geo) == layout.BIAS_GEO.length and list(geo) == [2, 3, 1, 2, 5, 60, 20, 0, 10, 1]


def test_a_refused_library_turns_the_compiled_paths_off_and_numpy_serves():
    """In a fresh process with layout.VERSION changed: every compiled part is off with the layout as reason,
    `xconv backends` says so, and the calls the C loops would take give the exact path's results."""
    if not _builds():
        pytest.skip("the compiled loops are not built here")
    script = (
        "import sys; sys.path[:0] = {paths!r}\n"
        "from xconv_numpy import layout\n"
        "layout.VERSION = 999\n"
        "import numpy as np, xconv\n"
        "from xconv_numpy import dense, depthwise, small\n"
        "assert not dense.available() and not depthwise.available() and not small.compiled_available()\n"
        "print(dense.build_error())\n"
        "print(xconv.get_backend('numpy').version())\n"
        "rng = np.random.default_rng(0)\n"
        "for xs, ws, kw in [((2, 16, 6, 6), (16, 16, 3, 3), dict(padding=1)),\n"
        "                   ((2, 4, 7, 7), (8, 1, 3, 3), dict(padding=1, groups=4, stride=2)),\n"
        "                   ((1, 3, 6, 5), (5, 3, 3, 2), dict(padding=1))]:\n"
        "    x, w = rng.standard_normal(xs), rng.standard_normal(ws)\n"
        "    dy = rng.standard_normal(xconv.output_shape(xs, ws, **kw))\n"
        "    got = xconv.convolution_backward(dy, x, w, backend='numpy', **kw)\n"
        "    want = xconv.convolution_backward(dy, x, w, backend='numpy-exact', **kw)\n"
        "    for g, e in zip(got, want):\n"
        "        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)\n"
        "print('fallback ok')\n"
    ).format(paths=[str(ROOT / "backends"), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    assert (f"LayoutError: the compiled library's argument layout is version {layout.VERSION}, expected 999"
            in out.stdout)
    assert "compiled loops: none, NumPy paths only (LayoutError" in out.stdout
    assert "fallback ok" in out.stdout
