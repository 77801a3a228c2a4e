"""The pytest front end: ``pytest conformance --xconv-backend NAME`` (repeatable).

One test per case x backend, with ids ``<case id>@<backend>``. Default backends: every
registered backend except the oracle "numpy-exact" (a backend that is registered but cannot
run here is reported unavailable, with its reason). Each backend runs in a worker process
(:mod:`.isolation`): a case that crashes it or runs past the case timeout fails as "crashed: SIGNAL"
or "timed out" and the session goes on. Outcomes map to pytest as: passed -> passed; failed,
crashed, timed out -> failed; refused (UnsupportedError) -> skipped "refused: ..."; unavailable ->
skipped "unavailable: ...". The terminal summary prints the kit's table: passed, failed, refused
and unavailable per backend, and the worst error/bound.

Options: ``--xconv-backend NAME`` (repeatable), ``--xconv-cases PATTERN`` (repeatable; glob or
substring of case ids), ``--xconv-import MODULE`` (repeatable; import a module that registers
backends at run time), ``--xconv-case-timeout SECONDS`` (default 300), ``--xconv-no-isolate``
(run the backends in the pytest process).
"""

from __future__ import annotations

import importlib
import time
from collections import defaultdict

import pytest

import xconv

from .cases import load_corpus, select
from .isolation import DEFAULT_CASE_TIMEOUT, CaseRunner, FreshDigests
from .runner import FAILING, ORACLE, apply_fresh_process

__all__ = ["pytest_addoption", "pytest_configure", "pytest_generate_tests", "pytest_terminal_summary", "pytest_unconfigure",
           "conformance_check"]

_STATE = pytest.StashKey[dict]()


def _add(group, name: str, **kwargs) -> None:
    try:
        group.addoption(name, **kwargs)
    except ValueError:  # already added (the plugin loaded twice): keep the first definition
        pass


def pytest_addoption(parser):
    group = parser.getgroup("xconv-conformance", "xconv conformance kit")
    _add(group, "--xconv-backend", action="append", default=None, metavar="NAME",
         help="run the conformance corpus on backend NAME (repeatable; default: every registered backend "
              "except the oracle numpy-exact)")
    _add(group, "--xconv-cases", action="append", default=None, metavar="PATTERN",
         help="only conformance cases whose id matches PATTERN (glob or substring; repeatable)")
    _add(group, "--xconv-import", action="append", default=None, metavar="MODULE",
         help="import MODULE before collecting (it may register backends); repeatable")
    _add(group, "--xconv-case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT, metavar="SECONDS",
         help=f"fail a case still running after SECONDS as timed out (default {DEFAULT_CASE_TIMEOUT:g})")
    _add(group, "--xconv-no-isolate", action="store_true", default=False,
         help="run the backends in the pytest process instead of worker processes")


def pytest_configure(config):
    config.stash[_STATE] = {"outcomes": defaultdict(list), "fresh": {}, "seconds": defaultdict(float),
                            "runners": {}, "notes": set()}
    for module in config.getoption("--xconv-import") or ():
        importlib.import_module(module)


def _backends(config) -> list[str]:
    names = config.getoption("--xconv-backend")
    if names:
        return list(dict.fromkeys(names))
    return [r.name for r in xconv.list_backends() if r.name != ORACLE]


def pytest_generate_tests(metafunc):
    if "conformance_case" not in metafunc.fixturenames:
        return
    cases = select(load_corpus(), metafunc.config.getoption("--xconv-cases"))
    backends = _backends(metafunc.config)
    params = [pytest.param(case, backend, id=f"{case.id}@{backend}") for case in cases for backend in backends]
    metafunc.parametrize(("conformance_case", "conformance_backend"), params)


def _runner(config, backend: str) -> CaseRunner:
    runners = config.stash[_STATE]["runners"]
    if backend not in runners:
        runners[backend] = CaseRunner(backend, isolate=not config.getoption("--xconv-no-isolate"),
                                      case_timeout=config.getoption("--xconv-case-timeout"),
                                      imports=config.getoption("--xconv-import") or (), spawn=False)
    return runners[backend]


def _fresh(config, backend: str) -> FreshDigests:
    fresh = config.stash[_STATE]["fresh"]
    if backend not in fresh:
        fresh[backend] = FreshDigests(backend, config.getoption("--xconv-import") or (),
                                      config.getoption("--xconv-case-timeout"))
    return fresh[backend]


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    for holder in (state or {}).get("runners", {}).values():
        holder.close()
    for holder in (state or {}).get("fresh", {}).values():
        holder.close()


@pytest.fixture
def conformance_check(request):
    """``check(case, backend)``: run and judge one case, record it for the summary, map it to a pytest outcome."""

    def check(case, backend):
        start = time.perf_counter()
        state = request.config.stash[_STATE]
        runner = _runner(request.config, backend)
        outcome = runner.run(case)
        if runner.note:
            state["notes"].add(runner.note)
        if outcome.status == "passed" and case.deterministic and case.kind == "valid":
            apply_fresh_process(outcome, _fresh(request.config, backend).digest(case))
        state["outcomes"][backend].append((case, outcome))
        state["seconds"][backend] += time.perf_counter() - start
        if outcome.ratio is not None:
            request.node.user_properties.append(("xconv_error_over_bound", outcome.ratio))
        # for the summary of a pytest-xdist run: the controller sees the workers' reports, not their state
        request.node.user_properties.append(("xconv_outcome", [backend, case.id, outcome.status, outcome.ratio,
                                                               outcome.message[:300], time.perf_counter() - start]))
        if outcome.status == "unavailable":
            pytest.skip(f"unavailable: backend {backend!r}: {outcome.message}")
        if outcome.status == "refused":
            pytest.skip(f"refused: {outcome.message}")
        if outcome.status in FAILING:
            stderr = f"\n--- its stderr (tail) ---\n{outcome.stderr}" if outcome.stderr.strip() else ""
            pytest.fail(f"{case.id} on {backend}: {outcome.message}{stderr}", pytrace=False)
        return outcome

    return check


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if state is not None and not state["outcomes"]:
        _from_worker_reports(state, terminalreporter)      # the controller of `pytest -n N` (pytest-xdist)
    if not state or not state["outcomes"]:
        return
    from .summary import summary_table
    terminalreporter.section("xconv conformance")
    for line in summary_table(dict(state["outcomes"]), dict(state["seconds"])).splitlines():
        terminalreporter.write_line(line)
    for backend, pairs in state["outcomes"].items():
        reasons = {o.message for _, o in pairs if o.status == "unavailable"}
        for reason in sorted(reasons):
            terminalreporter.write_line(f"{backend}: unavailable: {reason}")
    for note in sorted(state["notes"]):
        terminalreporter.write_line(f"note: {note}")


def _from_worker_reports(state, terminalreporter) -> None:
    """Rebuild the summary's outcomes from the ``xconv_outcome`` user properties of the reports the xdist
    workers sent (each worker ran a share of the cases in its own worker processes)."""
    from .runner import Outcome
    corpus = {c.id: c for c in load_corpus()}
    seen = set()
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()) or ():
                if key != "xconv_outcome" or getattr(report, "when", "call") != "call":
                    continue
                backend, case_id, status, ratio, message, seconds = value
                if (backend, case_id) in seen or case_id not in corpus:
                    continue
                seen.add((backend, case_id))
                state["outcomes"][backend].append((corpus[case_id], Outcome(case_id, backend, status, message, ratio)))
                state["seconds"][backend] += seconds
