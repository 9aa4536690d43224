"""Mart views of the safety taxonomy ("Consistent but Dangerous"): quadrants, transitions,
correlation and confidence screening."""

from __future__ import annotations

from medrobust_lib.store.completeness import complete_filter_sql
from medrobust_lib.store.schema import QUADRANTS, TAXONOMY_TABLE
from medrobust_lib.store.views.common import BAND_ROWS_SQL, View, off_band_sql, sql_bool, static

_QUADRANT_ORDER_SQL = "case {col} " + " ".join(f"when '{q}' then {i}" for i, q in enumerate(QUADRANTS)) + " end"
"""Sort key of a quadrant column: Ideal, Fragile, Dangerous, Worst (unknown values last)."""

# taxonomy_transitions: each perturbed ok row paired with the clean ok row (perturbation 'clean') of
# the same (config, dataset, record_id, image_mode). n pairs per (cell, from, to); share_of_from =
# n / all pairs of that from_quadrant in the same (config, dataset, perturbation, level, image_mode).
# n_error: error rows of the perturbed cell (outside every pair; the same on the cell's rows); a cell
# with errors only has one row with NULL quadrants and n = 0.
_TAXONOMY_TRANSITIONS = f"""
        with errs as (
            select config, dataset, perturbation, level, image_mode, count(*) as n_error
            from {TAXONOMY_TABLE} t
            where outcome = 'error' and perturbation <> 'clean' and {complete_filter_sql(TAXONOMY_TABLE, "t")}
            group by all),
        ok as (
            select config, dataset, record_id, image_mode, perturbation, level, quadrant
            from {TAXONOMY_TABLE} t
            where outcome = 'ok' and quadrant is not null and {complete_filter_sql(TAXONOMY_TABLE, "t")}),
        clean as (select config, dataset, record_id, image_mode, quadrant from ok where perturbation = 'clean'),
        pert as (select * from ok where perturbation <> 'clean'),
        counts as (
            select p.config, p.dataset, p.perturbation, p.level, p.image_mode, c.quadrant as from_quadrant,
                   p.quadrant as to_quadrant, count(*) as n
            from pert p join clean c
              on p.config = c.config and p.dataset = c.dataset and p.record_id = c.record_id
                 and p.image_mode = c.image_mode
            group by all),
        cells as (
            select config, dataset, perturbation, level, image_mode, from_quadrant, to_quadrant,
                   cast(n as bigint) as n,
                   cast(n as double) / sum(n) over (
                       partition by config, dataset, perturbation, level, image_mode, from_quadrant) as share_of_from
            from counts
            union all
            select config, dataset, perturbation, level, image_mode, null, null, cast(0 as bigint), null
            from errs e where not exists (
                select 1 from counts c where c.config = e.config and c.dataset = e.dataset
                  and c.perturbation = e.perturbation and c.level = e.level and c.image_mode = e.image_mode))
        select c.*, cast(coalesce(e.n_error, 0) as bigint) as n_error
        from cells c left join errs e using (config, dataset, perturbation, level, image_mode)
        order by config, dataset, perturbation, level, image_mode, {_QUADRANT_ORDER_SQL.format(col="from_quadrant")},
                 {_QUADRANT_ORDER_SQL.format(col="to_quadrant")}"""

TAXONOMY_QUADRANTS_SQL = f"""
        select * from taxonomy_quadrant_stats
        order by config, dataset, perturbation, level, image_mode, {_QUADRANT_ORDER_SQL.format(col="quadrant")}"""
TAXONOMY_CORRELATION_SQL = """
        select * from taxonomy_correlation_stats
        order by case scope when 'headline' then 0 when 'condition' then 1 else 2 end,
                 perturbation nulls first, level nulls first, image_mode nulls first"""
# taxonomy_screening: taxonomy_screening_stats (medrobust_lib.taxonomy.confidence_screening) in a fixed order, the signals
# max_p, margin, entropy within each group
TAXONOMY_SCREENING_SQL = """
        select * from taxonomy_screening_stats
        order by config, dataset, perturbation, level, image_mode,
                 case signal when 'max_p' then 0 when 'margin' then 1 else 2 end"""

PERTURBED = "perturbed"
"""``condition`` of the pooled perturbed rows in :func:`taxonomy_quadrants_pooled`."""
def _condition_sql(perturbation: str = "perturbation") -> str:
    """SQL: ``clean`` for the clean rows of the ``perturbation`` column, else :data:`PERTURBED`."""
    return f"case when {perturbation} = 'clean' then 'clean' else '{PERTURBED}' end"


def _pooled(col: str) -> str:
    """A per-group column pooled over the cells with their ``n_total`` as weights."""
    return (f"sum({col} * n_total) filter (where {col} is not null)"
            f" / nullif(sum(n_total) filter (where {col} is not null), 0) as {col}")


TAXONOMY_QUADRANTS_POOLED_SQL = f"""
        with q as (select *, {_condition_sql()} as condition from taxonomy_quadrants)
        select config, image_mode, condition, quadrant,
               sum(n) as n, sum(n_total) as n_total,
               cast(sum(n) as double) / nullif(sum(n_total), 0) as share,
               sum(accuracy * n) filter (where accuracy is not null and n > 0)
                   / nullif(sum(n) filter (where accuracy is not null and n > 0), 0) as accuracy,
               sum(mean_entropy * n) filter (where mean_entropy is not null and n > 0)
                   / nullif(sum(n) filter (where mean_entropy is not null and n > 0), 0) as mean_entropy,
               sum(n_error) as n_error, sum(band_miss) as band_miss,
               {_pooled("flip_rate")}, {_pooled("text_only_accuracy")}, {_pooled("dangerous_floor")},
               {_pooled("share_abstention")}, any_value(abstention_tau) as abstention_tau
        from q group by config, image_mode, condition, quadrant"""


def taxonomy_quadrant_images(complete_only: bool = True, include_off_band: bool | str = False,
                             band_rows: str = BAND_ROWS_SQL) -> str:
    """Per (config, image_mode, condition clean or :data:`PERTURBED`, dataset, sample_id, quadrant):
    ``n``, the ok ``taxonomy_results`` rows (of complete partitions unless ``complete_only`` is false,
    for a database without ``partition_completeness``); records whose perturbed image missed its
    SSIM band (``band_rows``, the manifest's flags) are left out unless ``include_off_band``, as
    ``taxonomy_quadrant_stats`` leaves them out."""
    complete = complete_filter_sql(TAXONOMY_TABLE, "t") if complete_only else "true"
    off = off_band_sql("t.perturbation <> 'clean'", "b.band_reached")
    return f"""
        with band_rows as ({band_rows})
        select t.config, t.image_mode, {_condition_sql("t.perturbation")} as condition,
               t.dataset, t.sample_id, t.quadrant, count(*) as n
        from {TAXONOMY_TABLE} t
        left join band_rows b on b.dataset = t.dataset and b.sample_id = t.sample_id
             and b.perturbation = t.perturbation and b.level = t.level
        where t.outcome = 'ok' and t.quadrant is not null and {complete}
              and ({sql_bool(include_off_band)} or not {off})
        group by all"""


VIEWS: list[View] = [
    View("taxonomy_quadrants", static(TAXONOMY_QUADRANTS_SQL),
         doc=""": `taxonomy_quadrant_stats` in a fixed order (config, dataset,
perturbation, level, image_mode, then Ideal, Fragile, Dangerous, Worst): shares beside the
group's flip rate, text-only accuracy, oracle Dangerous floor, `n_error` and the labelled
abstention sensitivity column."""),
    View("taxonomy_transitions", static(_TAXONOMY_TRANSITIONS),
         doc="""(from `taxonomy_results`): one row per (config, dataset, perturbation,
level, image_mode, `from_quadrant`, `to_quadrant`): `n` ok records whose clean quadrant is
`from_quadrant` and perturbed quadrant `to_quadrant`, `share_of_from` (n over all records
leaving `from_quadrant` in that cell, [0, 1]), `n_error` (error rows of the perturbed cell, in
no pair; a cell with errors only has one row with NULL quadrants and n = 0); complete partitions only."""),
    View("taxonomy_correlation", static(TAXONOMY_CORRELATION_SQL),
         doc=""": `taxonomy_correlation_stats`, the `headline` rows first, then
`condition`, then `pooled_perturbed`, each by perturbation, level, image_mode."""),
    View("taxonomy_screening", static(TAXONOMY_SCREENING_SQL),
         doc=""": `taxonomy_screening_stats` by config, dataset, perturbation, level,
image_mode, then signal (max_p, margin, entropy)."""),
    View("taxonomy_quadrants_pooled", static(TAXONOMY_QUADRANTS_POOLED_SQL),
         """ (from `taxonomy_quadrants`): one row per (config, image_mode, `condition`, quadrant),
`condition` `clean` or `perturbed` (every type and level pooled), pooled over datasets: `n`, `n_total`,
`share` (n / n_total), `accuracy` and `mean_entropy` weighted by each cell's `n`, `n_error`, and the
group's `flip_rate`, `text_only_accuracy`, `dangerous_floor`, `share_abstention` weighted by
`n_total`, `abstention_tau`. The report's `taxonomy_quadrants` table reads it."""),
    View("taxonomy_quadrant_images", lambda include_off_band: taxonomy_quadrant_images(
        include_off_band=include_off_band),
         """ (from `taxonomy_results`, complete partitions only): one row per (config,
image_mode, `condition` clean or `perturbed`, dataset, sample_id, quadrant): `n` ok rows (records
whose perturbed image missed its SSIM band left out unless `perturbations.include_off_band`). The
report resamples these images for the CI of the pooled shares."""),
]
