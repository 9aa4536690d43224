"""One home for the mart's views (medrobust_lib.store.views) and one floor rule.

- every view is registered once, in its track's module, and the mart has exactly the registered views;
- the floor rule has one definition (``SEGMENTATION_FLOOR_SQL``): the Python callers run it through
  ``dataset_floors`` and get the mart's ``segmentation_floor`` answer on the same rows (known answers
  from the hand-made rows of tests/store/test_floor_views.py);
- a view shown in the report is one declarative entry (``report.entries.view_table``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from medrobust_lib.report.entries import REPORT_TABLES, ReportSettings, build_tables, view_table
from medrobust_lib.report.table import Column
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.views import MART_VIEWS, VIEW_MODULES, mart_views, registered_views, view
from medrobust_lib.store.views.common import dataset_floors
from medrobust_lib.tracks.finetune.ranking import without_floor
from medrobust_lib.tracks.segmentation.stats import floor_datasets
from tests.store.test_floor_views import seg_rows


@pytest.fixture(scope="module")
def mart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("views")
    res = root / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), seg_rows(), "fp")
    build_mart(res, root / "marts.duckdb")
    return root / "marts.duckdb"


def test_every_view_is_registered_once_in_its_track_module() -> None:
    names = [v.name for v in registered_views()]
    assert len(names) == len(set(names))
    assert names == list(MART_VIEWS) == [v.name for m in VIEW_MODULES for v in m.VIEWS]
    assert all(v.doc.strip() for v in registered_views())
    assert view("segmentation_model_summary").sql() == MART_VIEWS["segmentation_model_summary"]
    with pytest.raises(KeyError, match="segmentation_floor"):
        view("no_such_view")


def test_off_band_setting_changes_only_the_views_that_follow_it() -> None:
    default, inc = mart_views(False), mart_views(True)
    assert list(default) == list(inc)
    changed = {n for n in default if default[n] != inc[n]}
    assert {"vlm_by_level", "segmentation_by_level", "segmentation_summary", "segmentation_model_summary",
            "segmentation_level_means_all"} <= changed
    assert not changed & {"perturbation_summary", "strategy_ranking", "segmentation_by_modality", "vlm_floor"}


def test_mart_has_exactly_the_registered_views(mart: Path) -> None:
    con = connect_readonly(mart)
    try:
        got = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
    finally:
        con.close()
    assert got == set(MART_VIEWS)


def test_floor_rule_in_python_is_the_marts_sql(mart: Path) -> None:
    rows = seg_rows()
    fl = dataset_floors(rows).set_index(["model", "dataset"])
    # known answers: m/low (clean IoU 0.05) and z/low (0.0) are at the floor; z has nothing else
    assert fl["floor"].to_dict() == {("lv", "good"): False, ("m", "good"): False, ("m", "low"): True,
                                     ("z", "low"): True}
    assert fl["all_floor"].to_dict() == {("lv", "good"): False, ("m", "good"): False, ("m", "low"): False,
                                         ("z", "low"): True}
    con = connect_readonly(mart)
    try:
        view_rows = con.execute("select model, dataset, floor_effect from segmentation_floor").df()
    finally:
        con.close()
    assert view_rows.set_index(["model", "dataset"])["floor_effect"].to_dict() == fl["floor"].to_dict()
    # both Python callers follow it: the ranking leaves m/low out and keeps z (every dataset at the floor)
    kept, info = without_floor(rows)
    assert set(zip(kept["model"], kept["dataset"], strict=True)) == {("m", "good"), ("z", "low"), ("lv", "good")}
    assert info == {"lv": (0, False), "m": (1, False), "z": (0, True)}
    seg = floor_datasets(rows).set_index(["model", "dataset"])["floor_effect"]
    assert seg.to_dict() == fl["floor"].to_dict()


def test_floor_rule_keys_with_missing_values_and_non_text_types() -> None:
    rows = seg_rows()
    rows["checkpoint"] = None
    rows.loc[rows["model"] == "m", "strategy"] = float("nan")
    fl = dataset_floors(rows)
    assert fl["checkpoint"].isna().all()
    kept, info = without_floor(rows)
    assert info["m"] == (1, False) and len(kept) == len(rows) - 3  # the three rows of m/low


def test_a_view_shown_in_the_report_is_one_entry(mart: Path) -> None:
    """What a new view needs in the report: one ``view_table`` entry (here for the existing
    ``segmentation_coverage`` view), which the report's table loop builds like the declared ones."""
    entry = view_table("coverage", "segmentation", "segmentation_coverage", "What each model covers",
                       (Column("Model", "model"), Column("Levels", "levels"), Column("Floor", "n_floor_datasets", "int")),
                       order_by="model")
    con = connect_readonly(mart)
    try:
        settings = ReportSettings(con)
        tables, skipped = build_tables(settings, {"segmentation": ["m", "z"]}, [entry])
        assert skipped == {}
        (table,) = tables
        assert table.name == "coverage" and list(table.data["model"]) == ["m", "z"]
        assert list(table.data["n_floor_datasets"]) == [1, 1] and list(table.data["levels"]) == ["2", "2"]
        # an unknown relation or an empty selection is a reason, not an error
        missing = view_table("x", "segmentation", "no_such_view", "x", ())
        _, why = build_tables(settings, {"segmentation": None}, [missing])
        assert why == {"x": "the mart has no no_such_view view"}
        _, why = build_tables(settings, {"segmentation": []}, [entry])
        assert why == {"coverage": "none of the selected models is in the segmentation track"}
    finally:
        con.close()
    assert [e.name for e in REPORT_TABLES] == [
        "real_labels", "real_model_worst_types", "segmentation_summary", "segmentation_by_level", "modality_share",
        "iou_dice_agreement", "mce", "strategy_ranking", "vlm_task_drops", "taxonomy_quadrants",
        "taxonomy_correlation", "taxonomy_screening"]


def test_report_summary_reads_the_view(mart: Path) -> None:
    """The report's segmentation summary is the ``segmentation_model_summary`` view, filtered."""
    from medrobust_lib.report.paper_tables import segmentation_summary

    con = connect_readonly(mart)
    try:
        table = segmentation_summary(con, ["m"])
        view_df = con.execute("select * from segmentation_model_summary where model = 'm'").df()
    finally:
        con.close()
    assert not isinstance(table, str)
    pd.testing.assert_frame_equal(table.data[list(view_df.columns)].reset_index(drop=True),
                                  view_df.astype({c: "int64" for c in table.data.columns
                                                  if str(table.data[c].dtype) == "int64"}))
    # m: the floor dataset 'low' is left out; blur drops 0.2 and 0.1, noise 0.1 and 0.3 -> 0.175
    assert table.data["corruption_iou_drop"].iloc[0] == pytest.approx(0.175)
    assert table.data["n_floor_datasets"].iloc[0] == 1
