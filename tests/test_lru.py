"""The library's bounded cache: least recently used dropped first, by count and by bytes."""

from __future__ import annotations

import os
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


def test_byte_bound_with_callable_budget_and_evict_callback() -> None:
    budget = [100]
    evicted: list[str] = []
    c: LRU[str, str] = LRU(max_bytes=lambda: budget[0], on_evict=evicted.append)
    assert c.put("a", "A", 40) and c.put("b", "B", 40)
    assert c.put("c", "C", 40)  # 120 > 100: a goes
    assert evicted == ["A"] and c.nbytes == 80 and c.values() == ["B", "C"]
    assert not c.put("huge", "H", 101)  # larger than the whole budget: not kept, nothing dropped
    assert "huge" not in c and c.values() == ["B", "C"]
    budget[0] = 50  # the budget is read at every insert
    c.put("d", "D", 10)
    assert c.values() == ["C", "D"] and evicted == ["A", "B"] and c.nbytes == 50
    c.clear()
    assert len(c) == 0 and c.nbytes == 0 and (c.hits, c.misses) == (0, 0)


def test_keep_newest_keeps_an_oversized_entry_alone_and_make_room_frees_first() -> None:
    evicted: list[str] = []
    c: LRU[str, str] = LRU(max_bytes=100, keep_newest=True, on_evict=evicted.append)
    c.put("a", "A", 30)
    c.put("b", "B", 30)
    c.make_room(50)  # before building a 50-byte value: a goes now, not after the build
    assert evicted == ["A"] and c.values() == ["B"]
    c.make_room(500)
    assert evicted == ["A", "B"] and len(c) == 0
    assert c.put("big", "G", 500) and c.values() == ["G"]  # kept alone
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
