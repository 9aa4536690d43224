"""One-off tools (reference fixtures, generated docs, mart comparison, demo weights), run from the
repository root as ``python -m tools.<name>``; the project's packages come from the editable install."""
