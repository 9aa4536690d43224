"""README step 5's "one track" on a new suite: ``medrobust run --select segmentation`` before the
datasets were materialized fails in one line that names the command which materializes the track
with what it depends on, and that command, run as printed, works."""

from __future__ import annotations

import shlex
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from tests.cli_runs import cli_env, run_cli

pytestmark = pytest.mark.slow  # two Dagster runs in subprocesses (about a minute)




def test_select_a_track_names_the_command_with_its_upstream_and_that_command_works(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    for i in range(2):
        img = np.full((64, 64), 40, np.uint8)
        mask = np.zeros((64, 64), np.uint8)
        img[10 + i : 40, 12:44] = 190
        mask[10 + i : 40, 12:44] = 255
        cv2.imwrite(str(data / "images" / f"s{i}.png"), img)
        cv2.imwrite(str(data / "masks" / f"s{i}.png"), mask)
    home, work = tmp_path / "proj", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    suite = work / "mine.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "mine", "modalities": ["ct"], "demo": {"enabled": False},
        "datasets": [{"name": "scans", "modality": "ct", "format": "folder", "root": str(data), "size": None,
                      "options": {"grayscale": True}}],
        "perturbations": {"include": ["gaussian_noise"], "levels": [2], "split": "all", "calibration_subset": 1},
        "segmentation": {"models": [{"id": "lite", "family": "litemedsam", "checkpoint": "package", "batch_size": 1,
                                     "attacks": False}], "split": "all"},
    }))
    env = cli_env(home)
    res = run_cli(["run", "--suite", str(suite), "--select", "segmentation"], work, env)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "no clean sample index for modality 'ct': materialize 'clean_samples' first; run " \
        "the selection with what it depends on: `" in errors[0], res.stderr
    command = errors[0].rsplit("`", 2)[-2]
    argv = [a for a in shlex.split(command) if not a.startswith("MEDROBUST_HOME=")]
    assert argv[:2] == ["medrobust", "run"] and argv[-2:] == ["--select", "+segmentation"], command
    res = run_cli(argv[1:], work, env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout + res.stderr  # progress lines go to stderr
    assert "lite/clean_predictions[ct]" in out and "lite/perturbed_predictions[ct|2]" in out, out
