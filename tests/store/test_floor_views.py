"""The mart's averaging and ranking views leave floor datasets out by default and keep them in their
``_all`` companions; every row says what it covers. Known answers on hand-made result rows.

Model ``m`` (checkpoint ``ck``, strategy ``pretrained``) has two datasets at level 2 under the
corruptions ``blur`` and ``noise``: ``good`` (samples g0, g1) and ``low`` (sample f0, clean IoU 0.05 <
0.1: at the floor). Model ``z`` has only a floor dataset (kept, flagged, never ranked by default).
Model ``lv`` evaluates ``blur`` at level 2 and ``noise`` at level 4 (coverages that are not ranked
together).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, MART_VIEWS, build_mart, connect_readonly
from medrobust_lib.store.views.common import ALL_SUFFIX, FLOOR_NOTE, LEVELS_NOTE, LEVELS_NOTE_TAIL
from medrobust_lib.tracks.finetune.ranking import write_strategy_ranking

SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]
STATS_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_stats")]

# (model, dataset, sample) -> clean (IoU, Dice)
CLEAN: dict[tuple[str, str, str], tuple[float, float]] = {
    ("m", "good", "g0"): (0.8, 0.9), ("m", "good", "g1"): (0.6, 0.7), ("m", "low", "f0"): (0.05, 0.08),
    ("z", "low", "z0"): (0.0, 0.0),
    ("lv", "good", "g0"): (0.8, 0.9),
}
# (model, dataset, sample) -> {(type, level): perturbed (IoU, Dice)}
PERTURBED: dict[tuple[str, str, str], dict[tuple[str, int], tuple[float, float]]] = {
    # IoU drops: blur 0.2, noise 0.1; Dice drops: blur 0.1, noise 0.05
    ("m", "good", "g0"): {("blur", 2): (0.6, 0.8), ("noise", 2): (0.7, 0.85)},
    # IoU drops: blur 0.1, noise 0.3; Dice drops: blur 0.1, noise 0.3
    ("m", "good", "g1"): {("blur", 2): (0.5, 0.6), ("noise", 2): (0.3, 0.4)},
    # IoU drops: blur 0.0, noise 0.03; Dice drops: blur 0.0, noise 0.05 (at the floor: not informative)
    ("m", "low", "f0"): {("blur", 2): (0.05, 0.08), ("noise", 2): (0.02, 0.03)},
    ("z", "low", "z0"): {("blur", 2): (0.0, 0.0), ("noise", 2): (0.0, 0.0)},
    # IoU drops: blur 0.1 at level 2, noise 0.3 at level 4
    ("lv", "good", "g0"): {("blur", 2): (0.7, 0.8), ("noise", 4): (0.5, 0.6)},
}
STATS_CI = (0.01, 0.3)
"""The (made-up) IoU drop CI of ``segmentation_stats`` for (m, blur, 2): computed over every dataset."""


def _row(key: tuple[str, str, str], condition: str, perturbation: str, level: int, iou: float,
         dice: float) -> dict[str, Any]:
    model, dataset, sample = key
    ci, cd = CLEAN[key]
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    r.update(model=model, checkpoint="ck", strategy="pretrained", dataset=dataset, modality="ct", sample_id=sample,
             condition=condition, perturbation=perturbation, level=level, iou=iou, dice=dice, clean_iou=ci,
             clean_dice=cd, iou_drop=ci - iou, dice_drop=cd - dice, status="ok")
    return r


def seg_rows() -> pd.DataFrame:
    rows = [_row(k, "clean", "clean", 0, *v) for k, v in CLEAN.items()]
    rows += [_row(k, "perturbation", t, lv, *v) for k, per in PERTURBED.items() for (t, lv), v in per.items()]
    return pd.DataFrame(rows, columns=SEG_COLUMNS)


def _stats() -> pd.DataFrame:
    r: dict[str, Any] = dict.fromkeys(STATS_COLUMNS)
    r.update(model="m", checkpoint="ck", strategy="pretrained", condition="perturbation", perturbation="blur",
             level=2, n=3, iou_drop_ci_low=STATS_CI[0], iou_drop_ci_high=STATS_CI[1], wilcoxon_q=0.5)
    return pd.DataFrame([r], columns=STATS_COLUMNS)


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    root = tmp_path_factory.mktemp("floor")
    res = root / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), seg_rows(), "fp")
    results.write_chunk(results.chunk_path(res, "segmentation_stats", {"part": "x"}, "d"), _stats(), "fp")
    build_mart(res, root / "m.duckdb")
    c = connect_readonly(root / "m.duckdb")
    try:
        yield c
    finally:
        c.close()


def _df(con: duckdb.DuckDBPyConnection, sql: str) -> pd.DataFrame:
    return con.execute(sql).df()


def test_every_averaging_view_has_an_all_companion_with_the_same_columns(con: duckdb.DuckDBPyConnection) -> None:
    for view in ("segmentation_by_level", "segmentation_summary", "segmentation_top_corruptions",
                 "strategy_ranking"):
        assert view + ALL_SUFFIX in MART_VIEWS
        cols = list(_df(con, f"select * from {view} limit 0").columns)
        assert cols == list(_df(con, f"select * from {view}{ALL_SUFFIX} limit 0").columns)


def test_by_level_leaves_the_floor_dataset_out(con: duckdb.DuckDBPyConnection) -> None:
    r = _df(con, "select * from segmentation_by_level where model = 'm' and perturbation = 'blur'").iloc[0]
    # good only: IoU (0.6 + 0.5) / 2, drop (0.2 + 0.1) / 2, clean (0.8 + 0.6) / 2
    assert r["n"] == 2 and r["iou"] == pytest.approx(0.55) and r["iou_drop"] == pytest.approx(0.15)
    assert r["iou_rel_drop"] == pytest.approx(0.15 / 0.7) and r["dice_drop"] == pytest.approx(0.1)
    assert (r["n_datasets"], r["n_floor_excluded"], bool(r["floor_effect"])) == (1, 1, False)
    # the stats pool every dataset: not this row's mean, so left empty
    assert pd.isna(r["iou_drop_ci_low"]) and pd.isna(r["wilcoxon_q"])


def test_by_level_all_keeps_the_floor_dataset(con: duckdb.DuckDBPyConnection) -> None:
    r = _df(con, "select * from segmentation_by_level_all where model = 'm' and perturbation = 'blur'").iloc[0]
    # good and low: IoU (0.6 + 0.5 + 0.05) / 3, drop (0.2 + 0.1 + 0.0) / 3, clean (0.8 + 0.6 + 0.05) / 3
    assert r["n"] == 3 and r["iou"] == pytest.approx(1.15 / 3) and r["iou_drop"] == pytest.approx(0.1)
    assert r["iou_rel_drop"] == pytest.approx(0.1 / (1.45 / 3))
    assert (r["n_datasets"], r["n_floor_excluded"], bool(r["floor_effect"])) == (2, 0, False)
    assert (r["iou_drop_ci_low"], r["iou_drop_ci_high"]) == pytest.approx(STATS_CI)


def _summary(con: duckdb.DuckDBPyConnection, view: str, model: str) -> pd.DataFrame:
    return _df(con, f"select * from {view} where model = '{model}'").set_index("perturbation")


def test_summary_averages_without_the_floor_dataset(con: duckdb.DuckDBPyConnection) -> None:
    s = _summary(con, "segmentation_summary", "m")
    assert s.loc["Clean", "iou"] == pytest.approx((0.8 + 0.6) / 2) and s.loc["Clean", "n"] == 2
    assert s.loc["blur", "iou_drop"] == pytest.approx((0.2 + 0.1) / 2)
    assert s.loc["noise", "iou_drop"] == pytest.approx((0.1 + 0.3) / 2)
    assert s.loc["noise", "dice_drop"] == pytest.approx((0.05 + 0.3) / 2)
    # Avg and Delta: the mean over the two types of each type's mean drop
    avg_iou = ((0.2 + 0.1) / 2 + (0.1 + 0.3) / 2) / 2
    avg_dice = ((0.1 + 0.1) / 2 + (0.05 + 0.3) / 2) / 2
    assert s.loc["Avg", "iou_drop"] == pytest.approx(avg_iou) and s.loc["Avg", "dice_drop"] == pytest.approx(avg_dice)
    assert s.loc["Avg", "iou_rel_drop"] == pytest.approx(avg_iou / 0.7)
    assert s.loc["Delta", "iou"] == pytest.approx(avg_iou)
    assert list(s["levels"]) == ["0", "2", "2", "2", "2"]
    assert set(s["n_datasets"]) == {1} and set(s["n_floor_excluded"]) == {1} and not s["floor_effect"].any()


def test_summary_all_averages_with_the_floor_dataset(con: duckdb.DuckDBPyConnection) -> None:
    s = _summary(con, "segmentation_summary_all", "m")
    assert s.loc["Clean", "iou"] == pytest.approx((0.8 + 0.6 + 0.05) / 3) and s.loc["Clean", "n"] == 3
    blur, noise = (0.2 + 0.1 + 0.0) / 3, (0.1 + 0.3 + 0.03) / 3
    assert s.loc["blur", "iou_drop"] == pytest.approx(blur) and s.loc["noise", "iou_drop"] == pytest.approx(noise)
    assert s.loc["Avg", "iou_drop"] == pytest.approx((blur + noise) / 2)
    assert s.loc["Avg", "iou_rel_drop"] == pytest.approx((blur + noise) / 2 / ((0.8 + 0.6 + 0.05) / 3))
    assert s.loc["Avg", "dice_drop"] == pytest.approx(((0.1 + 0.1 + 0.0) / 3 + (0.05 + 0.3 + 0.05) / 3) / 2)
    assert set(s["n_datasets"]) == {2} and set(s["n_floor_excluded"]) == {0} and not s["floor_effect"].any()


def test_a_model_entirely_at_the_floor_is_kept_and_flagged(con: duckdb.DuckDBPyConnection) -> None:
    for view in ("segmentation_summary", "segmentation_summary_all"):
        z = _summary(con, view, "z")
        assert z.loc["Avg", "iou_drop"] == 0.0 and z["floor_effect"].all() and set(z["n_floor_excluded"]) == {0}
    cov = _df(con, "select model, n_floor_datasets, floor_effect from segmentation_coverage order by model")
    assert cov.values.tolist() == [["lv", 0, False], ["m", 1, False], ["z", 1, True]]


def test_top_corruptions_rank_without_floors_and_within_levels(con: duckdb.DuckDBPyConnection) -> None:
    t = _df(con, "select * from segmentation_top_corruptions")
    m = t[t["model"] == "m"].set_index("perturbation")
    # without the floor dataset noise (0.2) loses more than blur (0.15)
    assert m.loc["noise", "iou_drop"] == pytest.approx(0.2) and m.loc["blur", "iou_drop"] == pytest.approx(0.15)
    assert (m.loc["noise", "rank"], m.loc["blur", "rank"]) == (1, 2) and m["note"].isna().all()
    assert set(m["n_floor_excluded"]) == {1}
    z = t[t["model"] == "z"]
    assert z["rank"].isna().all() and set(z["note"]) == {FLOOR_NOTE} and z["floor_effect"].all()
    lv = t[t["model"] == "lv"].set_index("perturbation")
    # levels 2 and 4 are not ranked together: each is rank 1 of its own coverage, with a note
    assert list(lv.loc[["blur", "noise"], "rank"]) == [1, 1]
    assert lv.loc["noise", "note"] == LEVELS_NOTE + "4" + LEVELS_NOTE_TAIL
    a = _df(con, "select * from segmentation_top_corruptions_all")
    assert a[a["model"] == "z"]["rank"].notna().all() and a[a["model"] == "z"]["note"].isna().all()
    am = a[a["model"] == "m"].set_index("perturbation")
    assert am.loc["blur", "iou_drop"] == pytest.approx(0.1) and set(am["n_floor_excluded"]) == {0}


def test_strategy_ranking_views_split_the_stored_variants(tmp_path: Path) -> None:
    """Two strategies of base model ``b``: ``full`` has the floor dataset ``low`` besides ``good``,
    ``zero`` has only ``low``. Without floors ``zero`` is not ranked; with floors it ranks first."""
    rows = seg_rows()
    full = rows[rows["model"] == "m"].assign(model="b-full", strategy="full")
    zero = rows[rows["model"] == "z"].assign(model="b-zero", strategy="zero")
    res = tmp_path / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"),
                        pd.concat([full, zero], ignore_index=True), "fp")
    # one to three samples per model: no n floor here (min_n=1), so the tiny fixture still gets CIs and ranks
    write_strategy_ranking(res, {"b-full": ("b", "full"), "b-zero": ("b", "zero")}, seed=0, min_n=1)
    build_mart(res, tmp_path / "m.duckdb")
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        d = _df(con, "select * from strategy_ranking where kind = 'corruption'").set_index("strategy")
        a = _df(con, "select * from strategy_ranking_all where kind = 'corruption'").set_index("strategy")
    finally:
        con.close()
    # each sample's mean IoU drop over blur and noise, averaged over samples
    assert d.loc["full", "mean_iou_drop"] == pytest.approx(((0.2 + 0.1) / 2 + (0.1 + 0.3) / 2) / 2)
    assert a.loc["full", "mean_iou_drop"] == pytest.approx(((0.2 + 0.1) / 2 + (0.1 + 0.3) / 2 + (0.0 + 0.03) / 2) / 3)
    assert (d.loc["full", "n_floor_excluded"], d.loc["full", "n_datasets"], d.loc["full", "rank"]) == (1, 1, 1)
    assert (a.loc["full", "n_floor_excluded"], a.loc["full", "n_datasets"]) == (0, 2)
    assert pd.isna(d.loc["zero", "rank"]) and d.loc["zero", "note"] == FLOOR_NOTE and d.loc["zero", "floor_effect"]
    assert (a.loc["zero", "rank"], a.loc["full", "rank"]) == (1, 2)  # the floor model would look most robust
    assert set(d["levels"]) == set(a["levels"]) == {"2"}
    assert not d["with_floor"].any() and a["with_floor"].all()


def test_default_by_level_carries_cis_of_its_own_rows(tmp_path: Path) -> None:
    """With the real ``segmentation_stats`` (scopes ``all`` and ``floor_excluded``) the default view's
    CI and q describe the rows it averages (floor dataset left out) and the ``_all`` view's those of
    every dataset; floor-excluded stats exist only for a model with a floor dataset that is not
    entirely at the floor."""
    from medrobust_lib.tracks.segmentation.stats import floor_datasets, segmentation_stats

    seg = seg_rows()
    floor = floor_datasets(seg).set_index(["model", "dataset"])["floor_effect"]
    assert floor.to_dict() == {("lv", "good"): False, ("m", "good"): False, ("m", "low"): True,
                               ("z", "low"): True}
    stats = segmentation_stats(seg, seed=0, min_n=2)  # cells of 2-3 images: floor 2 so they carry CIs
    excl = stats[stats["scope"] == "floor_excluded"]
    assert set(excl["model"]) == {"m"} and set(stats.loc[stats["scope"] == "all", "model"]) == {"m", "z", "lv"}
    blur = excl[excl["perturbation"] == "blur"].iloc[0]
    assert blur["n"] == 2 and blur["iou_drop"] == pytest.approx(0.15)  # good only: (0.2 + 0.1) / 2
    pooled = stats[(stats["scope"] == "all") & (stats["model"] == "m") & (stats["perturbation"] == "blur")].iloc[0]
    assert pooled["n"] == 3 and pooled["iou_drop"] == pytest.approx(0.1)
    res = tmp_path / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), seg, "fp")
    results.write_chunk(results.chunk_path(res, "segmentation_stats", {"part": "x"}, "d"),
                        stats.reindex(columns=STATS_COLUMNS), "fp")
    build_mart(res, tmp_path / "m.duckdb")
    c = connect_readonly(tmp_path / "m.duckdb")
    try:
        d = _df(c, "select * from segmentation_by_level where model = 'm' and perturbation = 'blur'").iloc[0]
        a = _df(c, "select * from segmentation_by_level_all where model = 'm' and perturbation = 'blur'").iloc[0]
    finally:
        c.close()
    for col in ("iou_drop_ci_low", "iou_drop_ci_high", "dice_drop_ci_low", "wilcoxon_q"):
        assert d[col] == pytest.approx(blur[col], nan_ok=True) and a[col] == pytest.approx(pooled[col], nan_ok=True)
    assert d["iou_drop_ci_low"] <= d["iou_drop"] <= d["iou_drop_ci_high"]
