"""The conformance corpus as tests: one per case x backend (see xconv_conformance.pytest_plugin)."""

from xconv_conformance.corpus_tests import test_case  # noqa: F401
