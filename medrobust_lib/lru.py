"""Bounded per-process caches: one least-recently-used map for every cache of the library, and
the file stamp that tells a cached decode from a stale one.

:class:`LRU` bounds by entry count, by bytes, or both; the byte budget may be a callable read at
every insert (an environment setting). An entry larger than the whole byte budget is not kept,
unless ``keep_newest`` (a real model of several GiB must still be shared while it is the one in
use: it is then kept alone). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

FileStamp = tuple[str, int, int, int]
"""(resolved path, inode, size, modification time in ns) of a file."""


def file_stamp(path: str | Path) -> FileStamp:
    """What identifies one version of a file: a write through a temporary file and a rename (how
    this project writes) changes the inode; an in-place rewrite changes the size or the time."""
    p = Path(path)
    st = p.stat()
    return (str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


class LRU(Generic[K, V]):
    """A map that keeps at most ``max_items`` entries and at most ``max_bytes`` bytes (each entry
    counted at the size given to :meth:`put`), dropping the least recently used first.
    ``on_evict(value)`` runs for every dropped entry (outside the lock). ``keep_newest``: an
    entry larger than the byte budget is kept alone instead of not at all."""

    def __init__(self, max_items: int | None = None, max_bytes: int | Callable[[], int] | None = None,
                 *, keep_newest: bool = False, on_evict: Callable[[V], None] | None = None) -> None:
        if max_items is not None and max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._keep_newest = keep_newest
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def budget(self) -> int | None:
        """The byte budget now (None: unbounded in bytes)."""
        b = self._max_bytes
        return b() if callable(b) else b

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None; counted as a hit or a miss."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return hit[0]

    def _evict_for(self, nbytes: int, budget: int | None) -> list[V]:
        """Drop least recently used entries until one more of ``nbytes`` fits (lock held)."""
        dropped: list[V] = []
        while self._entries and (
                (self._max_items is not None and len(self._entries) >= self._max_items)
                or (budget is not None and self._bytes + nbytes > budget)):
            v, n = self._entries.popitem(last=False)[1]
            self._bytes -= n
            dropped.append(v)
        return dropped

    def _evicted(self, dropped: list[V]) -> None:
        if self._on_evict is not None:
            for v in dropped:
                self._on_evict(v)

    def make_room(self, nbytes: int) -> None:
        """Drop least recently used entries until an entry of ``nbytes`` would fit, before it
        is built (a model's memory is released before the next one loads)."""
        with self._lock:
            dropped = self._evict_for(nbytes, self.budget())
        self._evicted(dropped)

    def put(self, key: K, value: V, nbytes: int = 0) -> bool:
        """Keep ``value`` under ``key`` (replacing an entry of the key), dropping the least recently
        used entries until it fits. Returns whether it was kept."""
        budget = self.budget()
        with self._lock:
            old = self._entries.pop(key, None)
            dropped = [] if old is None or old[0] is value else [old[0]]
            if old is not None:
                self._bytes -= old[1]
            if budget is not None and nbytes > budget and not self._keep_newest:
                kept = False
            else:
                dropped += self._evict_for(nbytes, budget)
                self._entries[key] = (value, nbytes)
                self._bytes += nbytes
                kept = True
        self._evicted(dropped)
        return kept

    def values(self) -> list[V]:
        """The values, least recently used first."""
        with self._lock:
            return [v for v, _ in self._entries.values()]

    def clear(self) -> None:
        """Drop every entry (without ``on_evict``) and reset the counters."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
