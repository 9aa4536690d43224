"""Segmentation asset family, one per configured model (key prefix = model id), plus the report."""

from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.assets.perturbed import PERTURBED_SAMPLES
from medrobust_assets.metadata import image_md, install_or_train, markdown_table
from medrobust_assets.partitions import SuitePartitions, by_modality, modality_and_level
from medrobust_assets.progress import reporter
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_assets.tags import GPU_OP_TAGS
from medrobust_lib.paths import suite_paths
from medrobust_lib.tracks.segmentation.model import committed_test_dice, train_base_checkpoint


def _eval_metadata(summary: Any) -> dict[str, Any]:
    overhead = summary.total_seconds / summary.model_seconds if summary.model_seconds else float("nan")
    return {"n_rows": summary.n_rows, "n_failed": summary.n_failed, "mean_iou": summary.mean_iou,
            "mean_dice": summary.mean_dice, "clean_cache_hits": summary.clean_cache_hits,
            "clean_cache_misses": summary.clean_cache_misses, "images_per_s": summary.n_images / summary.total_seconds
            if summary.total_seconds else float("nan"), "pipeline_overhead": overhead,
            "reused": summary.reused}  # true: the partition was current (a resumed run), nothing scored


def _run_partition(context: dg.AssetExecutionContext, suite: SuiteResource, tracking: TrackingResource,
                   model_id: str, condition: str, evaluate: Any) -> dg.MaterializeResult:
    """One modality x severity evaluation with its MLflow run and metadata."""
    modality, level = modality_and_level(context)
    s = suite.load()
    with tracking.run(context, s, "segmentation_eval", {"model": model_id, "condition": condition,
                                                        "level": level}) as run:
        meta = _eval_metadata(evaluate(s, model_id, modality, level, progress=reporter(context)))
        tracking.log_metrics(run, meta)
    return dg.MaterializeResult(metadata=meta)


def segmentation_family(model_id: str, parts: SuitePartitions, *, trained: bool, attacks: bool = True,
                        levels: list[int] | None = None,
                        attack_levels: list[int] | None = None) -> list[dg.AssetsDefinition]:
    """Assets for one model: [base_checkpoint], clean_predictions (by the suite's modalities),
    perturbed_predictions (by modality x severity over the model's ``levels``; None: every
    perturbed level of the suite) and [attack_predictions] (by modality x severity over
    ``attack_levels``, perturbed or not; None: the same levels as perturbed_predictions)."""
    grid = parts.grid(levels)
    attack_grid = grid if attack_levels is None else parts.attack_grid(attack_levels)
    out: list[dg.AssetsDefinition] = []
    deps_clean: list[Any] = [CLEAN_SAMPLES]
    if trained:
        @dg.asset(
            key=[model_id, "base_checkpoint"], group_name="segmentation", kinds={"pytorch", "safetensors"},
            deps=[CLEAN_SAMPLES], pool="gpu", op_tags=GPU_OP_TAGS,
            description=f"{model_id}: trained from scratch on the demo train split (selection on val), saved as "
                        "safetensors + config.json; reports test Dice.",
        )
        def base_checkpoint(context: dg.AssetExecutionContext, suite: SuiteResource,
                            tracking: TrackingResource) -> dg.MaterializeResult:
            from medrobust_lib.demo.committed import install_sam

            s = suite.load()
            inst = install_sam(s, model_id)

            def committed() -> dict[str, Any]:  # test Dice of the committed weights measured again here
                dice = committed_test_dice(s, model_id)
                with tracking.run(context, s, "segmentation_training",
                                  {"model": model_id, "weights": "committed"}) as run:
                    tracking.log_metrics(run, {"test_dice": dice})
                return {"test_dice": dice, "val_dice": inst.meta.get("val_dice"), "steps": inst.meta.get("best_step"),
                        "checkpoint": dg.MetadataValue.path(inst.folder)}

            def train() -> dict[str, Any]:
                with tracking.run(context, s, "segmentation_training", {"model": model_id}) as run:
                    r = train_base_checkpoint(s, model_id, log=context.log.info)
                    tracking.log_metrics(run, {"val_dice": r.val_dice, "test_dice": r.test_dice, "steps": r.steps,
                                               "train_seconds": r.seconds})
                    tracking.log_artifact(run, r.checkpoint, "checkpoint")
                return {"val_dice": r.val_dice, "test_dice": r.test_dice, "steps": r.steps, "seconds": r.seconds,
                        "n_train": r.n_train, "checkpoint": dg.MetadataValue.path(r.checkpoint)}

            return install_or_train(context, inst, what=f"training {model_id}", committed=committed, train=train)

        out.append(base_checkpoint)
        deps_clean.append(base_checkpoint)

    @dg.asset(
        key=[model_id, "clean_predictions"], group_name="segmentation", kinds={"pytorch", "parquet"},
        partitions_def=parts.modality, deps=deps_clean, pool="gpu", op_tags=GPU_OP_TAGS,
        description=f"{model_id}: clean predictions with tight box prompts, one row per test image "
                    "(segmentation_results, condition 'clean'); the clean cache for every other condition.",
    )
    def clean_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                          tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.segmentation.evaluate import evaluate_clean

        s = suite.load()
        with tracking.run(context, s, "segmentation_eval", {"model": model_id, "condition": "clean"}) as run:
            summary = evaluate_clean(s, model_id, context.partition_key, progress=reporter(context))
            meta = _eval_metadata(summary)
            tracking.log_metrics(run, meta)
        return dg.MaterializeResult(metadata=meta)

    @dg.asset(
        key=[model_id, "perturbed_predictions"], group_name="segmentation", kinds={"pytorch", "parquet"},
        partitions_def=grid, pool="gpu", op_tags=GPU_OP_TAGS,
        deps=[PERTURBED_SAMPLES, dg.AssetDep(clean_predictions, partition_mapping=by_modality)],
        description=f"{model_id}: predictions on every perturbed test image of the partition, regenerated from "
                    "the manifest (spatial types with moved masks and boxes); IoU/Dice and drops vs clean.",
    )
    def perturbed_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                              tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.segmentation.evaluate import evaluate_perturbed

        return _run_partition(context, suite, tracking, model_id, "perturbation", evaluate_perturbed)

    @dg.asset(
        key=[model_id, "attack_predictions"], group_name="segmentation", kinds={"pytorch", "parquet"},
        partitions_def=attack_grid, pool="gpu", op_tags=GPU_OP_TAGS,
        deps=[dg.AssetDep(clean_predictions, partition_mapping=by_modality)],
        description=f"{model_id}: L-inf FGSM and PGD in pixel space on the clean images (eps = 2, 4, 6, 8, 10 /255 "
                    "by attack level, segmentation.attacks.levels; PGD steps 3, 5, 7, 10, 15), model in eval mode, "
                    "fixed box prompt, seeded random start.",
    )
    def attack_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                           tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.segmentation.evaluate import evaluate_attacks

        return _run_partition(context, suite, tracking, model_id, "attack", evaluate_attacks)

    out.extend([clean_predictions, perturbed_predictions] + ([attack_predictions] if attacks else []))
    return out


def segmentation_report(upstream: list[dg.AssetsDefinition]) -> dg.AssetsDefinition:
    @dg.asset(
        group_name="segmentation", kinds={"python", "png", "parquet"}, deps=upstream,
        description="Bootstrap CIs, paired Wilcoxon + Benjamini-Hochberg per (model, type, level) "
                    "(table segmentation_stats), robustness curves (IoU drop vs level per type), and for every "
                    "real-architecture model (LiteMedSAM, SAM, ...) its worst corruption types drawn on the image "
                    "where they hurt most (table segmentation_examples), logged to MLflow.",
    )
    def segmentation_report(context: dg.AssetExecutionContext, suite: SuiteResource,
                            tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.report.figures.paper import stored_bands
        from medrobust_lib.report.figures.segmentation import robustness_curves
        from medrobust_lib.tracks.perturbed import read_manifest
        from medrobust_lib.tracks.segmentation.examples import write_examples
        from medrobust_lib.tracks.segmentation.stats import write_segmentation_stats

        s = suite.load()
        with tracking.run(context, s, "segmentation_report") as run:
            stats = write_segmentation_stats(s.results_dir, s.seed, s.stats.min_n)
            bands = stored_bands(read_manifest(s))  # the bands the perturbed data was calibrated to
            paths = robustness_curves(stats, suite_paths(s).reports / "segmentation", bands=bands)
            tracking.log_files(run, paths, "curves")
            examples = write_examples(s)
        meta: dict[str, Any] = {"n_stats_rows": len(stats), "n_worst_type_examples": len(examples)}
        if len(examples):
            meta["worst_types"] = markdown_table(examples.drop(columns=["png"]))
        if len(stats):
            top = (stats[stats["condition"] == "perturbation"].groupby(["model", "perturbation"])
                   [["iou_drop", "dice_drop"]].mean().sort_values("iou_drop", ascending=False).head(10).reset_index())
            meta["top_iou_drops"] = markdown_table(top)
        for p in paths:
            meta[p.stem] = image_md(p)
        return dg.MaterializeResult(metadata=meta)

    return segmentation_report
