"""The kit's status vocabulary lives in one module; every front end reads it from there."""

import xconv_conformance.compare as compare
import xconv_conformance.manifest_schema as manifest_schema
import xconv_conformance.report as report
import xconv_conformance.runner as runner
from xconv_conformance import status


def test_one_status_vocabulary():
    assert status.STATUSES == ("passed", "failed", "crashed", "timed_out", "refused", "unavailable")
    assert set(status.FAILING) | {status.REFUSED, status.UNAVAILABLE, status.PASSED} == set(status.STATUSES)
    assert set(status.DIED) <= set(status.FAILING)
    # the modules that used to spell the list out each read the one tuple
    assert runner.STATUSES is status.STATUSES and runner.FAILING is status.FAILING
    assert manifest_schema.STATUSES is status.STATUSES
    assert report._COUNTED is status.STATUSES and report._FAILING is status.FAILING
    assert compare._COUNTED == (*status.STATUSES, status.ABSENT)
    assert set(status.LABELS) >= set(compare._COUNTED) and set(status.COLORS) == set(status.STATUSES)
