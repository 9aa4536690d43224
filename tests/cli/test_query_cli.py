"""``medrobust query``: --out with the format from --format or the extension; refusals exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart

runner = CliRunner()

SQL = "select sample_id, level, iou, error from segmentation_results order by sample_id"


@pytest.fixture()
def mart(tmp_path: Path) -> Path:
    p = results.chunk_path(tmp_path / "results", "segmentation_results", {"modality": "mri", "level": 2}, "c")
    results.write_chunk(p, [
        {"model": "sam", "sample_id": "a", "condition": "perturbation", "perturbation": "noise", "iou": 0.75,
         "status": "ok"},
        {"model": "sam", "sample_id": "b", "condition": "perturbation", "perturbation": "noise", "iou": None,
         "status": "error", "error": "boom"},
    ], "fp")
    out = tmp_path / "m.duckdb"
    build_mart(tmp_path / "results", out)
    return out


def _query(mart: Path, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["query", *args, "--mart", str(mart)])
    return res.exit_code, res.stdout, res.stderr


EXPECTED = [{"sample_id": "a", "level": 2, "iou": 0.75, "error": None},
            {"sample_id": "b", "level": 2, "iou": None, "error": "boom"}]


@pytest.mark.parametrize("ext", ["csv", "parquet", "json"])
def test_out_takes_the_format_from_the_extension(mart: Path, tmp_path: Path, ext: str) -> None:
    out = tmp_path / "o" / f"result.{ext}"
    code, stdout, stderr = _query(mart, SQL, "--out", str(out))
    assert code == 0, stderr
    assert stdout == "" and f"wrote 2 rows to {out} ({ext})" in stderr
    con = duckdb.connect()
    try:
        reader = {"csv": "read_csv", "parquet": "read_parquet", "json": "read_json"}[ext]
        back = con.execute(f"select * from {reader}('{out.as_posix()}') order by sample_id").df()
    finally:
        con.close()
    assert back.astype(object).where(back.notna(), None).to_dict("records") == EXPECTED


def test_format_option_overrides_the_extension(mart: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.txt"
    code, _, stderr = _query(mart, SQL, "--format", "json", "--out", str(out))
    assert code == 0, stderr
    assert json.loads(out.read_text()) == EXPECTED
    # the old spelling still works, and parquet lands as parquet whatever the name
    out2 = tmp_path / "result.bin"
    code, _, stderr = _query(mart, SQL, "-f", "parquet", "--output", str(out2))
    assert code == 0, stderr
    assert pd.read_parquet(out2)["sample_id"].tolist() == ["a", "b"]


def test_unknown_extension_without_format_exits_2_and_writes_nothing(mart: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.txt"
    code, _, stderr = _query(mart, SQL, "--out", str(out))
    assert code == 2 and ".csv, .parquet, .json" in stderr
    assert not out.exists()


def test_without_out_it_prints(mart: Path) -> None:
    code, stdout, _ = _query(mart, SQL, "--format", "json")
    assert code == 0 and json.loads(stdout) == EXPECTED
    code, stdout, _ = _query(mart, "select sample_id from segmentation_results order by 1", "-f", "csv")
    assert code == 0 and stdout.split() == ["sample_id", "a", "b"]
    code, stdout, _ = _query(mart, "select count(*) as n from segmentation_results")
    assert code == 0 and stdout.split() == ["n", "2"]
    code, _, stderr = _query(mart, SQL, "--format", "parquet")
    assert code == 2 and "--out" in stderr


@pytest.mark.parametrize("sql", [
    "copy (select * from segmentation_results) to '{leak}'",
    "export database '{leak}'",
    "delete from segmentation_results",
    "attach '{leak}' as other",
    "set threads = 1",
    "pragma enable_profiling",
    "explain analyze copy (select 1) to '{leak}'",
    "select 1; copy (select 1) to '{leak}'",
])
def test_statements_that_write_are_refused_with_exit_2(mart: Path, tmp_path: Path, sql: str) -> None:
    leak = tmp_path / "leak.csv"
    out = tmp_path / "result.csv"
    before = mart.read_bytes()
    code, stdout, stderr = _query(mart, sql.format(leak=leak.as_posix()), "--out", str(out))
    assert code == 2
    assert "refused" in stderr and ("read-only" in stderr or "one statement at a time" in stderr)
    assert stdout == ""
    assert not leak.exists() and not out.exists()
    assert mart.read_bytes() == before


def test_bad_sql_and_a_missing_mart_exit_2_with_one_line(mart: Path, tmp_path: Path) -> None:
    code, _, stderr = _query(mart, "select nope from segmentation_results")
    assert code == 2 and stderr.startswith("error: query failed: Binder Error") and stderr.count("\n") == 1
    code, _, stderr = _query(mart, "selec 1")
    assert code == 2 and stderr.startswith("error: query failed: Parser Error") and stderr.count("\n") == 1
    code, _, stderr = _query(tmp_path / "none.duckdb", "select 1")
    assert code == 2 and "medrobust demo" in stderr
