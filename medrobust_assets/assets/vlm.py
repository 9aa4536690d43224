"""VLM asset family, one per configured model (key prefix = model id): [base_checkpoint |
finetuned_adapter], clean_predictions (by modality), perturbed_predictions (modality x severity)."""

from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.assets.perturbed import PERTURBED_SAMPLES
from medrobust_assets.checks import error_share_result, error_share_spec
from medrobust_assets.metadata import install_or_train, markdown_table
from medrobust_assets.partitions import SuitePartitions, by_modality, modality_and_level
from medrobust_assets.progress import reporter
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_assets.tags import GPU_OP_TAGS
from medrobust_lib.store.schema import VLM_TABLE


def _eval_meta(s: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"n_rows": s.n_rows, "n_reused": s.n_reused, "n_images": s.n_images, "seconds": s.seconds,
                            "model_seconds": s.model_seconds, "n_vision_calls": s.n_vision_calls}
    meta.update({f"n_{k.replace(':', '_')}": v for k, v in s.outcomes.items()})
    meta.update(s.metrics)
    return meta


def vlm_family(model_id: str, parts: SuitePartitions, *, trained: bool, finetuned: bool,
               upstream: dg.AssetsDefinition | None, levels: list[int] | None = None) -> list[dg.AssetsDefinition]:
    """Assets of one VLM, partitioned by the suite's modalities (x ``levels``: the model's own
    ``levels``; None: every perturbed level of the suite).
    ``upstream``: the asset that produces the weights it builds on (another model's
    base_checkpoint), or None for a model on disk / behind an API."""
    out: list[dg.AssetsDefinition] = []
    deps: list[Any] = [CLEAN_SAMPLES] + ([upstream] if upstream is not None else [])
    if trained:
        @dg.asset(key=[model_id, "base_checkpoint"], group_name="vlm", kinds={"pytorch", "safetensors"},
                  deps=[CLEAN_SAMPLES], pool="gpu", op_tags=GPU_OP_TAGS,
                  description=f"{model_id}: a tiny LLaVA (CLIP tower + Llama, word-level tokenizer) trained from "
                              "scratch on the demo train split (VQA, yes/no paraphrases, captions, grounding), "
                              "selected on val; saved with save_pretrained, registered in MLflow.")
        def base_checkpoint(context: dg.AssetExecutionContext, suite: SuiteResource,
                            tracking: TrackingResource) -> dg.MaterializeResult:
            from medrobust_lib.demo.committed import install_vlm
            from medrobust_lib.demo.tiny_llava_train import train_base_vlm

            s = suite.load()
            inst = install_vlm(s, model_id)

            def committed() -> dict[str, Any]:  # held-out scores as recorded with the committed weights
                return {**{f"trained_{k}": v for k, v in inst.meta.get("heldout", {}).items()},
                        "steps": inst.meta.get("steps"), "folder": dg.MetadataValue.path(inst.folder)}

            def train() -> dict[str, Any]:
                with tracking.run(context, s, "vlm_training", {"model": model_id}) as run:
                    r = train_base_vlm(s, model_id, log=context.log.info)
                    meta: dict[str, Any] = {"seconds": r.seconds, "steps": r.steps, "best_step": r.best_step,
                                            "best_val_loss": r.best_val_loss, "n_train": r.n_train, "n_val": r.n_val,
                                            **r.heldout}
                    tracking.log_metrics(run, meta)
                    meta["registered_version"] = tracking.log_and_register(
                        run, r.folder, "model", f"medrobust-vlm-{model_id}", {"task": "all", "kind": "base"})
                return {**meta, "folder": dg.MetadataValue.path(r.folder)}

            return install_or_train(context, inst, what=f"training {model_id}", committed=committed, train=train)

        out.append(base_checkpoint)
        deps.append(base_checkpoint)
    if finetuned:
        @dg.asset(key=[model_id, "finetuned_adapter"], group_name="vlm", kinds={"pytorch", "safetensors"},
                  deps=list(deps), pool="gpu", op_tags=GPU_OP_TAGS,
                  description=f"{model_id}: a LoRA adapter (peft; language-model projections only, prompt tokens "
                              "masked, early stopping on val) saved as safetensors, logged and registered in MLflow.")
        def finetuned_adapter(context: dg.AssetExecutionContext, suite: SuiteResource,
                              tracking: TrackingResource) -> dg.MaterializeResult:
            from medrobust_lib.demo.committed import install_adapter
            from medrobust_lib.tracks.finetune.vlm_adapter import finetune_adapter

            s = suite.load()
            inst = install_adapter(s, model_id)  # the committed adapter was trained on the committed base

            def train() -> dict[str, Any]:
                with tracking.run(context, s, "vlm_finetuning", {"model": model_id}) as run:
                    r = finetune_adapter(s, model_id, log=context.log.info)
                    meta: dict[str, Any] = {
                        "task": r.task, "adapter_hash": r.adapter_hash, "initial_val_loss": r.initial_val_loss,
                        "best_val_loss": r.best_val_loss, "steps": r.steps, "seconds": r.seconds,
                        "n_trainable": r.n_trainable, "n_total": r.n_total, "n_target_modules": len(r.target_modules)}
                    tracking.log_metrics(run, meta)
                    meta["registered_version"] = tracking.log_and_register(
                        run, r.folder, "adapter", f"medrobust-vlm-{model_id}",
                        {"task": r.task, "kind": "lora", "adapter_hash": r.adapter_hash})
                return {**meta, "folder": dg.MetadataValue.path(r.folder)}

            return install_or_train(context, inst, what=f"fine-tuning {model_id}",
                                    committed=lambda: {"folder": dg.MetadataValue.path(inst.folder)}, train=train)

        out.append(finetuned_adapter)
        deps.append(finetuned_adapter)

    clean_key = [model_id, "vlm_clean_predictions"]
    perturbed_key = [model_id, "vlm_perturbed_predictions"]

    @dg.asset(key=clean_key, group_name="vlm", kinds={"pytorch", "parquet"},
              partitions_def=parts.modality, deps=deps, pool="gpu", op_tags=GPU_OP_TAGS,
              check_specs=[error_share_spec(clean_key)],
              description=f"{model_id}: clean answers for every VQA, yes/no, caption and grounding record of the "
                          "evaluation split (vlm_results, perturbation 'clean').")
    def vlm_clean_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                              tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.vlm.evaluate import evaluate_clean

        s = suite.load()
        with tracking.run(context, s, "vlm_eval", {"model": model_id, "condition": "clean"}) as run:
            meta = _eval_meta(evaluate_clean(s, model_id, context.partition_key, progress=reporter(context)))
            tracking.log_metrics(run, meta)
        check = error_share_result(s, VLM_TABLE, clean_key, {"model": model_id, "run": "clean",
                                                             "modality": context.partition_key, "level": 0})
        return dg.MaterializeResult(metadata=meta, check_results=[check])

    out.append(vlm_clean_predictions)
    if levels is not None and not levels:
        return out  # levels: [] evaluates the model on clean images only: no perturbed partitions

    @dg.asset(key=perturbed_key, group_name="vlm", kinds={"pytorch", "parquet"},
              partitions_def=parts.grid(levels), pool="gpu", op_tags=GPU_OP_TAGS,
              check_specs=[error_share_spec(perturbed_key)],
              deps=[PERTURBED_SAMPLES, dg.AssetDep(vlm_clean_predictions, partition_mapping=by_modality)],
              description=f"{model_id}: answers on every perturbed image of the partition (regenerated from the "
                          "manifest; spatial types move the grounding box).")
    def vlm_perturbed_predictions(context: dg.AssetExecutionContext, suite: SuiteResource,
                                  tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.vlm.evaluate import evaluate_perturbed

        modality, level = modality_and_level(context)
        s = suite.load()
        with tracking.run(context, s, "vlm_eval", {"model": model_id, "condition": "perturbation",
                                                   "level": level}) as run:
            meta = _eval_meta(evaluate_perturbed(s, model_id, modality, level, progress=reporter(context)))
            tracking.log_metrics(run, meta)
        check = error_share_result(s, VLM_TABLE, perturbed_key, {"model": model_id, "run": "perturbation",
                                                                 "modality": modality, "level": level})
        return dg.MaterializeResult(metadata=meta, check_results=[check])

    out.append(vlm_perturbed_predictions)
    return out


def vlm_report(upstream: list[dg.AssetsDefinition]) -> dg.AssetsDefinition:
    @dg.asset(group_name="vlm", kinds={"python", "parquet"}, deps=upstream,
              description="McNemar (binary) / Wilcoxon (captions) tests with Benjamini-Hochberg over the type x "
                          "level grid and paired bootstrap CIs of every drop (table vlm_stats).")
    def vlm_report(context: dg.AssetExecutionContext, suite: SuiteResource,
                   tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.vlm.stats import write_vlm_stats

        s = suite.load()
        with tracking.run(context, s, "vlm_report"):
            stats = write_vlm_stats(s.results_dir, s.seed, s.max_error_share, min_n=s.stats.min_n,
                                    include_off_band=s.perturbations.include_off_band)
        meta: dict[str, Any] = {"n_stats_rows": len(stats)}
        if len(stats):
            summary = (stats.assign(significant=stats["q_value"] < 0.05)
                       .groupby(["model", "task", "metric"], as_index=False)
                       .agg(n_cells=("drop", "size"), mean_drop=("drop", "mean"), max_drop=("drop", "max"),
                            n_significant=("significant", "sum")))
            meta["drops_by_model_task"] = markdown_table(summary)
        return dg.MaterializeResult(metadata=meta)

    return vlm_report
