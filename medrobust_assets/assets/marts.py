"""The one mart asset: rebuilds var/marts.duckdb from the Parquet results."""

from typing import Any

import dagster as dg

from medrobust_assets.assets.datasets import CLEAN_SAMPLES
from medrobust_assets.assets.perturbed import PERTURBATION_GALLERY, PERTURBED_SAMPLES
from medrobust_assets.metadata import markdown_table
from medrobust_assets.resources import SuiteResource
from medrobust_lib.store.marts import build_mart, connect_readonly


def build_marts(extra_deps: list[Any]) -> dg.AssetsDefinition:
    """The mart asset, downstream of every asset that writes Parquet results (``extra_deps``:
    the suite's model families and reports assembled by ``definitions_for``)."""

    @dg.asset(
        key="marts", group_name="marts", kinds={"duckdb"},
        deps=[CLEAN_SAMPLES, PERTURBED_SAMPLES, PERTURBATION_GALLERY, *extra_deps],
        description="DuckDB mart var/marts.duckdb, rebuilt whole from the Parquet results by this single writer "
                    "(temporary file + atomic replace): tables clean_samples, perturbation_manifest, "
                    "segmentation_results/_stats, vlm_results/_stats, taxonomy_results and its stats, "
                    "strategy_ranking_stats, plus a view per summary (docs/mart-schema.md).",
    )
    def marts(context: dg.AssetExecutionContext, suite: SuiteResource) -> dg.MaterializeResult:
        s = suite.load()
        counts = build_mart(s.results_dir, s.mart_path, s.max_error_share,
                            include_off_band=s.perturbations.include_off_band)
        con = connect_readonly(s.mart_path)
        try:
            summary = con.execute(
                "select modality, level, sum(n) as n, avg(band_hit_rate) as hit_rate, avg(mean_ssim) as mean_ssim "
                "from perturbation_summary group by all order by all").df()
            ranking = con.execute(
                "select model, strategy, kind, mean_iou_drop, iou_drop_ci_low, iou_drop_ci_high, rank "
                "from strategy_ranking").df()
            incomplete = con.execute(
                "select source_table, model, modality, level, n_error, n_attempted, error_share "
                "from incomplete_partitions").df()
        finally:
            con.close()
        return dg.MaterializeResult(metadata={
            "path": dg.MetadataValue.path(s.mart_path),
            **{f"rows_{k}": v for k, v in counts.items()},
            "perturbation_summary": markdown_table(summary),
            "strategy_ranking": markdown_table(ranking),
            "incomplete_partitions": markdown_table(incomplete) if len(incomplete) else "none",
        })

    return marts
