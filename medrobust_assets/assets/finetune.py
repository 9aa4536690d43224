"""Fine-tuning strategies and the registry loop (issue 6).

Per base model: ``<base>/finetuned_checkpoint`` and ``<base>/strategy_predictions`` partitioned by
strategy, then ``<base>/strategy_ranking``. One ``registry_evaluation`` asset partitioned by
registered version (``<registered name>:<version>``, a dynamic partition the registry sensor
adds) evaluates any registered segmentation checkpoint and runs the ``robustness_gate`` check
against the model's ``champion``.
"""

from pathlib import Path
from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.assets.perturbed import PERTURBED_SAMPLES
from medrobust_assets.metadata import image_md, markdown_table
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_assets.tags import GPU_OP_TAGS
from medrobust_lib.paths import suite_paths
from medrobust_lib.store.model_registry import seg_model_name
from medrobust_lib.tracks.finetune.strategy_runs import (
    evaluate_model,
    evaluate_version,
    finetune_strategy,
    register_version,
    require_finetune,
    strategy_model_config,
    strategy_params,
)

REGISTERED_VERSIONS = dg.DynamicPartitionsDefinition(name="registered_seg_versions")
REGISTRY_PREFIX = "medrobust-seg-"


def version_key(name: str, version: int) -> str:
    return f"{name}:{version}"


def parse_version_key(key: str) -> tuple[str, int]:
    name, _, version = key.rpartition(":")
    if not name or not version.isdigit():
        raise ValueError(f"not a registered-version partition key: {key!r}; expected '<name>:<version>'")
    return name, int(version)


def finetune_family(base_id: str, strategies: list[str], base_checkpoint: Any) -> list[dg.AssetsDefinition]:
    """The strategy-partitioned checkpoint and evaluation assets of one base model, and its ranking."""
    by_strategy = dg.StaticPartitionsDefinition(strategies)
    upstream = [base_checkpoint] if base_checkpoint is not None else [CLEAN_SAMPLES]

    @dg.asset(
        key=[base_id, "finetuned_checkpoint"], group_name="finetune", kinds={"pytorch", "safetensors", "mlflow"},
        partitions_def=by_strategy, deps=[*upstream, CLEAN_SAMPLES], pool="gpu", op_tags=GPU_OP_TAGS,
        description=f"{base_id} fine-tuned with one strategy (full, decoder_only, decoder_prompt, encoder_partial, "
                    "lora, adapter, lora_plus_encoder, lora_plus_decoder) on the train split, selected on val (or "
                    "the last weights: finetune.train.select), test Dice reported; safetensors + "
                    f"config.json logged to MLflow and registered as medrobust-seg-{base_id}-<strategy> with the "
                    "'candidate' alias (the first version is also 'champion'). Resumes from its train_state.pt.",
    )
    def finetuned_checkpoint(context: dg.AssetExecutionContext, suite: SuiteResource,
                             tracking: TrackingResource) -> dg.MaterializeResult:

        s = suite.load()
        strategy = context.partition_key
        with tracking.run(context, s, "finetune", {"model": base_id, "strategy": strategy}) as run:
            r = finetune_strategy(s, strategy, log=context.log.info)
            metrics = {"val_dice": r.val_dice, "test_dice": r.test_dice, "base_val_dice": r.base_val_dice,
                       "n_trainable": r.n_trainable, "n_total": r.n_total, "steps": r.steps, "train_seconds": r.seconds}
            tracking.log_metrics(run, metrics)
            version, created = None, False
            if run is not None:
                folder = Path(r.checkpoint).parent
                tags = {"strategy": strategy, "dataset": ",".join(s.modalities), "suite": s.name,
                        "base_model": base_id, "base_checkpoint_sha256": str(r.meta.get("base_checkpoint_sha256")),
                        "val_dice": f"{r.val_dice:.4f}", "test_dice": f"{r.test_dice:.4f}",
                        "n_trainable": str(r.n_trainable), "dagster.run_id": context.run_id}
                version, created = register_version(folder, seg_model_name(base_id, strategy), tags, run=run,
                                                    mlruns_dir=tracking.mlruns_dir)
        return dg.MaterializeResult(metadata={
            **metrics, "trainable_modules": dg.MetadataValue.json(r.trainable_modules),
            "checkpoint": dg.MetadataValue.path(r.checkpoint),
            "registered_model": seg_model_name(base_id, strategy), "registered_version": version,
            "new_version": created, "reused": r.reused,
        })

    @dg.asset(
        key=[base_id, "strategy_predictions"], group_name="finetune", kinds={"pytorch", "parquet"},
        partitions_def=by_strategy, pool="gpu", op_tags=GPU_OP_TAGS,
        deps=[finetuned_checkpoint, dg.AssetDep(PERTURBED_SAMPLES, partition_mapping=dg.AllPartitionMapping())],
        description=f"segmentation_results rows of {base_id}-<strategy>: clean test split, the perturbation types "
                    "and levels of segmentation.finetune.eval and FGSM/PGD, with IoU/Dice and drops.",
    )
    def strategy_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                             tracking: TrackingResource) -> dg.MaterializeResult:

        s = suite.load()
        m = strategy_model_config(s, context.partition_key)
        with tracking.run(context, s, "finetune_eval", {"model": m.id, "strategy": m.strategy}) as run:
            r = evaluate_model(s, m, log=context.log.info)
            meta = {"n_rows": r.n_rows, "n_failed": r.n_failed, "partitions": r.n_partitions, "seconds": r.seconds,
                    **{f"mean_iou_{k}": v for k, v in r.mean_iou.items()}}
            tracking.log_metrics(run, meta)
        return dg.MaterializeResult(metadata={**meta, "model_id": m.id, "checkpoint_hash": r.checkpoint})

    @dg.asset(
        key=[base_id, "strategy_ranking"], group_name="finetune", kinds={"python", "parquet", "png"},
        deps=[strategy_predictions],
        description="Table strategy_ranking_stats (views strategy_ranking, floor datasets left out, and "
                    "strategy_ranking_all): mean IoU / Dice drop per strategy over "
                    "corruptions and over attacks with bootstrap 95 % CIs, beside the published ranking.",
    )
    def strategy_ranking(context: dg.AssetExecutionContext, suite: SuiteResource,
                         tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.report.figures.paper import strategy_bars
        from medrobust_lib.tracks.finetune.ranking import compare_published, write_strategy_ranking

        s = suite.load()
        ft = require_finetune(s)
        models = {f"{base_id}-{st}": (base_id, st) for st in ft.strategies}
        with tracking.run(context, s, "finetune_report") as run:
            table = write_strategy_ranking(s.results_dir, models, strategy_params(s), s.seed,
                                           min_n=s.stats.min_n,
                                           include_off_band=s.perturbations.include_off_band)
            bars = strategy_bars(table, suite_paths(s).reports / "finetune")
            tracking.log_files(run, bars, "ranking")
            tracking.log_text(run, table.to_csv(index=False), "ranking/strategy_ranking.csv")
        cols = ["strategy", "kind", "mean_iou_drop", "iou_drop_ci_low", "iou_drop_ci_high", "mean_dice_drop",
                "clean_iou", "n_samples", "n_conditions", "n_trainable", "rank", "ref_strategy", "iou_drop_diff",
                "wilcoxon_q"]
        meta: dict[str, Any] = {"n_rows": len(table), "ranking": markdown_table(table[cols] if len(table) else table),
                                "vs_published": markdown_table(compare_published(table))}
        for p in bars:
            meta[p.stem] = image_md(p)
        return dg.MaterializeResult(metadata=meta)

    return [finetuned_checkpoint, strategy_predictions, strategy_ranking]


@dg.asset(
    key="registry_evaluation", group_name="finetune", kinds={"pytorch", "parquet", "mlflow"},
    partitions_def=REGISTERED_VERSIONS, pool="gpu", op_tags=GPU_OP_TAGS,
    deps=[dg.AssetDep(PERTURBED_SAMPLES, partition_mapping=dg.AllPartitionMapping())],
    check_specs=[dg.AssetCheckSpec("robustness_gate", asset="registry_evaluation", description=(
        "medrobust check inside Dagster: this version against the model's 'champion' on the same samples and "
        "conditions (paired tests, Benjamini-Hochberg); ERROR when it is less robust beyond the thresholds of "
        "segmentation.finetune.gate."))],
    description="Evaluates one registered segmentation version (partition '<name>:<version>', added by the "
                "registry sensor) on the fine-tuning evaluation set as model '<name>-v<version>'; rows of the same "
                "weights already evaluated by the strategy asset are reused.",
)
def registry_evaluation(context: dg.AssetExecutionContext, suite: SuiteResource, tracking: TrackingResource) -> Any:
    from medrobust_lib.tracks.finetune.gate import gate_version, summary_frame

    s = suite.load()
    name, version = parse_version_key(context.partition_key)
    with tracking.run(context, s, "registry_evaluation", {"model": name, "version": version}) as run:
        fresh = context.run.tags.get("medrobust/trigger") == "nightly"  # nightly: recompute, never copy
        meta = evaluate_version(s, name, version, tracking.mlruns_dir, reuse=not fresh, log=context.log.info)
        from medrobust_lib.tracks.segmentation.stats import write_model_stats

        meta["n_stats_rows"] = len(write_model_stats(s.results_dir, meta["model_id"], s.seed, s.stats.min_n))  # CIs in the views
        tracking.log_metrics(run, meta)
    yield dg.MaterializeResult(metadata=meta)

    champion, result = gate_version(s, name, version, tracking.mlruns_dir, log=context.log.info)
    if result is None:
        yield dg.AssetCheckResult(check_name="robustness_gate", passed=True, severity=dg.AssetCheckSeverity.WARN,
                                  metadata={"note": f"nothing to compare: {name} has champion {champion}"})
        return
    yield dg.AssetCheckResult(
        check_name="robustness_gate", passed=result.passed, severity=dg.AssetCheckSeverity.ERROR,
        metadata={"champion_version": champion, "verdict": result.verdict,
                  "failures": dg.MetadataValue.md("\n".join(f"- {f}" for f in result.failures) or "_none_"),
                  "differences": markdown_table(summary_frame(result))})
