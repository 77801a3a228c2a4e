"""pytest configuration of the conformance corpus: ``pytest conformance --xconv-backend NAME``.

The hooks, options and fixtures live in :mod:`xconv_conformance.pytest_plugin` (see its docstring);
they are used from here unless that module was also loaded as a plugin (``-p``).
"""

import os
import sys

try:
    import xconv_conformance  # noqa: F401 - installed with xconv
except ImportError:  # a source checkout that was not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from xconv_conformance import pytest_plugin as _plugin  # noqa: E402

conformance_check = _plugin.conformance_check


def _here(pluginmanager) -> bool:
    return not pluginmanager.has_plugin(_plugin.__name__)


def pytest_addoption(parser, pluginmanager):
    if _here(pluginmanager):
        _plugin.pytest_addoption(parser)


def pytest_configure(config):
    if _here(config.pluginmanager):
        _plugin.pytest_configure(config)


def pytest_generate_tests(metafunc):
    if _here(metafunc.config.pluginmanager):
        _plugin.pytest_generate_tests(metafunc)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _here(config.pluginmanager):
        _plugin.pytest_terminal_summary(terminalreporter, exitstatus, config)


def pytest_unconfigure(config):
    if _here(config.pluginmanager):
        _plugin.pytest_unconfigure(config)
