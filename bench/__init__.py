"""Benchmarks of the medrobust pipeline: one script per question, run from the repository root as
``python -m bench.<name>`` (the package itself comes from the editable install); shared helpers
live in modules of their own (:mod:`bench.timing`) so no script imports another."""
