"""SQLite response cache for API models.

One table ``responses(key TEXT PRIMARY KEY, response TEXT, created REAL)``. The key is the SHA-256
hex digest of a canonical JSON document holding the image hash, the prompt, the model and every
generation setting that changes the answer (temperature, max_tokens, logprobs, ...), so a changed
setting never returns a stale answer. Only successful responses are stored (the caller decides);
a second identical run is served entirely from the file and makes no HTTP call.

Thread safety: one connection shared across threads (``check_same_thread=False``) guarded by a
lock; SQLite serialises writers anyway and the lock keeps cursor use race-free.

Journal mode: WAL on local disk (other processes read while one writes); WAL needs shared memory
that network file systems (NFS, the SLURM and Kubernetes volumes) do not provide safely, so the
deploy targets set ``MEDROBUST_CACHE_JOURNAL_MODE=DELETE`` (or pass ``journal_mode``).

Faults never cost an answer: a cache file that fails SQLite's ``quick_check`` (or is not a
database at all) is moved aside to ``<name>.corrupt-<time>`` with a warning and a fresh cache is
started; a failed read is a miss (logged); a failed write is a logged warning and the caller keeps
the answer it already has.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

JOURNAL_MODES: tuple[str, ...] = ("WAL", "DELETE", "TRUNCATE", "PERSIST")
"""Journal modes the cache accepts; WAL only on local disk."""
JOURNAL_MODE_ENV = "MEDROBUST_CACHE_JOURNAL_MODE"
"""Environment variable the deploy targets set (``DELETE`` on shared volumes); default ``WAL``."""


def default_journal_mode() -> str:
    """``$MEDROBUST_CACHE_JOURNAL_MODE`` (upper-cased) or ``WAL``; ValueError naming the valid modes."""
    mode = (os.environ.get(JOURNAL_MODE_ENV) or "WAL").strip().upper()
    if mode not in JOURNAL_MODES:
        raise ValueError(f"{JOURNAL_MODE_ENV}={mode!r}; valid: {', '.join(JOURNAL_MODES)}")
    return mode


def cache_key(image_hash: str | None, prompt: str, model: str, settings: Mapping[str, Any]) -> str:
    """SHA-256 hex of ``(image_hash, prompt, model, settings)`` in canonical JSON (sorted keys).

    ``image_hash`` is ``None`` for text-only requests; ``settings`` must be JSON-serialisable.
    """
    doc = {"image": image_hash, "prompt": prompt, "model": model, "settings": dict(settings)}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Key -> response JSON store on a SQLite file (created with its parent folder if missing).

    ``journal_mode``: one of :data:`JOURNAL_MODES` (None: :func:`default_journal_mode`).
    ``moved_aside`` is the path a corrupt file was moved to at open (None when it was sound);
    ``n_read_errors`` / ``n_write_errors`` count faults that were turned into misses / warnings.
    """

    def __init__(self, path: str | Path, *, journal_mode: str | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.journal_mode = (journal_mode or default_journal_mode()).upper()
        if self.journal_mode not in JOURNAL_MODES:
            raise ValueError(f"journal_mode {journal_mode!r}; valid: {', '.join(JOURNAL_MODES)}")
        self._lock = threading.Lock()
        self.moved_aside: Path | None = None
        self.n_read_errors = 0
        self.n_write_errors = 0
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:  # not a database, or quick_check failed
            self.moved_aside = self._move_aside(exc)
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        try:
            with self._lock:
                verdict = conn.execute("PRAGMA quick_check").fetchone()
                if verdict is None or verdict[0] != "ok":
                    raise sqlite3.DatabaseError(f"quick_check: {verdict[0] if verdict else 'no answer'}")
                conn.execute(f"PRAGMA journal_mode={self.journal_mode}")
                conn.execute("PRAGMA synchronous=NORMAL" if self.journal_mode == "WAL" else "PRAGMA synchronous=FULL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS responses "
                    "(key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL)"
                )
                conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self, exc: BaseException) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        os.replace(self.path, target)
        for suffix in ("-wal", "-shm", "-journal"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.replace(side, target.with_name(target.name + suffix))
        logger.warning("response cache %s is corrupt (%s); moved aside to %s and starting an empty cache "
                       "(answers in it will be requested again)", self.path, exc, target)
        return target

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored response for ``key``, or ``None`` when absent, unreadable or the read fails
        (a failed read is a miss: the caller asks the API instead)."""
        try:
            with self._lock:
                row = self._conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            self.n_read_errors += 1
            logger.warning("response cache %s: read failed (%s); treated as a miss", self.path, exc)
            return None
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, response: Mapping[str, Any]) -> bool:
        """Store (or overwrite) the response JSON for ``key``; False (and a logged warning) when
        the write fails (disk full, locked or read-only file): the caller keeps its answer."""
        blob = json.dumps(dict(response), ensure_ascii=False)
        try:
            with self._lock:
                try:
                    self._conn.execute(
                        "INSERT OR REPLACE INTO responses (key, response, created) VALUES (?, ?, ?)",
                        (key, blob, time.time()),
                    )
                    self._conn.commit()
                except sqlite3.Error:
                    self._conn.rollback()
                    raise
        except sqlite3.Error as exc:
            self.n_write_errors += 1
            logger.warning("response cache %s: write failed (%s); the answer is kept but not cached",
                           self.path, exc)
            return False
        return True

    def __len__(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()
        return int(row[0])

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._lock:
            row = self._conn.execute("SELECT 1 FROM responses WHERE key = ?", (key,)).fetchone()
        return row is not None

    def close(self) -> None:
        """Close the connection; further use raises ``sqlite3.ProgrammingError``."""
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"ResponseCache(path={str(self.path)!r})"
