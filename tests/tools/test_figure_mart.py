"""tools/figure_mart.py builds a mart the report's table builders accept (it broke silently once
when the taxonomy and VLM schemas grew; this keeps it in step)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tests.tools.tool_loader import load_tool


def _tool():  # type: ignore[no-untyped-def]
    return load_tool("figure_mart")


def test_figure_mart_feeds_every_report_table(tmp_path: Path) -> None:
    from medrobust_lib.report import paper_tables as pt

    path = _tool().make_mart(tmp_path / "m.duckdb")
    con = duckdb.connect(str(path), read_only=True)
    try:
        built = {
            "segmentation_summary": pt.segmentation_summary(con, None),
            "segmentation_by_level": pt.segmentation_by_level(con, None),
            "strategy_ranking": pt.strategy_ranking(con, None),
            "vlm_task_drops": pt.vlm_task_drops(con, None),
            "taxonomy_quadrants": pt.taxonomy_quadrants(con, None),
        }
        for name, table in built.items():
            assert not isinstance(table, str), (name, table)
            assert len(table.data) > 0, name
        # the floor dataset (clean IoU near 0) is flagged, not averaged in
        summary = built["segmentation_summary"]
        assert not isinstance(summary, str)
        assert set(summary.data["n_floor_datasets"]) == {1}
        # the taxonomy quadrant shares of every (config, mode, condition) add up to 1
        quads = built["taxonomy_quadrants"]
        assert not isinstance(quads, str)
        sums = quads.data.groupby(["config", "image_mode", "condition"])["share"].sum()
        assert ((sums - 1.0).abs() < 1e-9).all()
    finally:
        con.close()
