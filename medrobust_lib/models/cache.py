"""SQLite response cache for API models.

One table ``responses(key TEXT PRIMARY KEY, response TEXT, created REAL)``. The key is the SHA-256
hex digest of a canonical JSON document holding the image hash, the prompt, the model and every
generation setting that changes the answer (temperature, max_tokens, logprobs, ...), so a changed
setting never returns a stale answer. Only successful responses are stored (the caller decides);
a second identical run is served entirely from the file and makes no HTTP call.

Thread safety: one connection shared across threads (``check_same_thread=False``) guarded by a
lock; SQLite serialises writers anyway and the lock keeps cursor use race-free. WAL journaling lets
other processes read while one writes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cache_key(image_hash: str | None, prompt: str, model: str, settings: Mapping[str, Any]) -> str:
    """SHA-256 hex of ``(image_hash, prompt, model, settings)`` in canonical JSON (sorted keys).

    ``image_hash`` is ``None`` for text-only requests; ``settings`` must be JSON-serialisable.
    """
    doc = {"image": image_hash, "prompt": prompt, "model": model, "settings": dict(settings)}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Key -> response JSON store on a SQLite file (created with its parent folder if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS responses "
                "(key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._conn.commit()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored response for ``key``, or ``None`` when absent (or unreadable)."""
        with self._lock:
            row = self._conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, response: Mapping[str, Any]) -> None:
        """Store (or overwrite) the response JSON for ``key``."""
        blob = json.dumps(dict(response), ensure_ascii=False)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO responses (key, response, created) VALUES (?, ?, ?)",
                (key, blob, time.time()),
            )
            self._conn.commit()

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
