"""Shared fixtures of the test suite."""

import pytest

from xconv import plan_cache


@pytest.fixture(autouse=True)
def _no_plans_from_earlier_tests():
    """Each test starts without the plans of the tests before it in its process (xconv.plan_cache): a repeated public
    call runs its plan's runner, not the backend's dispatch, so what a test sees run must not depend on which tests
    ran first."""
    plan_cache.clear()
    yield
