from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly


def test_chunks_are_atomic_fingerprinted_and_finalized(tmp_path: Path) -> None:
    part = {"modality": "ct", "level": 2}
    p1 = results.chunk_path(tmp_path, "t", part, "a")
    p2 = results.chunk_path(tmp_path, "t", part, "b")
    results.write_chunk(p1, [{"x": 1, "modality": "ct"}], "fp1")
    results.write_chunk(p2, [{"x": 2}], "fp2")
    assert results.chunk_is_current(p1, "fp1") and not results.chunk_is_current(p1, "other")
    # rewriting replaces, never appends
    results.write_chunk(p1, [{"x": 10}, {"x": 11}], "fp1b")
    df = results.read_partition(tmp_path, "t", part)
    assert sorted(df["x"]) == [2, 10, 11] and set(df["level"]) == {2}
    (p1.parent / ".a.parquet.123.tmp").write_bytes(b"partial")  # a killed writer's leftover
    removed = results.finalize_partition(tmp_path, "t", part, ["a"])
    assert {p.name for p in removed} == {"b.parquet", ".a.parquet.123.tmp"}
    assert sorted(results.read_partition(tmp_path, "t", part)["x"]) == [10, 11]
    with pytest.raises(ValueError, match="unsafe"):
        results.partition_dir(tmp_path, "t", {"modality": "../etc"})


def test_read_partition_decodes_unchanged_chunks_once_and_returns_fresh_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = {"modality": "ct", "level": 4}
    p1 = results.chunk_path(tmp_path, "t", part, "a")
    results.write_chunk(p1, [{"x": 1, "s": "u"}, {"x": 2, "s": "v"}], "fp1")
    first = results.read_partition(tmp_path, "t", part)
    decoded: list[Path] = []
    real = results.pq.read_table
    monkeypatch.setattr(results.pq, "read_table", lambda path, *a, **k: decoded.append(path) or real(path, *a, **k))
    first.loc[0, "x"] = 99  # a caller changing its frame does not change the next read
    first.loc[1, "s"] = "changed"
    again = results.read_partition(tmp_path, "t", part)
    assert decoded == []  # served from the cache
    assert list(again["x"]) == [1, 2] and list(again["s"]) == ["u", "v"] and set(again["level"]) == {4}
    results.write_chunk(p1, [{"x": 7, "s": "w"}], "fp2")  # replaced: read again
    assert list(results.read_partition(tmp_path, "t", part)["x"]) == [7]
    assert decoded == [p1]
    monkeypatch.setattr(results, "CHUNK_CACHE_BYTES", 0)  # nothing fits: every read decodes
    results._CHUNKS.clear()
    results.read_partition(tmp_path, "t", part)
    results.read_partition(tmp_path, "t", part)
    assert decoded == [p1, p1, p1] and not results._CHUNKS


def test_mart_has_every_table_and_view_even_without_data(tmp_path: Path) -> None:
    mart = tmp_path / "m.duckdb"
    counts = build_mart(tmp_path / "results", mart)
    assert counts == {"clean_samples": 0, "perturbation_manifest": 0, "dataset_info": 0, "segmentation_results": 0,
                      "segmentation_instances": 0, "segmentation_examples": 0,
                      "taxonomy_screening_stats": 0,
                      "segmentation_stats": 0, "vlm_results": 0, "vlm_stats": 0, "taxonomy_results": 0,
                      "taxonomy_quadrant_stats": 0, "taxonomy_correlation_stats": 0,
                      "taxonomy_paraphrases": 0, "strategy_ranking_stats": 0, "partition_completeness": 0}
    con = connect_readonly(mart)
    try:
        assert con.execute("select count(*) from perturbation_summary").fetchall() == [(0,)]
        with pytest.raises(duckdb.Error):
            con.execute("create table x (a int)")  # read-only
    finally:
        con.close()


def test_mart_reads_hive_partitions(tmp_path: Path) -> None:
    res = tmp_path / "results"
    for lv in (1, 2):
        p = results.chunk_path(res, "perturbation_manifest", {"modality": "mri", "level": lv}, "ds__noise")
        results.write_chunk(p, [{"sample_id": "a", "dataset": "ds", "perturbation": "noise", "ssim": 0.9 - lv / 10,
                                 "strength": lv * 0.1, "band_reached": True, "status": "ok", "n_ssim_evals": 2}], "fp")
    build_mart(res, tmp_path / "m.duckdb")
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        rows = con.execute("select modality, level, n, band_hit_rate from perturbation_summary order by level").fetchall()
    finally:
        con.close()
    assert rows == [("mri", 1, 1, 1.0), ("mri", 2, 1, 1.0)]


def test_perturbation_summary_counts_not_applicable_apart_from_errors(tmp_path: Path) -> None:
    res = tmp_path / "results"
    rows = [{"sample_id": sid, "dataset": "ds", "perturbation": "saturation", "ssim": 0.9, "strength": 0.1,
             "band_reached": status == "ok", "status": status, "n_ssim_evals": 2}
            for sid, status in (("a", "ok"), ("b", "not_applicable"), ("c", "not_applicable"), ("d", "error"))]
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "dermoscopy", "level": 1},
                                           "ds__saturation"), rows, "fp")
    build_mart(res, tmp_path / "m.duckdb")
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        got = con.execute("select n, n_error, n_not_applicable, band_hit_rate from perturbation_summary").fetchall()
    finally:
        con.close()
    assert got == [(4, 1, 2, 1.0)]  # a type that does not apply to a sample is no failure
