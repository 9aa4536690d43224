"""``medrobust export-masks``: stored masks of a suite's segmentation_results rows as 0/255 PNGs
plus index.csv; filters; refuses a non-empty folder it did not write; damaged masks exit 1."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.store import pred_masks

runner = CliRunner()


def _mask(seed: int, hw: tuple[int, int] = (9, 13)) -> np.ndarray:
    return np.random.default_rng(seed).random(hw) > 0.5


@pytest.fixture()
def suite(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A tmp suite whose results folder holds a tiny segmentation_results table written with pandas
    (hive folders as the pipeline writes them) and whose mask store holds three masks."""
    root = tmp_path / "var" / "t"
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "results_dir": str(root / "results"),
                                    "mart_path": str(root / "marts.duckdb")}))
    store = root / "pred_masks"
    masks = {"clean": _mask(0), "noise3": _mask(1), "odd": _mask(2, (4, 4))}
    sha = {k: pred_masks.put(store, m) for k, m in masks.items()}
    base = {"checkpoint": "ck", "strategy": "pretrained", "dataset": "ds/1", "modality": "ct", "status": "ok"}
    parts: dict[tuple[str, int], list[dict[str, object]]] = {
        ("clean", 0): [
            {**base, "sample_id": "s1", "condition": "clean", "perturbation": "clean", "iou": 0.9, "dice": 0.95,
             "pred_mask_sha256": sha["clean"]},
            {**base, "sample_id": "s2", "condition": "clean", "perturbation": "clean", "iou": 0.8, "dice": 0.9,
             "pred_mask_sha256": None},
        ],
        ("perturbation", 3): [
            {**base, "sample_id": "s1", "condition": "perturbation", "perturbation": "gaussian_noise", "iou": 0.5,
             "dice": 2 / 3, "pred_mask_sha256": sha["noise3"]},
            {**base, "sample_id": "we ird:id", "condition": "perturbation", "perturbation": "gaussian_noise",
             "iou": 0.25, "dice": 0.4, "pred_mask_sha256": sha["odd"]},
        ],
    }
    for (run, level), rows in parts.items():
        folder = root / "results" / "segmentation_results" / "model=sam" / f"run={run}" / "modality=ct" / f"level={level}"
        folder.mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(folder / "ds.parquet", index=False)
    return path, masks


def _export(suite: Path, out: Path, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["export-masks", "--suite", str(suite), "--out", str(out), *args])
    return res.exit_code, res.stdout, res.stderr


def _read(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None and img.dtype == np.uint8 and set(np.unique(img)) <= {0, 255}
    return np.asarray(img == 255)


def test_export_writes_pngs_and_an_index(suite: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    path, masks = suite
    out = tmp_path / "export"
    code, stdout, stderr = _export(path, out)
    assert code == 0, stderr
    assert stdout.strip() == f"wrote 3 masks to {out} (4 rows selected, 1 without a stored mask)"
    files = sorted(p.name for p in out.glob("*.png"))
    assert files == ["sam__ds_1__s1__clean__L0.png", "sam__ds_1__s1__gaussian_noise__L3.png",
                     "sam__ds_1__we_ird_id__gaussian_noise__L3.png"]
    assert np.array_equal(_read(out / files[0]), masks["clean"])
    assert np.array_equal(_read(out / files[1]), masks["noise3"])
    assert np.array_equal(_read(out / files[2]), masks["odd"])
    index = list(csv.DictReader((out / "index.csv").open()))
    assert len(index) == 4
    by_file = {r["file"]: r for r in index}
    assert by_file[files[1]]["iou"] == "0.5" and by_file[files[1]]["dice"] == repr(2 / 3)
    assert by_file[files[1]]["sample_id"] == "s1" and by_file[files[1]]["level"] == "3"
    assert by_file[""]["sample_id"] == "s2" and by_file[""]["pred_mask_sha256"] == ""


def test_filters(suite: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    path, _ = suite
    code, stdout, stderr = _export(path, tmp_path / "a", "--level", "3", "--sample", "s1", "--model", "sam",
                                   "--dataset", "ds/1", "--condition", "perturbation")
    assert code == 0, stderr
    assert "wrote 1 masks" in stdout and [p.name for p in (tmp_path / "a").glob("*.png")] == [
        "sam__ds_1__s1__gaussian_noise__L3.png"]
    code, _, stderr = _export(path, tmp_path / "b", "--model", "medsam")
    assert code == 2 and "model = 'medsam'" in stderr and "sam" in stderr and not (tmp_path / "b").exists()


def test_refuses_a_non_empty_folder_it_did_not_write(suite: tuple[Path, dict[str, np.ndarray]],
                                                      tmp_path: Path) -> None:
    path, _ = suite
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    code, stdout, stderr = _export(path, out)
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1 and "not empty" in stderr
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    ours = tmp_path / "ours"
    assert _export(path, ours)[0] == 0
    code, stdout, _ = _export(path, ours, "--level", "0")  # its own folder: rewritten, old files gone
    assert code == 0 and sorted(p.name for p in ours.glob("*.png")) == ["sam__ds_1__s1__clean__L0.png"]


def test_a_missing_or_hostile_mask_is_reported_not_a_crash(suite: tuple[Path, dict[str, np.ndarray]],
                                                           tmp_path: Path) -> None:
    path, masks = suite
    store = tmp_path / "var" / "t" / "pred_masks"
    pred_masks.mask_path(store, pred_masks.mask_sha256(masks["noise3"])).unlink()
    folder = tmp_path / "var" / "t" / "results" / "segmentation_results" / "model=evil" / "run=clean" / \
        "modality=ct" / "level=0"
    folder.mkdir(parents=True)
    pd.DataFrame([{"dataset": "d", "sample_id": "x", "condition": "clean", "perturbation": "clean",
                   "pred_mask_sha256": "../../../../etc/passwd"}]).to_parquet(folder / "d.parquet", index=False)
    out = tmp_path / "e"
    code, stdout, stderr = _export(path, out)
    assert code == 1 and "wrote 2 masks" in stdout and "2 stored masks missing or corrupt" in stderr
    index = list(csv.DictReader((out / "index.csv").open()))
    errors = {r["sample_id"]: r["export_error"] for r in index if r["export_error"]}
    assert "missing" in errors["s1"] and "64 lowercase hex" in errors["x"]
    assert not list(tmp_path.glob("etc*"))


def test_no_results(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "u", "results_dir": str(tmp_path / "r"), "mart_path": str(tmp_path / "m")}))
    code, _, stderr = _export(path, tmp_path / "o")
    assert code == 2 and "no segmentation_results rows" in stderr
