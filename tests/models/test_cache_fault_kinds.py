"""The response cache tells faults apart, in both journal modes (WAL locally, DELETE on shared
volumes): only a failed integrity check moves the file aside; a full disk and a busy (locked) file
are warnings, the file and every committed row are kept, and the run goes on uncached; a busy cache
never discards another process's commit."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from medrobust_lib.models import cache as cache_mod
from medrobust_lib.models.cache import ResponseCache
from medrobust_lib.ownership import NotOurs

MODES = ["WAL", "DELETE"]

HOLDER = textwrap.dedent("""
    import os, sqlite3, sys, time
    db, go = sys.argv[1], sys.argv[2]
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    con.execute("INSERT INTO responses (key, response, created) VALUES ('theirs', '{\\"v\\": 2}', 0)")
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    con.execute("COMMIT")
    print("committed", flush=True)
""")


def _seed(db: Path, mode: str) -> None:
    c = ResponseCache(db, journal_mode=mode)
    assert c.put("mine", {"v": 1})
    c.close()


def _keys(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("select key from responses")}
    finally:
        con.close()


def _aside(db: Path) -> list[Path]:
    return sorted(db.parent.glob(db.name + ".corrupt-*"))


@pytest.mark.parametrize("mode", MODES)
def test_a_busy_cache_is_kept_and_the_other_processs_commit_survives(
        mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "c.sqlite"
    _seed(db, mode)
    go = tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(go)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with caplog.at_level(logging.WARNING):
            c = ResponseCache(db, journal_mode=mode, busy_timeout_s=0.2)  # waits 0.2 s, then goes on
            assert c.put("k2", {"v": 3}) is False  # the other process holds the write lock
        assert c.moved_aside is None and _aside(db) == []
        assert "locked" in caplog.text and "corrupt" not in caplog.text
        go.touch()
        assert holder.stdout.readline().strip() == "committed"
        assert holder.wait(timeout=30) == 0
    finally:
        go.touch()
        holder.wait(timeout=30)
    assert _keys(db) == {"mine", "theirs"}  # their commit landed in the file we kept
    c.close()
    again = ResponseCache(db, journal_mode=mode)
    assert again.get("theirs") == {"v": 2} and again.get("mine") == {"v": 1} and again.unavailable is None
    assert again.put("k3", {"v": 4}) and _keys(db) == {"mine", "theirs", "k3"}


class _FullDiskConn:
    """A real connection whose statements that write fail as SQLite does on a full disk."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, sql: str, *a: Any) -> Any:
        if not sql.lstrip().upper().startswith(("SELECT", "PRAGMA QUICK_CHECK")):
            exc = sqlite3.OperationalError("database or disk is full")
            exc.sqlite_errorcode = 13  # type: ignore[attr-defined]
            exc.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
            raise exc
        return self.real.execute(sql, *a)

    def commit(self) -> None:
        self.real.commit()

    def rollback(self) -> None:
        self.real.rollback()

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("mode", MODES)
def test_disk_full_at_open_is_a_warning_and_keeps_the_cache(
        mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "c.sqlite"
    _seed(db, mode)
    before = db.read_bytes()
    real_connect = sqlite3.connect
    monkeypatch.setattr(cache_mod.sqlite3, "connect", lambda *a, **k: _FullDiskConn(real_connect(*a, **k)))
    with caplog.at_level(logging.WARNING):
        c = ResponseCache(db, journal_mode=mode)  # never raises
    assert c.moved_aside is None and _aside(db) == [] and db.read_bytes() == before
    assert c.unavailable is not None and "disk is full" in c.unavailable
    assert "disk is full" in caplog.text and "corrupt" not in caplog.text
    assert c.put("k2", {"v": 2}) is False and c.get("mine") is None  # uncached, not failed
    monkeypatch.undo()
    assert _keys(db) == {"mine"}
    assert ResponseCache(db, journal_mode=mode).get("mine") == {"v": 1}


@pytest.fixture()
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (needs the right to mount; skipped where there is none)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)  # lazy: an open handle must not block it


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", MODES)
def test_a_really_full_disk_keeps_every_committed_row(
        mode: str, small_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = small_fs / "c.sqlite"
    c = ResponseCache(db, journal_mode=mode)
    for i in range(20):
        assert c.put(f"k{i}", {"v": "x" * 2000})
    c.close()
    _fill(small_fs / "filler")
    with caplog.at_level(logging.WARNING):
        full = ResponseCache(db, journal_mode=mode)  # never raises, never moves the file
        stored = full.put("new", {"v": "y" * 200_000})
    assert stored is False and full.moved_aside is None and _aside(db) == []
    assert "corrupt" not in caplog.text and ("full" in caplog.text or "disk" in caplog.text)
    full.close()
    (small_fs / "filler").unlink()
    assert _keys(db) >= {f"k{i}" for i in range(20)}  # every committed row is still there
    assert ResponseCache(db, journal_mode=mode).get("k19") == {"v": "x" * 2000}


@pytest.mark.parametrize("mode", MODES)
def test_only_a_failed_integrity_check_moves_the_file_aside(mode: str, tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    c = ResponseCache(db, journal_mode=mode)
    for i in range(200):
        c.put(f"k{i}", {"v": "y" * 500})
    c.close()
    raw = bytearray(db.read_bytes())
    raw[2 * 4096 + 100: 2 * 4096 + 400] = b"\xff" * 300  # smash a b-tree page, keep the header
    db.write_bytes(bytes(raw))
    c2 = ResponseCache(db, journal_mode=mode)
    assert c2.moved_aside is not None and _aside(db) == [c2.moved_aside] and len(c2) == 0
    assert c2.unavailable is None and c2.put("k", {"v": 1}) and c2.get("k") == {"v": 1}
    # a file that is no SQLite database at all is not a damaged cache but someone else's file: refused
    # and left as it is, never moved aside (issue 44, finding 3)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(NotOurs, match="not an SQLite database"):
        ResponseCache(junk, journal_mode=mode)
    assert junk.read_bytes() == b"not a database at all" * 100 and not _aside(junk)


def test_an_uncached_cache_is_reopened_once_the_lock_is_gone(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    _seed(db, "DELETE")
    go = tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(go)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        c = ResponseCache(db, journal_mode="DELETE", busy_timeout_s=0.1, reopen_after_s=0.0)
        assert c.unavailable is not None and "SQLITE_BUSY" in c.unavailable  # the open itself was blocked
        go.touch()
        assert holder.stdout.readline().strip() == "committed"
    finally:
        go.touch()
        holder.wait(timeout=30)
    assert c.put("later", {"v": 5}) and c.unavailable is None  # reopened on the next use
    assert _keys(db) == {"mine", "theirs", "later"}
