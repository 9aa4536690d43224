"""LiteMedSAM through the segmentation track on a small demo: clean and capped perturbed rows with
their precision, per-model levels, the worst-type examples, the mart views and the report's lead section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE, evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.segmentation.examples import EXAMPLES_TABLE, write_examples
from medrobust_lib.tracks.segmentation.stats import write_segmentation_stats
from tests.suite_helpers import write_suite

SEG = {"models": [{"id": "lite", "family": "litemedsam", "checkpoint": "package", "levels": [4],
                   "max_perturbed_per_modality": 1, "attacks": False, "precision": "fp32"}],
       "split": "all"}


@pytest.fixture(scope="module")
def lite_suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("lite")
    suite = load_suite(write_suite(root, demo_root, modalities=["ct", "dermoscopy"], segmentation=SEG,
                                   perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                                  "calibration_subset": 2, "levels": [2, 4]}))
    for m in suite.modalities:
        build_clean_index(suite, m)
        build_perturbed(suite, m, 4)
    return suite


def test_levels_and_caps_of_one_model(lite_suite: Suite) -> None:
    s = lite_suite
    assert s.levels_for("segmentation.lite") == [4] and s.levels_for(None) == [2, 4]
    clean = evaluate_clean(s, "lite", "ct")
    assert clean.n_rows == 4 and clean.n_failed == 0 and clean.mean_dice > 0.5  # a real model, not a random one
    pert = evaluate_perturbed(s, "lite", "ct", 4)
    man = read_manifest(s, "ct", 4)
    first = sorted(set(zip(man["dataset"], man["sample_id"], strict=True)))[0]
    assert pert.n_rows == int(((man["dataset"] == first[0]) & (man["sample_id"] == first[1])).sum()) == 2
    df = results.read_table(s.results_dir, RESULTS_TABLE)
    # fp32 on the CPU with runtime auto: the encoder through OpenVINO, the decoder through ONNX Runtime,
    # exported into the suite's cache (models.onnx_engine)
    assert set(df["precision"]) == {"fp32-openvino+onnxruntime"}
    assert set(df["family"]) == {"litemedsam"} and set(df["arch"]) == {"tinyvit"}
    assert set(df.loc[df["condition"] == "perturbation", "sample_id"]) == {first[1]}


def test_examples_mart_and_report_lead_with_the_real_model(lite_suite: Suite, tmp_path: Path) -> None:
    from medrobust_lib.report.paper import build_report

    s = lite_suite
    evaluate_clean(s, "lite", "dermoscopy")
    evaluate_perturbed(s, "lite", "dermoscopy", 4)
    write_segmentation_stats(s.results_dir, s.seed)
    ex = write_examples(s, top=2)
    assert len(ex) == 2 and list(ex["model"]) == ["lite", "lite"]
    assert ex["mean_iou_drop"].is_monotonic_decreasing
    assert all(bytes(p[:8]) == b"\x89PNG\r\n\x1a\n" for p in ex["png"])
    rows = results.read_table(s.results_dir, RESULTS_TABLE)
    for r in ex.itertuples():  # the panel's IoUs are the stored rows' (recomputed on the same images)
        stored = rows[(rows["perturbation"] == r.perturbation) & (rows["sample_id"] == r.sample_id)
                      & (rows["condition"] == "perturbation")]
        assert np.isclose(float(stored["iou"].iloc[0]), r.iou) and np.isclose(float(stored["clean_iou"].iloc[0]),
                                                                              r.clean_iou)
    build_mart(s.results_dir, s.mart_path)
    con = connect_readonly(s.mart_path)
    try:
        assert con.execute(f"select count(*) from {EXAMPLES_TABLE}").fetchall()[0][0] == 2
        mods = con.execute("select distinct modality from segmentation_by_modality where model = 'lite'").fetchall()
        assert sorted(m[0] for m in mods) == ["ct", "dermoscopy"]
    finally:
        con.close()
    rep = build_report(s.mart_path, tmp_path / "report", log_mlflow=False)
    assert rep.tables[0] == "real_model_worst_types"
    page = rep.html.read_text()
    lead = page.index('id="real_model_worst_types"')
    assert lead < page.index('id="segmentation_summary"')
    assert page.index("figures/worst_lite_") > lead and page.index("figures/worst_lite_") < page.index(
        'id="segmentation_summary"')
    # the model was not attacked (attacks: false): its curve's caption says so instead of naming dashed lines
    curve = page[page.index("lite_iou_curves.png"):][:600]
    assert "no attack was evaluated" in curve and "dashed: FGSM/PGD" not in curve
