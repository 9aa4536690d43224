"""Result chunks verify: Parquet page checksums are written, and every chunk carries a SHA-256 of
its decoded content that the mart build (and :func:`results.read_partition`) checks. A flipped byte
anywhere in a chunk either stops the build with a message naming the table, the file and the
partition, or leaves the mart identical (a byte nothing reads): never a silently changed value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MartBuildError, build_mart

ROW = {"model": "sam", "strategy": "pretrained", "dataset": "ds", "condition": "perturbation",
       "perturbation": "noise", "status": "ok"}
PART = {"modality": "ct", "level": 2}


def _rows(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [{**ROW, "sample_id": f"s{i:03d}", "iou": float(rng.random()), "dice": float(rng.random())}
            for i in range(n)]


def _mart_rows(mart: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        return con.execute("select sample_id, iou, dice, status from segmentation_results order by all").fetchall()
    finally:
        con.close()


@pytest.fixture()
def chunk(tmp_path: Path) -> tuple[Path, Path]:
    res = tmp_path / "results"
    p = results.chunk_path(res, "segmentation_results", PART, "ds")
    results.write_chunk(p, _rows(200), "fp")
    return res, p


def test_chunks_carry_page_checksums_and_a_content_hash(chunk: tuple[Path, Path]) -> None:
    _, p = chunk
    meta = pq.read_metadata(p)
    assert results.CONTENT_HASH_KEY in (meta.metadata or {})
    results.verify_chunk(p)  # a sound chunk verifies
    col = meta.row_group(0).column(meta.schema.names.index("iou"))
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(p.read_bytes())
    raw[start + col.total_compressed_size - 8] ^= 0x01  # a value byte at the end of the iou pages
    p.write_bytes(bytes(raw))
    plain = pq.read_table(p).column("iou").to_pylist()  # without verification: a changed value
    assert plain != [r["iou"] for r in _rows(200)]
    with pytest.raises(OSError, match="(?i)crc|checksum"):  # the page CRC catches it
        pq.read_table(p, page_checksum_verification=True)
    with pytest.raises(results.CorruptChunkError, match="segmentation_results"):
        results.verify_chunk(p)


def test_a_flipped_byte_at_50_offsets_never_changes_the_mart_silently(
        chunk: tuple[Path, Path], tmp_path: Path) -> None:
    res, p = chunk
    good = p.read_bytes()
    mart = tmp_path / "marts.duckdb"
    build_mart(res, mart)
    expected = _mart_rows(mart)
    assert len(expected) == 200
    offsets = np.linspace(4, len(good) - 5, 50).astype(int)  # spread over pages, page headers and footer
    caught = same = 0
    for off in offsets:
        bad = bytearray(good)
        bad[off] ^= 0xFF
        p.write_bytes(bytes(bad))
        results._CHUNKS.clear()
        try:
            build_mart(res, mart)
        except MartBuildError as e:
            msg = str(e)
            assert "'segmentation_results'" in msg and str(p) in msg and "modality=ct, level=2" in msg, (off, msg)
            assert _mart_rows(mart) == expected  # the previous mart is kept
            caught += 1
            continue
        assert _mart_rows(mart) == expected, f"flip at offset {off} changed the mart silently"
        same += 1
    p.write_bytes(good)
    print(f"flips caught {caught}, harmless {same}")
    assert caught + same == 50 and caught >= 40  # nearly every byte of a chunk is read and verified


def test_a_flipped_data_byte_is_refused_by_read_partition(chunk: tuple[Path, Path]) -> None:
    res, p = chunk
    raw = bytearray(p.read_bytes())
    raw[200] ^= 0x01  # inside the first data page
    p.write_bytes(bytes(raw))
    results._CHUNKS.clear()
    with pytest.raises(results.CorruptChunkError) as e:
        results.read_partition(res, "segmentation_results", PART)
    assert str(p) in str(e.value) and "modality=ct, level=2" in str(e.value)


def test_a_chunk_without_a_content_hash_is_not_current(chunk: tuple[Path, Path]) -> None:
    _, p = chunk
    t = pq.read_table(p)
    meta = dict(t.schema.metadata or {})
    meta.pop(results.CONTENT_HASH_KEY, None)
    pq.write_table(t.replace_schema_metadata(meta), p)  # as written by an older version
    assert results.read_chunk_fingerprint(p) == "fp"
    assert not results.chunk_is_current(p, "fp")  # so a resumed run rewrites it with a hash


def test_a_damaged_chunks_rows_are_recomputed_not_reused(tmp_path: Path) -> None:
    from medrobust_lib.store.rerun import reusable_rows

    part = {"model": "m"}
    p = results.chunk_path(tmp_path, "scratch_table", part, "ds")
    rows = [{"sample_id": f"s{i}", "outcome": "ok", "score": i / 7} for i in range(50)]
    results.write_chunk(p, rows, "fp")
    cols, key = ["sample_id", "outcome", "score", "model"], ["sample_id"]
    assert len(reusable_rows(str(tmp_path), "scratch_table", part, "fp", cols, key)) == 50
    col = pq.read_metadata(p).row_group(0).column(2)  # score
    raw = bytearray(p.read_bytes())
    raw[(col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size - 4] ^= 0x10
    p.write_bytes(bytes(raw))
    assert reusable_rows(str(tmp_path), "scratch_table", part, "fp", cols, key) == {}


def test_the_content_hash_ignores_what_lies_under_nulls_and_the_chunk_layout(tmp_path: Path) -> None:
    import pyarrow as pa

    # all-null and partly null columns: Arrow leaves the bytes under a null slot undefined, and
    # the Parquet reader fills them differently from pandas; the hash must not see them
    rows = [{**ROW, "sample_id": f"s{i}", "iou": None if i % 3 else i / 10, "dice": None,
             "status": None if i == 2 else "ok"} for i in range(30)]
    p = results.chunk_path(tmp_path, "segmentation_results", PART, "nulls")
    results.write_chunk(p, rows, "fp")
    results.verify_chunk(p)  # written and read back: the same hash
    t = pq.read_table(p)
    rechunked = pa.concat_tables([t.slice(0, 7), t.slice(7, 11), t.slice(18)])
    assert results.content_hash(rechunked) == results.content_hash(t)
    changed = t.set_column(t.schema.get_field_index("iou"), "iou",
                           pa.array([None if i % 3 else i / 10 + (i == 3) for i in range(30)], pa.float64()))
    assert results.content_hash(changed) != results.content_hash(t)
