"""``medrobust query`` output cannot drive the terminal or break a table (issue 44, finding 12): control
characters in a value are shown escaped, a line break in Markdown is ``<br>``; ``--out`` never writes
into the results folder; ``report --mart`` on a file that is no mart is exit 2 in one line."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from medrobust_cli import app

runner = CliRunner()
SQL = "select 'a' || chr(27) || '[31mred' as v, 'line1' || chr(10) || 'line2|x' as w"


@pytest.fixture()
def mart(tmp_path: Path) -> Path:
    p = tmp_path / "m.duckdb"
    con = duckdb.connect(str(p))
    con.execute("create table clean_samples (x integer)")
    con.close()
    return p


def test_table_output_escapes_control_characters(mart: Path) -> None:
    res = runner.invoke(app, ["query", "--mart", str(mart), SQL])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "a\\x1b[31mred" in res.output
    assert "line1\\nline2|x" in res.output


def test_markdown_keeps_one_row_per_record(mart: Path) -> None:
    res = runner.invoke(app, ["query", "--mart", str(mart), "--format", "markdown", SQL])
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.output.splitlines() if ln.startswith("|")]
    assert len(rows) == 3  # header, rule, one record
    assert "line1<br>line2\\|x" in rows[2] and "\x1b" not in res.output


def test_out_refuses_the_results_folder(mart: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDROBUST_HOME", str(tmp_path))
    chunk = tmp_path / "var" / "results" / "segmentation_results" / "x.parquet"
    chunk.parent.mkdir(parents=True)
    chunk.write_bytes(b"PAR1 pretend chunk")
    res = runner.invoke(app, ["query", "--mart", str(mart), "--out", str(chunk), "select 1 as x"])
    assert res.exit_code != 0 and "inside the results folder" in res.output
    assert chunk.read_bytes() == b"PAR1 pretend chunk"


def test_report_on_a_file_that_is_no_mart_is_exit_2(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# hello\n")
    res = runner.invoke(app, ["report", "--mart", str(readme), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 2 and "is not a DuckDB mart" in res.output and "internal error" not in res.output
