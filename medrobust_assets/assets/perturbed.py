"""Perturbed datasets (manifests) by modality x severity, and the per-modality gallery."""

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.metadata import image_md, markdown_table
from medrobust_assets.partitions import SuitePartitions, by_modality, modality_and_level
from medrobust_assets.progress import reporter
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_lib.paths import suite_paths
from medrobust_lib.tracks.perturbed import build_perturbed
from medrobust_lib.tracks.perturbed_checks import modality_gallery, partition_checks

CHECKS = [
    dg.AssetCheckSpec("band_hit_rate", asset="perturbed_samples",
                      description="Share of outputs inside their SSIM band, among outputs whose band is "
                                  "reachable; fails below the threshold (0.95)."),
    dg.AssetCheckSpec("finite_outputs", asset="perturbed_samples",
                      description="Every ok row has a finite strength and SSIM in [-1, 1]."),
    dg.AssetCheckSpec("completeness", asset="perturbed_samples",
                      description="Exactly one row per (sample, type) and no error rows."),
]


PERTURBED_SAMPLES = dg.AssetKey("perturbed_samples")
PERTURBATION_GALLERY = dg.AssetKey("perturbation_gallery")


def perturbed_assets(parts: SuitePartitions) -> list[dg.AssetsDefinition]:
    """``perturbed_samples`` over the suite's modalities x perturbed levels, and the per-modality
    ``perturbation_gallery``."""
    perturbed = dg.asset(
        name="perturbed_samples", group_name="perturbations", kinds={"python", "parquet"},
        partitions_def=parts.grid(), deps=[dg.AssetDep(CLEAN_SAMPLES, partition_mapping=by_modality)],
        check_specs=CHECKS,
        description="Perturbation manifest for one modality and severity: every applicable type calibrated per "
                    "image to the level's SSIM band (strength, SSIM, band flag, SSIM evaluations, seed key, "
                    "content hash). Images are regenerated bit-exactly from it. Table perturbation_manifest.",
    )(_perturbed_samples)
    gallery = dg.asset(
        name="perturbation_gallery", group_name="perturbations", kinds={"python", "png"},
        partitions_def=parts.modality, deps=[dg.AssetDep(PERTURBED_SAMPLES, partition_mapping=by_modality)],
        description="Gallery PNG per modality: every type (rows) at each level the suite perturbs (columns: "
                    "perturbations.levels; the fast demo 2 and 4, demo_full 1-5) on one test image, captioned "
                    "with SSIM; logged to MLflow.",
    )(_perturbation_gallery)
    return [perturbed, gallery]


def _perturbed_samples(context: dg.AssetExecutionContext, suite: SuiteResource,
                      tracking: TrackingResource) -> dg.MaterializeResult:
    s = suite.load()
    modality, level = modality_and_level(context)
    params = {"seed": s.seed, "level": level, "band": s.perturbations.bands[level],
              "split": s.perturbations.split, "calibration_subset": s.perturbations.calibration_subset,
              "calibration_mode": s.perturbations.calibration_mode}
    with tracking.run(context, s, "perturbed_samples", params) as run:
        summary = build_perturbed(s, modality, level, progress=context.log.debug, report=reporter(context))
        metrics = {"n_rows": summary.n_rows, "n_error": summary.n_error,
                   "band_hit_rate_reachable": summary.reachable_hit_rate, f"mean_ssim_L{level}": summary.mean_ssim,
                   "chunks_reused": summary.chunks_reused}
        tracking.log_params(run, {"types": ",".join(summary.types)})
        tracking.log_metrics(run, metrics)
    checks = partition_checks(s, modality, level, summary)
    return dg.MaterializeResult(
        metadata={**metrics, "n_types": len(summary.types),
                  "unreachable_types": ", ".join(summary.unreachable_types) or "none",
                  "summary": markdown_table(checks.table)},
        check_results=[
            dg.AssetCheckResult(check_name=c.name, passed=c.passed, metadata=c.metadata,
                                severity=dg.AssetCheckSeverity.ERROR if c.severity == "error"
                                else dg.AssetCheckSeverity.WARN)
            for c in checks.results
        ],
    )


def _perturbation_gallery(context: dg.AssetExecutionContext, suite: SuiteResource,
                         tracking: TrackingResource) -> dg.MaterializeResult:
    s = suite.load()
    modality = context.partition_key
    with tracking.run(context, s, "perturbation_gallery") as run:
        paths = modality_gallery(s, modality, suite_paths(s).galleries)
        tracking.log_files(run, paths, "galleries")
    meta: dict[str, object] = {"n_galleries": len(paths)}
    for p in paths[:3]:
        meta[f"gallery_{p.stem}"] = image_md(p)
    return dg.MaterializeResult(metadata=meta)  # type: ignore[arg-type]
