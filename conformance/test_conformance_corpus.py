"""The conformance corpus as tests: one per case x backend (see xconv_conformance.pytest_plugin)."""


def test_case(conformance_case, conformance_backend, conformance_check):
    conformance_check(conformance_case, conformance_backend)
