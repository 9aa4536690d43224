"""Read-only SQL over the mart: the parser check, run_query and write_frame round trips."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart
from medrobust_lib.store.query import (
    QueryRefused,
    check_read_only,
    frame_to_json,
    infer_format,
    run_query,
    write_frame,
)

ROWS = [
    {"model": "sam", "strategy": "pretrained", "dataset": "ds", "sample_id": "a", "condition": "perturbation",
     "perturbation": "noise", "iou": 0.5, "dice": 0.25, "iou_drop": 0.125, "status": "ok"},
    {"model": "sam", "strategy": "pretrained", "dataset": "ds", "sample_id": "b", "condition": "perturbation",
     "perturbation": "noise", "iou": None, "dice": None, "iou_drop": None, "status": "error", "error": "boom"},
]

# Every column kind the CLI writes, NULLs included: integer, double, text, boolean, timestamp.
ROUND_TRIP_SQL = """
    select sample_id, level, iou, error, status = 'ok' as ok,
           case when status = 'ok' then timestamp '2024-01-02 03:04:05.123456' end as ts
    from segmentation_results order by sample_id"""


@pytest.fixture()
def mart(tmp_path: Path) -> Path:
    p = results.chunk_path(tmp_path / "results", "segmentation_results", {"modality": "ct", "level": 3}, "c")
    results.write_chunk(p, ROWS, "fp")
    out = tmp_path / "m.duckdb"
    build_mart(tmp_path / "results", out)
    return out


REFUSED = {
    "INSERT": "insert into segmentation_results (model) values ('x')",
    "INSERT_RETURNING": "insert into segmentation_results (model) select 'x' returning *",
    "UPDATE": "update segmentation_results set iou = 1",
    "DELETE": "delete from segmentation_results",
    "MERGE_INTO": "merge into t using s on (t.a = s.a) when matched then delete",
    "CREATE": "create table x as select 1 as a",
    "CREATE_VIEW": "create view v as select 1",
    "CREATE_MACRO": "create macro m() as 1",
    "DROP": "drop table segmentation_results",
    "ALTER": "alter table segmentation_results add column x int",
    "COPY_TO": "copy (select 1) to 'out.csv'",
    "COPY_TABLE_TO": "copy segmentation_results to 'out.parquet' (format parquet)",
    "COPY_FROM": "copy segmentation_results from 'in.csv'",
    "COPY_DATABASE": "copy from database a to b",
    "EXPORT": "export database 'dump'",
    "ATTACH": "attach 'other.duckdb' as other",
    "DETACH": "detach other",
    "INSTALL": "install httpfs",
    "LOAD": "load httpfs",
    "SET": "set threads = 1",
    "RESET": "reset threads",
    "USE": "use memory",
    "CALL": "call checkpoint()",
    "CHECKPOINT": "checkpoint",
    "PRAGMA": "pragma enable_profiling",
    "PRAGMA_INFO": "pragma table_info('segmentation_results')",
    "BEGIN": "begin transaction",
    "VACUUM": "vacuum",
    "ANALYZE": "analyze",
    "PREPARE": "prepare p as select 1",
    "EXECUTE": "execute p",
    "UPDATE_EXTENSIONS": "update extensions",
    "EXPLAIN_ANALYZE_COPY": "explain analyze copy (select 1) to 'out.csv'",
    "EXPLAIN_OPTIONS_COPY": "explain (format json) copy (select 1) to 'out.csv'",
    "EXPLAIN_DELETE": "explain delete from segmentation_results",
    "COMMENTED_COPY": "-- looks harmless\n/* select */ copy (select 1) to 'out.csv'",
}


@pytest.mark.parametrize("sql", list(REFUSED.values()), ids=list(REFUSED))
def test_statements_that_write_or_change_state_are_refused(sql: str) -> None:
    with pytest.raises(QueryRefused, match="refused"):
        check_read_only(sql)


@pytest.mark.parametrize("sql", [
    "select 1; drop table segmentation_results",
    "select 1; select 2",
    "select 1;\ncopy (select 1) to 'out.csv'",
])
def test_several_statements_are_refused(sql: str) -> None:
    with pytest.raises(QueryRefused, match="one statement at a time"):
        check_read_only(sql)


@pytest.mark.parametrize("sql", ["", "  ", ";", "-- nothing"])
def test_no_statement_is_refused(sql: str) -> None:
    with pytest.raises(QueryRefused, match="no SQL statement"):
        check_read_only(sql)


def test_a_syntax_error_is_a_duckdb_error_not_a_refusal() -> None:
    with pytest.raises(duckdb.ParserException):
        check_read_only("selec 1")


ALLOWED = [
    "select count(*) from segmentation_results",
    "SELECT 1;",
    "select 'a;b' as s; -- trailing comment",
    "with ok as (select * from segmentation_results where status = 'ok') select model, avg(iou) from ok group by all",
    "from segmentation_results select model",
    "values (1, 'x')",
    "table segmentation_results",
    "select 1 union all select 2",
    "describe segmentation_results",
    "show tables",
    "summarize segmentation_results",
    "select * from segmentation_by_level",
    "select * from pragma_table_info('segmentation_results')",
    "-- a comment\n/* another */ select 1",
    "explain select * from segmentation_results",
    "EXPLAIN ANALYZE select count(*) from segmentation_results",
    "explain (format json) select 1",
    "explain (select 1)",
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_read_only_statements_are_allowed_and_run(mart: Path, sql: str) -> None:
    check_read_only(sql)
    assert isinstance(run_query(mart, sql), pd.DataFrame)


def test_refusal_happens_before_anything_runs(mart: Path, tmp_path: Path) -> None:
    target = tmp_path / "leak.csv"
    with pytest.raises(QueryRefused):
        run_query(mart, f"copy (select * from segmentation_results) to '{target.as_posix()}'")
    assert not target.exists()
    # refused before connecting: no mart needed to be told no
    with pytest.raises(QueryRefused):
        run_query(tmp_path / "missing.duckdb", "drop table segmentation_results")
    with pytest.raises(FileNotFoundError, match="medrobust demo"):
        run_query(tmp_path / "missing.duckdb", "select 1")


def test_run_query_returns_the_rows(mart: Path) -> None:
    df = run_query(mart, "select sample_id, level, iou from segmentation_results order by sample_id")
    assert df["sample_id"].tolist() == ["a", "b"]
    assert df["level"].tolist() == [3, 3]
    assert df["iou"].iloc[0] == 0.5 and math.isnan(df["iou"].iloc[1])


def _duckdb_rows(mart: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_round_trip_equals_the_duckdb_result(mart: Path, tmp_path: Path, fmt: str) -> None:
    expected = _duckdb_rows(mart, ROUND_TRIP_SQL)
    assert expected[1][2] is None and expected[1][5] is None  # the NULLs are really there
    df = run_query(mart, ROUND_TRIP_SQL)
    out = write_frame(df, tmp_path / "sub" / f"r.{fmt}")
    assert out == tmp_path / "sub" / f"r.{fmt}" and out.is_file()
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left behind
    if fmt == "json":
        records = json.loads(out.read_text())
        assert records == [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in zip(df.columns, row, strict=True)}
            for row in expected]
        assert records[1]["ts"] is None and records[0]["ts"] == "2024-01-02T03:04:05.123456"
    else:
        reader = "read_csv" if fmt == "csv" else "read_parquet"
        con = duckdb.connect()
        try:
            back = con.execute(f"select * from {reader}('{out.as_posix()}')").fetchall()
        finally:
            con.close()
        assert back == expected
    if fmt == "parquet":
        pd.testing.assert_frame_equal(pd.read_parquet(out), df)


def test_format_comes_from_the_extension_or_is_named(tmp_path: Path) -> None:
    df = pd.DataFrame({"a": [1, 2]})
    assert infer_format("x/r.CSV") == "csv" and infer_format(Path("r.parquet")) == "parquet"
    with pytest.raises(ValueError, match=r"\.csv, \.parquet, \.json"):
        infer_format("r.txt")
    with pytest.raises(ValueError, match="--format"):
        write_frame(df, tmp_path / "r.txt")
    assert not (tmp_path / "r.txt").exists()
    out = write_frame(df, tmp_path / "r.txt", "json")
    assert json.loads(out.read_text()) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match="valid: csv, parquet, json"):
        write_frame(df, tmp_path / "r.csv", "xlsx")


def test_json_of_an_empty_result_is_an_empty_array() -> None:
    assert json.loads(frame_to_json(pd.DataFrame({"a": pd.Series([], dtype="float64")}))) == []
