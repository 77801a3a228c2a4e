"""The XCONV_* settings (xconv.settings) and the one byte-count parser (xconv.units).

Truth: the documented unit table (every unit a power of 1024), hand-computed byte counts, and what a call
does after the environment changes (the plan cache must key on the settings snapshot).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import xconv
from xconv import plan_cache, settings, units
from xconv.errors import ConfigError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("text, expected", [
    (4194304, 4194304), ("4194304", 4194304), ("0", 0), (" 7 ", 7), ("12B", 12),
    ("4k", 4 * KiB), ("4K", 4 * KiB), ("4KB", 4 * KiB), ("4KiB", 4 * KiB), ("4kib", 4 * KiB),
    ("4M", 4 * MiB), ("4MB", 4 * MiB), ("4MiB", 4 * MiB), ("1G", GiB), ("1 GB", GiB), ("1.5GiB", 3 * GiB // 2),
    ("1T", TiB), ("0.5k", 512), (".25M", MiB // 4), (str((1 << 63) - 1), (1 << 63) - 1)])
def test_parse_bytes_binary_units(text, expected):
    assert units.parse_bytes(text, "X") == expected


@pytest.mark.parametrize("text, problem", [
    ("-1", "not a byte count"), (-1, "from 0 to"), ("+4", "not a byte count"), ("nan", "not a byte count"),
    ("inf", "not a byte count"), ("1e9", "not a byte count"), ("1X", "not a byte count"), ("4 MiBs", "not a byte count"),
    ("", "not a byte count"), ("lots", "not a byte count"), ("1.5", "whole number"), ("0.3k", "whole number"),
    ("8192P", "not a byte count"), ("8388608T", "larger than"), (str(1 << 63), "larger than"), ("9" * 5000, "larger than"),
    (1 << 63, "from 0 to"), (True, "must be a byte count"), (1.0, "must be a byte count"), (None, "must be a byte count")])
def test_parse_bytes_refusals_name_what_expected_and_given(text, problem):
    with pytest.raises(ConfigError) as info:
        units.parse_bytes(text, "--some-option")
    message = str(info.value)
    assert message.startswith("--some-option: ") and problem in message
    assert "expected bytes such as 4194304" in message and "given " in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, xconv.XconvError)


def test_parse_limit_none_means_no_limit():
    assert [units.parse_limit(t, "X") for t in (None, "", " none ", "NONE", "2k")] == [None, None, None, None, 2048]


def test_defaults_without_any_variable():
    assert settings.from_environ({}) == settings.Settings(
        backend=None, memory_limit=None, workspace_limit=None, numpy_c=True, numpy_direct=True, numpy_isa=None,
        numpy_openmp=True, cudnn_benchmark=False, cudnn_plan_cache_size=512, numpy_cpu=None)


def test_every_variable_read():
    env = {"XCONV_BACKEND": "numpy-exact", "XCONV_MEMORY_LIMIT": "8G", "XCONV_WORKSPACE_LIMIT": "4MiB",
           "XCONV_NUMPY_C": "0", "XCONV_NUMPY_DIRECT": "off", "XCONV_NUMPY_ISA": "avx2", "XCONV_NUMPY_OPENMP": "False",
           "XCONV_NUMPY_CPU": " Intel-AVX512", "XCONV_CUDNN_BENCHMARK": " yes ", "XCONV_CUDNN_PLAN_CACHE_SIZE": "7"}
    assert settings.from_environ(env) == settings.Settings("numpy-exact", 8 * GiB, 4 * MiB, False, False, "avx2",
                                                           False, True, 7, "intel-avx512")
    assert set(env) == set(settings.NAMES)
    assert settings.from_environ({"XCONV_WORKSPACE_LIMIT": "none", "XCONV_NUMPY_C": "1"}).numpy_c is True


@pytest.mark.parametrize("name, bad, expected", [
    ("XCONV_NUMPY_ISA", "bogus", "baseline or avx2 or avx512"), ("XCONV_NUMPY_ISA", "avx-2", "baseline or avx2"),
    ("XCONV_NUMPY_CPU", "zen5", "zen4 or avx2 or intel-avx512"),
    ("XCONV_NUMPY_OPENMP", "maybe", "1/true/yes/on or 0/false/no/off"), ("XCONV_NUMPY_C", "2", "1/true"),
    ("XCONV_NUMPY_DIRECT", "disabled", "1/true"), ("XCONV_CUDNN_BENCHMARK", "maybe", "1/true"),
    ("XCONV_CUDNN_PLAN_CACHE_SIZE", "0", "e.g. 512"), ("XCONV_MEMORY_LIMIT", "lots", "bytes such as"),
    ("XCONV_WORKSPACE_LIMIT", "-1k", "bytes such as")])
def test_a_bad_value_names_the_variable_expected_and_given(name, bad, expected):
    with pytest.raises(ConfigError) as info:
        settings.from_environ({name: bad})
    assert str(info.value).startswith(f"{name}: ") and expected in str(info.value)
    assert f"given {bad!r}" in str(info.value)


def test_problems_lists_every_bad_variable():
    assert settings.problems({}) == []
    found = settings.problems({"XCONV_NUMPY_ISA": "bogus", "XCONV_NUMPY_OPENMP": "maybe", "XCONV_NUMPY_C": "1"})
    assert [m.split(":")[0] for m in found] == ["XCONV_NUMPY_ISA", "XCONV_NUMPY_OPENMP"]
    assert "given 'bogus'" in found[0] and "given 'maybe'" in found[1]


def test_isas_match_the_numpy_backend():
    native = pytest.importorskip("xconv_numpy.native")
    assert settings.NUMPY_ISAS == native.ISAS


def test_cpu_kinds_match_the_numpy_cost_model():
    cost = pytest.importorskip("xconv_numpy.cost")
    assert settings.NUMPY_CPUS == tuple(cost.RATES)


def test_current_follows_the_environment_and_keeps_one_snapshot_per_value(monkeypatch):
    for name in settings.NAMES:
        monkeypatch.delenv(name, raising=False)
    first = settings.current()
    assert first == settings.Settings() and settings.current() is first and hash(settings.key())
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "1k")
    assert settings.current().workspace_limit == 1024 and settings.key() != ()
    monkeypatch.setenv("XCONV_NUMPY_ISA", "bogus")
    for read in (settings.current, settings.key):
        with pytest.raises(ConfigError, match="XCONV_NUMPY_ISA"):
            read()
    monkeypatch.delenv("XCONV_NUMPY_ISA")
    monkeypatch.delenv("XCONV_WORKSPACE_LIMIT")
    assert settings.current() is first


def test_a_bad_variable_is_refused_by_the_first_call(monkeypatch):
    x, w = np.ones((1, 2, 6, 6)), np.ones((3, 2, 3, 3))
    xconv.conv_fprop(x, w)
    monkeypatch.setenv("XCONV_NUMPY_ISA", "bogus")
    for call in (lambda: xconv.conv_fprop(x, w), lambda: xconv.conv_fprop(x, w, padding=np.array([1, 1]))):
        with pytest.raises(ConfigError, match=r"XCONV_NUMPY_ISA: .*expected baseline or avx2 or avx512, given 'bogus'"):
            call()                                  # a cached configuration and an uncacheable one alike


WS_X = np.ones((2, 64, 30, 30), np.float32)
WS_W = np.ones((64, 64, 3, 3), np.float32)


def test_workspace_limit_set_after_a_cached_call_refuses_it(monkeypatch):
    monkeypatch.delenv("XCONV_WORKSPACE_LIMIT", raising=False)
    plan_cache.clear()
    for _ in range(2):
        xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact")      # runs, and is cached
    assert plan_cache.size() >= 1
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "1k")
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit=1024"):
        xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact")


def test_workspace_limit_unset_after_a_refused_call_runs_it(monkeypatch):
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "1k")
    plan_cache.clear()
    for _ in range(2):                                                   # refused (never cached) ...
        with pytest.raises(xconv.UnsupportedError, match="workspace_limit=1024"):
            xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact")
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "64M")
    y = xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact")   # a plan under this limit
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "1k")
    with pytest.raises(xconv.UnsupportedError, match="workspace_limit=1024"):   # a plan not reused under another
        xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact")
    monkeypatch.delenv("XCONV_WORKSPACE_LIMIT")                          # ... and runs once it is unset
    np.testing.assert_array_equal(xconv.conv_fprop(WS_X, WS_W, padding=1, backend="numpy-exact"), y)


def test_read_takes_only_the_named_variables():
    env = {"XCONV_WORKSPACE_LIMIT": "lots", "XCONV_CUDNN_PLAN_CACHE_SIZE": "7"}
    assert settings.read(("XCONV_CUDNN_PLAN_CACHE_SIZE",), env).cudnn_plan_cache_size == 7
    with pytest.raises(ConfigError, match="XCONV_CUDNN_PLAN_CACHE_SIZE"):
        settings.read(("XCONV_CUDNN_PLAN_CACHE_SIZE",), {"XCONV_CUDNN_PLAN_CACHE_SIZE": "0"})
    assert settings.problems(env, names=("XCONV_NUMPY_ISA",)) == []


def test_cudnn_plugin_reads_its_own_variables_at_use_only(monkeypatch):
    """A bad unrelated variable must not break the cudnn plugin's hook (it once built a PlanCache that read
    every setting); its own variables are read when the cache is first used, and only they are reported."""
    from xconv_cudnn import cache
    monkeypatch.setenv("XCONV_WORKSPACE_LIMIT", "lots")
    monkeypatch.setenv("XCONV_CUDNN_PLAN_CACHE_SIZE", "0")
    c = cache.PlanCache()                                         # no setting read yet
    monkeypatch.setenv("XCONV_CUDNN_PLAN_CACHE_SIZE", "3")
    assert c.maxsize == 3 and cache.benchmark_enabled() is False  # XCONV_WORKSPACE_LIMIT is not its business
    monkeypatch.setenv("XCONV_CUDNN_BENCHMARK", "maybe")
    with pytest.raises(ConfigError, match="^XCONV_CUDNN_BENCHMARK"):
        cache.benchmark_enabled()


@pytest.mark.parametrize("text", ["AVX2", "Avx512", " BASELINE "])
def test_numpy_isa_takes_any_case_like_the_switches(text):
    assert settings.from_environ({"XCONV_NUMPY_ISA": text}).numpy_isa == text.strip().lower()


def test_one_reads_a_single_variable_and_follows_it(monkeypatch):
    """settings.one(field) is current().<field> from that variable alone: it follows the variable's changes and names
    it when bad, while another variable's bad value is left to the calls that validate them all."""
    monkeypatch.delenv("XCONV_NUMPY_OPENMP", raising=False)
    assert settings.one("numpy_openmp") is True
    monkeypatch.setenv("XCONV_NUMPY_OPENMP", "off")
    assert settings.one("numpy_openmp") is False
    monkeypatch.setenv("XCONV_NUMPY_OPENMP", "maybe")
    with pytest.raises(ConfigError, match="XCONV_NUMPY_OPENMP"):
        settings.one("numpy_openmp")
    monkeypatch.setenv("XCONV_NUMPY_OPENMP", "1")
    monkeypatch.setenv("XCONV_NUMPY_ISA", "bogus")
    assert settings.one("numpy_openmp") is True
    with pytest.raises(ConfigError, match="XCONV_NUMPY_ISA"):
        settings.current()


def test_a_bad_variable_never_leaves_the_compiled_loops_unloaded():
    """Before the compiled library is loaded, the compiled parts' switch (native.part_on) validates every variable:
    a bad XCONV_NUMPY_ISA at a helper's first call raises, and does not become the library's lasting load failure
    (a fresh process: the library loads once per process)."""
    from xconv_numpy import native
    if native.library() is None:
        pytest.skip(f"the compiled loops are not built here: {native.load_error()}")
    code = ("import os; from xconv import ConfigError; from xconv_numpy import dense, native\n"
            "os.environ['XCONV_NUMPY_ISA'] = 'bogus'\n"
            "try:\n    dense.available(); print('no error')\nexcept ConfigError as e:\n    print('ConfigError')\n"
            "del os.environ['XCONV_NUMPY_ISA']\n"
            "print(dense.available(), native.load_error())\n")
    env = {k: v for k, v in os.environ.items() if k != "XCONV_NUMPY_ISA"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ConfigError", "True", "None"], out.stdout
