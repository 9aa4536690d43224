"""Segmentation and strategy views lead with IoU, rank by IoU drop and carry absolute and relative
drops (drop / clean, NULL when clean is 0); known answers on hand-made result rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, build_mart, connect_readonly
from medrobust_lib.store.schema import RANKING_COLUMNS, RANKING_TABLE

SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]
# (sample, clean IoU, clean Dice); per type the perturbed (IoU, Dice) per sample.
CLEAN = {"s0": (0.8, 0.9), "s1": (0.4, 0.6)}
PERTURBED = {
    # IoU drops 0.1, 0.1 (mean 0.1, rel 0.1 / 0.6); Dice drops 0.3, 0.3 (mean 0.3, rel 0.3 / 0.75)
    "blur": {"s0": (0.7, 0.6), "s1": (0.3, 0.3)},
    # IoU drops 0.3, 0.1 (mean 0.2, rel 0.2 / 0.6); Dice drops 0.1, 0.1 (mean 0.1): ranks first by IoU,
    # last by Dice
    "noise": {"s0": (0.5, 0.8), "s1": (0.3, 0.5)},
}


def _row(sample: str, condition: str, perturbation: str, level: int, iou: float, dice: float,
         **extra: Any) -> dict[str, Any]:
    ci, cd = CLEAN[sample]
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    r.update(model="m", checkpoint="ck", strategy="pretrained", dataset="d", modality="ct", sample_id=sample,
             condition=condition, perturbation=perturbation, level=level, iou=iou, dice=dice, clean_iou=ci,
             clean_dice=cd, iou_drop=ci - iou, dice_drop=cd - dice, status="ok")
    r.update(extra)
    return r


@pytest.fixture()
def con(tmp_path: Path) -> Any:
    rows = [_row(s, "clean", "clean", 0, *CLEAN[s]) for s in CLEAN]
    rows += [_row(s, "perturbation", t, 1, *v) for t, per in PERTURBED.items() for s, v in per.items()]
    # a model whose clean IoU and Dice are 0: relative drops are NULL, absolute drops stay
    rows += [dict(_row("s0", c, p, lv, 0.0, 0.0), model="zero", clean_iou=0.0, clean_dice=0.0, iou_drop=0.0,
                  dice_drop=0.0) for c, p, lv in (("clean", "clean", 0), ("perturbation", "blur", 1))]
    res = tmp_path / "results"
    df = pd.DataFrame(rows, columns=SEG_COLUMNS)
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), df, "fp")
    ranking = pd.DataFrame([{"model": "m", "strategy": "lora", "kind": "corruption", "mean_iou_drop": 0.06,
                             "clean_iou": 0.6, "mean_dice_drop": 0.03, "clean_dice": 0.0, "rank": 1}],
                           columns=[c for c, _ in RANKING_COLUMNS])
    results.write_chunk(results.chunk_path(res, RANKING_TABLE, {"model": "m"}, "stats"), ranking, "fp")
    build_mart(res, tmp_path / "m.duckdb")
    c = connect_readonly(tmp_path / "m.duckdb")
    try:
        yield c
    finally:
        c.close()


def test_top_corruptions_rank_by_iou_drop_with_relative_drops(con: Any) -> None:
    df = con.execute("select * from segmentation_top_corruptions where model = 'm'").df()
    assert list(df.columns[:4]) == ["model", "strategy", "perturbation", "iou_drop"]
    assert list(df["perturbation"]) == ["noise", "blur"] and list(df["rank"]) == [1, 2]
    noise, blur = df.iloc[0], df.iloc[1]
    assert noise["iou_drop"] == pytest.approx(0.2) and noise["iou_rel_drop"] == pytest.approx(0.2 / 0.6)
    assert blur["dice_drop"] == pytest.approx(0.3) and blur["dice_rel_drop"] == pytest.approx(0.3 / 0.75)
    assert blur["dice_drop"] > noise["dice_drop"]  # a Dice ranking would have put blur first
    zero = con.execute("select * from segmentation_top_corruptions where model = 'zero'").df().iloc[0]
    assert zero["iou_drop"] == 0.0 and pd.isna(zero["iou_rel_drop"]) and pd.isna(zero["dice_rel_drop"])


def test_by_level_and_summary_have_absolute_and_relative_drops(con: Any) -> None:
    lv = con.execute("select * from segmentation_by_level where model = 'm' and perturbation = 'noise'").df().iloc[0]
    assert lv["iou_drop"] == pytest.approx(0.2) and lv["iou_rel_drop"] == pytest.approx(0.2 / 0.6)
    assert lv["dice_drop"] == pytest.approx(0.1) and lv["dice_rel_drop"] == pytest.approx(0.1 / 0.75)
    assert lv["clean_iou"] == pytest.approx(0.6)
    s = con.execute("select * from segmentation_summary where model = 'm'").df().set_index("row_kind")
    assert s.loc["Clean", "iou_rel_drop"] == 0.0
    # Avg / Delta: mean drop over types over mean clean score over types
    assert s.loc["Avg", "iou_drop"] == pytest.approx(0.15) and s.loc["Avg", "iou_rel_drop"] == pytest.approx(0.25)
    assert s.loc["Delta", "dice_rel_drop"] == pytest.approx(0.2 / 0.75)
    per = con.execute("select * from segmentation_summary where model = 'zero' and row_kind = 'corruption'").df()
    assert per.iloc[0]["iou_drop"] == 0.0 and pd.isna(per.iloc[0]["iou_rel_drop"])


def test_strategy_ranking_view_has_relative_drops(con: Any) -> None:
    r = con.execute("select * from strategy_ranking").df().iloc[0]
    assert r["iou_rel_drop"] == pytest.approx(0.1) and pd.isna(r["dice_rel_drop"])
