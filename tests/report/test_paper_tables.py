"""Captions of the paper tables name what the rows cover."""

from __future__ import annotations

import duckdb
import pytest

from medrobust_lib.report.paper_tables import _vlm_levels, where_in


@pytest.mark.parametrize(("levels", "text"), [([0, 2, 4], "levels 2, 4"), ([0, 1, 2, 3, 4, 5], "levels 1-5"),
                                              ([0], "levels (none)")])
def test_vlm_caption_names_the_evaluated_levels(levels: list[int], text: str) -> None:
    con = duckdb.connect()
    con.execute("create table vlm_results (model varchar, level integer)")
    con.executemany("insert into vlm_results values (?, ?)", [("m", lv) for lv in levels] + [("other", 3)])
    where, params = where_in("model", ["m"])
    assert _vlm_levels(con, where, params) == text


def test_vlm_caption_without_results_table() -> None:
    where, params = where_in("model", None)
    assert _vlm_levels(duckdb.connect(), where, params) == "the evaluated levels"
