"""Which existing files and folders are the project's own, so that it never replaces or deletes one it
did not create (issue 44, finding 3).

An output path a suite names (its mart, its API response cache, its demo root) may already exist.
It is the project's own when it has the format only the project writes there: a DuckDB database
holding the mart's ``clean_samples`` table, an SQLite file holding the response cache's
``responses`` table (or a damaged SQLite file, which the cache moves aside as before), a demo
folder carrying the demo's stamp. Anything else (the suite file itself, a README, a mask, a
user's own database or folders) is refused in one line, in ``validate`` too. Plain Python: the
checks read a few header bytes; the mart's table check opens the database read-only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"
DUCKDB_MAGIC = b"DUCK"
"""DuckDB's magic bytes, at offset 8 of the file (after the header checksum)."""


class NotOurs(ValueError):
    """An output path that exists and was not written by the project: refused, nothing changed."""


def _head(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def _refuse(what: str, path: Path, why: str) -> NotOurs:
    return NotOurs(f"{what} {path} already exists and medrobust did not create it ({why}): refusing to replace it; "
                   f"choose another path, or move the file away")


def check_mart_target(path: str | Path) -> None:
    """None when ``path`` does not exist or holds a mart (a DuckDB database with the
    ``clean_samples`` table); else :class:`NotOurs`."""
    p = Path(path)
    if not p.exists():
        return
    if not p.is_file():
        raise _refuse("mart_path", p, "not a file")
    if p.stat().st_size == 0:
        raise _refuse("mart_path", p, "an empty file")
    if _head(p, 12)[8:12] != DUCKDB_MAGIC:
        raise _refuse("mart_path", p, "not a DuckDB database")
    import duckdb

    try:
        con = duckdb.connect(str(p), read_only=True)
        try:
            found = con.execute("select count(*) from information_schema.tables "
                                "where table_name = 'clean_samples'").fetchall()[0][0]
        finally:
            con.close()
    except duckdb.Error as exc:
        raise _refuse("mart_path", p, f"a DuckDB database that cannot be read: {type(exc).__name__}") from None
    if not found:
        raise _refuse("mart_path", p, "a DuckDB database without the mart's tables")


def check_cache_target(path: str | Path) -> None:
    """None when ``path`` does not exist, is empty, or is an SQLite file that is the response cache
    (its ``responses`` table, or no table yet) or too damaged to tell (the cache moves such a file
    aside and keeps it); else :class:`NotOurs` (not SQLite, or another SQLite database)."""
    p = Path(path)
    if not p.exists():
        return
    if not p.is_file():
        raise _refuse("api.cache_path", p, "not a file")
    if p.stat().st_size == 0:
        return
    if _head(p, 16) != SQLITE_MAGIC:
        raise _refuse("api.cache_path", p, "not an SQLite database")
    try:
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return  # a damaged cache: ResponseCache moves it aside (kept) and starts afresh
    if tables and "responses" not in tables:
        raise _refuse("api.cache_path", p, f"an SQLite database with other tables: {', '.join(sorted(tables))}")


def check_demo_root(root: str | Path, own_names: Iterable[str], stamp_name: str) -> None:
    """None when the demo may write ``root``: it does not exist, holds none of the demo's own
    entries (``own_names``), or carries the demo's stamp (``stamp_name``: it built them); else
    :class:`NotOurs` naming the entries it would delete."""
    p = Path(root)
    if not p.is_dir() or (p / stamp_name).is_file():
        return
    clash = sorted(n for n in set(own_names) if (p / n).exists())
    if clash:
        raise NotOurs(f"demo.root {p} holds {', '.join(clash)}, which the demo did not build (no {stamp_name}): "
                      "refusing to delete them; point demo.root at an empty folder or at one the demo built")
