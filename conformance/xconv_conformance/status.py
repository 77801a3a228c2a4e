"""The kit's verdict vocabulary: every status a case outcome (and a bundle record) may hold.

- ``passed``: the case ran and every check held.
- ``failed``: a check did not hold (a result outside its bound, a wrong error, a raw exception).
- ``crashed``: the case killed its worker process (``signal`` and ``stderr`` say how).
- ``timed_out``: the case ran past the case timeout (its worker was stopped).
- ``refused``: the backend raised UnsupportedError: reported, never a pass.
- ``unavailable``: the backend cannot run here (with its reason).

``absent`` is not a status: :mod:`.compare` uses it for a case one bundle lacks.
"""

from __future__ import annotations

PASSED, FAILED, CRASHED, TIMED_OUT, REFUSED, UNAVAILABLE = (
    "passed", "failed", "crashed", "timed_out", "refused", "unavailable")

#: Every status, in the order tables show them.
STATUSES = (PASSED, FAILED, CRASHED, TIMED_OUT, REFUSED, UNAVAILABLE)
#: Statuses that count as failures (a non-zero exit).
FAILING = (FAILED, CRASHED, TIMED_OUT)
#: The case's worker died on it (a record adds ``signal`` and ``stderr``).
DIED = (CRASHED, TIMED_OUT)
#: compare: the case is not in a bundle.
ABSENT = "absent"

#: Column headings.
LABELS = {PASSED: "passed", FAILED: "failed", CRASHED: "crashed", TIMED_OUT: "timed out", REFUSED: "refused",
          UNAVAILABLE: "unavailable", ABSENT: "absent"}
#: Colours of the HTML report.
COLORS = {PASSED: "#2e7d32", FAILED: "#c62828", CRASHED: "#6a1b9a", TIMED_OUT: "#ad1457", REFUSED: "#ef6c00",
          UNAVAILABLE: "#757575"}
