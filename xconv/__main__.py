"""``python -m xconv`` is the ``xconv`` command."""

import sys

from .cli import main

sys.exit(main())
