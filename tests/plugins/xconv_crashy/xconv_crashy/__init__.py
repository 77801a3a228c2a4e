"""A backend plugin that crashes, aborts and hangs on purpose: the fixture of the kit's isolation tests.

It is its own distribution (``tests/plugins/xconv_crashy/pyproject.toml``, entry point ``crashy``
in the group ``xconv.backends``), found exactly as an outside vendor's plugin would be. The
tests expose it through a generated ``.dist-info`` on ``PYTHONPATH`` instead of installing it, so
that it never joins the backends of a normal ``xconv conformance`` run.
"""
