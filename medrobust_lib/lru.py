"""Bounded per-process caches: one least-recently-used map for every cache of the library, and
the file stamp that tells a cached decode from a stale one. A library cache is created with a
``name`` and so registered in :data:`REGISTRY`, which :mod:`medrobust_lib.runtime` lists and
resets.

:class:`LRU` bounds by entry count, by bytes, or both; the byte budget may be a callable read at
every insert (an environment setting). An entry larger than the whole byte budget is not kept,
unless ``keep_newest`` (a real model of several GiB must still be shared while it is the one in
use: it is then kept alone). :meth:`make_room` drops entries before a new value is built, so a
cache of models never holds the old ones while the next loads. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

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


REGISTRY: dict[str, LRU[Any, Any]] = {}
"""The library's caches by name (``<package>.<what>``), each registered by ``LRU(..., name=...)``;
read and reset through :mod:`medrobust_lib.runtime`."""
_REGISTRY_LOCK = threading.Lock()


class LRU(Generic[K, V]):
    """A map that keeps at most ``max_items`` entries and at most ``max_bytes`` bytes (each entry
    counted at the size given to :meth:`put`), dropping the least recently used first.
    ``keep_newest``: an entry larger than the byte budget is kept alone instead of not at all."""

    def __init__(self, max_items: int | None = None, max_bytes: int | Callable[[], int] | None = None,
                 *, keep_newest: bool = False, name: str | None = None) -> None:
        if max_items is not None and max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if name is not None:  # a library cache: owned by medrobust_lib.runtime (caches(), reset())
            with _REGISTRY_LOCK:
                if name in REGISTRY:
                    raise ValueError(f"cache {name!r} is registered twice")
                REGISTRY[name] = self
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._keep_newest = keep_newest
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

    def _evict_for(self, nbytes: int, budget: int | None) -> int:
        """Drop least recently used entries until one more of ``nbytes`` fits (lock held)."""
        n_dropped = 0
        while self._entries and (
                (self._max_items is not None and len(self._entries) >= self._max_items)
                or (budget is not None and self._bytes + nbytes > budget)):
            self._bytes -= self._entries.popitem(last=False)[1][1]
            n_dropped += 1
        return n_dropped

    def make_room(self, nbytes: int = 0) -> int:
        """Drop least recently used entries until one more entry of ``nbytes`` would fit (with
        ``max_items``: until there is a free slot), before that entry is built. Returns how many
        were dropped; the cache keeps no reference to them, so a ``gc.collect()`` by the caller
        frees them."""
        with self._lock:
            return self._evict_for(nbytes, self.budget())

    def put(self, key: K, value: V, nbytes: int = 0) -> bool:
        """Keep ``value`` under ``key`` (replacing an entry of the key), dropping the least recently
        used entries until it fits. Returns whether it was kept."""
        budget = self.budget()
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if budget is not None and nbytes > budget and not self._keep_newest:
                return False
            self._evict_for(nbytes, budget)
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            return True

    def values(self) -> list[V]:
        """The values, least recently used first."""
        with self._lock:
            return [v for v, _ in self._entries.values()]

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
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
