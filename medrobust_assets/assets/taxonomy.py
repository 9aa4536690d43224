"""Safety-taxonomy assets, one family per configuration (key prefix = configuration id):
[taxonomy_model] (demo training, or a lora_of configuration's consistency LoRA), text_only_baselines (by modality), taxonomy_clean (by modality),
taxonomy_perturbed (modality x severity); then taxonomy_report (quadrant tables, plots)."""

from pathlib import Path
from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.assets.perturbed import PERTURBED_SAMPLES
from medrobust_assets.checks import ERROR_SHARE_CHECK, error_share_result, error_share_spec
from medrobust_assets.metadata import image_md, install_or_train, markdown_table
from medrobust_assets.partitions import SuitePartitions, by_modality, modality_and_level
from medrobust_assets.progress import reporter
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_assets.tags import GPU_OP_TAGS
from medrobust_lib.config import Suite
from medrobust_lib.config.common import by_id
from medrobust_lib.paths import suite_paths
from medrobust_lib.report.figures.style import parallel_saves
from medrobust_lib.store.schema import TAXONOMY_TABLE


def _meta(s: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"n_rows": s.n_rows, "n_images": s.n_images, "n_vision_calls": s.n_vision_calls,
                            "seconds": s.seconds}
    meta.update({f"quadrant_{k}": v for k, v in s.quadrants.items()})
    meta.update({f"n_{k.replace(':', '_')}": v for k, v in s.outcomes.items()})
    return meta


def taxonomy_family(config_id: str, parts: SuitePartitions, *, trained: bool, upstream: list[Any],
                    levels: list[int] | None = None) -> list[dg.AssetsDefinition]:
    """Assets of one configuration, partitioned by the suite's modalities (x ``levels``: the
    taxonomy's levels; None: every perturbed level). ``upstream``: assets its weights come from."""
    out: list[dg.AssetsDefinition] = []
    deps: list[Any] = [CLEAN_SAMPLES, *upstream]
    if trained:
        @dg.asset(key=[config_id, "taxonomy_model"], group_name="taxonomy", kinds={"pytorch", "safetensors"},
                  deps=list(deps), pool="gpu", op_tags=GPU_OP_TAGS,
                  description=f"{config_id}: the weights of this configuration: the consistency LoRA of its recipe "
                              "(lora_of; reused while its fingerprint holds), or the demo's known-answer model, "
                              "trained on the yes/no train split (selection on val).")
        def taxonomy_model(context: dg.AssetExecutionContext, suite: SuiteResource,
                           tracking: TrackingResource) -> dg.MaterializeResult:
            s = suite.load()
            if by_id(s.taxonomy.configs, config_id, "taxonomy configuration").lora_of is not None:
                return _consistency_lora(context, s, config_id, tracking)
            from medrobust_lib.demo.committed import install_taxonomy
            from medrobust_lib.demo.taxonomy_train import train_taxonomy_model

            inst = install_taxonomy(s, config_id)  # committed weights only when trained from the same inputs

            def train() -> dict[str, Any]:
                with tracking.run(context, s, "taxonomy_training", {"config": config_id}) as run:
                    r = train_taxonomy_model(s, config_id, log=context.log.info)
                    meta: dict[str, Any] = {"kind": r.kind, "seconds": r.seconds, "steps": r.steps,
                                            "best_val_loss": r.best_val_loss, "n_train": r.n_train, **r.extra}
                    tracking.log_metrics(run, meta)
                    meta["registered_version"] = tracking.log_and_register(
                        run, r.folder, "model", f"medrobust-taxonomy-{config_id}", {"kind": r.kind})
                return {**meta, "folder": dg.MetadataValue.path(r.folder)}

            return install_or_train(context, inst, what=f"training {config_id}", train=train, committed=lambda: {
                "steps": inst.meta.get("steps"), "folder": dg.MetadataValue.path(inst.folder)})

        out.append(taxonomy_model)
        deps.append(taxonomy_model)

    @dg.asset(key=[config_id, "text_only_baselines"], group_name="taxonomy", kinds={"pytorch", "parquet"},
              partitions_def=parts.modality, deps=deps, pool="gpu", op_tags=GPU_OP_TAGS,
              description=f"{config_id}: answers to every original yes/no question with the image removed (no image "
                          "token, blank image, noise image), reused by every condition.")
    def text_only_baselines(context: dg.AssetExecutionContext, suite: SuiteResource,
                            tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.taxonomy.evaluate import compute_baselines

        s = suite.load()
        with tracking.run(context, s, "taxonomy", {"config": config_id, "step": "baselines"}) as run:
            n = compute_baselines(s, config_id, context.partition_key, progress=reporter(context))
            tracking.log_metrics(run, {"n_rows": n})
        return dg.MaterializeResult(metadata={"n_rows": n})

    clean_key = [config_id, "taxonomy_clean"]
    perturbed_key = [config_id, "taxonomy_perturbed"]

    @dg.asset(key=clean_key, group_name="taxonomy", kinds={"pytorch", "parquet"},
              partitions_def=parts.modality, deps=[text_only_baselines], pool="gpu", op_tags=GPU_OP_TAGS,
              check_specs=[error_share_spec(clean_key)],
              description=f"{config_id}: paraphrase predictions (vision tower once per image), flags and quadrant per "
                          "clean sample (taxonomy_results).")
    def taxonomy_clean(context: dg.AssetExecutionContext, suite: SuiteResource,
                       tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.taxonomy.evaluate import evaluate

        s = suite.load()
        with tracking.run(context, s, "taxonomy", {"config": config_id, "condition": "clean"}) as run:
            meta = _meta(evaluate(s, config_id, context.partition_key, 0, progress=reporter(context)))
            tracking.log_metrics(run, meta)
        check = error_share_result(s, TAXONOMY_TABLE, clean_key, {"config": config_id, "run": "clean",
                                                                  "modality": context.partition_key, "level": 0})
        return dg.MaterializeResult(metadata=meta, check_results=[check])

    out.extend([text_only_baselines, taxonomy_clean])
    if levels is not None and not levels:
        return out  # taxonomy.levels: [] evaluates clean images only: no perturbed partitions

    @dg.asset(key=perturbed_key, group_name="taxonomy", kinds={"pytorch", "parquet"},
              partitions_def=parts.grid(levels), pool="gpu", op_tags=GPU_OP_TAGS,
              check_specs=[error_share_spec(perturbed_key)],
              deps=[PERTURBED_SAMPLES, dg.AssetDep(text_only_baselines, partition_mapping=by_modality)],
              description=f"{config_id}: the taxonomy on every perturbed image of the partition (levels: "
                          "taxonomy.levels, default every perturbed level).")
    def taxonomy_perturbed(context: dg.AssetExecutionContext, suite: SuiteResource,
                           tracking: TrackingResource) -> dg.MaterializeResult:
        from medrobust_lib.tracks.taxonomy.evaluate import evaluate

        modality, level = modality_and_level(context)
        s = suite.load()
        if level not in s.taxonomy_levels():
            context.log.info(f"level {level} is not in taxonomy.levels {s.taxonomy_levels()}: nothing to evaluate")
            return dg.MaterializeResult(
                metadata={"skipped": f"level {level} not in taxonomy.levels"},
                check_results=[dg.AssetCheckResult(check_name=ERROR_SHARE_CHECK, asset_key=dg.AssetKey(perturbed_key),
                                                   passed=True, metadata={"skipped": "no rows"})])
        with tracking.run(context, s, "taxonomy", {"config": config_id, "condition": "perturbation",
                                                "level": level}) as run:
            meta = _meta(evaluate(s, config_id, modality, level, progress=reporter(context)))
            tracking.log_metrics(run, meta)
        check = error_share_result(s, TAXONOMY_TABLE, perturbed_key, {"config": config_id, "run": "perturbation",
                                                                      "modality": modality, "level": level})
        return dg.MaterializeResult(metadata=meta, check_results=[check])

    out.append(taxonomy_perturbed)
    return out


def _consistency_lora(context: dg.AssetExecutionContext, s: Suite, config_id: str,
                      tracking: TrackingResource) -> dg.MaterializeResult:
    """The ``taxonomy_model`` body of a ``lora_of`` configuration: train (or reuse) its consistency LoRA."""
    from medrobust_lib.tracks.taxonomy.lora import train_consistency_lora

    with tracking.run(context, s, "taxonomy_training", {"config": config_id}) as run:
        r = train_consistency_lora(s, config_id, log=context.log.info)
        meta: dict[str, Any] = {"kind": "consistency_lora", "lora_of": r.lora_of, "reused": r.reused,
                                "fingerprint": r.fingerprint, "adapter_hash": r.adapter_hash, "seconds": r.seconds,
                                "steps": r.steps, "best_val_loss": r.best_val_loss,
                                "initial_val_loss": r.initial_val_loss, "n_train": r.n_train, "n_val": r.n_val,
                                "n_trainable": r.n_trainable}
        tracking.log_metrics(run, meta)
        if not r.reused:
            meta["registered_version"] = tracking.log_and_register(
                run, r.folder, "adapter", f"medrobust-taxonomy-{config_id}",
                {"kind": "consistency_lora", "lora_of": r.lora_of, "adapter_hash": r.adapter_hash})
    return dg.MaterializeResult(metadata={**{k: v for k, v in meta.items() if v is not None},
                                          "folder": dg.MetadataValue.path(r.folder)})


def taxonomy_report(upstream: list[dg.AssetsDefinition]) -> dg.AssetsDefinition:
    @dg.asset(group_name="taxonomy", kinds={"python", "png", "parquet"}, deps=upstream,
              description="Quadrant shares with bootstrap CIs, text-only accuracy and the oracle Dangerous floor "
                          "(taxonomy_quadrant_stats), flip rate vs Dangerous share correlation with the clean "
                          "headline (taxonomy_correlation_stats), confidence screening of the Dangerous quadrant "
                          "(taxonomy_screening_stats), plots to MLflow and here.")
    def taxonomy_report(context: dg.AssetExecutionContext, suite: SuiteResource,
                        tracking: TrackingResource) -> dg.MaterializeResult:

        from medrobust_lib.report.figures import taxonomy as tf
        from medrobust_lib.store import results as res
        from medrobust_lib.taxonomy.aggregates import correlation_points
        from medrobust_lib.tracks.taxonomy import stats as tr

        s = suite.load()
        out_dir = suite_paths(s).reports / "taxonomy"
        with tracking.run(context, s, "taxonomy_report") as run:
            stats, corr = tr.write_taxonomy_stats(s.results_dir, s.seed, s.taxonomy.abstention_tau,
                                                  max_error_share=s.max_error_share, min_n=s.stats.min_n,
                                                  include_off_band=s.perturbations.include_off_band)
            screening = tr.write_screening_stats(s.results_dir, max_error_share=s.max_error_share)
            from medrobust_lib.store.completeness import complete_rows

            rows = complete_rows(res.read_table(s.results_dir, TAXONOMY_TABLE), TAXONOMY_TABLE, s.max_error_share)
            paths: list[Path] = []
            if len(stats):
                from medrobust_lib.taxonomy.aggregates import transitions

                ok = rows[rows["outcome"] == "ok"]
                with parallel_saves(s.workers):  # the figure files are drawn by the suite's workers
                    paths += tf.quadrant_bars(stats, out_dir)
                    paths += tf.transition_heatmaps(transitions(ok).rename(columns={"count": "n"}), out_dir)
                    paths.append(tf.flip_vs_dangerous_scatter(correlation_points(rows, clean_only=True), corr,
                                                              out_dir))
            tracking.log_files(run, paths, "plots")
        meta: dict[str, Any] = {"n_stats_rows": len(stats), "n_screening_rows": len(screening)}
        mode = s.taxonomy.known_answer_checks
        if len(stats) and mode != "off":
            from medrobust_lib.taxonomy.known_answers import PRIMARY_MODE, demo_checks

            checks = demo_checks(stats, tuple(sorted(set(stats["image_mode"]))))
            for c in checks:
                (context.log.info if c.passed else context.log.warning)(f"known answer: {c.text()}")
            meta["known_answers"] = "\n".join(c.text() for c in checks)
            meta["known_answers_failed"] = sum(1 for c in checks if not c.passed)
            failed = [c.text() for c in checks if not c.passed and c.image_mode == PRIMARY_MODE]
            if failed and mode == "fail":
                raise RuntimeError("taxonomy known-answer checks failed on the demo: " + "; ".join(failed))
        if len(stats):
            clean = stats[stats["perturbation"] == "clean"]
            keep = [c for c in ("config", "dataset", "image_mode", "quadrant", "n", "n_total", "n_error", "share",
                                "text_only_accuracy", "dangerous_floor", "flip_rate") if c in clean.columns]
            meta["clean_quadrants"] = markdown_table(clean[keep])
        if len(corr):
            meta["headline_correlation"] = " | ".join(tf.correlation_label(r) for _, r in tf.headline_rows(corr)
                                                      .iterrows())
            meta["correlation"] = markdown_table(corr)
        for p in paths:
            meta[p.stem] = image_md(p)
        return dg.MaterializeResult(metadata=meta)

    return taxonomy_report
