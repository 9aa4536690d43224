"""Dataset assets: the embedded demo data and the clean-sample index per modality."""

import dagster as dg

from medrobust_assets.partitions import SuitePartitions
from medrobust_assets.resources import SuiteResource, TrackingResource
from medrobust_lib.demo.build import ensure_demo
from medrobust_lib.tracks.datasets import build_clean_index


@dg.asset(
    group_name="datasets", kinds={"python", "png"},
    description="Embedded offline demo data: 10 modality groups written in their published folder "
                "layouts (ISIC 2016, Kvasir-SEG, BUSI, REFUGE, DICOM, NIfTI/MSD, ...) plus VQA, caption, "
                "grounding and paraphrase records. Skipped when the suite disables the demo.",
)
def demo_data(context: dg.AssetExecutionContext, suite: SuiteResource) -> dg.MaterializeResult:
    s = suite.load()
    manifest = ensure_demo(s)
    if manifest is None:
        return dg.MaterializeResult(metadata={"enabled": False})
    return dg.MaterializeResult(metadata={
        "enabled": True, "root": dg.MetadataValue.path(s.demo.root),
        "n_per_modality": s.demo.n_per_modality, "seed": s.demo.seed,
    })


CLEAN_SAMPLES = dg.AssetKey("clean_samples")


def clean_samples_asset(parts: SuitePartitions, *, demo: bool = True) -> dg.AssetsDefinition:
    """``clean_samples``, partitioned by the suite's modalities (downstream of ``demo_data`` when
    the suite builds the demo data, ``demo``)."""
    return dg.asset(
        name="clean_samples", group_name="datasets", kinds={"python", "parquet"}, partitions_def=parts.modality,
        deps=[demo_data] if demo else [],
        description="Every sample of the modality's datasets, loaded once through its reader: status 'ok' with "
                    "shape, mask area and content hash, or 'quarantined' with the reason (corrupt file, mask "
                    "mismatch, empty mask, unreadable DICOM). Table clean_samples.",
    )(_clean_samples)


def _clean_samples(context: dg.AssetExecutionContext, suite: SuiteResource,
                  tracking: TrackingResource) -> dg.MaterializeResult:
    s = suite.load()
    modality = context.partition_key
    with tracking.run(context, s, "clean_samples") as run:
        summary = build_clean_index(s, modality)
        tracking.log_metrics(run, {"n_ok": summary.n_ok, "n_quarantined": summary.n_quarantined})
    return dg.MaterializeResult(metadata={
        "n_ok": summary.n_ok, "n_quarantined": summary.n_quarantined,
        "quarantine_reasons": dg.MetadataValue.json(summary.reasons), "datasets": ", ".join(summary.datasets),
    })
