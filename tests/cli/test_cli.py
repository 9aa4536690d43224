"""The medrobust CLI: list, perturb (grayscale/RGB/npy/all), query."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.perturb.spec import list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart

runner = CliRunner()


def test_list_perturbations_covers_the_registry() -> None:
    res = runner.invoke(app, ["list-perturbations", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["name"] for r in rows] == list_perturbations()
    assert all(r["reference"] for r in rows)


def _write_png(path: Path, img: np.ndarray) -> Path:
    u8 = np.round(img * 255).astype(np.uint8)
    cv2.imwrite(str(path), u8 if u8.ndim == 2 else cv2.cvtColor(u8, cv2.COLOR_RGB2BGR))
    return path


def test_perturb_one_npy_output_is_the_measured_array(tmp_path: Path, gray_image: np.ndarray) -> None:
    src = _write_png(tmp_path / "in.png", gray_image)
    out = tmp_path / "out.npy"
    res = runner.invoke(app, ["perturb", str(src), "--type", "gaussian_blur", "--level", "3", "--output", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout.strip())
    arr = np.load(out)
    assert arr.dtype == np.float32 and arr.shape == gray_image.shape
    clean = cv2.imread(str(src), cv2.IMREAD_UNCHANGED).astype(np.float32) / 255
    assert ssim(clean, arr) == rec["ssim"]
    assert rec["band_reached"] and 0.70 <= rec["ssim"] <= 0.79
    assert set(rec) >= {"perturbation", "level", "strength", "ssim", "band_reached", "n_ssim_evals", "path"}


def test_perturb_all_keeps_channels_and_covers_modality(tmp_path: Path, gray_image: np.ndarray,
                                                        rgb_image: np.ndarray) -> None:
    gsrc = _write_png(tmp_path / "g.png", gray_image)
    res = runner.invoke(app, ["perturb", str(gsrc), "--type", "all", "--level", "1", "--modality", "mri",
                              "--output-dir", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.strip().splitlines()]
    names = {r["perturbation"] for r in recs}
    expected = set(list_perturbations(modality="mri", n_channels=1))
    assert names == expected and "saturation" not in names and "kspace_spike" in names
    for r in recs:
        assert cv2.imread(r["path"], cv2.IMREAD_UNCHANGED).ndim == 2
    csrc = _write_png(tmp_path / "c.png", rgb_image)
    res = runner.invoke(app, ["perturb", str(csrc), "--type", "saturation", "--level", "all",
                              "--output-dir", str(tmp_path / "c"), "--format", "npy"])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert [r["level"] for r in recs] == [1, 2, 3, 4, 5]
    assert all(np.load(r["path"]).shape == rgb_image.shape for r in recs)
    ssims = [r["ssim"] for r in recs]
    assert ssims == sorted(ssims, reverse=True)


def test_perturb_errors_are_clear(tmp_path: Path, gray_image: np.ndarray) -> None:
    src = _write_png(tmp_path / "g.png", gray_image)
    res = runner.invoke(app, ["perturb", str(src), "--type", "saturation", "--level", "1", "--output", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "RGB" in res.output
    res = runner.invoke(app, ["perturb", str(tmp_path / "missing.png"), "--output", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "not found" in res.output
    res = runner.invoke(app, ["perturb", str(src), "--type", "nope", "--output", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "valid:" in res.output


def test_query_formats_and_read_only(tmp_path: Path) -> None:
    res_dir = tmp_path / "results"
    p = results.chunk_path(res_dir, "perturbation_manifest", {"modality": "ct", "level": 1}, "a")
    results.write_chunk(p, [{"sample_id": "s1", "perturbation": "x", "ssim": 0.95, "status": "ok"}], "fp")
    mart = tmp_path / "m.duckdb"
    build_mart(res_dir, mart)
    res = runner.invoke(app, ["query", "select sample_id, ssim from perturbation_manifest", "--format", "json",
                              "--mart", str(mart)])
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"sample_id": "s1", "ssim": 0.95}]
    res = runner.invoke(app, ["query", "select level from perturbation_manifest", "-f", "csv", "--mart", str(mart)])
    assert res.stdout.split() == ["level", "1"]
    res = runner.invoke(app, ["query", "delete from perturbation_manifest", "--mart", str(mart)])
    assert res.exit_code == 2 and "read-only" in res.output.lower()
    res = runner.invoke(app, ["query", "select 1", "--mart", str(tmp_path / "none.duckdb")])
    assert res.exit_code == 2 and "medrobust demo" in res.output
