"""The one Definitions object, assembled explicitly."""

from __future__ import annotations

import dagster as dg

from medrobust_assets.assets.datasets import clean_samples, demo_data
from medrobust_assets.assets.marts import marts
from medrobust_assets.assets.perturbed import perturbation_gallery, perturbed_samples
from medrobust_assets.resources import SuiteResource, TrackingResource

ALL_ASSETS = [demo_data, clean_samples, perturbed_samples, perturbation_gallery, marts]


def build_resources(suite_path: str = "", mlruns_dir: str = "mlruns", workers: int = 0) -> dict[str, object]:
    """Resources for a run. An empty ``suite_path`` means: $MEDROBUST_SUITE at run time, else
    configs/demo.yaml (read when the resource is used, not at import)."""
    return {
        "suite": SuiteResource(suite_path=suite_path, workers=workers),
        "tracking": TrackingResource(mlruns_dir=mlruns_dir),
    }


defs = dg.Definitions(assets=ALL_ASSETS, resources=build_resources())
