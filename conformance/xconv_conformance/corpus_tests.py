"""The corpus as pytest tests, one per case x backend.

In a source checkout: ``pytest conformance --xconv-backend NAME``. From an installed xconv
(no checkout): ``pytest -p xconv_conformance.pytest_plugin --pyargs xconv_conformance.corpus_tests
--xconv-backend NAME``.
"""


def test_case(conformance_case, conformance_backend, conformance_check):
    conformance_check(conformance_case, conformance_backend)
