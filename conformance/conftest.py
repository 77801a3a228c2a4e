"""pytest configuration of the conformance corpus: ``pytest conformance --xconv-backend NAME``.

The hooks, options and fixtures live in :mod:`xconv_conformance.pytest_plugin` (see its docstring).
"""

import os
import sys

try:
    import xconv_conformance  # noqa: F401 - installed with xconv
except ImportError:  # a source checkout that was not pip-installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from xconv_conformance.pytest_plugin import *  # noqa: F401,F403,E402
