"""The SHA-256 of a file, read in 1 MiB blocks: checkpoint and adapter hashes (the ``checkpoint`` and
``adapter`` columns, first 16 hex digits) and the committed demo weights' manifest (full digest)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 (64 lowercase characters) of the bytes of file ``path``.

    Raises:
        FileNotFoundError: no such file (IsADirectoryError for a folder).
    """
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
