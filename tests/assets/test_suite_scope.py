"""A suite materializes what it declares and nothing else (issue 43, item 5), and the run says
what it left out (item 6) and how far a partition has got (item 4).

A segmentation-only suite (its own data, one model) has no demo, VLM, taxonomy or registry assets,
no registry sensor or nightly schedule, and opens MLflow experiments only for what it runs; the
demo's suite keeps all of them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml
from PIL import Image

from medrobust_assets.definitions import definitions_for_file
from medrobust_assets.runner import run_suite

ROOT = Path(__file__).resolve().parents[2]
TINY_SAM = ROOT / "medrobust_lib" / "demo" / "weights" / "tiny-sam" / "model.safetensors"
SEG_ONLY_KEYS = {"clean_samples", "perturbed_samples", "perturbation_gallery", "tiny/clean_predictions",
                 "tiny/perturbed_predictions", "segmentation_report", "marts"}


def _gray_folder(root: Path, n: int = 3) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    yy, xx = np.mgrid[0:64, 0:64]
    mask = np.zeros((64, 64), np.uint8)
    mask[16:44, 20:48] = 255
    for i in range(n):
        img = 90 + 60 * np.sin(xx / 5.0 + i) * np.cos(yy / 7.0) + (mask > 0) * 50
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(root / "images" / f"s{i}.png")
        Image.fromarray(mask).save(root / "masks" / f"s{i}.png")
    return root


def seg_only_suite(tmp_path: Path) -> Path:
    """One grayscale dermoscopy folder, one segmentation model (the committed tiny SAM, no
    attacks), gaussian_noise and the RGB-only saturation at level 1."""
    data = _gray_folder(tmp_path / "data")
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump({
        "name": "mine", "seed": 1, "results_dir": str(tmp_path / "var" / "results"),
        "mart_path": str(tmp_path / "var" / "marts.duckdb"), "workers": 1, "modalities": ["dermoscopy"],
        "datasets": [{"name": "gray", "modality": "dermoscopy", "format": "folder", "root": str(data), "size": 64}],
        "perturbations": {"include": ["gaussian_noise", "saturation"], "levels": [1], "split": "all",
                          "calibration_subset": 2},
        "segmentation": {"split": "all", "models": [{"id": "tiny", "family": "sam", "arch": "tiny",
                                                     "checkpoint": str(TINY_SAM), "attacks": False}]},
    }))
    return path


def _keys(defs: dg.Definitions) -> set[str]:
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def test_a_segmentation_only_suite_declares_only_its_assets(tmp_path: Path) -> None:
    defs = definitions_for_file(seg_only_suite(tmp_path))
    assert _keys(defs) == SEG_ONLY_KEYS
    repo = defs.get_repository_def()
    assert not repo.sensor_defs and not repo.schedule_defs
    assert {j.name for j in repo.get_all_jobs() if not j.name.startswith("__")} == {"marts_job"}


def test_the_demo_keeps_its_registry_loop_and_reports() -> None:
    defs = definitions_for_file(ROOT / "configs" / "demo.yaml")
    keys = _keys(defs)
    assert {"demo_data", "registry_evaluation", "vlm_report", "taxonomy_report", "segmentation_report"} <= keys
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {"registry_sensor", "mart_after_evaluation"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_reevaluation"}


@pytest.mark.slow
def test_run_suite_on_a_segmentation_only_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole run: only the suite's own assets materialize (registered versions of another
    suite in the instance are not evaluated), MLflow experiments only for them, and the summary
    counts the RGB-only type that does not apply to the grayscale data. Each partition's progress
    (here unthrottled) reaches the terminal and the Dagster run's log."""
    import medrobust_assets.progress as prog

    for name in ("QUIET_S", "LOG_INTERVAL_S", "FILE_INTERVAL_S"):
        monkeypatch.setattr(prog, name, 0.0)
    suite = seg_only_suite(tmp_path)
    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions("registered_seg_versions", ["medrobust-seg-tiny-sam-lora:1"])  # the demo's
    lines: list[str] = []
    mlruns = tmp_path / "mlruns"
    run_suite(str(suite), instance=inst, log=lines.append, mlruns_dir=str(mlruns))
    done = {k.to_user_string() for k in inst.get_asset_keys()
            if inst.get_latest_materialization_event(k) is not None}
    assert done == SEG_ONLY_KEYS, lines
    con = sqlite3.connect(mlruns / "mlflow.db")
    try:
        experiments = {r[0] for r in con.execute("select name from experiments")}
    finally:
        con.close()
    assert experiments and all(e.startswith("mine/") for e in experiments - {"Default"}), experiments
    assert not {e for e in experiments if any(w in e for w in ("vlm", "taxonomy", "registry", "demo"))}
    i = lines.index(next(ln for ln in lines if ln.startswith("== left out")))
    summary = lines[i:]
    assert any("type saturation on dataset gray" in ln and "not_applicable (every sample)" in ln
               and "needs an RGB image" in ln for ln in summary), summary
    assert any(ln.startswith("  segmentation_results:") and "not_applicable" in ln for ln in summary), summary
    progress = [ln for ln in lines if ln.startswith("    [")]
    assert any(ln.startswith("    [tiny/clean_predictions[dermoscopy]] clean images ") for ln in progress), lines
    assert any("[tiny/perturbed_predictions[dermoscopy|1]] perturbed images 3/3 (100 %), done in" in ln
               for ln in progress), lines
    assert any("[perturbed_samples[dermoscopy|1]] perturbation chunks" in ln for ln in progress), lines
    logged = [e.user_message for r in inst.get_runs() for e in inst.all_logs(r.run_id)]
    assert any("[tiny/clean_predictions[dermoscopy]] clean images 3/3 (100 %)" in m for m in logged)
