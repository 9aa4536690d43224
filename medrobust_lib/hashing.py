"""Every hash the project records: the one canonical JSON form of a fingerprint payload and its
digest, and the file and folder hashes.

- :func:`digest` (over :func:`canonical_json`): the fingerprint of a result chunk's inputs
  (:mod:`medrobust_lib.tracks.partition`), of a fine-tuning recipe and of the inputs the committed
  demo weights were trained from (:mod:`medrobust_lib.demo.committed`). One form only: sorted keys,
  compact separators, anything that is not JSON written as its ``str``.
- :func:`file_sha256`: a file's SHA-256, read in 1 MiB blocks; :func:`short_file_hash` is its first
  :data:`SHORT_HASH_LEN` hex digits, the ``checkpoint`` and ``adapter`` columns of a weights file.
- :func:`folder_hash`: a model folder's sampled hash (the ``checkpoint`` column of a local VLM).
- :func:`tree_sha256` and :func:`files_digest`: the per-file digests of a folder and one digest
  over named files (the committed demo weights' manifest and the record files they were trained on).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

SHORT_HASH_LEN = 16
"""Hex digits of a weights hash as results store it (``checkpoint``, ``adapter`` columns)."""


def canonical_json(payload: Any) -> str:
    """The canonical JSON text of ``payload``: keys sorted, compact separators (``,`` and ``:``),
    non-ASCII escaped, and any value JSON cannot hold written as its ``str`` (a path, a numpy
    scalar). Tuples are lists. The fingerprints of stored results depend on this exact text:
    changing it invalidates every stored partition and the committed demo weights' manifests."""
    return json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))


def digest(payload: Any) -> str:
    """Hex SHA-256 (64 lowercase characters) of :func:`canonical_json` of ``payload``."""
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


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


def short_file_hash(path: str | Path) -> str:
    """:func:`file_sha256` of ``path``, first :data:`SHORT_HASH_LEN` hex digits: how results name
    a checkpoint or adapter weights file."""
    return file_sha256(path)[:SHORT_HASH_LEN]


FOLDER_HASH_SAMPLE = 1 << 20
"""Bytes of each file that :func:`folder_hash` reads (so multi-gigabyte checkpoints are not read whole)."""


def folder_hash(source: str | Path) -> str:
    """Sampled hash of a model folder, first :data:`SHORT_HASH_LEN` hex digits: the name, size and
    first :data:`FOLDER_HASH_SAMPLE` bytes of every ``*.safetensors`` then every ``*.json`` file
    (each sorted by name; files in sub-folders are not read). ``source`` that is not a folder (a
    hub id) is returned as it is."""
    p = Path(source)
    if not p.is_dir():
        return str(source)
    h = hashlib.sha256()
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.json")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(FOLDER_HASH_SAMPLE))
    return h.hexdigest()[:SHORT_HASH_LEN]


def tree_sha256(folder: Path, exclude: Collection[str] = ()) -> dict[str, str]:
    """:func:`file_sha256` of every file under ``folder`` by relative POSIX path (sorted), files
    named in ``exclude`` left out."""
    return {p.relative_to(folder).as_posix(): file_sha256(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in exclude}


def files_digest(paths: Iterable[Path]) -> str:
    """Hex SHA-256 over the names and contents of ``paths`` in order (a missing file counts as
    absent, not as an error)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(file_sha256(p).encode() if p.is_file() else b"missing")
    return h.hexdigest()
