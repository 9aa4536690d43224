"""The statistics use the rows the views average (issue 30, deliver 6): a corruption output that
missed its level's SSIM band is left out of the CIs, tests and rankings by default, as it is left out
of the means, and kept with the switch (the suite's ``perturbations.include_off_band``, the report's
``--include-off-band`` for the by-level table). Segmentation stats, the strategy ranking, the VLM
stats and the taxonomy stats.

Seeded table: model ``m-full`` (strategy ``full`` of base ``m``) on dataset ``d``, clean IoU 0.8 for
ten samples; ``blur`` level 4 loses 0.05-0.1375 IoU on the eight in-band outputs and 0.7 on the two
off-band ones, so the off-band rows move the mean drop from 0.094 to 0.215 and the CI with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, build_mart, connect_readonly
from medrobust_lib.store.schema import TAXONOMY_COLUMN_NAMES, TAXONOMY_TABLE, VLM_COLUMN_NAMES, VLM_TABLE
from medrobust_lib.tracks.finetune.ranking import write_strategy_ranking
from medrobust_lib.tracks.off_band import off_band
from medrobust_lib.tracks.segmentation.stats import segmentation_stats
from medrobust_lib.tracks.taxonomy.stats import write_taxonomy_stats
from medrobust_lib.tracks.vlm.stats import write_vlm_stats

SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]
MANIFEST_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "perturbation_manifest")]
SAMPLES = [f"s{i}" for i in range(10)]
OFF = {"s8", "s9"}
DROPS = {s: (0.7 if s in OFF else 0.05 + 0.0125 * i) for i, s in enumerate(SAMPLES)}
IN_BAND_MEAN = float(np.mean([d for s, d in DROPS.items() if s not in OFF]))
ALL_MEAN = float(np.mean(list(DROPS.values())))


def _seg(sample: str, condition: str, level: int, drop: float) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    r.update(model="m-full", checkpoint="ck", strategy="full", dataset="d", modality="ct", sample_id=sample,
             condition=condition, perturbation="clean" if condition == "clean" else "blur", level=level,
             iou=0.8 - drop, dice=0.9 - drop, clean_iou=0.8, clean_dice=0.9, iou_drop=drop, dice_drop=drop,
             status="ok")
    return r


def _manifest(sample: str) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(MANIFEST_COLUMNS)
    reached = sample not in OFF
    r.update(sample_id=sample, dataset="d", modality="ct", perturbation="blur", family="blur",
             geometry="intensity", level=4, band_low=0.6, band_high=0.69, strength=3.0,
             ssim=0.65 if reached else 0.72, band_reached=reached, miss_reason=None if reached else "unreachable",
             n_ssim_evals=3, status="ok")
    return r


SEG = pd.DataFrame([_seg(s, "clean", 0, 0.0) for s in SAMPLES] + [_seg(s, "perturbation", 4, DROPS[s])
                                                                   for s in SAMPLES], columns=SEG_COLUMNS)
MANIFEST = pd.DataFrame([_manifest(s) for s in SAMPLES], columns=MANIFEST_COLUMNS)


def _scope(stats: pd.DataFrame, scope: str) -> dict[str, Any]:
    row = stats[(stats["scope"] == scope) & (stats["perturbation"] == "blur")]
    assert len(row) == 1, stats
    return row.iloc[0].to_dict()


def test_off_band_marks_the_manifests_misses_only() -> None:
    flags = off_band(SEG, MANIFEST)
    assert sorted(SEG.loc[flags, "sample_id"]) == sorted(OFF)
    assert not SEG.loc[flags, "condition"].eq("clean").any()
    assert not off_band(SEG, None).any() and not off_band(SEG, MANIFEST.iloc[0:0]).any()


def test_stats_of_the_in_band_rows_and_of_all_rows() -> None:
    stats = segmentation_stats(SEG, seed=0, bands=MANIFEST)
    in_band, every = _scope(stats, "in_band"), _scope(stats, "all")
    assert (in_band["n"], every["n"]) == (8, 10)
    assert in_band["iou_drop"] == pytest.approx(IN_BAND_MEAN)
    assert every["iou_drop"] == pytest.approx(ALL_MEAN)
    # the CI of the in-band rows lies within their range; the off-band rows push the other one up
    assert 0.05 <= in_band["iou_drop_ci_low"] <= IN_BAND_MEAN <= in_band["iou_drop_ci_high"] <= 0.1375
    assert every["iou_drop_ci_high"] > 0.2
    # without band flags (or without misses) there is nothing to leave out: one scope
    assert set(segmentation_stats(SEG, seed=0)["scope"]) == {"all"}


@pytest.fixture(scope="module")
def marts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pd.DataFrame, dict[Any, Any]]]:
    root = tmp_path_factory.mktemp("off_band_stats")
    res = root / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), SEG, "fp")
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "ct", "level": 4}, "d"),
                        MANIFEST, "fp")
    stats = segmentation_stats(SEG, seed=0, bands=MANIFEST)
    results.write_chunk(results.chunk_path(res, "segmentation_stats", {"part": "x"}, "d"), stats, "fp")
    cons: dict[bool, duckdb.DuckDBPyConnection] = {}
    for inc in (False, True):
        build_mart(res, root / f"m{int(inc)}.duckdb", include_off_band=inc)
        cons[inc] = connect_readonly(root / f"m{int(inc)}.duckdb")
    try:
        yield stats, {"res": res, **cons}
    finally:
        for inc in (False, True):
            cons[inc].close()


def test_by_level_view_shows_the_stats_of_its_own_rows(marts: tuple[pd.DataFrame, dict[Any, Any]]) -> None:
    stats, m = marts
    for inc, scope, n, mean in ((False, "in_band", 8, IN_BAND_MEAN), (True, "all", 10, ALL_MEAN)):
        row = m[inc].execute("select * from segmentation_by_level where perturbation = 'blur'").df().iloc[0]
        want = _scope(stats, scope)
        assert (row["n"], row["band_miss"]) == (n, 2)
        assert row["iou_drop"] == pytest.approx(mean)
        for c in ("iou_drop_ci_low", "iou_drop_ci_high", "dice_drop_ci_low", "wilcoxon_p", "wilcoxon_q"):
            assert row[c] == pytest.approx(want[c]), c


def test_strategy_ranking_leaves_off_band_rows_out_by_default(marts: tuple[pd.DataFrame, dict[Any, Any]]) -> None:
    res = marts[1]["res"]
    models = {"m-full": ("m", "full")}
    for inc, mean in ((False, IN_BAND_MEAN), (True, ALL_MEAN)):
        table = write_strategy_ranking(res, models, seed=0, include_off_band=inc)
        row = table[table["kind"] == "corruption"].iloc[0]
        assert row["mean_iou_drop"] == pytest.approx(mean)
        assert row["n_samples"] == (8 if not inc else 10)
        assert row["iou_drop_ci_high"] <= 0.1375 if not inc else row["iou_drop_ci_high"] > 0.2


def _vlm(sample: str, perturbation: str, level: int, correct: float) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(VLM_COLUMN_NAMES)
    r.update(model="v", checkpoint="base", task="vqa_mc", dataset="d", modality="ct", sample_id=sample,
             record_id=f"r-{sample}", prompt_id=0, image_mode="image", perturbation=perturbation, level=level,
             outcome="ok", correct=correct, parsed="A")
    return r


def test_vlm_stats_leave_off_band_rows_out_by_default(tmp_path: Path) -> None:
    """The VLM model answers every clean item and every in-band perturbed item right and the two
    off-band ones wrong: accuracy 1.0 (drop 0) on the in-band pairs, 0.8 (drop 0.2) on all."""
    res = tmp_path / "results"
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "ct", "level": 4}, "d"),
                        MANIFEST, "fp")
    vlm = pd.DataFrame([_vlm(s, "clean", 0, 1.0) for s in SAMPLES]
                       + [_vlm(s, "blur", 4, 0.0 if s in OFF else 1.0) for s in SAMPLES], columns=list(VLM_COLUMN_NAMES))
    for level in (0, 4):
        part = {"model": "v", "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level}
        results.write_chunk(results.chunk_path(res, VLM_TABLE, part, "d"), vlm[vlm["level"] == level], "fp")
    for inc, n, value in ((False, 8, 1.0), (True, 10, 0.8)):
        row = write_vlm_stats(res, seed=0, include_off_band=inc).iloc[0]
        assert (row["n_pairs"], row["perturbed_value"]) == (n, pytest.approx(value))
        assert row["drop"] == pytest.approx(1.0 - value)


def _taxonomy(sample: str, perturbation: str, level: int, quadrant: str) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(TAXONOMY_COLUMN_NAMES)
    consistent, reliant = quadrant in ("Ideal", "Dangerous"), quadrant in ("Ideal", "Fragile")
    r.update(config="c", checkpoint="base", dataset="d", modality="ct", sample_id=sample, record_id=f"r-{sample}",
             perturbation=perturbation, level=level, image_mode="none", n_variants=3, answer="yes",
             source="logprobs", outcome="ok", quadrant=quadrant, consistent=consistent, image_reliant=reliant,
             pairwise_disagreement=0.0 if consistent else 2 / 3, entropy_original=0.5, correct_original=1.0,
             pred_original="yes", pred_removed="no" if reliant else "yes", margin_removed=-2.0 if reliant else 2.0,
             n_negations=0)
    return r


def test_taxonomy_stats_leave_off_band_records_out_by_default(tmp_path: Path) -> None:
    """Every clean and in-band perturbed record is Ideal, the two off-band ones Dangerous: the blur
    level-4 group has 8 records, Dangerous share 0, band_miss 2 by default; 10 records, share 0.2
    with the switch (band_miss 2 either way); the clean group is untouched (band_miss 0)."""
    res = tmp_path / "results"
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "ct", "level": 4}, "d"),
                        MANIFEST, "fp")
    tax = pd.DataFrame([_taxonomy(s, "clean", 0, "Ideal") for s in SAMPLES]
                       + [_taxonomy(s, "blur", 4, "Dangerous" if s in OFF else "Ideal") for s in SAMPLES],
                       columns=list(TAXONOMY_COLUMN_NAMES))
    for level in (0, 4):
        part = {"config": "c", "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level}
        results.write_chunk(results.chunk_path(res, TAXONOMY_TABLE, part, "d"), tax[tax["level"] == level], "fp")
    for inc, n, share in ((False, 8, 0.0), (True, 10, 0.2)):
        quad, _ = write_taxonomy_stats(res, seed=0, include_off_band=inc)
        blur = quad[(quad["perturbation"] == "blur") & (quad["quadrant"] == "Dangerous")].iloc[0]
        assert (blur["n_total"], blur["band_miss"]) == (n, 2) and blur["share"] == pytest.approx(share)
        clean = quad[quad["perturbation"] == "clean"]
        assert set(clean["band_miss"]) == {0} and set(clean["n_total"]) == {10}
        # the mart's pooled view and the images the report's CI resamples use the same records
        mart = tmp_path / f"m{int(inc)}.duckdb"
        build_mart(res, mart, include_off_band=inc)
        con = connect_readonly(mart)
        try:
            pooled = con.execute("select band_miss, n_total from taxonomy_quadrants_pooled "
                                 "where condition = 'perturbed' and quadrant = 'Dangerous'").fetchall()
            images = con.execute("select sum(n) from taxonomy_quadrant_images where condition = 'perturbed'").fetchone()
        finally:
            con.close()
        assert pooled == [(2, n)] and images == (n,)
