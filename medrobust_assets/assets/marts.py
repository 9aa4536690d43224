"""The one mart asset: rebuilds var/marts.duckdb from the Parquet results."""

import dagster as dg

from medrobust_assets.assets.datasets import clean_samples
from medrobust_assets.assets.perturbed import perturbation_gallery, perturbed_samples
from medrobust_assets.metadata import markdown_table
from medrobust_assets.resources import SuiteResource
from medrobust_lib.store.marts import build_mart, connect_readonly


@dg.asset(
    group_name="marts", kinds={"duckdb"},
    deps=[clean_samples, perturbed_samples, perturbation_gallery, dg.AssetKey("segmentation_report"),
          dg.AssetKey("vlm_report"), dg.AssetKey("taxonomy_report")],
    description="DuckDB mart (single writer, atomic replace): tables clean_samples and perturbation_manifest, "
                "views perturbation_summary and quarantine.",
)
def marts(context: dg.AssetExecutionContext, suite: SuiteResource) -> dg.MaterializeResult:
    s = suite.load()
    counts = build_mart(s.results_dir, s.mart_path)
    con = connect_readonly(s.mart_path)
    try:
        summary = con.execute(
            "select modality, level, sum(n) as n, avg(band_hit_rate) as hit_rate, avg(mean_ssim) as mean_ssim "
            "from perturbation_summary group by all order by all").df()
    finally:
        con.close()
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(s.mart_path),
        **{f"rows_{k}": v for k, v in counts.items()},
        "perturbation_summary": markdown_table(summary),
    })
