"""A small typed registry: one per extensible concept (perturbations, readers, models)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry mapping. Duplicate names raise; unknown names raise KeyError listing the valid ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries))
            raise KeyError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def list(self, pattern: str = "*", **filters: Any) -> list[str]:
        """Sorted names matching a glob; each filter ``attr=value`` keeps entries whose attribute
        equals the value, or contains it when the attribute is a tuple/frozenset."""
        out = []
        for name, entry in self._entries.items():
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            if all(_matches(getattr(entry, k), v) for k, v in filters.items()):
                out.append(name)
        return sorted(out)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(entry: T) -> T:
            return self.register(name, entry)

        return wrap


def _matches(attr: Any, value: Any) -> bool:
    if isinstance(attr, tuple | frozenset | set | list):
        return value in attr
    return bool(attr == value)
