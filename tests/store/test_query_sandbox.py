"""The query sandbox: statements the parser labels SELECT still cannot read or write files.

Each hostile statement is run through ``medrobust query`` (exit 2, one line on stderr, no file
written) and through :func:`run_query`; the mart's own views keep working on the same connection.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_VIEWS, build_mart
from medrobust_lib.store.query import SANDBOX_CONFIG, QueryRefused, connect_sandboxed, run_query

runner = CliRunner()


@pytest.fixture()
def mart(tmp_path: Path) -> Path:
    p = results.chunk_path(tmp_path / "results", "segmentation_results", {"modality": "ct", "level": 3}, "c")
    results.write_chunk(p, [
        {"model": "sam", "strategy": "pretrained", "dataset": "ds", "sample_id": "a", "condition": "perturbation",
         "perturbation": "noise", "iou": 0.5, "dice": 0.25, "iou_drop": 0.125, "dice_drop": 0.1, "status": "ok"},
    ], "fp")
    out = tmp_path / "mart" / "m.duckdb"
    build_mart(tmp_path / "results", out)
    return out


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "outside" / "secret.csv"
    f.parent.mkdir()
    f.write_text("token\nhunter2\n")
    return f


def _hostile(secret: Path, target: Path) -> dict[str, str]:
    s, t = secret.as_posix(), target.as_posix()
    return {
        "cte_copy": f"WITH x AS (COPY (SELECT 42 AS a) TO '{t}') SELECT 1",
        "explain_analyze_cte_copy": f"EXPLAIN ANALYZE WITH x AS (COPY (SELECT 42 AS a) TO '{t}') SELECT 1",
        "explain_analyze_copy": f"EXPLAIN ANALYZE COPY (SELECT 42 AS a) TO '{t}'",
        "read_text": f"select * from read_text('{s}')",
        "read_csv": f"select * from read_csv('{s}')",
        "read_blob": f"select * from read_blob('{s}')",
        "glob": f"select * from glob('{secret.parent.as_posix()}/*')",
        "read_parquet": f"select * from read_parquet('{s}')",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "set": "SET enable_external_access = true",
        "set_in_select": "select set_config('enable_external_access', 'true')",
        "attach": f"ATTACH '{t}.duckdb' AS other",
        "copy": f"COPY (select 1) TO '{t}'",
        "export": f"EXPORT DATABASE '{t}.d'",
    }


def test_every_hostile_statement_exits_2_with_one_line_and_writes_nothing(
        mart: Path, secret: Path, tmp_path: Path) -> None:
    target = tmp_path / "written.csv"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for name, sql in _hostile(secret, target).items():
        res = runner.invoke(app, ["query", sql, "--mart", str(mart)])
        assert res.exit_code == 2, (name, res.exit_code, res.stdout, res.stderr, res.exception)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, res.stderr)
        assert "hunter2" not in res.stdout + res.stderr, name
        assert "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written anywhere


@pytest.mark.parametrize("name", ["cte_copy", "explain_analyze_cte_copy", "read_text", "read_csv", "read_blob",
                                  "glob", "read_parquet"])
def test_statements_labelled_select_are_stopped_by_the_connection(
        mart: Path, secret: Path, tmp_path: Path, name: str) -> None:
    sql = _hostile(secret, tmp_path / "w.csv")[name]
    with pytest.raises(QueryRefused, match="refused by the sandbox: Permission Error"):
        run_query(mart, sql)
    assert not (tmp_path / "w.csv").exists()


def test_the_unsandboxed_engine_would_have_written_the_file(tmp_path: Path) -> None:
    # The CTE COPY is not a parser-check artefact: a default DuckDB connection really writes the file,
    # so the sandbox test above guards something real.
    target = tmp_path / "w.csv"
    con = duckdb.connect()
    try:
        con.execute(f"WITH x AS (COPY (SELECT 42 AS a) TO '{target.as_posix()}') SELECT 1").fetchall()
    finally:
        con.close()
    assert target.read_text().split() == ["a", "42"]


def test_settings_are_locked_on_the_query_connection(mart: Path) -> None:
    con = connect_sandboxed(mart)
    try:
        got = dict(con.execute(
            "select name, value from duckdb_settings() where name in "
            "('enable_external_access', 'autoload_known_extensions', 'autoinstall_known_extensions', "
            "'allow_community_extensions', 'lock_configuration')").fetchall())
        assert got == {k: str(v).lower() for k, v in SANDBOX_CONFIG.items()}
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("set enable_external_access = true")
    finally:
        con.close()


@pytest.mark.parametrize("view", sorted(MART_VIEWS))
def test_every_mart_view_works_inside_the_sandbox(mart: Path, view: str) -> None:
    df = run_query(mart, f"select * from {view}")
    assert list(df.columns)  # the view resolves and runs without external access


def test_views_return_the_mart_rows_in_the_sandbox(mart: Path) -> None:
    df = run_query(mart, "select model, perturbation, level, n, iou from segmentation_by_level")
    assert df.to_dict("records") == [{"model": "sam", "perturbation": "noise", "level": 3, "n": 1, "iou": 0.5}]
