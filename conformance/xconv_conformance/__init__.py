"""The xconv conformance kit: one case corpus, error-bound tolerances, any backend, results compared across machines.

- :func:`load_corpus` — the cases (``corpus.toml`` expanded; stable ids, inputs from the id).
- :func:`run_case` — run and judge one case on one backend.
- :mod:`.bundle` — portable result bundles (``.xcr``); :mod:`.compare` — hold bundles against each other.
- ``xconv conformance ...`` — the command line (:mod:`.cli`); ``pytest conformance --xconv-backend NAME``.

See docs/conformance.md.
"""

from .cases import Case, CorpusError, corpus_hash, load_corpus, make_inputs, select
from .runner import Outcome, run_case
from .tolerance import LAMBDA, bound, c_constant

__version__ = "1.0.0"

__all__ = ["Case", "CorpusError", "LAMBDA", "Outcome", "bound", "c_constant", "corpus_hash", "load_corpus",
           "make_inputs", "run_case", "select", "__version__"]
