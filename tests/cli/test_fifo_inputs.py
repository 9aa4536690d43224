"""A FIFO given as ``perturb --mask`` or as a checkpoint no longer blocks ``perturb`` / ``validate``
(issue 44, finding 12): both answer in one line that it is not a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import yaml
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.tracks.validate import validate_suite

runner = CliRunner()


def test_a_fifo_mask_is_refused_not_read(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "img.png"), np.full((32, 32), 90, np.uint8))
    os.mkfifo(tmp_path / "mask.png")
    res = runner.invoke(app, ["perturb", str(tmp_path / "img.png"), "-t", "gaussian_noise", "-l", "2",
                              "--mask", str(tmp_path / "mask.png"), "-o", str(tmp_path / "o.png")])
    assert res.exit_code == 2 and "is not a regular file" in res.output and not (tmp_path / "o.png").exists()


def test_a_fifo_checkpoint_is_a_validate_error(tmp_path: Path) -> None:
    (tmp_path / "data" / "images").mkdir(parents=True)
    os.mkfifo(tmp_path / "sam.pth")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "fifo", "modalities": ["ct"], "demo": {"enabled": False},
        "datasets": [{"name": "d", "modality": "ct", "format": "folder", "root": str(tmp_path / "data"),
                      "options": {"mask_dir": None}}],
        "segmentation": {"models": [{"id": "sam-b", "family": "sam", "arch": "vit_b",
                                     "checkpoint": str(tmp_path / "sam.pth")}]}}))
    report = validate_suite(suite, n_load=0, root=tmp_path)
    assert any("is not a regular file" in e for e in report.errors), report.errors
