"""xconv backends on JAX/XLA, one per platform JAX reaches: jax-cpu, jax-gpu, jax-tpu.

A plugin distribution of its own (``backends/xconv_jax/pyproject.toml``, entry point ``jax`` in
the group ``xconv.backends``); nothing in the xconv core names it. Importing it imports no jax:
jax is imported when a backend is probed (``availability()``) or used. See docs/jax.md.
"""

from .backend import PLATFORMS, JaxBackend

__all__ = ["PLATFORMS", "JaxBackend"]
