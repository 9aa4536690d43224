"""The DuckDB mart: tables copied from the Parquet results (declared in
:mod:`medrobust_lib.store.schema`) plus every view registered in :mod:`medrobust_lib.store.views`.

The mart is rebuilt as a whole by one writer (the mart asset) into a temporary file that then
replaces ``marts.duckdb`` atomically, so readers never see a half-built database and partitions
never write it concurrently. Tables whose Parquet folder is missing are created empty with their
declared columns, so every view always exists.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import duckdb

from medrobust_lib.ownership import check_mart_target
from medrobust_lib.processes import pid_alive
from medrobust_lib.store.completeness import (
    COMPLETENESS_COLUMNS,
    COMPLETENESS_TABLE,
    DEFAULT_MAX_ERROR_SHARE,
    PARTITION_KEYS,
    error_share_sql,
)
from medrobust_lib.store.results import TABLE_KEY, CorruptChunkError, verify_chunk
from medrobust_lib.store.schema import MART_TABLES, MartTable
from medrobust_lib.store.views import MART_VIEWS, mart_views
from medrobust_lib.store.writer_lock import suite_writer_lock


class MartBuildError(RuntimeError):
    """The mart could not be rebuilt; the previous ``marts.duckdb`` is untouched. The message names
    the table and, for an unreadable chunk, the file and the partition to re-materialise."""


def build_mart(results_dir: str | Path, mart_path: str | Path,
               max_error_share: float = DEFAULT_MAX_ERROR_SHARE, include_off_band: bool = False) -> dict[str, int]:
    """Rebuild the mart from Parquet; returns row counts per table. ``max_error_share`` (the
    suite setting) decides which partitions ``partition_completeness`` marks complete;
    ``include_off_band`` (the suite's ``perturbations.include_off_band``) keeps rows whose perturbed
    output missed its SSIM band in the level means
    (:func:`medrobust_lib.store.views.mart_views`).

    Crash safety: the new mart is built in ``.<name>.<pid>.<uuid>.tmp`` next to the old one,
    fsynced, renamed over it (atomic on POSIX) and the folder fsynced, so a reader sees the old
    mart or the new one, never a mixture, and a power cut after the return keeps the new one. On any
    failure (disk full, a corrupt chunk, an interrupt) the temporary file is removed and the old
    mart stays; a temporary file left by a killed build (its process gone) is removed by the next
    build. A chunk that cannot be read, or fails its page checksums or content hash
    (:func:`medrobust_lib.store.results.verify_chunk`), raises :class:`MartBuildError` naming the
    table, the file and its partition. The build holds the suite's writer lock
    (:func:`medrobust_lib.store.writer_lock.suite_writer_lock`; :class:`SuiteBusyError` when another
    process writes the results).
    """
    if "?" in str(mart_path):
        raise MartBuildError(f"mart not rebuilt: its path {str(mart_path)!r} holds '?', which DuckDB reads as the "
                             "start of connection options; choose a mart_path without '?'")
    with suite_writer_lock(results_dir):  # one writer per suite (re-entrant inside medrobust run)
        return _build_mart(results_dir, mart_path, max_error_share, include_off_band)


def _build_mart(results_dir: str | Path, mart_path: str | Path, max_error_share: float,
                include_off_band: bool = False) -> dict[str, int]:
    mart = Path(mart_path)
    check_mart_target(mart)  # NotOurs: never replace a file that is not a mart (issue 44, finding 3)
    mart.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temps(mart)
    tmp = mart.with_name(f".{mart.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    counts: dict[str, int] = {}
    try:
        con = duckdb.connect(str(tmp))
        try:
            for t in MART_TABLES:
                cols = ", ".join(f"{c} {typ}" for c, typ in t.columns)
                con.execute(f"create table {t.name} ({cols})")
                folder = Path(results_dir, t.name)
                files = sorted(f.as_posix() for f in folder.rglob("*.parquet")) if folder.is_dir() else []
                if files:
                    _verify_chunks(t.name, folder)
                    names = ", ".join(c for c, _ in t.columns)
                    # the chunk files as a bound parameter: no character of a path (', ", a space,
                    # glob characters) is ever read as SQL or as a pattern
                    src = "read_parquet(?, hive_partitioning = true, union_by_name = true)"
                    try:
                        con.execute(f"insert into {t.name} ({names}) select {_select_list(con, src, t, files)} "
                                    f"from {src}", [files])
                    except duckdb.Error as exc:
                        raise _chunk_error(t.name, folder, exc) from None
                if t.name == COMPLETENESS_TABLE:
                    _fill_completeness(con, max_error_share)
                counts[t.name] = int(con.execute(f"select count(*) from {t.name}").fetchall()[0][0])
                desc = t.description.replace("'", "''")
                con.execute(f"comment on table {t.name} is '{desc}'")
            for name, sql in mart_views(include_off_band).items():
                con.execute(f"create view {name} as {sql}")
            con.execute("checkpoint")
        finally:
            con.close()
        _fsync_file(tmp)
        os.replace(tmp, mart)
        _fsync_dir(mart.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for side in (tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + ".tmp")):
            if side.is_file():
                side.unlink(missing_ok=True)
    return counts


def _verify_chunks(table: str, folder: Path) -> None:
    """Page checksums and content hash of every chunk of ``table`` (one chunk in memory at a time)
    before DuckDB reads them; :class:`MartBuildError` naming table, file and partition."""
    for f in sorted(folder.rglob("*.parquet")):
        try:
            chunk = verify_chunk(f)
        except CorruptChunkError as exc:
            raise MartBuildError(f"mart not rebuilt (the previous one is kept): {exc}; re-materialise that "
                                 f"partition of the asset that writes {table!r} (or delete the file), then "
                                 "rebuild the mart") from None
        written_for = (chunk.schema.metadata or {}).get(TABLE_KEY)
        if written_for is not None and written_for.decode(errors="replace") != table:
            raise MartBuildError(f"mart not rebuilt (the previous one is kept): chunk {f} was written for table "
                                 f"{written_for.decode(errors='replace')!r}, not {table!r} (a file copied into the "
                                 "wrong folder); move or delete it, then rebuild the mart")


def _chunk_error(table: str, folder: Path, exc: duckdb.Error) -> MartBuildError:
    """Find the first chunk of ``table`` DuckDB cannot read and name it with its partition."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    probe = duckdb.connect()
    try:
        for f in sorted(folder.rglob("*.parquet")):
            try:
                probe.execute("select count(*) from read_parquet(?)", [f.as_posix()]).fetchall()
            except duckdb.Error as bad:
                rel = f.relative_to(folder)
                part = ", ".join(p for p in rel.parent.parts if "=" in p) or "(unpartitioned)"
                reason = (str(bad).strip().splitlines() or [type(bad).__name__])[0]
                return MartBuildError(
                    f"mart not rebuilt (the previous one is kept): table {table!r}, partition {part}: "
                    f"chunk {f} is unreadable ({reason}); re-materialise that partition of the asset that "
                    f"writes {table!r} (or delete the file), then rebuild the mart")
    finally:
        probe.close()
    return MartBuildError(f"mart not rebuilt (the previous one is kept): table {table!r} from {folder}: {first}")


def _remove_orphaned_temps(mart: Path) -> None:
    """Remove ``.<mart>.<pid>.<uuid>.tmp`` files whose building process no longer exists."""
    for f in mart.parent.glob(f".{mart.name}.*.tmp*"):
        parts = f.name[len(mart.name) + 2:].split(".")
        pid = int(parts[0]) if parts and parts[0].isdigit() else None
        if pid is not None and pid != os.getpid() and pid_alive(pid):
            continue  # another build is running (should not happen: one writer), leave it
        if pid == os.getpid():
            continue
        f.unlink(missing_ok=True)



def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # platforms without directory fds
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)
def _fill_completeness(con: duckdb.DuckDBPyConnection, max_error_share: float) -> None:
    """Rows of ``partition_completeness`` from the results tables loaded so far (it is declared
    after them)."""
    names = ", ".join(c for c, _ in COMPLETENESS_COLUMNS)
    for table in PARTITION_KEYS:
        con.execute(f"insert into {COMPLETENESS_TABLE} ({names}) {error_share_sql(table, table, max_error_share)}")


def _select_list(con: duckdb.DuckDBPyConnection, src: str, t: MartTable, files: list[str]) -> str:
    """Cast each declared column; a column missing from the files becomes NULL. ``src`` reads the
    ``files`` bound as its one parameter."""
    desc = con.execute(f"select * from {src} limit 0", [files]).description or []
    present = {d[0] for d in desc}
    return ", ".join(f"cast({c} as {typ})" if c in present else f"cast(null as {typ})" for c, typ in t.columns)


def connect_readonly(mart_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection; raises FileNotFoundError naming the command that builds the mart."""
    p = Path(mart_path)
    if not p.is_file():
        raise FileNotFoundError(f"no mart at {p}: build it with `medrobust run --suite SUITE.yaml` (your suite; "
                                "then pass --suite) or `medrobust demo` (the demo's)")
    try:
        return duckdb.connect(str(p), read_only=True)
    except duckdb.IOException as exc:  # README.md given as --mart: bad input (exit 2), not an internal error
        raise ValueError(f"{p} is not a DuckDB mart ({str(exc).splitlines()[0]})") from None


__all__ = ["MART_TABLES", "MART_VIEWS", "MartBuildError", "build_mart", "connect_readonly", "mart_views"]
