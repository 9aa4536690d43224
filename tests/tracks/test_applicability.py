"""A folder of grayscale and RGB images runs end to end (clean index -> perturbed partition ->
checks -> mart): RGB-only types give counted ``not_applicable`` rows for grayscale samples and
calibrate on the RGB ones; a dataset whose every sample fails to load still writes its error rows."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from PIL import Image

from medrobust_lib.config import Suite
from medrobust_lib.perturb.engine import NOT_APPLICABLE
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart
from medrobust_lib.tracks.datasets import CLEAN_TABLE, build_clean_index
from medrobust_lib.tracks.perturbed import MANIFEST_TABLE, build_perturbed, read_manifest
from medrobust_lib.tracks.perturbed_checks import partition_checks

GRAY = ["g1", "g2", "g3"]
RGB = ["c1", "c2"]


def _image(seed: int, rgb: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32]
    base = (96 + 80 * np.sin(xx / 4.0 + seed) * np.cos(yy / 5.0)).astype(np.float64)
    base += rng.normal(0, 6, base.shape)
    if rgb:
        base = np.stack([base, base * 0.8 + 20, 255 - base], axis=2)
    return np.clip(base, 0, 255).astype(np.uint8)


def _folder(root: Path) -> None:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    mask = np.zeros((32, 32), np.uint8)
    mask[8:20, 10:24] = 255
    for i, sid in enumerate(GRAY + RGB):
        Image.fromarray(_image(i, sid in RGB)).save(root / "images" / f"{sid}.png")
        Image.fromarray(mask).save(root / "masks" / f"{sid}.png")


def _suite(tmp_path: Path, root: Path) -> Suite:
    return Suite.model_validate({
        "name": "mixed", "seed": 1, "results_dir": str(tmp_path / "results"),
        "mart_path": str(tmp_path / "marts.duckdb"), "workers": 1, "modalities": ["dermoscopy"],
        "demo": {"enabled": False},
        "datasets": [{"name": "mixed", "modality": "dermoscopy", "format": "folder", "root": str(root),
                      "size": None}],
        "perturbations": {"include": ["saturation", "gaussian_noise"], "levels": [1], "split": "all",
                          "calibration_subset": 2},
    })


def test_a_mixed_channel_folder_runs_end_to_end(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _folder(root)
    suite = _suite(tmp_path, root)
    clean = build_clean_index(suite, "dermoscopy")
    assert clean.n_ok == 5 and clean.n_quarantined == 0
    summary = build_perturbed(suite, "dermoscopy", 1)  # raised "needs an RGB image" before
    df = read_manifest(suite, "dermoscopy", 1)
    assert len(df) == 5 * 2  # one row per (sample, type), none vanished
    sat = df[df["perturbation"] == "saturation"].set_index("sample_id")
    assert set(sat.loc[GRAY, "status"]) == {NOT_APPLICABLE}
    assert all("needs an RGB image" in e for e in sat.loc[GRAY, "error"])
    assert set(sat.loc[RGB, "status"]) == {"ok"} and sat.loc[RGB, "ssim"].between(0.5, 1.0).all()
    # the warm start came from RGB samples only, so it is a real strength
    assert np.isfinite(sat["dataset_strength"]).all()
    assert set(df.loc[df["perturbation"] == "gaussian_noise", "status"]) == {"ok"}
    assert summary.n_not_applicable == 3 and summary.n_error == 0 and summary.n_rows == 10
    checks = {c.name: c for c in partition_checks(suite, "dermoscopy", 1, summary).results}
    assert checks["completeness"].passed, checks["completeness"].metadata
    counts = build_mart(suite.results_dir, suite.mart_path)
    assert counts[MANIFEST_TABLE] == 10
    con = duckdb.connect(suite.mart_path, read_only=True)
    try:
        got = con.execute("select status, count(*) from perturbation_manifest group by all order by all").fetchall()
    finally:
        con.close()
    assert got == [("not_applicable", 3), ("ok", 7)]


def test_a_dataset_whose_every_sample_fails_still_writes_its_rows(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _folder(root)
    suite = _suite(tmp_path, root)
    build_clean_index(suite, "dermoscopy")
    build_perturbed(suite, "dermoscopy", 1)
    for p in (root / "images").glob("*.png"):  # every image changes on disk after the clean index
        arr = np.asarray(Image.open(p)).copy()
        arr[0, 0] = 255 - arr.flat[0]
        Image.fromarray(arr).save(p)
    summary = build_perturbed(suite, "dermoscopy", 1)
    df = read_manifest(suite, "dermoscopy", 1)
    assert len(df) == 5 * 2 and set(df["status"]) == {"error"}  # no chunk dropped, no row lost
    assert all("changed_on_disk" in e for e in df["error"])
    assert summary.n_error == 10
    files = sorted(p.name for p in results.partition_dir(suite.results_dir, MANIFEST_TABLE,
                                                         {"modality": "dermoscopy", "level": 1}).iterdir())
    assert files == ["mixed__gaussian_noise.parquet", "mixed__saturation.parquet"]
    assert not results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": "dermoscopy"}).empty


@pytest.mark.parametrize("channels", [1, 3])
def test_not_applicable_rows_are_never_calibrated(tmp_path: Path, channels: int) -> None:
    from medrobust_lib.data.sample import Sample
    from medrobust_lib.perturb.engine import ChunkSpec, run_chunk

    img = _image(0, channels == 3).astype(np.float32) / 255.0
    s = Sample("a", "d", "dermoscopy", img)
    rows, stats = run_chunk(ChunkSpec("d", "dermoscopy", "saturation", 1, (0.9, 0.98), 0, 4), [s])
    if channels == 1:
        assert rows[0]["status"] == NOT_APPLICABLE and stats["calibration_evals"] == 0
        assert np.isnan(stats["dataset_strength"])
    else:
        assert rows[0]["status"] == "ok" and stats["calibration_evals"] > 0


def test_a_type_that_applies_to_no_sample_is_counted_not_dropped(tmp_path: Path) -> None:
    """Issue 43, item 6: an RGB-only type on an all-grayscale dataset used to get no chunk at all
    (it vanished); now every sample has a ``not_applicable`` row with the reason."""
    root = tmp_path / "data"
    _folder(root)
    for sid in RGB:  # every image grayscale
        (root / "images" / f"{sid}.png").unlink()
        (root / "masks" / f"{sid}.png").unlink()
    suite = _suite(tmp_path, root)
    build_clean_index(suite, "dermoscopy")
    summary = build_perturbed(suite, "dermoscopy", 1)
    df = read_manifest(suite, "dermoscopy", 1)
    sat = df[df["perturbation"] == "saturation"]
    assert sorted(sat["sample_id"]) == GRAY and set(sat["status"]) == {NOT_APPLICABLE}
    assert all("needs an RGB image" in e for e in sat["error"])
    assert summary.n_not_applicable == 3 and "saturation" in summary.types
    checks = {c.name: c for c in partition_checks(suite, "dermoscopy", 1, summary).results}
    assert checks["completeness"].passed, checks["completeness"].metadata
