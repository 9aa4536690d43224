"""Tidy result tables as hive-partitioned Parquet, written idempotently.

Layout: ``<results_dir>/<table>/<key>=<value>/.../<chunk>.parquet``. A partition is a folder; a
chunk is one file in it, written to a temporary name and renamed into place, so a reader (or a
killed run) only ever sees whole chunks. Each chunk records a fingerprint of its inputs in the
Parquet metadata (:func:`medrobust_lib.hashing.digest` of a track's inputs,
:mod:`medrobust_lib.tracks.partition`): a resumed run skips chunks whose fingerprint matches and recomputes the rest,
and :func:`finalize_partition` removes chunks that are no longer expected. Re-running a partition
therefore never duplicates or loses rows.

Integrity: chunks are written with Parquet page checksums (CRC-32 of every data and dictionary
page) and carry a SHA-256 of their decoded content (:func:`content_hash`) in the file metadata.
:func:`verify_chunk` reads a chunk with page-checksum verification and compares the hash; the mart
build and :func:`read_partition` verify every chunk before using it, so a flipped byte is a
:class:`CorruptChunkError` naming the table, the file and the partition, never a changed value. A
chunk without the hash (written by an older version) is not current, so a resumed run rewrites it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medrobust_lib.lru import LRU, FileStamp, file_stamp
from medrobust_lib.store.schema import conform, table_columns

FINGERPRINT_KEY = b"medrobust.fingerprint"
CONTENT_HASH_KEY = b"medrobust.content_sha256"
"""File-metadata key of the SHA-256 of a chunk's decoded content (see :func:`content_hash`)."""
TABLE_KEY = b"medrobust.table"
"""File-metadata key of the declared table a chunk was written for: the mart refuses a chunk found
under another table's folder (a valid file copied there would add rows of NULLs)."""
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def partition_dir(results_dir: str | Path, table: str, partition: Mapping[str, object]) -> Path:
    """Folder of one partition, e.g. ``results/perturbation_manifest/modality=ct/level=3``."""
    parts = [f"{k}={_safe(str(v))}" for k, v in partition.items()]
    return Path(results_dir, _safe(table), *parts)


def _safe(name: str) -> str:
    if not _SAFE.match(name):
        raise ValueError(f"unsafe name for a path component: {name!r}")
    return name


def chunk_path(results_dir: str | Path, table: str, partition: Mapping[str, object], chunk: str) -> Path:
    return partition_dir(results_dir, table, partition) / f"{_safe(chunk)}.parquet"


def read_chunk_fingerprint(path: Path) -> str | None:
    """The fingerprint stored in a chunk, or None if the file is missing or unreadable."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return None
    fp = meta.get(FINGERPRINT_KEY)
    return fp.decode() if fp else None


def chunk_is_current(path: Path, fp: str) -> bool:
    """The chunk exists, carries fingerprint ``fp`` and a content hash (a chunk of an older version,
    without the hash, is rewritten)."""
    if not path.is_file():
        return False
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return False
    stored = meta.get(FINGERPRINT_KEY)
    return stored is not None and stored.decode(errors="replace") == fp and CONTENT_HASH_KEY in meta


def chunks_current(results_dir: str | Path, table: str, partition: Mapping[str, object], names: Iterable[str],
                   fp: str) -> bool:
    """A resumed run may reuse the partition: it holds exactly the chunks ``names`` (at least one;
    no other chunk, no missing one) and each is current for ``fp`` (:func:`chunk_is_current`).
    Only the file metadata is read; the caller reads the rows with :func:`read_partition`, which
    verifies them (a corrupt chunk is then a :class:`CorruptChunkError`, and the partition is
    computed again)."""
    wanted = set(names)
    folder = partition_dir(results_dir, table, partition)
    if not wanted or not folder.is_dir():
        return False
    present = {f.stem for f in folder.glob("*.parquet")}
    return present == wanted and all(chunk_is_current(folder / f"{n}.parquet", fp) for n in sorted(wanted))


class CorruptChunkError(OSError):
    """A result chunk failed its page checksums or its content hash, or does not parse. The message
    names the table, the file and the partition."""


def content_hash(table: pa.Table) -> str:
    """SHA-256 hex of a table's content: column names, types, which values are null and the
    values themselves (what lies under a null slot is undefined in Arrow and is not hashed), so the
    same data hashes the same before writing and after reading back, whatever the chunk layout."""
    h = hashlib.sha256()
    arrays: list[pa.Array] = []
    for field, col in zip(table.schema, table.columns, strict=True):
        h.update(json.dumps([field.name, str(field.type)]).encode())
        arrays.extend(_canonical(col))
    if arrays:
        canon = pa.Table.from_arrays(arrays, names=[str(i) for i in range(len(arrays))])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, canon.schema) as writer:
            if canon.num_rows:
                writer.write_table(canon)
        h.update(sink.getvalue().to_pybytes())
    h.update(str(table.num_rows).encode())
    return h.hexdigest()


def _canonical(col: pa.ChunkedArray) -> list[pa.Array]:
    """``[null flags as int8, values with nulls filled]`` for a column (both fully defined), or the
    values as JSON text for a type without a fill value (nested types)."""
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    nulls = pc.cast(pc.is_null(arr), pa.int8())
    t = arr.type
    fill: Any
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        fill = ""
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        fill = b""
    elif pa.types.is_boolean(t):
        fill = False
    elif pa.types.is_floating(t):
        fill = 0.0
    elif pa.types.is_integer(t) or pa.types.is_temporal(t):
        fill = 0
    else:
        text = [json.dumps(v, sort_keys=True, default=str) for v in arr.to_pylist()]
        return [nulls, pa.array(text, pa.string())]
    values = pc.fill_null(arr, pa.scalar(fill, type=t)) if arr.null_count else arr
    return [nulls, values]


def _where(path: Path) -> str:
    """``table 'x', partition k=v, ...: chunk <path>`` for messages."""
    parts: list[str] = []
    for comp in reversed(path.parent.parts):  # the trailing key=value folders
        if "=" not in comp:
            break
        parts.insert(0, comp)
    anchor = path.parents[len(parts)] if len(parts) < len(path.parents) else path.parent
    part = ", ".join(parts) or "(unpartitioned)"
    return f"table {anchor.name!r}, partition {part}: chunk {path}"


def verify_chunk(path: Path) -> pa.Table:
    """Read a chunk with Parquet page-checksum verification and check its content hash; returns
    the table. Raises :class:`CorruptChunkError` (naming table, file and partition) on a checksum
    or hash mismatch, an unparsable file or a missing hash."""
    try:
        table = pq.read_table(path, page_checksum_verification=True)
        stored = (table.schema.metadata or {}).get(CONTENT_HASH_KEY)
        actual = content_hash(table)
    except FileNotFoundError:
        raise
    except Exception as exc:  # pyarrow raises many types (OSError, ArrowInvalid, UnicodeDecodeError) on damage
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CorruptChunkError(f"{_where(path)} is unreadable ({type(exc).__name__}: {reason})") from None
    if stored is None:
        raise CorruptChunkError(f"{_where(path)} carries no content hash (damaged, or written by an "
                                "older version); re-materialise the partition")
    if stored.decode(errors="replace") != actual:
        raise CorruptChunkError(f"{_where(path)} fails its content hash (stored "
                                f"{stored.decode(errors='replace')[:16]}..., actual {actual[:16]}...)")
    return table


def write_chunk(path: Path, rows: Sequence[Mapping[str, Any]] | pd.DataFrame, fp: str,
                columns: Sequence[str] | None = None, schema: pa.Schema | None = None) -> int:
    """Atomically write one chunk (temp file, fsync, rename, fsync of the folder). Partition
    columns are not stored in the file (they are in the folder names). Returns the number of rows.

    On any failure (disk full, an interrupt) the temporary file is removed, the previous chunk at
    ``path`` (if any) is untouched, and an ``OSError`` names the chunk and the cause."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=list(columns) if columns else None)
    partition_cols = {p.split("=", 1)[0] for p in path.parent.parts if "=" in p}
    df = _utf8_safe(df.drop(columns=[c for c in df.columns if c in partition_cols]))
    table_name = next((p.name for p in path.parents if table_columns(p.name) is not None), None)
    if schema is None and table_name is not None:  # the declared schema, so no chunk types a column null
        df, schema = conform(df, table_name)
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    meta = {**(table.schema.metadata or {}), FINGERPRINT_KEY: fp.encode(), CONTENT_HASH_KEY: content_hash(table).encode()}
    if table_name is not None:
        meta[TABLE_KEY] = table_name.encode()
    table = table.replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, write_page_checksum=True)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write result chunk {path} ({exc.strerror or exc}); "
                                 "the previous chunk, if any, is kept") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return len(df)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with surrogates in its string cells replaced by U+FFFD: Parquet stores UTF-8, which
    cannot hold a lone surrogate (an API answer may), and one such cell would fail the whole chunk.
    The trackers flag the answers they changed themselves; this is the last line of defence."""
    out = df
    for col in df.columns:
        if df[col].dtype != object:
            continue
        bad = [i for i, v in enumerate(df[col].array) if isinstance(v, str) and _SURROGATE.search(v)]
        if bad:
            if out is df:
                out = df.copy()
            values = out[col].to_numpy(dtype=object, copy=True)
            for i in bad:
                values[i] = _SURROGATE.sub("\ufffd", values[i])
            out[col] = values
    return out


def _fsync(path: Path) -> None:
    """fsync a file or a folder (a folder fsync that the file system refuses is ignored)."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def finalize_partition(results_dir: str | Path, table: str, partition: Mapping[str, object],
                       expected_chunks: Iterable[str]) -> list[Path]:
    """Remove chunk files (and stray temp files) that are not in ``expected_chunks``; returns
    the removed paths."""
    folder = partition_dir(results_dir, table, partition)
    keep = {f"{c}.parquet" for c in expected_chunks}
    removed = []
    if folder.is_dir():
        for f in folder.iterdir():
            if f.is_file() and f.name not in keep:
                f.unlink()
                removed.append(f)
    return removed


CHUNK_CACHE_BYTES = 256 << 20
"""Bytes of decoded chunks :func:`read_partition` keeps per process (least recently used dropped
first): a process that reads a partition again (every model of a manifest partition, the clean
index of each evaluation) decodes its unchanged chunks once."""
_CHUNKS: LRU[str, tuple[FileStamp, pd.DataFrame]] = LRU(max_bytes=lambda: CHUNK_CACHE_BYTES,
                                                      name="store.result_chunks")


def _read_chunk(path: Path) -> pd.DataFrame:
    """One chunk file as a frame, verified (:func:`verify_chunk`) and decoded once while the file stays the same
    (:func:`medrobust_lib.lru.file_stamp`). The returned frame is the cached one: callers must
    not change it."""
    stamp = file_stamp(path)
    hit = _CHUNKS.get(stamp[0])
    if hit is not None and hit[0] == stamp:
        return hit[1]
    table = verify_chunk(path)
    df = table.to_pandas()
    _CHUNKS.put(stamp[0], (stamp, df), int(table.nbytes))  # Arrow's size: counts the strings
    return df


def read_partition(results_dir: str | Path, table: str, partition: Mapping[str, object]) -> pd.DataFrame:
    """All chunks of one partition, with the partition columns added back. A new frame on every
    call (the caller may change it); unchanged chunks are decoded once per process."""
    folder = partition_dir(results_dir, table, partition)
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return pd.DataFrame()
    frames = [_read_chunk(f) for f in files]
    # concat of one frame shares its memory (pandas 2): copy, so the cached chunk stays unchanged
    df = frames[0].copy() if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    columns: dict[str, Any] = {str(k): v for k, v in partition.items()}
    for k, v in columns.items():
        df[k] = v
    return df


def read_table(results_dir: str | Path, table: str) -> pd.DataFrame:
    """A whole hive-partitioned table (every partition), or an empty frame."""
    root = Path(results_dir, table)
    if not root.is_dir() or not any(root.rglob("*.parquet")):
        return pd.DataFrame()
    import duckdb

    glob = str(root / "**" / "*.parquet")
    con = duckdb.connect()
    try:
        return con.execute(
            "select * from read_parquet(?, hive_partitioning = true, union_by_name = true)", [glob]
        ).df()
    finally:
        con.close()


def write_rows_by_dataset(results_dir: str | Path, table: str, partition: Mapping[str, object],
                          rows: Sequence[Mapping[str, Any]], fp: str, columns: Sequence[str],
                          sort_key: Any = None) -> None:
    """Write a partition's rows as one chunk per ``dataset`` value (sorted by ``sort_key`` when
    given) and remove the partition's chunks of datasets that no longer have rows."""
    by_ds: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_ds.setdefault(str(r["dataset"]), []).append(r)
    for ds, rs in by_ds.items():
        if sort_key is not None:
            rs.sort(key=sort_key)
        write_chunk(chunk_path(results_dir, table, partition, ds), rs, fp, columns=columns)
    finalize_partition(results_dir, table, partition, list(by_ds))


def write_per_key(results_dir: str | Path, table: str, df: pd.DataFrame, key: str, fp: str,
                  chunk: str = "stats") -> list[str]:
    """Write ``df`` as one chunk per value of column ``key`` (folder ``<key>=<value>``) and remove
    the folders of values that are gone. Returns the values written."""
    values = sorted(str(v) for v in df[key].unique()) if len(df) else []
    for v in values:
        write_chunk(chunk_path(results_dir, table, {key: v}, chunk), df[df[key].astype(str) == v], fp)
    root = Path(results_dir, table)
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and d.name.removeprefix(f"{key}=") not in values:
                for f in d.iterdir():
                    f.unlink()
                d.rmdir()
    return values
