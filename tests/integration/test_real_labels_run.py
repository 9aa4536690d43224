"""A researcher's own-data flow on real labels: a few LiTS 117 slices (CT, expert liver labels) written
as a NIfTI volume in another working folder, a minimal LiteMedSAM entry, then ``validate``, ``run``
and ``query`` as a user runs them (the real CLI, subprocesses, MEDROBUST_HOME). The clean Dice the
mart reports equals what LiteMedSAM's official inference script gives on the same slices
(``tests/models/fixtures/litemedsam_official_real.npz``, written by
``tools/litemedsam_official_real.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from medrobust_lib.demo.data_wheels import DataWheelError
from tests.cli_runs import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "models" / "fixtures" / "litemedsam_official_real.npz"
N_SLICES = 3
pytestmark = pytest.mark.slow  # about 65 s (Dagster run in a subprocess): .ci/run runs the slow tests after make test




def _official_union_dice(dataset: str) -> dict[str, float]:
    """sample id -> the official script's union Dice, from the committed fixture."""
    with np.load(FIXTURE, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    names = [str(x) for x in data["dataset"]]
    ids = [str(x) for x in data["sample_id"]]
    return {i: float(d) for n, i, d in zip(names, ids, data["union_dice"], strict=True) if n == dataset}


def test_lits_slices_validate_run_and_query_equal_the_official_inference(tmp_path: Path) -> None:
    from medrobust_lib.demo.real import LITS_SLICES, LITS_WINDOW
    from medrobust_lib.demo.real_wheels import write_lits117

    try:
        write_lits117(tmp_path / "data" / "lits")
    except DataWheelError as e:
        pytest.skip(f"data wheels not installed ({e}); make setup fetches them")
    home, work = tmp_path / "proj", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    suite = work / "lits.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "lits", "modalities": ["ct"], "demo": {"enabled": False},
        "datasets": [{"name": "lits117_liver", "modality": "ct", "format": "nifti", "root": str(tmp_path / "data" / "lits"),
                      "size": None, "max_samples": N_SLICES,
                      "options": {**LITS_WINDOW, **LITS_SLICES, "label_values": [1, 2]}}],
        "perturbations": {"include": ["gaussian_noise"], "levels": [2], "split": "all", "calibration_subset": 2},
        "segmentation": {"models": [{"id": "litemedsam", "family": "litemedsam", "checkpoint": "package"}],
                         "split": "all", "attacks": {"kinds": ["fgsm"], "max_samples": 1}},
    }))
    env = cli_env(home)
    res = run_cli(["validate", "--suite", str(suite)], work, env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli(["run", "--suite", str(suite), "--select", "datasets", "--select", "perturbations", "--select", "segmentation",
                "--select", "marts"], work, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = run_cli(["query", "--suite", str(suite), "--format", "json",
                "select sample_id, dice, condition, perturbation from segmentation_results where model = 'litemedsam'"],
               work, env)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    clean = {r["sample_id"]: r["dice"] for r in rows if r["condition"] == "clean"}
    official = _official_union_dice("lits117_liver")
    assert len(clean) == N_SLICES and set(clean) <= set(official)
    for sid, d in clean.items():
        assert d == pytest.approx(official[sid], abs=1e-4), sid
    assert {r["perturbation"] for r in rows} >= {"clean", "gaussian_noise", "fgsm"}
