"""The Definitions of one suite, built from the suite object: :func:`definitions_for`.

Nothing here runs at import and no environment variable shapes the graph: the suite's model
lists decide the asset families, its modalities and levels the partitions
(:mod:`medrobust_assets.partitions`). A code location builds its ``defs`` by calling
:func:`definitions_for` (the demo's: :mod:`medrobust_assets.location`; another suite's: the file
``medrobust ui --suite`` writes, :mod:`medrobust_assets.location_files`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import clean_samples_asset, demo_data
from medrobust_assets.assets.finetune import finetune_family, registry_evaluation
from medrobust_assets.assets.marts import build_marts
from medrobust_assets.assets.perturbed import perturbed_assets
from medrobust_assets.assets.segmentation import segmentation_family, segmentation_report
from medrobust_assets.assets.taxonomy import taxonomy_family, taxonomy_report
from medrobust_assets.assets.vlm import vlm_family, vlm_report
from medrobust_assets.partitions import SuitePartitions, partitions_for
from medrobust_assets.resources import SuiteResource, TrackingResource, pin_location
from medrobust_assets.sensors import (
    mart_after_evaluation,
    marts_job,
    nightly_reevaluation,
    registry_evaluation_job,
    registry_sensor,
)
from medrobust_lib import runtime
from medrobust_lib.config import Suite
from medrobust_lib.model_table import model_entry

JOBS = [registry_evaluation_job, marts_job]
SENSORS = [registry_sensor, mart_after_evaluation]
SCHEDULES = [nightly_reevaluation]
"""All but ``marts_job`` only for a suite that fine-tunes (:func:`declares_registry`): the registry
evaluation's job, the sensor that launches it, the mart rebuild after it, the nightly re-evaluation."""


def declares_registry(suite: Suite) -> bool:
    """Whether the suite evaluates registered segmentation versions: it declares
    ``segmentation.finetune`` (whose strategies register the versions and whose ``eval`` and ``gate``
    the registry evaluation uses). A suite without it gets no ``registry_evaluation``, no registry
    sensor and no nightly schedule: versions another suite registered in the shared MLflow registry
    are not evaluated on its data."""
    return suite.segmentation.finetune is not None


def _segmentation_assets(suite: Suite, parts: SuitePartitions) -> list[dg.AssetsDefinition]:

    assets: list[dg.AssetsDefinition] = []
    for m in suite.segmentation.models:
        assets.extend(segmentation_family(m.id, parts, trained=m.checkpoint == "trained", attacks=m.attacks,
                                          levels=suite.levels_for(f"segmentation.{m.id}"),
                                          attack_levels=suite.attack_levels_for(m.id)))
    return assets


def _vlm_assets(suite: Suite, parts: SuitePartitions) -> list[dg.AssetsDefinition]:
    produced: dict[str, dg.AssetsDefinition] = {}
    assets: list[dg.AssetsDefinition] = []
    for m in sorted(suite.vlm.models, key=lambda m: m.base is not None):  # bases first
        trained = model_entry(m.kind, "vlm").local_weights and m.base is None and m.source == "trained"
        family = vlm_family(m.id, parts, trained=trained, finetuned=m.adapter == "finetuned",
                            upstream=produced.get(m.base) if m.base else None,
                            levels=suite.levels_for(f"vlm.{m.id}"))
        if trained:
            produced[m.id] = family[0]
        assets.extend(family)
    return assets


def _taxonomy_assets(suite: Suite, parts: SuitePartitions,
                     vlm_assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:

    by_key = {a.key.to_user_string(): a for a in vlm_assets}
    assets: list[dg.AssetsDefinition] = []
    made: dict[str, dg.AssetsDefinition] = {}
    levels = suite.taxonomy_levels()
    for c in sorted(suite.taxonomy.configs, key=lambda c: c.base is not None):  # bases first
        upstream: list[Any] = []
        named = c.model if c.model is not None else c.lora_of  # lora_of: the weights its LoRA goes on
        if named is not None:
            upstream = [a for k, a in by_key.items() if k.startswith(f"{named}/") and "predictions" not in k]
        elif c.base is not None and c.base in made:
            upstream = [made[c.base]]
        family = taxonomy_family(c.id, parts, trained=c.trains(), upstream=upstream, levels=levels)
        if c.demo_training is not None:
            made[c.id] = family[0]
        assets.extend(family)
    return assets


def _finetune_assets(suite: Suite, model_assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    ft = suite.segmentation.finetune
    if ft is None:
        return []
    base = next((a for a in model_assets if a.key.path == [ft.base, "base_checkpoint"]), None)
    return finetune_family(ft.base, list(ft.strategies), base)


def suite_assets(suite: Suite) -> list[dg.AssetsDefinition]:
    """Every asset of ``suite``'s graph: the datasets and perturbations over its modalities and
    levels, one family per segmentation model, VLM and taxonomy configuration it names, the
    fine-tuning family when it fine-tunes, the reports, the registry evaluation and the mart.

    Only what the suite declares: ``demo_data`` when the demo is enabled; a track's report only
    when the track has models (or configurations); ``registry_evaluation`` only when
    :func:`declares_registry`. A segmentation-only suite thus materializes no VLM, taxonomy or demo
    asset and opens no MLflow experiment for them."""
    parts = partitions_for(suite)
    models = _segmentation_assets(suite, parts)
    finetune = _finetune_assets(suite, models)
    vlms = _vlm_assets(suite, parts)
    taxonomy = _taxonomy_assets(suite, parts, vlms)
    demo = [demo_data] if suite.demo.enabled else []
    reports: list[dg.AssetsDefinition] = []
    if models:
        reports.append(segmentation_report([a for a in models if a.key.path[-1] != "base_checkpoint"]))
    if vlms:
        reports.append(vlm_report([a for a in vlms if "predictions" in a.key.path[-1]]))
    if taxonomy:
        reports.append(taxonomy_report([a for a in taxonomy if a.key.path[-1].startswith("taxonomy_")
                                        and a.key.path[-1] != "taxonomy_model"]))
    registry = [registry_evaluation] if declares_registry(suite) else []
    assets = [*demo, clean_samples_asset(parts, demo=bool(demo)), *perturbed_assets(parts), *models, *finetune,
              *registry, *vlms, *taxonomy, *reports]
    assets.append(build_marts([*reports, *registry,
                               *[a for a in finetune if a.key.path[-1] == "strategy_ranking"]]))
    return assets


def build_resources(suite_path: str | Path = "", mlruns_dir: str = "mlruns", workers: int = 0,
                    retrain: bool = False) -> dict[str, object]:
    """Resources for a run of the suite at ``suite_path`` (read when a resource is used, through
    :func:`medrobust_lib.runtime.load_suite`: once per process while the file is unchanged)."""
    return {
        "suite": SuiteResource(suite_path=str(suite_path), workers=workers, retrain=retrain),
        "tracking": TrackingResource(mlruns_dir=mlruns_dir),
    }


def definitions_for(suite: Suite, *, suite_path: str | Path | None = None, mlruns_dir: str = "mlruns",
                    workers: int = 0, retrain: bool = False) -> dg.Definitions:
    """The Definitions of ``suite``: its assets (:func:`suite_assets`), the mart job, the registry
    job, sensors and nightly schedule when the suite declares a registry (:func:`declares_registry`),
    and the resources that run it. ``suite_path``: the YAML the runs read
    (default: the file :func:`medrobust_lib.runtime.load_suite` parsed ``suite`` from; a suite
    built in memory without one can be planned and inspected, and its runs fail with a clear
    error). Two suites give two independent Definitions in one process."""
    path = str(suite_path) if suite_path else (runtime.suite_source(suite) or "")
    registry = declares_registry(suite)
    return dg.Definitions(assets=suite_assets(suite), jobs=JOBS if registry else [marts_job],
                          sensors=SENSORS if registry else [], schedules=SCHEDULES if registry else [],
                          resources=build_resources(path, mlruns_dir=mlruns_dir, workers=workers, retrain=retrain))


def definitions_for_file(suite_path: str | Path, *, pin: bool = False, **kwargs: Any) -> dg.Definitions:
    """:func:`definitions_for` of the suite YAML at ``suite_path`` (parsed once per process).
    ``pin``: the code-location modules set it, so runs of this process cannot be pointed at another
    suite file or MLflow store by launch config (:func:`medrobust_assets.resources.pin_location`)."""
    path = Path(suite_path).resolve()
    if pin:
        pin_location(path, kwargs.get("mlruns_dir", "mlruns"))
    return definitions_for(runtime.load_suite(path), suite_path=path, **kwargs)
