"""Honest outcome names and counts: a perturbation type that does not apply to a sample
(``not_applicable`` in the manifest) and a sample without a ground-truth mask (``no_mask``) are
their own outcomes in ``segmentation_results``, the evaluation summary, the mart's views and the
report, never counted as failures; a real failure still is one."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from safetensors.torch import save_file

from medrobust_lib.config import Suite
from medrobust_lib.models.sam import arch_for, build_sam
from medrobust_lib.report.paper_tables import segmentation_summary
from medrobust_lib.report.table import ReportTable
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart
from medrobust_lib.store.schema import excluded_outcome, seg_failed
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.finetune.ranking import strategy_ranking
from medrobust_lib.tracks.perturbed import build_perturbed
from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE, evaluate_clean, evaluate_perturbed

GRAY = ["g1", "g2", "g3"]
RGB = ["c1", "c2"]
NO_MASK = ["n1", "n2"]
MODALITY = "dermoscopy"


def _image(seed: int, rgb: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32]
    base = (96 + 80 * np.sin(xx / 4.0 + seed) * np.cos(yy / 5.0)).astype(np.float64)
    base += rng.normal(0, 6, base.shape)
    if rgb:
        base = np.stack([base, base * 0.8 + 20, 255 - base], axis=2)
    return np.clip(base, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    root = tmp_path_factory.mktemp("outcomes")
    mixed, nomask = root / "mixed", root / "nomask"
    for d in (mixed / "images", mixed / "masks", nomask / "images"):
        d.mkdir(parents=True)
    mask = np.zeros((32, 32), np.uint8)
    mask[8:20, 10:24] = 255
    for i, sid in enumerate(GRAY + RGB):
        Image.fromarray(_image(i, sid in RGB)).save(mixed / "images" / f"{sid}.png")
        Image.fromarray(mask).save(mixed / "masks" / f"{sid}.png")
    for i, sid in enumerate(NO_MASK):
        Image.fromarray(_image(10 + i, True)).save(nomask / "images" / f"{sid}.png")
    ckpt = root / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in build_sam(arch_for("tiny", "sam"), seed=3).state_dict().items()},
              str(ckpt))
    return Suite.model_validate({
        "name": "outcomes", "seed": 1, "results_dir": str(root / "results"),
        "mart_path": str(root / "marts.duckdb"), "workers": 1, "modalities": [MODALITY],
        "demo": {"enabled": False},
        "datasets": [
            {"name": "mixed", "modality": MODALITY, "format": "folder", "root": str(mixed), "size": None},
            {"name": "nomask", "modality": MODALITY, "format": "folder", "root": str(nomask), "size": None,
             "options": {"mask_dir": None}}],
        "perturbations": {"include": ["saturation", "gaussian_noise"], "levels": [1], "split": "all",
                          "calibration_subset": 2},
        "segmentation": {"models": [{"id": "ref", "arch": "tiny", "checkpoint": str(ckpt), "engine": "reference"}],
                         "split": "all", "feed_workers": 0},
    })


@pytest.fixture(scope="module")
def evaluated(suite: Suite) -> pd.DataFrame:
    build_clean_index(suite, MODALITY)
    build_perturbed(suite, MODALITY, 1)
    evaluate_clean(suite, "ref", MODALITY)
    summary = evaluate_perturbed(suite, "ref", MODALITY, 1)
    # 7 samples x 2 types: saturation is RGB-only (3 grayscale samples not applicable), 2 samples lack a mask
    assert summary.n_rows == 14
    assert (summary.n_failed, summary.n_not_applicable, summary.n_no_mask) == (0, 3, 4)
    build_mart(suite.results_dir, suite.mart_path)
    return results.read_partition(suite.results_dir, RESULTS_TABLE,
                                  {"model": "ref", "run": "perturbation", "modality": MODALITY, "level": 1})


def test_results_name_the_outcome(evaluated: pd.DataFrame) -> None:
    sat = evaluated[evaluated["perturbation"] == "saturation"].set_index("sample_id")
    assert set(sat.loc[GRAY, "status"]) == {"not_applicable"}
    assert all("needs an RGB image" in e for e in sat.loc[GRAY, "error"])
    assert set(evaluated.loc[evaluated["sample_id"].isin(NO_MASK), "status"]) == {"no_mask"}
    assert "perturbation_error" not in set(evaluated["status"])
    assert not evaluated["status"].map(seg_failed).any()
    assert evaluated.loc[evaluated["status"] != "ok", "iou"].isna().all()


def test_views_count_them_apart_from_failures(suite: Suite, evaluated: pd.DataFrame) -> None:
    con = duckdb.connect(suite.mart_path, read_only=True)
    try:
        got = dict(((p,), (n, f, na, nm)) for p, n, f, na, nm in con.execute(
            "select perturbation, n, n_failed, n_not_applicable, n_no_mask from segmentation_by_level_all "
            "where model = 'ref'").fetchall())
    finally:
        con.close()
    assert got == {("saturation",): (7, 0, 3, 2), ("gaussian_noise",): (7, 0, 0, 2)}


def test_a_real_failure_is_still_a_failure(evaluated: pd.DataFrame, tmp_path: Path) -> None:
    df = evaluated.copy()
    df.loc[(df["perturbation"] == "gaussian_noise") & (df["sample_id"] == "c1"), ["status", "iou"]] = \
        ["perturbation_error", np.nan]
    part = {"model": "ref", "run": "perturbation", "modality": MODALITY, "level": 1}
    results.write_chunk(results.chunk_path(tmp_path, RESULTS_TABLE, part, "mixed"), df, "fp")
    build_mart(tmp_path, tmp_path / "m.duckdb")
    con = duckdb.connect(str(tmp_path / "m.duckdb"), read_only=True)
    try:
        got = con.execute("select perturbation, n_failed, n_not_applicable, n_no_mask from segmentation_by_level_all "
                          "order by perturbation").fetchall()
    finally:
        con.close()
    assert got == [("gaussian_noise", 1, 0, 2), ("saturation", 0, 3, 2)]
    assert seg_failed("perturbation_error") and seg_failed("error") and seg_failed("mask_out_of_view")
    assert not seg_failed("ok") and not seg_failed("not_applicable") and not seg_failed("no_mask")


def test_report_columns_say_failed_not_applicable_no_mask(suite: Suite, evaluated: pd.DataFrame) -> None:
    con = duckdb.connect(suite.mart_path, read_only=True)
    try:
        table = segmentation_summary(con, None, include_floor=True)
    finally:
        con.close()
    assert isinstance(table, ReportTable)
    headers = [c.header for c in table.columns]
    assert {"Failed", "Not applicable", "No mask"} <= set(headers)
    row = table.data.set_index("model").loc["ref"]
    # clean: 5 with a mask + 2 no_mask; perturbed: 14 rows of which 3 not applicable, 4 without a mask
    assert (row["n_failed"], row["n_not_applicable"], row["n_no_mask"]) == (0, 3, 6)


def test_ranking_counts_them_apart(suite: Suite, evaluated: pd.DataFrame) -> None:
    clean = results.read_partition(suite.results_dir, RESULTS_TABLE,
                                   {"model": "ref", "run": "clean", "modality": MODALITY, "level": 0})
    rows = pd.concat([clean, evaluated]).assign(model="ref-lora")
    table = strategy_ranking(rows, {"ref-lora": ("ref", "lora")}, seed=0, n_boot=50)
    row = table[table["kind"] == "corruption"].iloc[0]
    assert (row["n_failed"], row["n_not_applicable"], row["n_no_mask"]) == (0, 3, 4)


def test_vlm_and_taxonomy_exclusions_name_not_applicable() -> None:
    assert excluded_outcome("not_applicable") == "excluded:not_applicable"
    assert excluded_outcome("error") == "excluded:perturbation_error"
