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

Faults never cost an answer, and they are told apart (by SQLite's result code):

* corruption (``quick_check`` fails, ``SQLITE_CORRUPT``, ``SQLITE_NOTADB``: not a database at
  all) is the only fault that moves the file aside, to ``<name>.corrupt-<time>`` (kept for
  inspection), with a warning; a fresh cache is started;
* a busy or locked file (another process holds the lock) is waited for ``busy_timeout_s``
  (default 30 s), then the cache runs uncached with a warning: the file, every committed row and
  the other process's transaction are left alone;
* a full disk, an I/O error, a read-only or unopenable file: a warning, the file and its rows are
  kept, and the run goes on uncached (``unavailable`` says why); opening is retried after
  ``reopen_after_s``.

At run time a failed read is a miss (logged); a failed write (disk full, locked) is a logged
warning and the caller keeps the answer it already has.
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

from medrobust_lib.ownership import check_cache_target

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


class IntegrityCheckFailed(sqlite3.DatabaseError):
    """``PRAGMA quick_check`` reported damage: the one fault that moves a cache aside."""


def is_corruption(exc: BaseException) -> bool:
    """True for a failed integrity check, ``SQLITE_CORRUPT*`` and ``SQLITE_NOTADB``; False for
    busy/locked, full disk, I/O, permission and every other fault (those keep the file)."""
    if isinstance(exc, IntegrityCheckFailed):
        return True
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    return name.startswith("SQLITE_CORRUPT") or name.startswith("SQLITE_NOTADB")


def cache_key(image_hash: str | None, prompt: str, model: str, settings: Mapping[str, Any]) -> str:
    """SHA-256 hex of ``(image_hash, prompt, model, settings)`` in canonical JSON (sorted keys).

    ``image_hash`` is ``None`` for text-only requests; ``settings`` must be JSON-serialisable.
    """
    doc = {"image": image_hash, "prompt": prompt, "model": model, "settings": dict(settings)}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()  # same bytes for valid text


class ResponseCache:
    """Key -> response JSON store on a SQLite file (created with its parent folder if missing).

    ``journal_mode``: one of :data:`JOURNAL_MODES` (None: :func:`default_journal_mode`).
    ``busy_timeout_s``: how long a statement waits for another process's lock.
    ``moved_aside`` is the path a corrupt file was moved to at open (None when it was sound);
    ``unavailable`` is why the cache runs uncached (None when it is open): a busy file, a full disk;
    ``n_read_errors`` / ``n_write_errors`` count faults that were turned into misses / warnings.
    """

    def __init__(self, path: str | Path, *, journal_mode: str | None = None, busy_timeout_s: float = 30.0,
                 reopen_after_s: float = 60.0) -> None:
        self.path = Path(path)
        check_cache_target(self.path)  # never move aside or overwrite a file that is not a cache (NotOurs)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.journal_mode = (journal_mode or default_journal_mode()).upper()
        if self.journal_mode not in JOURNAL_MODES:
            raise ValueError(f"journal_mode {journal_mode!r}; valid: {', '.join(JOURNAL_MODES)}")
        self.busy_timeout_s = float(busy_timeout_s)
        self.reopen_after_s = float(reopen_after_s)
        self._lock = threading.Lock()
        self.moved_aside: Path | None = None
        self.unavailable: str | None = None
        self.n_read_errors = 0
        self.n_write_errors = 0
        self._conn: sqlite3.Connection | None = None
        self._last_try = 0.0
        self._connect(first=True)

    def _connect(self, *, first: bool = False) -> None:
        """Open the file; on corruption move it aside and start fresh; on any other fault run
        uncached (``unavailable``) and keep the file untouched."""
        self._last_try = time.monotonic()
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            if not is_corruption(exc):
                self._uncached(exc, first)
                return
            self.moved_aside = self._move_aside(exc)
            try:
                self._conn = self._open()
            except sqlite3.DatabaseError as again:
                self._uncached(again, first)
                return
        if self.unavailable is not None:
            logger.warning("response cache %s is available again", self.path)
        self.unavailable = None

    def _uncached(self, exc: BaseException, first: bool) -> None:
        self._conn = None
        reason = f"{getattr(exc, 'sqlite_errorname', None) or type(exc).__name__}: {exc}"
        if first or self.unavailable != reason:
            logger.warning("response cache %s cannot be used (%s); running uncached, the file and every row "
                           "in it are kept (retried in %.0f s)", self.path, reason, self.reopen_after_s)
        self.unavailable = reason

    def _usable(self) -> sqlite3.Connection | None:
        """The connection, reopening an unavailable cache once ``reopen_after_s`` has passed."""
        if self._conn is None and time.monotonic() - self._last_try >= self.reopen_after_s:
            self._connect()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=self.busy_timeout_s)
        try:
            with self._lock:
                verdict = conn.execute("PRAGMA quick_check").fetchone()
                if verdict is None or verdict[0] != "ok":
                    raise IntegrityCheckFailed(f"quick_check: {verdict[0] if verdict else 'no answer'}")
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
        conn = self._usable()
        if conn is None:
            return None
        try:
            with self._lock:
                row = conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
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
        # ASCII JSON: a string no UTF-8 encoder takes (a lone surrogate an API returned, legal in
        # JSON) is stored escaped and read back as it was sent
        blob = json.dumps(dict(response), ensure_ascii=True)
        conn = self._usable()
        if conn is None:
            return False
        try:
            with self._lock:
                try:
                    conn.execute(
                        "INSERT OR REPLACE INTO responses (key, response, created) VALUES (?, ?, ?)",
                        (key, blob, time.time()),
                    )
                    conn.commit()
                except sqlite3.Error:
                    conn.rollback()
                    raise
        except sqlite3.Error as exc:
            self.n_write_errors += 1
            logger.warning("response cache %s: write failed (%s); the answer is kept but not cached",
                           self.path, exc)
            return False
        return True

    def __len__(self) -> int:
        """Rows in the cache (0 while it runs uncached)."""
        conn = self._usable()
        if conn is None:
            return 0
        with self._lock:
            row = conn.execute("SELECT COUNT(*) FROM responses").fetchone()
        return int(row[0])

    def __contains__(self, key: object) -> bool:
        conn = self._usable()
        if not isinstance(key, str) or conn is None:
            return False
        with self._lock:
            row = conn.execute("SELECT 1 FROM responses WHERE key = ?", (key,)).fetchone()
        return row is not None

    def close(self) -> None:
        """Close the connection; further use raises ``sqlite3.ProgrammingError`` (an uncached
        cache stays uncached)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._last_try = float("inf")  # never reopened after close

    def __repr__(self) -> str:
        return f"ResponseCache(path={str(self.path)!r})"
