"""The error of an asset whose upstream was never materialized for this suite."""

from __future__ import annotations


class MissingUpstream(FileNotFoundError):
    """An input that an upstream asset writes does not exist yet (the clean index, the demo data, a
    trained base checkpoint): ``asset`` names that upstream asset. The CLI answers it with the
    command that materializes the selection together with what it depends on (``--select +...``)."""

    def __init__(self, message: str, asset: str) -> None:
        super().__init__(message)
        self.asset = asset
