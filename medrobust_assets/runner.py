"""Materialize the whole graph in order (used by ``medrobust demo``), one run per partition,
recorded in the instance configured by dagster.yaml so the runs show up in the UI."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from medrobust_assets.definitions import ALL_ASSETS, build_resources
from medrobust_lib.config import load_suite
from medrobust_lib.types import SEVERITY_LEVELS

# Progress is printed by run_demo; Dagster's own event stream stays in the instance (and the UI).
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def get_instance() -> dg.DagsterInstance:
    """The instance of $DAGSTER_HOME, defaulting to this project folder when it has a dagster.yaml."""
    if not os.environ.get("DAGSTER_HOME") and Path("dagster.yaml").is_file():
        os.environ["DAGSTER_HOME"] = str(Path.cwd().resolve())
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def run_demo(suite_path: str, *, workers: int = 0, log: Callable[[str], None] = print,
             instance: dg.DagsterInstance | None = None, mlruns_dir: str = "mlruns") -> str:
    """Materialize demo_data, then every partition of every asset, then the mart. Returns the
    mart path. Raises RuntimeError naming the first failed step."""
    suite = load_suite(suite_path)
    inst = instance or get_instance()
    resources = build_resources(suite_path=suite_path, mlruns_dir=mlruns_dir, workers=workers)

    def step(asset: str, partition: str | None = None) -> None:
        t0 = time.perf_counter()
        res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey.from_user_string(asset)], partition_key=partition, instance=inst,
                             resources=resources, raise_on_error=False, run_config=QUIET,
                             tags={"medrobust/source": "medrobust demo"})
        label = f"{asset}[{partition}]" if partition else asset
        if not res.success:
            raise RuntimeError(f"materializing {label} failed; see the run in the Dagster UI (run id {res.run_id})")
        log(f"  {label:<48} {time.perf_counter() - t0:6.1f} s")

    log("== datasets")
    step("demo_data")
    for m in suite.modalities:
        step("clean_samples", m)
    log("== perturbed datasets (modality x severity)")
    for m in suite.modalities:
        for lv in SEVERITY_LEVELS:
            if lv in suite.perturbations.levels:
                step("perturbed_samples", dg.MultiPartitionKey({"modality": m, "severity": str(lv)}))
    for m in suite.modalities:
        step("perturbation_gallery", m)
    from medrobust_lib.pipeline.segmentation import seg_config

    models = seg_config(suite).models
    for model in models:
        log(f"== segmentation: {model.id}")
        if model.checkpoint == "trained":
            step(f"{model.id}/base_checkpoint")
        for m in suite.modalities:
            step(f"{model.id}/clean_predictions", m)
        for kind in ("perturbed_predictions", "attack_predictions"):
            for m in suite.modalities:
                for lv in suite.perturbations.levels:
                    step(f"{model.id}/{kind}", dg.MultiPartitionKey({"modality": m, "severity": str(lv)}))
    if models:
        step("segmentation_report")
    from medrobust_lib.pipeline.vlm_config import vlm_config

    vlms = sorted(vlm_config(suite).models, key=lambda v: v.base is not None)
    for v in vlms:
        log(f"== vision-language: {v.id}")
        if v.kind == "hf" and v.base is None and v.source == "trained":
            step(f"{v.id}/base_checkpoint")
        if v.adapter == "finetuned":
            step(f"{v.id}/finetuned_adapter")
        for m in suite.modalities:
            step(f"{v.id}/vlm_clean_predictions", m)
        for m in suite.modalities:
            for lv in suite.perturbations.levels:
                step(f"{v.id}/vlm_perturbed_predictions", dg.MultiPartitionKey({"modality": m, "severity": str(lv)}))
    step("vlm_report")
    from medrobust_lib.pipeline.taxonomy import taxonomy_config

    for c in sorted(taxonomy_config(suite).configs, key=lambda c: c.base is not None):
        log(f"== safety taxonomy: {c.id}")
        if c.demo_training is not None:
            step(f"{c.id}/taxonomy_model")
        for m in suite.modalities:
            step(f"{c.id}/text_only_baselines", m)
            step(f"{c.id}/taxonomy_clean", m)
        for m in suite.modalities:
            for lv in suite.perturbations.levels:
                step(f"{c.id}/taxonomy_perturbed", dg.MultiPartitionKey({"modality": m, "severity": str(lv)}))
    step("taxonomy_report")
    log("== mart")
    step("marts")
    return suite.mart_path
