"""Issue 44, finding 11: a results folder whose path holds ``'``, ``"``, a space or glob characters
builds the mart. Before, the path was pasted into ``read_parquet('...')`` and an apostrophe broke
every mart build ("unterminated string literal"); now every path reaches DuckDB as a bound
parameter (a list of the chunk files, so no character of the path is read as a glob either)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MartBuildError, build_mart, connect_readonly


@pytest.mark.parametrize("folder", ["it's a \"quoted\" dir", "o'brien's [glob]*?{x} dir", "semi; drop table x; --'"])
def test_a_results_dir_with_quotes_and_spaces_builds_the_mart_and_queries(tmp_path: Path, folder: str) -> None:
    res = tmp_path / folder / "results"
    for lv in (1, 2):
        p = results.chunk_path(res, "perturbation_manifest", {"modality": "mri", "level": lv}, "ds__noise")
        results.write_chunk(p, [{"sample_id": "a", "dataset": "ds", "perturbation": "noise", "ssim": 0.9 - lv / 10,
                                 "strength": lv * 0.1, "band_reached": True, "status": "ok", "n_ssim_evals": 2}], "fp")
    mart = tmp_path / "the \"mart's\" dir" / "m'art.duckdb"  # DuckDB reads a `?` in its own file's path as options
    counts = build_mart(res, mart)
    assert counts["perturbation_manifest"] == 2
    con = connect_readonly(mart)
    try:
        rows = con.execute("select modality, level, n, band_hit_rate from perturbation_summary order by level").fetchall()
    finally:
        con.close()
    assert rows == [("mri", 1, 1, 1.0), ("mri", 2, 1, 1.0)]


def test_an_unreadable_chunk_under_a_quoted_path_is_named(tmp_path: Path) -> None:
    """The probe that names a bad chunk binds its path too (it used to break on the quote itself)."""
    res = tmp_path / "it's here" / "results"
    p = results.chunk_path(res, "perturbation_manifest", {"modality": "mri", "level": 1}, "ds__noise")
    results.write_chunk(p, [{"sample_id": "a", "dataset": "ds", "perturbation": "noise", "ssim": 0.8,
                             "strength": 0.1, "band_reached": True, "status": "ok", "n_ssim_evals": 2}], "fp")
    from medrobust_lib.store import marts

    bad = p.with_name("zz.parquet")
    bad.write_bytes(b"PAR1 not parquet PAR1")
    err = marts._chunk_error("perturbation_manifest", res / "perturbation_manifest", Exception("x"))  # type: ignore[arg-type]
    assert isinstance(err, MartBuildError) and str(bad) in str(err) and "unreadable" in str(err)


def test_a_question_mark_in_the_mart_path_is_refused_in_one_line(tmp_path: Path) -> None:
    """DuckDB reads ``?`` in a database path as the start of connection options (its WAL file then
    lands elsewhere): refused up front, the previous mart untouched."""
    with pytest.raises(MartBuildError) as err:
        build_mart(tmp_path / "results", tmp_path / "what?" / "m.duckdb")
    assert "?" in str(err.value) and "\n" not in str(err.value)
