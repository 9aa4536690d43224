"""segmentation_stats writers: the whole table, or one model's chunk without touching the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES
from medrobust_lib.tracks.segmentation.stats import STATS_TABLE, write_model_stats, write_segmentation_stats

SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]


def _rows(model: str, drops: list[float]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for i, d in enumerate(drops):
        for cond, pert, lv, iou in (("clean", "clean", 0, 0.8), ("perturbation", "blur", 2, 0.8 - d)):
            r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
            r.update(model=model, checkpoint="ck", strategy="pretrained", dataset="ds", modality="ct",
                     sample_id=f"s{i}", condition=cond, perturbation=pert, level=lv, iou=iou, dice=iou,
                     clean_iou=0.8, clean_dice=0.8, iou_drop=0.8 - iou, dice_drop=0.8 - iou, status="ok")
            rows.append(r)
    return pd.DataFrame(rows, columns=SEG_COLUMNS)


def test_one_model_stats_leave_the_other_chunks_alone(tmp_path: Path) -> None:
    res = tmp_path / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"model": "a"}, "x"),
                        _rows("a", [0.1, 0.2, 0.3]), "fp")
    write_segmentation_stats(res)
    a_chunk = results.chunk_path(res, STATS_TABLE, {"model": "a"}, "stats")
    before = a_chunk.read_bytes()
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"model": "b-v2"}, "x"),
                        _rows("b-v2", [0.0, 0.4]), "fp")
    got = write_model_stats(res, "b-v2")
    assert list(got["model"]) == ["b-v2"] and got["iou_drop"].iloc[0] == pytest.approx(0.2)
    assert a_chunk.read_bytes() == before  # untouched
    table = results.read_table(res, STATS_TABLE).set_index("model")
    assert table.loc["a", "iou_drop"] == pytest.approx(0.2) and table.loc["b-v2", "n"] == 2
    assert list(table["scope"]) == ["all", "all"]
    assert write_model_stats(res, "unknown").empty
