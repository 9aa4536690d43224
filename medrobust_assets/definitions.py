"""The one Definitions object, assembled explicitly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import clean_samples, demo_data
from medrobust_assets.assets.finetune import finetune_family, registry_evaluation
from medrobust_assets.assets.marts import build_marts
from medrobust_assets.assets.perturbed import perturbation_gallery, perturbed_samples
from medrobust_assets.assets.segmentation import segmentation_family, segmentation_report
from medrobust_assets.assets.taxonomy import taxonomy_family, taxonomy_report
from medrobust_assets.assets.vlm import vlm_family, vlm_report
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_assets.sensors import (
    mart_after_evaluation,
    marts_job,
    nightly_reevaluation,
    registry_evaluation_job,
    registry_sensor,
)


def _suite_for_definitions() -> Any:
    """The suite whose model list shapes the asset graph ($MEDROBUST_SUITE or the demo suite).
    Only the model ids are read here; everything else is read at run time by the resources."""
    from medrobust_lib.config import load_suite

    path = dg.EnvVar("MEDROBUST_SUITE").get_value("configs/demo.yaml") or "configs/demo.yaml"
    return load_suite(path) if Path(path).is_file() else None


def _model_assets() -> list[dg.AssetsDefinition]:
    suite = _suite_for_definitions()
    assets: list[dg.AssetsDefinition] = []
    if suite is not None:
        for m in suite.segmentation.models:
            assets.extend(segmentation_family(m.id, trained=m.checkpoint == "trained", attacks=m.attacks))
    return assets


def _vlm_assets() -> list[dg.AssetsDefinition]:

    suite = _suite_for_definitions()
    assets: list[dg.AssetsDefinition] = []
    if suite is None:
        return assets
    produced: dict[str, dg.AssetsDefinition] = {}
    models = suite.vlm.models
    for m in sorted(models, key=lambda m: m.base is not None):  # bases first
        trained = m.kind == "hf" and m.base is None and m.source == "trained"
        family = vlm_family(m.id, trained, m.adapter == "finetuned", produced.get(m.base) if m.base else None)
        if trained:
            produced[m.id] = family[0]
        assets.extend(family)
    return assets


def _taxonomy_assets(vlm_assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    suite = _suite_for_definitions()
    if suite is None:
        return []
    by_key = {a.key.to_user_string(): a for a in vlm_assets}
    assets: list[dg.AssetsDefinition] = []
    made: dict[str, dg.AssetsDefinition] = {}
    configs = suite.taxonomy.configs
    for c in sorted(configs, key=lambda c: c.base is not None):  # bases first
        upstream: list[Any] = []
        if c.model is not None:
            upstream = [a for k, a in by_key.items() if k.startswith(f"{c.model}/") and "predictions" not in k]
        elif c.base is not None and c.base in made:
            upstream = [made[c.base]]
        family = taxonomy_family(c.id, c.demo_training is not None, upstream)
        if c.demo_training is not None:
            made[c.id] = family[0]
        assets.extend(family)
    return assets


def _finetune_assets(model_assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    suite = _suite_for_definitions()
    ft = suite.segmentation.finetune if suite is not None else None
    if ft is None:
        return []
    base = next((a for a in model_assets if a.key.path == [ft.base, "base_checkpoint"]), None)
    return finetune_family(ft.base, list(ft.strategies), base)


MODEL_ASSETS = _model_assets()
FINETUNE_ASSETS = _finetune_assets(MODEL_ASSETS)
VLM_ASSETS = _vlm_assets()
TAXONOMY_ASSETS = _taxonomy_assets(VLM_ASSETS)
SEGMENTATION_REPORT = segmentation_report([a for a in MODEL_ASSETS if a.key.path[-1] != "base_checkpoint"])
VLM_REPORT = vlm_report([a for a in VLM_ASSETS if "predictions" in a.key.path[-1]])
TAXONOMY_REPORT = taxonomy_report([a for a in TAXONOMY_ASSETS if a.key.path[-1].startswith("taxonomy_")
                                   and a.key.path[-1] != "taxonomy_model"])
ALL_ASSETS = [demo_data, clean_samples, perturbed_samples, perturbation_gallery, *MODEL_ASSETS,
              SEGMENTATION_REPORT, *FINETUNE_ASSETS, registry_evaluation, *VLM_ASSETS, VLM_REPORT,
              *TAXONOMY_ASSETS, TAXONOMY_REPORT]
ALL_ASSETS.append(build_marts([SEGMENTATION_REPORT, VLM_REPORT, TAXONOMY_REPORT, registry_evaluation,
                               *[a for a in FINETUNE_ASSETS if a.key.path[-1] == "strategy_ranking"]]))
JOBS = [registry_evaluation_job, marts_job]
SENSORS = [registry_sensor, mart_after_evaluation]


def build_resources(suite_path: str = "", mlruns_dir: str = "mlruns", workers: int = 0,
                    retrain: bool = False) -> dict[str, object]:
    """Resources for a run. An empty ``suite_path`` means: $MEDROBUST_SUITE at run time, else
    configs/demo.yaml (read when the resource is used, not at import)."""
    return {
        "suite": SuiteResource(suite_path=suite_path, workers=workers, retrain=retrain),
        "tracking": TrackingResource(mlruns_dir=mlruns_dir),
    }


SCHEDULES = [nightly_reevaluation]
defs = dg.Definitions(assets=ALL_ASSETS, jobs=JOBS, sensors=SENSORS, schedules=SCHEDULES, resources=build_resources())
