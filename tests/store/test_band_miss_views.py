"""Outputs that missed their level's SSIM band: left out of the level means by default, counted per cell
in ``band_miss``, kept with the suite's ``perturbations.include_off_band`` (the mart) or
``medrobust report --include-off-band``. Known answers on hand-made rows.

Model ``m`` on dataset ``d``, clean IoU 0.8 (Dice 0.9) for samples s0, s1, s2. ``blur`` level 4:
perturbed IoU 0.6, 0.4, 0.0 (drops 0.2, 0.4, 0.8); the manifest says s2's output missed the band.
``pix`` level 5: only s0, off-band. The VLM model ``v`` answers ``blur`` level 4 right, wrong, right
(s2 off-band): accuracy 1/2 without it, 2/3 with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest

from medrobust_lib.report import paper_tables as pt
from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_COLUMN_NAMES, VLM_TABLE

SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]
STATS_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_stats")]
MANIFEST_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "perturbation_manifest")]
BLUR_IOU = {"s0": 0.6, "s1": 0.4, "s2": 0.0}
OFF_BAND = {("s2", "blur", 4), ("s0", "pix", 5)}


def _seg(sample: str, condition: str, perturbation: str, level: int, iou: float) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    r.update(model="m", checkpoint="ck", strategy="pretrained", dataset="d", modality="ct", sample_id=sample,
             condition=condition, perturbation=perturbation, level=level, iou=iou, dice=iou + 0.1, clean_iou=0.8,
             clean_dice=0.9, iou_drop=0.8 - iou, dice_drop=0.8 - iou, status="ok")
    return r


def _manifest(sample: str, perturbation: str, level: int) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(MANIFEST_COLUMNS)
    reached = (sample, perturbation, level) not in OFF_BAND
    r.update(sample_id=sample, dataset="d", modality="ct", perturbation=perturbation, family="f",
             geometry="intensity", level=level, band_low=0.6, band_high=0.69, strength=1.0, ssim=0.65 if reached else 0.75,
             band_reached=reached, miss_reason=None if reached else "unreachable", n_ssim_evals=3, status="ok")
    return r


def _vlm(sample: str, perturbation: str, level: int, correct: float) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(VLM_COLUMN_NAMES)
    r.update(model="v", checkpoint="base", task="vqa_mc", dataset="d", modality="ct", sample_id=sample,
             record_id=f"r-{sample}", prompt_id=0, image_mode="image", perturbation=perturbation, level=level,
             outcome="ok", correct=correct, parsed="A")
    return r


def _write(res: Path) -> None:
    seg = [_seg(s, "clean", "clean", 0, 0.8) for s in BLUR_IOU]
    seg += [_seg(s, "perturbation", "blur", 4, iou) for s, iou in BLUR_IOU.items()]
    seg += [_seg("s0", "perturbation", "pix", 5, 0.1)]
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"),
                        pd.DataFrame(seg, columns=SEG_COLUMNS), "fp")
    stats: dict[str, Any] = dict.fromkeys(STATS_COLUMNS)
    stats.update(model="m", checkpoint="ck", strategy="pretrained", condition="perturbation", perturbation="blur",
                 level=4, n=3, iou_drop_ci_low=0.1, iou_drop_ci_high=0.7, wilcoxon_q=0.2, scope="all")
    results.write_chunk(results.chunk_path(res, "segmentation_stats", {"part": "x"}, "d"),
                        pd.DataFrame([stats], columns=STATS_COLUMNS), "fp")
    for level, man in ((4, [_manifest(s, "blur", 4) for s in BLUR_IOU]), (5, [_manifest("s0", "pix", 5)])):
        results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "ct", "level": level}, "d"),
                            pd.DataFrame(man, columns=MANIFEST_COLUMNS), "fp")
    vlm = pd.DataFrame([_vlm(s, "clean", 0, 1.0) for s in BLUR_IOU]
                       + [_vlm(s, "blur", 4, c) for s, c in zip(BLUR_IOU, (1.0, 0.0, 1.0), strict=True)],
                       columns=list(VLM_COLUMN_NAMES))
    for level in (0, 4):
        part = {"model": "v", "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level}
        results.write_chunk(results.chunk_path(res, VLM_TABLE, part, "d"), vlm[vlm["level"] == level], "fp")


@pytest.fixture(scope="module")
def marts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, duckdb.DuckDBPyConnection]]:
    """Connections to the mart built without (False) and with (True) the suite's include_off_band."""
    root = tmp_path_factory.mktemp("band_miss")
    _write(root / "results")
    cons = {}
    for inc in (False, True):
        build_mart(root / "results", root / f"m{int(inc)}.duckdb", include_off_band=inc)
        cons[inc] = connect_readonly(root / f"m{int(inc)}.duckdb")
    try:
        yield cons
    finally:
        for c in cons.values():
            c.close()


def _cell(con: duckdb.DuckDBPyConnection, view: str, perturbation: str, level: int) -> dict[str, Any]:
    df = con.execute(f"select * from {view} where perturbation = ? and level = ?", [perturbation, level]).df()
    assert len(df) == 1, df
    return df.iloc[0].to_dict()


@pytest.mark.parametrize("view", ["segmentation_by_level", "segmentation_by_level_all"])
def test_by_level_leaves_off_band_rows_out_and_counts_them(marts: dict[bool, duckdb.DuckDBPyConnection],
                                                            view: str) -> None:
    blur = _cell(marts[False], view, "blur", 4)
    assert (blur["n"], blur["band_miss"]) == (2, 1)
    assert blur["iou_drop"] == pytest.approx(0.3)
    assert blur["iou"] == pytest.approx(0.5)
    # the stored CI pools all three rows: not shown for the two-row mean
    assert pd.isna(blur["iou_drop_ci_low"]) and pd.isna(blur["wilcoxon_q"])
    # a cell whose every output missed its band stays visible, with no mean
    pix = _cell(marts[False], view, "pix", 5)
    assert (pix["n"], pix["band_miss"]) == (0, 1) and pd.isna(pix["iou_drop"])


def test_include_off_band_mart_keeps_them(marts: dict[bool, duckdb.DuckDBPyConnection]) -> None:
    blur = _cell(marts[True], "segmentation_by_level", "blur", 4)
    assert (blur["n"], blur["band_miss"]) == (3, 1)
    assert blur["iou_drop"] == pytest.approx((0.2 + 0.4 + 0.8) / 3)
    assert (blur["iou_drop_ci_low"], blur["iou_drop_ci_high"]) == (0.1, 0.7)
    pix = _cell(marts[True], "segmentation_by_level", "pix", 5)
    assert (pix["n"], pix["band_miss"]) == (1, 1) and pix["iou_drop"] == pytest.approx(0.7)


def test_summary_means_follow_the_same_rule(marts: dict[bool, duckdb.DuckDBPyConnection]) -> None:
    q = "select iou_drop, n from segmentation_summary where perturbation = 'blur'"
    assert marts[False].execute(q).fetchall() == [(pytest.approx(0.3), 2)]
    assert marts[True].execute(q).fetchall() == [(pytest.approx(1.4 / 3), 3)]
    q = "select n from segmentation_top_corruptions where perturbation = 'blur'"
    assert marts[False].execute(q).fetchall() == [(2,)]


def test_vlm_by_level_leaves_off_band_rows_out_and_counts_them(marts: dict[bool, duckdb.DuckDBPyConnection]) -> None:
    cell = _cell(marts[False], "vlm_by_level", "blur", 4)
    assert (cell["n"], cell["n_scored"], cell["band_miss"]) == (2, 2, 1)
    assert cell["accuracy"] == pytest.approx(0.5)
    cell = _cell(marts[True], "vlm_by_level", "blur", 4)
    assert (cell["n"], cell["band_miss"]) == (3, 1) and cell["accuracy"] == pytest.approx(2 / 3)
    clean = _cell(marts[False], "vlm_by_level", "clean", 0)
    assert (clean["n"], clean["band_miss"]) == (3, 0)


def test_report_switch_overrides_the_mart_setting(marts: dict[bool, duckdb.DuckDBPyConnection]) -> None:
    for con in marts.values():  # the report's own switch decides, whatever the mart was built with
        t = pt.segmentation_by_level(con, None)
        assert not isinstance(t, str)
        row = t.data[(t.data["perturbation"] == "blur")].iloc[0]
        assert (row["n"], row["band_miss"]) == (2, 1) and row["iou_drop"] == pytest.approx(0.3)
        assert "Band miss" in [c.header for c in t.columns] and "left out" in t.note
        t = pt.segmentation_by_level(con, None, include_off_band=True)
        assert not isinstance(t, str)
        row = t.data[(t.data["perturbation"] == "blur")].iloc[0]
        assert (row["n"], row["band_miss"]) == (3, 1) and row["iou_drop_ci_low"] == 0.1
        means = pt.segmentation_level_means(con, None)
        blur = means[means["perturbation"] == "blur"].iloc[0]
        assert (blur["n"], blur["band_miss"]) == (2, 1) and blur["iou_drop"] == pytest.approx(0.3)
        summary = pt.segmentation_summary(con, None, include_off_band=True)
        assert not isinstance(summary, str)
        # corruption drop = mean over types of each type's mean drop: blur 1.4/3, pix 0.7
        assert summary.data["corruption_iou_drop"].iloc[0] == pytest.approx((1.4 / 3 + 0.7) / 2)
        summary = pt.segmentation_summary(con, None)
        assert not isinstance(summary, str)
        assert summary.data["corruption_iou_drop"].iloc[0] == pytest.approx(0.3)
