"""The library's bounded cache: least recently used dropped first, by count and by bytes."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest

from medrobust_lib.lru import LRU, file_stamp


def test_count_bound_drops_the_least_recently_used() -> None:
    c: LRU[str, int] = LRU(max_items=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert "b" not in c and c.values() == [1, 3]
    assert c.get("b") is None and (c.hits, c.misses) == (1, 1)
    c.put("a", 10)  # replacing a key does not drop another entry
    assert c.values() == [3, 10] and len(c) == 2


def test_byte_bound_with_callable_budget() -> None:
    budget = [100]
    c: LRU[str, str] = LRU(max_bytes=lambda: budget[0])
    assert c.put("a", "A", 40) and c.put("b", "B", 40)
    assert c.put("c", "C", 40)  # 120 > 100: a goes
    assert c.nbytes == 80 and c.values() == ["B", "C"]
    assert not c.put("huge", "H", 101)  # larger than the whole budget: not kept, nothing dropped
    assert "huge" not in c and c.values() == ["B", "C"]
    budget[0] = 50  # the budget is read at every insert
    c.put("d", "D", 10)
    assert c.values() == ["C", "D"] and c.nbytes == 50
    c.put("c", "C2", 5)  # replacing a key counts its new size only
    assert c.values() == ["D", "C2"] and c.nbytes == 15
    c.clear()
    assert len(c) == 0 and c.nbytes == 0 and (c.hits, c.misses) == (0, 0)


def test_make_room_frees_before_a_build_and_keep_newest_keeps_an_oversized_entry_alone() -> None:
    class Model:
        pass

    c: LRU[str, Model] = LRU(max_bytes=100, keep_newest=True)
    c.put("a", Model(), 30)
    c.put("b", Model(), 30)
    gone = weakref.ref(c.values()[0])
    assert c.make_room(50) == 1  # before building a 50-byte value: a goes now, not after the build
    gc.collect()
    assert gone() is None and len(c) == 1  # nothing of the cache holds the dropped model
    assert c.make_room(500) == 1 and len(c) == 0
    big = Model()
    assert c.put("big", big, 500) and c.values() == [big]  # kept alone
    slots: LRU[str, int] = LRU(max_items=2)
    slots.put("x", 1)
    slots.put("y", 2)
    assert slots.make_room() == 1 and slots.values() == [2]  # a free slot before the next load
    with pytest.raises(ValueError, match="max_items"):
        LRU(max_items=0)


def test_file_stamp_changes_when_a_file_is_replaced_or_rewritten(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(b"one")
    first = file_stamp(p)
    assert first == file_stamp(p) and first[0] == str(p.resolve())
    tmp = tmp_path / "f.tmp"
    tmp.write_bytes(b"two")
    st = p.stat()
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and time: the inode tells
    tmp.replace(p)
    assert file_stamp(p) != first
    second = file_stamp(p)
    p.write_bytes(b"three")  # rewritten in place: the size tells
    assert file_stamp(p) != second
