"""What a run leaves out of the means is counted with its reason (issue 43, item 6): quarantined
samples, perturbation types that do not apply to a dataset, unscored segmentation rows, floor
datasets by name with their clean score, VLM error outcomes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from medrobust_lib.store.left_out import left_out, summary_lines


def _write(results: Path, table: str, rows: list[dict[str, object]], part: str = "modality=ct") -> None:
    folder = results / table / part
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(folder / "chunk.parquet")


def _seg(model: str, dataset: str, sample: str, iou: float, status: str = "ok", condition: str = "clean",
         error: str | None = None) -> dict[str, object]:
    return {"model": model, "checkpoint": "ck", "strategy": None, "dataset": dataset, "sample_id": sample,
            "condition": condition, "status": status, "iou": iou, "dice": iou, "error": error}


def test_every_left_out_group_is_counted_with_its_reason(tmp_path: Path) -> None:
    r = tmp_path / "results"
    _write(r, "clean_samples", [{"dataset": "scans", "sample_id": "a", "status": "ok", "reason": None},
                                {"dataset": "scans", "sample_id": "b", "status": "quarantined", "reason": "corrupt"}])
    _write(r, "perturbation_manifest", [
        {"dataset": "scans", "sample_id": s, "perturbation": p, "status": st, "error": e}
        for s in ("a", "c") for p, st, e in (("gaussian_noise", "ok", None),
                                             ("stain_variation", "not_applicable", "stain_variation needs an RGB image"))],
        part="modality=ct/level=1")
    _write(r, "segmentation_results", [
        _seg("m", "scans", "a", 0.8), _seg("m", "scans", "c", 0.7),
        _seg("m", "dark", "x", 0.02), _seg("m", "dark", "y", 0.04),
        _seg("m", "scans", "a", float("nan"), "not_applicable", "perturbation", "stain_variation needs an RGB image")])
    _write(r, "vlm_results", [{"model": "v", "outcome": "ok", "error": None},
                              {"model": "v", "outcome": "error", "error": "timeout"}])
    # taxonomy rows name a configuration (partition folder config=<id>), not a model
    _write(r, "taxonomy_results", [{"outcome": "ok"}, {"outcome": "excluded:not_applicable"}],
           part="config=shortcut/run=clean/modality=ct/level=0")
    items = left_out(r)
    text = [i.text() for i in items]
    assert "clean_samples: 1 samples of dataset scans: quarantined (corrupt)" in text
    assert ("perturbation_manifest: 2 samples of type stain_variation on dataset scans: not_applicable "
            "(every sample): stain_variation needs an RGB image") in text
    assert any(t.startswith("segmentation_results: 1 rows of model m: not_applicable") for t in text)
    floor = [t for t in text if t.startswith("segmentation floor:")]
    assert floor == ["segmentation floor: 1 dataset of dark for model m: clean IoU 0.030, Dice 0.030 below 0.1: "
                     "left out of the averages and rankings (the _all views and --include-floor keep it)"]
    assert "vlm_results: 1 rows of model v: error (e.g. timeout)" in text
    assert "taxonomy_results: 1 rows of config shortcut: excluded:not_applicable" in text
    lines = summary_lines(items)
    assert lines[0].startswith("== left out (6 group(s)") and all(ln.startswith("  ") for ln in lines[1:])


def test_nothing_left_out_says_so(tmp_path: Path) -> None:
    assert left_out(tmp_path / "none") == []
    assert summary_lines([]) == ["== left out: nothing (every sample, type and row is in the means)"]
