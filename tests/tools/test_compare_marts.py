"""tools/compare_marts.py on two small marts built here."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.tools.tool_loader import load_tool


def _tool():  # type: ignore[no-untyped-def]
    return load_tool("compare_marts")


def _mart(path: Path, rows: list[tuple[str, str, int, float]], extra: str = "") -> Path:
    con = duckdb.connect(str(path))
    con.execute(f"create table segmentation_results (model varchar, sample_id varchar, level bigint, iou double{extra})")
    for r in rows:
        con.execute("insert into segmentation_results (model, sample_id, level, iou) values (?, ?, ?, ?)", r)
    con.execute("create view v as select model, avg(iou) from segmentation_results group by all")
    con.close()
    return path


ROWS = [("m", "a", 1, 0.5), ("m", "b", 2, 0.25), ("n", "a", 1, 1.0)]


def test_identical_marts_match(tmp_path: Path) -> None:
    tool = _tool()
    a, b = _mart(tmp_path / "a.duckdb", ROWS), _mart(tmp_path / "b.duckdb", list(reversed(ROWS)))
    assert tool.compare(a, b) == [("segmentation_results", True, "match")]
    assert tool.main([str(a), str(b)]) == 0


@pytest.mark.parametrize("change, expected", [
    ([("m", "a", 1, 0.5), ("m", "b", 2, 0.25)], "rows 3 -> 2"),
    ([("m", "a", 1, 0.5), ("m", "c", 2, 0.25), ("n", "a", 1, 1.0)], "1 only old, 1 only new"),
    ([("m", "a", 1, 0.5), ("m", "b", 2, 0.26), ("n", "a", 1, 1.0)], "sum(iou) 1.75 -> 1.76"),
])
def test_differences_are_named(tmp_path: Path, change: list[tuple[str, str, int, float]], expected: str) -> None:
    tool = _tool()
    a, b = _mart(tmp_path / "a.duckdb", ROWS), _mart(tmp_path / "b.duckdb", change)
    [(table, ok, text)] = tool.compare(a, b)
    assert table == "segmentation_results" and not ok and expected in text
    assert tool.main([str(a), str(b)]) == 1


def test_extra_column_is_listed_not_failed(tmp_path: Path) -> None:
    tool = _tool()
    a, b = _mart(tmp_path / "a.duckdb", ROWS), _mart(tmp_path / "b.duckdb", ROWS, ", rel_drop double")
    [(_, ok, text)] = tool.compare(a, b)
    assert ok and "columns on one side only: rel_drop" in text
    assert tool.main([str(a), str(tmp_path / "missing.duckdb")]) == 2


def test_views_compare_a_changed_definition_over_equal_tables(tmp_path: Path) -> None:
    tool = _tool()
    a, b = _mart(tmp_path / "a.duckdb", ROWS), _mart(tmp_path / "b.duckdb", ROWS)
    assert tool.compare(a, b, views=True) == [("v", True, "match")]
    con = duckdb.connect(str(b))
    con.execute("create or replace view v as select model, avg(iou) + 0.5 as \"avg(iou)\" from segmentation_results group by all")
    con.execute("create view added as select 1 as one")
    con.close()
    rows = dict((t, (ok, text)) for t, ok, text in tool.compare(a, b, views=True))
    assert rows["added"] == (True, "only in new")  # a new view is listed, not failed
    assert not rows["v"][0] and "sum(" in rows["v"][1]
    assert tool.compare(a, b) == [("segmentation_results", True, "match")]  # the tables are still equal
    assert tool.main([str(a), str(b), "--views"]) == 1
