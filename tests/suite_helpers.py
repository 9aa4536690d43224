"""A tiny suite on a small demo build, shared by the integration and asset tests."""

from __future__ import annotations

from pathlib import Path

import yaml

TYPES = ["gaussian_noise", "rotation", "jpeg_compression", "ring_artifact", "hair", "saturation"]


def write_suite(root: Path, demo_root: Path, **over: object) -> Path:
    cfg = {
        "name": "tiny", "seed": 3, "results_dir": str(root / "results"), "mart_path": str(root / "marts.duckdb"),
        "workers": 1, "modalities": ["ct", "dermoscopy"],
        "demo": {"enabled": True, "root": str(demo_root), "n_per_modality": 4, "seed": 0},
        "perturbations": {"include": TYPES, "levels": [1, 2, 3, 4, 5], "split": "all", "calibration_subset": 2},
    }
    cfg.update(over)
    path = root / "suite.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path
