"""The report leads with the real model on real labels: the mart views of the real-label datasets
(known answers on hand-made rows written with the project's writers), the ``real_labels`` table
(the types that hurt and help most, signs kept, the official Dice), the per-dataset figure, the
synthetic-lesion table that follows it; the official Dice and the description come from the mart's
``dataset_info`` (the demo's values: tests/demo/test_official.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.report.figures import style
from medrobust_lib.report.paper import ReportSummary, build_report
from medrobust_lib.report.real_labels import pick_types
from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, build_mart, connect_readonly
from medrobust_lib.store.schema import column_names

SEG_COLUMNS = column_names("segmentation_results")
CLEAN_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "clean_samples")]
SAMPLES = [f"s{i}" for i in range(6)]
REAL, SYNTH = "real_ds", "synth_ds"
CLEAN_DICE = {s: 0.70 + 0.04 * i for i, s in enumerate(SAMPLES)}  # mean 0.80
# (type, level) -> the Dice drop of every sample of the real dataset (IoU drop: half of it)
REAL_DROPS = {("t1", 2): 0.40, ("t2", 2): 0.30, ("t3", 2): 0.20, ("t4", 2): 0.10, ("h1", 2): -0.05,
              ("h2", 2): -0.20, ("zero", 2): 0.0, ("t1", 4): 0.50, ("h1", 4): -0.10}
SYNTH_DROPS = {("t1", 2): 0.01, ("t2", 2): 0.02, ("t3", 2): 0.03, ("t4", 2): 0.04}
OFF_BAND = (REAL, "s5", "t1", 2)
"""The one perturbed output that missed its SSIM band: left out of its cell's n and mean."""
SPREAD = np.linspace(-0.02, 0.02, len(SAMPLES))  # per-sample spread, mean 0: the CI has width


def _row(model: str, arch: str, dataset: str, sample: str, condition: str, perturbation: str, level: int,
         dice_drop: float) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    cd = CLEAN_DICE[sample]
    ci = cd - 0.1
    r.update(model=model, checkpoint=f"ck_{model}", strategy="pretrained", dataset=dataset, modality="ct",
             sample_id=sample, condition=condition, perturbation=perturbation, level=level, clean_dice=cd,
             clean_iou=ci, dice=cd - dice_drop, dice_drop=dice_drop, iou=ci - dice_drop / 2, iou_drop=dice_drop / 2,
             status="ok", family="litemedsam" if arch != "tiny" else "sam", arch=arch, precision="fp32",
             epsilon=2 / 255 if condition == "fgsm" else None)
    return r


def seg_rows() -> pd.DataFrame:
    rows = []
    for model, arch in (("lite", "tinyvit"), ("tiny_sam", "tiny")):
        for dataset, drops in ((REAL, REAL_DROPS), (SYNTH, SYNTH_DROPS)):
            for i, s in enumerate(SAMPLES):
                rows.append(_row(model, arch, dataset, s, "clean", "clean", 0, 0.0))
                for (t, lv), d in drops.items():
                    rows.append(_row(model, arch, dataset, s, "perturbation", t, lv, d + SPREAD[i]))
                if dataset == REAL:
                    rows.append(_row(model, arch, dataset, s, "fgsm", "fgsm", 2, 0.15 + SPREAD[i]))
    return pd.DataFrame(rows, columns=SEG_COLUMNS)


def clean_rows() -> pd.DataFrame:
    return pd.DataFrame([{**dict.fromkeys(CLEAN_COLUMNS), "sample_id": s, "dataset": d, "modality": "ct",
                          "split": "test", "status": "ok", "synthetic_labels": d == SYNTH}
                         for d in (REAL, SYNTH) for s in SAMPLES], columns=CLEAN_COLUMNS)


def manifest_rows() -> pd.DataFrame:
    cols = column_names("perturbation_manifest")
    rows = [{**dict.fromkeys(cols), "dataset": d, "sample_id": s, "modality": "ct", "perturbation": t,
             "level": lv, "status": "ok", "band_reached": (d, s, t, lv) != OFF_BAND, "band_low": 0.7,
             "band_high": 0.8}
            for d, drops in ((REAL, REAL_DROPS), (SYNTH, SYNTH_DROPS)) for s in SAMPLES for t, lv in drops]
    return pd.DataFrame(rows, columns=cols)


@pytest.fixture(scope="module")
def mart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real_labels")
    res = root / "results"
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "rows"), seg_rows(), "fp")
    results.write_chunk(results.chunk_path(res, "clean_samples", {"modality": "ct"}, "index"), clean_rows(), "fp")
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"modality": "ct"}, "m"), manifest_rows(),
                        "fp")
    info = [{"dataset": REAL, "modality": "ct", "format": "nifti", "synthetic_labels": False, "evaluation_only": True,
             "description": f"{REAL}: real slices. Licence: CC BY.", "reference_family": "litemedsam",
             "reference_dice": 0.79, "reference_n": 6, "reference_source": "tools/litemedsam_official_real.py"},
            {"dataset": SYNTH, "modality": "ct", "format": "folder", "synthetic_labels": True, "evaluation_only": False,
             "description": None, "reference_family": None, "reference_dice": None, "reference_n": None,
             "reference_source": None}]
    results.write_chunk(results.chunk_path(res, "dataset_info", {"modality": "ct"}, "info"), info, "fp")
    build_mart(res, root / "marts.duckdb")
    return root / "marts.duckdb"


@pytest.fixture(scope="module")
def report(mart: Path, tmp_path_factory: pytest.TempPathFactory) -> ReportSummary:
    return build_report(mart, tmp_path_factory.mktemp("report") / "out", log_mlflow=False, seed=7)


def _view(mart: Path, sql: str) -> pd.DataFrame:
    con = connect_readonly(mart)
    try:
        return con.execute(sql).df()
    finally:
        con.close()


def test_views_keep_real_architectures_on_real_labels(mart: Path) -> None:
    clean = _view(mart, "select * from segmentation_real_labels")
    assert list(zip(clean["model"], clean["dataset"], strict=True)) == [("lite", REAL)]
    r = clean.iloc[0]
    assert r["n_images"] == 6 and r["clean_dice"] == pytest.approx(0.80) and r["clean_iou"] == pytest.approx(0.70)
    assert pd.isna(r["clean_instance_dice"]) and r["levels"] == "2,4" and r["n_conditions"] == len(REAL_DROPS) + 1
    assert not r["floor_effect"]
    types = _view(mart, "select * from segmentation_real_label_types")
    assert set(types["model"]) == {"lite"} and set(types["dataset"]) == {REAL}
    cell = types.set_index(["perturbation", "level"])
    assert cell.loc[("h2", 2), "dice_drop"] == pytest.approx(-0.20)  # the sign is kept: the corruption helped
    assert cell.loc[("h2", 2), "iou_drop"] == pytest.approx(-0.10)
    assert cell.loc[("h2", 2), "dice_rel_drop"] == pytest.approx(-0.20 / 0.80)
    # the off-band output is counted in band_miss, not in n or the mean
    t1 = cell.loc[("t1", 2)]
    assert (t1["n"], t1["n_ok"], t1["band_miss"]) == (5, 5, 1)
    assert t1["dice_drop"] == pytest.approx(0.40 + SPREAD[:5].mean())
    assert cell.loc[("fgsm", 2), "condition"] == "fgsm" and cell.loc[("fgsm", 2), "n"] == 6


def test_pick_types_lists_hurts_and_helps_with_their_sign() -> None:
    cells = pd.DataFrame([{"condition": "perturbation", "perturbation": t, "level": lv, "dice_drop": d}
                          for (t, lv), d in REAL_DROPS.items()]
                         + [{"condition": "fgsm", "perturbation": "fgsm", "level": 2, "dice_drop": 0.15}])
    got = pick_types(cells)
    at2 = got[got["level"] == 2]
    assert list(at2.loc[at2["effect"] == "hurts", "perturbation"]) == ["t1", "t2", "t3"]
    assert list(at2.loc[at2["effect"] == "helps", "perturbation"]) == ["h2", "h1"]  # most negative first
    assert list(at2.loc[at2["effect"] == "attack", "perturbation"]) == ["fgsm"]
    assert "zero" not in set(got["perturbation"])  # a drop of exactly 0 neither hurts nor helps
    at4 = got[got["level"] == 4]
    assert list(zip(at4["effect"], at4["perturbation"], strict=True)) == [("hurts", "t1"), ("helps", "h1")]


def test_the_report_leads_with_the_real_model_on_real_labels(report: ReportSummary) -> None:
    assert report.tables[:2] == ("real_labels", "real_model_worst_types")
    df = pd.read_csv(report.out_dir / "tables" / "real_labels.csv")
    assert set(df["model"]) == {"lite"} and set(df["dataset"]) == {REAL}
    at2 = df[df["level"] == 2]
    hurts, helps = at2[at2["effect"] == "hurts"], at2[at2["effect"] == "helps"]
    assert list(hurts["perturbation"]) == ["t1", "t2", "t3"] and list(hurts["rank"]) == [1, 2, 3]
    assert list(helps["perturbation"]) == ["h2", "h1"]
    assert (helps["dice_drop"] < 0).all() and helps["dice_drop"].iloc[0] == pytest.approx(-0.20)
    assert list(at2.loc[at2["effect"] == "attack", "perturbation"]) == ["fgsm"]
    # bootstrap CIs over the six images around each mean; none over fewer than stats.min_n (5) images
    listed = df[df["dice_drop"].notna()]
    assert (listed["dice_drop_ci_low"] <= listed["dice_drop"]).all()
    assert (listed["dice_drop"] <= listed["dice_drop_ci_high"]).all()
    assert (listed["dice_drop_ci_low"] < listed["dice_drop_ci_high"]).all()
    assert np.allclose(df["clean_dice"], 0.80) and (df["n_images"] == 6).all()
    # the official inference's clean Dice of the same dataset (a litemedsam model)
    assert (df["official_dice"] == 0.79).all() and (df["official_n"] == 6).all()
    md = (report.out_dir / "tables" / "real_labels.md").read_text()
    assert "Official Dice (n)" in md and "0.790 (6)" in md and "-0.200 [" in md


def test_the_cis_are_seeded_by_the_report_seed(mart: Path) -> None:
    from medrobust_lib.report.real_labels import real_label_type_stats

    con = connect_readonly(mart)
    try:
        a, b, c = (real_label_type_stats(con, ["lite"], seed=s) for s in (7, 7, 8))
    finally:
        con.close()
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["dice_drop_ci_low"], c["dice_drop_ci_low"])
    np.testing.assert_allclose(a["dice_drop"], c["dice_drop"])


def test_the_real_label_figure_is_drawn_and_shown_under_its_table(report: ReportSummary) -> None:
    png = report.out_dir / "figures" / f"real_labels_{REAL}.png"
    assert png in report.figures and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.with_suffix(".pdf").is_file() and png.with_suffix(".svg").is_file()
    page = report.html.read_text()
    first = page.index('id="real_labels"')
    assert first < page.index(f"figures/real_labels_{REAL}.png") < page.index('id="real_model_worst_types"')


def test_the_synthetic_lesion_table_follows_without_the_real_labels(report: ReportSummary) -> None:
    df = pd.read_csv(report.out_dir / "tables" / "real_model_worst_types.csv")
    assert set(df["model"]) == {"lite"} and set(df["level"]) == {2}  # the real dataset's level 4 is not pooled
    assert list(df["perturbation"]) == ["t4", "t3", "t2", "t1"] and list(df["rank"]) == [1, 2, 3, 4]
    assert df["iou_drop"].iloc[0] == pytest.approx(0.02) and (df["n"] == 6).all()
    md = (report.out_dir / "tables" / "real_model_worst_types.md").read_text()
    assert "synthetic-lesion datasets" in md.splitlines()[0]


def test_the_figure_has_no_overlapping_labels(mart: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.report.figures.real_labels import real_label_bars
    from medrobust_lib.report.real_labels import real_label_type_stats

    monkeypatch.setattr(style, "RECORD_OVERLAPS", True)
    style.OVERLAPS.clear()
    con = connect_readonly(mart)
    try:
        cells = real_label_type_stats(con, None, seed=0)
        clean = con.execute("select * from segmentation_real_labels").df()
    finally:
        con.close()
    (p,) = real_label_bars(cells, clean, tmp_path, {2: (0.8, 0.9), 4: (0.6, 0.7)})
    assert style.OVERLAPS[str(p)] == []
