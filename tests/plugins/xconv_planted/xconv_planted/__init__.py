"""A test fixture: the NumPy backend with a planted bug (see plugin.py)."""
