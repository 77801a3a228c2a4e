"""The hook a backend plugin implements. Plugins are found through the entry-point group ``xconv.backends``.

A plugin is a plain module with ``@xconv.hookimpl`` functions, named by an entry point::

    [project.entry-points."xconv.backends"]
    mybackend = "my_package.plugin"
"""

from __future__ import annotations

import pluggy

PROJECT = "xconv"
ENTRY_POINT_GROUP = "xconv.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def xconv_backends():
    """Return the backend objects this plugin provides (see :class:`xconv.Backend`).

    Called once per process, when the registry is first used. Must be cheap and must not
    touch a device or load vendor libraries: availability is asked later, of each backend.
    Each backend's ``name`` must be unique across all plugins.
    """
