"""Materialize the whole graph in order (used by ``medrobust demo``), one run per partition,
recorded in the instance configured by dagster.yaml so the runs show up in the UI."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

    def step(asset: str, partition: str | dg.MultiPartitionKey | None = None) -> dg.ExecuteInProcessResult:
        t0 = time.perf_counter()
        res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey.from_user_string(asset)], partition_key=partition, instance=inst,
                             resources=resources, raise_on_error=False, run_config=QUIET,
                             tags={"medrobust/source": "medrobust demo"})
        label = f"{asset}[{partition}]" if partition else asset
        if not res.success:
            raise RuntimeError(f"materializing {label} failed; see the run in the Dagster UI (run id {res.run_id})")
        log(f"  {label:<48} {time.perf_counter() - t0:6.1f} s")
        for ev in res.get_asset_check_evaluations():
            if ev.check_name == "error_share" and not ev.passed:
                share = ev.metadata.get("error_share")
                log(f"    error_share check FAILED ({share.value if share is not None else '?'} errors): the "
                    "partition is left out of the mart until re-run")
        return res

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
    from medrobust_lib.pipeline.strategies import finetune_config

    ft = finetune_config(suite)
    if ft is not None:
        log(f"== fine-tuning strategies from {ft.base}")
        t_ft = time.perf_counter()
        for st in ft.strategies:
            step(f"{ft.base}/finetuned_checkpoint", st)
        log(f"  (all {len(ft.strategies)} strategies fine-tuned in {time.perf_counter() - t_ft:.1f} s)")
        for st in ft.strategies:
            step(f"{ft.base}/strategy_predictions", st)
        step(f"{ft.base}/strategy_ranking")
        run_registry_demo(suite, inst, step, log, mlruns_dir)
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


def _sensor_tick(inst: dg.DagsterInstance, mlruns_dir: str, cursor_file: Path) -> list[str]:
    """One evaluation of the registry sensor, as the daemon would run it; the cursor lives in
    ``cursor_file`` (the daemon keeps its own). Returns the requested partition keys."""
    from medrobust_assets.resources import TrackingResource
    from medrobust_assets.sensors import registry_sensor

    cursor = cursor_file.read_text() if cursor_file.is_file() else None
    with dg.build_sensor_context(instance=inst, cursor=cursor,
                                 resources={"tracking": TrackingResource(mlruns_dir=mlruns_dir)}) as ctx:
        out = registry_sensor(ctx)
    assert isinstance(out, dg.SensorResult)
    for req in out.dynamic_partitions_requests or []:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            inst.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    cursor_file.parent.mkdir(parents=True, exist_ok=True)
    cursor_file.write_text(out.cursor or "")
    return [r.partition_key for r in out.run_requests or [] if r.partition_key]


def _gate(res: dg.ExecuteInProcessResult) -> tuple[bool, str]:
    evs = [e for e in res.get_asset_check_evaluations() if e.check_name == "robustness_gate"]
    if not evs:
        return True, "no gate result"
    md = evs[0].metadata
    text = md["verdict"].value if "verdict" in md else md.get("note", dg.MetadataValue.text("")).value
    return evs[0].passed, str(text)


def run_registry_demo(suite: Any, inst: dg.DagsterInstance, step: Callable[..., dg.ExecuteInProcessResult],
                      log: Callable[[str], None], mlruns_dir: str) -> None:
    """The registry loop on the demo, with no daemon: the sensor's evaluation is run here.

    1. A sensor tick launches ``registry_evaluation`` for every version not seen yet (the six
       strategy checkpoints: their rows are reused).
    2. A passing candidate: the LoRA recipe retrained with another seed is registered (alias
       ``candidate``); the tick evaluates it and the ``robustness_gate`` check compares it with the
       champion; then the mart is rebuilt. The time from registration to rows in the mart is the
       sensor-to-results latency (without the daemon's polling interval).
    3. A deliberately degraded candidate (seeded noise, 0.5 sd, on the mask decoder) must FAIL the gate.
    Raises RuntimeError when the gate verdicts are not the expected ones."""
    from medrobust_lib.pipeline.strategies import (
        degrade_checkpoint,
        finetune_strategy,
        register_version,
        require_finetune,
        strategy_dir,
    )
    from medrobust_lib.store import registry

    ft = require_finetune(suite)
    strategy = "lora" if "lora" in ft.strategies else ft.strategies[0]
    name = registry.seg_model_name(ft.base, strategy)
    cursor_file = Path(suite.results_dir).parent / "dagster" / "registry_sensor_cursor.json"
    log("== registry loop: sensor -> registry_evaluation -> robustness_gate")

    def evaluate_new() -> None:
        for key in _sensor_tick(inst, mlruns_dir, cursor_file):
            passed, text = _gate(step("registry_evaluation", key))
            log(f"    robustness_gate {key}: {'passed' if passed else 'FAILED'} ({text})")

    evaluate_new()
    root = strategy_dir(suite, ft.base, strategy)
    base_tags = {"strategy": strategy, "suite": suite.name, "dataset": ",".join(suite.modalities), "base_model": ft.base}
    retrained = finetune_strategy(suite, strategy, seed=suite.seed + 1, out_dir=root.with_name(root.name + "-seed1"))
    t_reg = time.perf_counter()
    v2, created = register_version(Path(retrained.checkpoint).parent, name,
                                   {**base_tags, "role": "retrained (seed + 1)", "val_dice": f"{retrained.val_dice:.4f}"},
                                   mlruns_dir=mlruns_dir)
    evaluate_new()
    if created:
        step("marts")
        log(f"  sensor-to-results latency for {name} v{v2}: {time.perf_counter() - t_reg:.1f} s "
            "(sensor tick + registry_evaluation + gate + mart rebuild; the daemon adds up to its 30 s interval)")
    degraded = degrade_checkpoint(root, root.with_name(root.name + "-degraded"), noise=0.5, seed=suite.seed,
                                  prefix="mask_decoder.")
    v3, _ = register_version(degraded.parent, name, {**base_tags, "role": "degraded (mask-decoder noise 0.5 sd)"},
                             mlruns_dir=mlruns_dir)
    evaluate_new()
    verdicts = {v: registry.version_tags(name, v, mlruns_dir).get("medrobust.gate", "") for v in (v2, v3)}
    log(f"  gate verdicts: retrained v{v2}: {verdicts[v2]}; degraded v{v3}: {verdicts[v3]}")
    if not verdicts[v2].startswith("PASS") or not verdicts[v3].startswith("FAIL"):
        raise RuntimeError(f"the regression gate did not behave as expected on the demo: retrained v{v2} "
                           f"{verdicts[v2] or 'not gated'}, degraded v{v3} {verdicts[v3] or 'not gated'}")
