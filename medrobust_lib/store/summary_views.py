"""The mart's averaging and ranking views of the segmentation and strategy results, each in two
variants: ``<view>`` leaves floor datasets out (the rule of
:func:`medrobust_lib.store.coverage.seg_rows_ctes`) and ``<view>_all`` keeps them.

Every row says what it covers: ``n_datasets`` (datasets in its means), ``n_floor_excluded`` (floor
datasets of its (model, checkpoint, strategy) left out; 0 in the ``_all`` views) and
``floor_effect`` (every dataset of the model at the floor: kept, flagged, never ranked by default);
summaries add ``levels`` (the severity levels they pool). Rankings rank a row only among rows with
the same ``levels`` and say so in ``note`` when a group mixes coverages.

The SQL reads only tables (``segmentation_results``, ``segmentation_stats``,
``strategy_ranking_stats``), so a view can be created in any order, in any mart that has them.
"""

from __future__ import annotations

from medrobust_lib.store.coverage import LEVELS_SQL, seg_rows_ctes
from medrobust_lib.store.schema import (
    RANKING_TABLE,
    RANKING_VIEW,
    SEG_NO_MASK,
    SEG_NOT_APPLICABLE,
    seg_failed_sql,
)

ALL_SUFFIX = "_all"
"""Name suffix of the variant of a view that keeps the floor datasets."""

FLOOR_NOTE = "every dataset at the floor: not ranked (the _all view ranks it)"
"""``note`` of a row left out of a default ranking because its clean score is at the floor."""
LEVELS_NOTE, LEVELS_NOTE_TAIL = "ranked only among rows covering levels ", " (other levels are not comparable)"
"""``note`` of a ranked row whose group mixes coverages: the prefix and suffix around its ``levels``."""

_STATS_COLUMNS = ("iou_drop_ci_low", "iou_drop_ci_high", "dice_drop_ci_low", "dice_drop_ci_high", "wilcoxon_p",
                  "wilcoxon_q")
"""``segmentation_stats`` columns the by-level views take: from the stats of scope ``all`` where every
dataset is averaged, from those of scope ``floor_excluded`` where the floor datasets were left out
(NULL when a mart predates that scope), and from ``in_band`` / ``floor_excluded_in_band`` where the
cell's off-band rows were left out."""


def _rank_note(partition: str, ranked: str) -> str:
    """``note`` of a row of a ranking: why it is not ranked (``ranked`` false: every dataset at the
    floor), or that it is ranked only among the rows of its ``levels`` when its ``partition`` group
    mixes levels; else NULL."""
    return (f"case when not ({ranked}) then '{FLOOR_NOTE}' "
            f"when min(levels) over (partition by {partition}) <> max(levels) over (partition by {partition}) "
            f"then '{LEVELS_NOTE}' || levels || '{LEVELS_NOTE_TAIL}' end")


def _scope_cte(name: str, scope: str) -> str:
    """CTE ``name``: the :data:`_STATS_COLUMNS` of ``segmentation_stats`` rows of ``scope`` per cell."""
    return (f"{name} as (select model, checkpoint, strategy, condition, perturbation, level, "
            f"{', '.join(f'any_value({c}) as {c}' for c in _STATS_COLUMNS)} from segmentation_stats "
            f"where scope = '{scope}' group by model, checkpoint, strategy, condition, perturbation, level)")


def _scope_join(name: str, alias: str) -> str:
    """Left join of the CTE ``name`` as ``alias`` on the cell of ``bm`` (the ``band_miss`` CTE)."""
    on = " and ".join(f"{alias}.{k} is not distinct from bm.{k}"
                      for k in ("model", "checkpoint", "strategy", "condition", "perturbation", "level"))
    return f"left join {name} {alias} on {on}"


def segmentation_by_level(include_floor: bool, include_off_band: bool | str = False) -> str:
    """Per (model, checkpoint, strategy, condition, perturbation, level) of the non-clean rows:
    counts (``n`` every row; ``n_failed`` the failures; ``n_not_applicable`` and ``n_no_mask``, which
    are not failures), mean scores and drops, relative drops, ``segmentation_stats`` CIs and tests of
    the same rows (scope ``all``, or ``floor_excluded`` when floor datasets were left out), coverage
    columns, and ``band_miss``: the cell's rows whose perturbed output missed its SSIM band, left out
    of ``n`` and every mean unless ``include_off_band`` (a bool or a SQL boolean such as
    ``$include_off_band``). The CI, p and q columns describe the same rows as the means: where
    off-band rows were left out of a cell they come from the stats of scope ``in_band`` (or
    ``floor_excluded_in_band``), computed without them; NULL in a mart written before those scopes."""
    inc_ob = include_off_band if isinstance(include_off_band, str) else ("true" if include_off_band else "false")
    # issue 30: the stats of the in-band rows where the cell's off-band rows are left out
    stats_cols = ", ".join(f"case when coalesce(bm.band_miss, 0) > 0 and not ({inc_ob}) then "
                           f"(case when coalesce(x.n_floor_excluded, 0) = 0 then ib.{c} else ibe.{c} end) "
                           f"when coalesce(x.n_floor_excluded, 0) = 0 then s.{c} else e.{c} end as {c}"
                           for c in _STATS_COLUMNS)
    return f"""
        with {seg_rows_ctes(include_floor, include_off_band=include_off_band)},
        agg as (
            select model, checkpoint, strategy, condition, perturbation, level,
                   count(*) as n, count(*) filter (where {seg_failed_sql()}) as n_failed,
                   count(*) filter (where status = '{SEG_NOT_APPLICABLE}') as n_not_applicable,
                   count(*) filter (where status = '{SEG_NO_MASK}') as n_no_mask,
                   avg(iou) filter (where status = 'ok') as iou, avg(dice) filter (where status = 'ok') as dice,
                   avg(iou_drop) filter (where status = 'ok') as iou_drop,
                   avg(dice_drop) filter (where status = 'ok') as dice_drop,
                   avg(clean_iou) filter (where status = 'ok') as clean_iou,
                   avg(clean_dice) filter (where status = 'ok') as clean_dice,
                   avg(ssim) as mean_ssim, any_value(epsilon) as epsilon,
                   cast(count(distinct dataset) as bigint) as n_datasets
            from seg_rows where condition <> 'clean'
            group by model, checkpoint, strategy, condition, perturbation, level),
        stats as (
            select model, checkpoint, strategy, condition, perturbation, level,
                   {", ".join(f"any_value({c}) as {c}" for c in _STATS_COLUMNS)}
            from segmentation_stats where coalesce(scope, 'all') = 'all'
            group by model, checkpoint, strategy, condition, perturbation, level),
        stats_excl as (
            select model, checkpoint, strategy, condition, perturbation, level,
                   {", ".join(f"any_value({c}) as {c}" for c in _STATS_COLUMNS)}
            from segmentation_stats where scope = 'floor_excluded'
            group by model, checkpoint, strategy, condition, perturbation, level),
        {_scope_cte("stats_in_band", "in_band")},
        {_scope_cte("stats_excl_in_band", "floor_excluded_in_band")}
        select bm.model, bm.checkpoint, bm.strategy, bm.condition, bm.perturbation, bm.level,
               coalesce(a.n, 0) as n, coalesce(a.n_failed, 0) as n_failed,
               coalesce(a.n_not_applicable, 0) as n_not_applicable, coalesce(a.n_no_mask, 0) as n_no_mask,
               a.iou, a.dice, a.iou_drop, a.dice_drop, a.iou_drop / nullif(a.clean_iou, 0) as iou_rel_drop,
               a.dice_drop / nullif(a.clean_dice, 0) as dice_rel_drop, a.clean_iou, a.clean_dice, a.mean_ssim,
               a.epsilon, {stats_cols}, coalesce(a.n_datasets, 0) as n_datasets,
               coalesce(x.n_floor_excluded, 0) as n_floor_excluded,
               coalesce(x.floor_effect, false) as floor_effect, bm.band_miss
        from band_miss bm
        left join agg a on a.model = bm.model and a.checkpoint is not distinct from bm.checkpoint
             and a.strategy is not distinct from bm.strategy and a.condition = bm.condition
             and a.perturbation is not distinct from bm.perturbation and a.level is not distinct from bm.level
        left join floor_excl x on x.model = bm.model and x.checkpoint is not distinct from bm.checkpoint
             and x.strategy is not distinct from bm.strategy
        left join stats s on s.model = bm.model and s.checkpoint is not distinct from bm.checkpoint
             and s.strategy is not distinct from bm.strategy and s.condition = bm.condition
             and s.perturbation is not distinct from bm.perturbation and s.level is not distinct from bm.level
        left join stats_excl e on e.model = bm.model and e.checkpoint is not distinct from bm.checkpoint
             and e.strategy is not distinct from bm.strategy and e.condition = bm.condition
             and e.perturbation is not distinct from bm.perturbation and e.level is not distinct from bm.level
        {_scope_join("stats_in_band", "ib")}
        {_scope_join("stats_excl_in_band", "ibe")}
        where bm.condition <> 'clean'
        order by bm.model, bm.checkpoint, bm.strategy, bm.condition, bm.perturbation, bm.level"""


def segmentation_summary(include_floor: bool, include_off_band: bool = False) -> str:
    """The published table in long form (Clean, one row per corruption / attack type, Avg, Delta)
    per (model, checkpoint, strategy), with ``levels``, ``n_datasets``, ``n_floor_excluded`` and
    ``floor_effect``; off-band rows left out unless ``include_off_band``."""
    return f"""
        with {seg_rows_ctes(include_floor, include_off_band=include_off_band)},
        ok as (select * from seg_rows where status = 'ok'),
        clean as (
            select model, checkpoint, strategy, avg(iou) as iou, avg(dice) as dice, count(*) as n,
                   {LEVELS_SQL} as levels, cast(count(distinct dataset) as bigint) as n_datasets
            from ok where condition = 'clean' group by model, checkpoint, strategy),
        per_type as (
            select model, checkpoint, strategy,
                   case when condition = 'perturbation' then 'corruption' else 'attack' end as row_kind,
                   perturbation, avg(iou) as iou, avg(dice) as dice, avg(iou_drop) as iou_drop,
                   avg(dice_drop) as dice_drop, avg(clean_iou) as clean_iou, avg(clean_dice) as clean_dice,
                   count(*) as n, {LEVELS_SQL} as levels, cast(count(distinct dataset) as bigint) as n_datasets
            from ok where condition <> 'clean' group by all),
        corruption_cov as (
            select model, checkpoint, strategy, {LEVELS_SQL} as levels,
                   cast(count(distinct dataset) as bigint) as n_datasets
            from ok where condition = 'perturbation' group by model, checkpoint, strategy),
        avg_row as (
            select model, checkpoint, strategy, avg(iou) as iou, avg(dice) as dice, avg(iou_drop) as iou_drop,
                   avg(dice_drop) as dice_drop, avg(clean_iou) as clean_iou, avg(clean_dice) as clean_dice,
                   sum(n) as n
            from per_type where row_kind = 'corruption' group by model, checkpoint, strategy),
        avg_cov as (select * from avg_row join corruption_cov using (model, checkpoint, strategy)),
        rows as (
            select model, checkpoint, strategy, 'Clean' as row_kind, 'Clean' as perturbation, iou, dice,
                   0.0 as iou_drop, 0.0 as dice_drop, 0.0 as iou_rel_drop, 0.0 as dice_rel_drop, n, 0 as sort_key,
                   levels, n_datasets
            from clean
            union all
            select model, checkpoint, strategy, row_kind, perturbation, iou, dice, iou_drop, dice_drop,
                   iou_drop / nullif(clean_iou, 0), dice_drop / nullif(clean_dice, 0), n,
                   case when row_kind = 'corruption' then 1 else 2 end, levels, n_datasets
            from per_type
            union all
            select model, checkpoint, strategy, 'Avg', 'Avg', iou, dice, iou_drop, dice_drop,
                   iou_drop / nullif(clean_iou, 0), dice_drop / nullif(clean_dice, 0), n, 3, levels, n_datasets
            from avg_cov
            union all
            -- Delta: the mean paired drop over corruption types. Types cover different modalities, so
            -- Clean minus Avg(dice) would mix sample sets; the paired drop does not.
            select model, checkpoint, strategy, 'Delta', 'Delta', iou_drop, dice_drop, iou_drop, dice_drop,
                   iou_drop / nullif(clean_iou, 0), dice_drop / nullif(clean_dice, 0), n, 4, levels, n_datasets
            from avg_cov)
        select r.*, coalesce(x.n_floor_excluded, 0) as n_floor_excluded,
               coalesce(x.floor_effect, false) as floor_effect
        from rows r left join floor_excl x using (model, checkpoint, strategy)
        order by r.model, r.strategy, r.sort_key, r.perturbation"""


def segmentation_top_corruptions(include_floor: bool, include_off_band: bool = False) -> str:
    """Per (model, strategy, corruption type) the mean drops over every level, ranked by the mean
    IoU drop (MedFM-Robust's primary metric) among the types of the same ``levels``; a model whose
    every dataset is at the floor is not ranked unless ``include_floor``; off-band rows left out
    unless ``include_off_band``."""
    ranked = "true" if include_floor else "not floor_effect"
    return f"""
        with {seg_rows_ctes(include_floor, include_off_band=include_off_band)},
        fx as (
            select model, strategy, cast(sum(n_floor_excluded) as bigint) as n_floor_excluded,
                   bool_or(floor_effect) as floor_effect
            from floor_excl group by model, strategy),
        per_type as (
            select model, strategy, perturbation, avg(iou_drop) as iou_drop,
                   avg(iou_drop) / nullif(avg(clean_iou), 0) as iou_rel_drop, avg(dice_drop) as dice_drop,
                   avg(dice_drop) / nullif(avg(clean_dice), 0) as dice_rel_drop, avg(clean_iou) as clean_iou,
                   avg(clean_dice) as clean_dice, count(*) as n, {LEVELS_SQL} as levels,
                   cast(count(distinct dataset) as bigint) as n_datasets
            from seg_rows where status = 'ok' and condition = 'perturbation'
            group by model, strategy, perturbation),
        flagged as (
            select p.*, coalesce(fx.n_floor_excluded, 0) as n_floor_excluded,
                   coalesce(fx.floor_effect, false) as floor_effect
            from per_type p left join fx using (model, strategy))
        select model, strategy, perturbation, iou_drop, iou_rel_drop, dice_drop, dice_rel_drop, clean_iou,
               clean_dice, n,
               case when {ranked} then rank() over (partition by model, strategy, levels, {ranked}
                                                    order by iou_drop desc nulls last) end as rank,
               levels, n_datasets, n_floor_excluded, floor_effect,
               {_rank_note("model, strategy", ranked)} as note
        from flagged order by model, strategy, rank nulls last, perturbation"""


def strategy_ranking(include_floor: bool) -> str:
    """``strategy_ranking_stats`` rows of one variant (``with_floor``; rows that do not say, written
    before the column existed, are in both) plus the relative drops."""
    keep = "with_floor is not false" if include_floor else "with_floor is not true"
    return f"""
        select *, mean_iou_drop / nullif(clean_iou, 0) as iou_rel_drop,
               mean_dice_drop / nullif(clean_dice, 0) as dice_rel_drop
        from {RANKING_TABLE}
        where {keep}
        order by model, kind, rank, strategy"""


def segmentation_by_modality(include_floor: bool) -> str:
    """Per (model, checkpoint, strategy, condition, perturbation, level, modality) of the non-clean
    rows: ``n`` (rows), ``n_ok``, mean IoU / Dice drops and clean scores of the ok rows, the model's
    ``family`` and ``arch`` (``real_architecture``: arch is not the demo's ``tiny``), coverage
    columns. The per-modality breakdown of ``segmentation_by_level`` (no CIs: a modality's cell is
    often a handful of images)."""
    return f"""
        with {seg_rows_ctes(include_floor)}
        select model, checkpoint, strategy, condition, perturbation, level, modality,
               count(*) as n, count(*) filter (where status = 'ok') as n_ok,
               avg(iou_drop) filter (where status = 'ok') as iou_drop,
               avg(dice_drop) filter (where status = 'ok') as dice_drop,
               avg(clean_iou) filter (where status = 'ok') as clean_iou,
               avg(clean_dice) filter (where status = 'ok') as clean_dice,
               any_value(family) as family, any_value(arch) as arch,
               coalesce(any_value(arch), 'tiny') <> 'tiny' as real_architecture,
               cast(count(distinct dataset) as bigint) as n_datasets
        from seg_rows where condition <> 'clean'
        group by model, checkpoint, strategy, condition, perturbation, level, modality
        order by model, strategy, condition, perturbation, level, modality"""


_BUILDERS = {
    "segmentation_by_level": segmentation_by_level,
    "segmentation_by_modality": segmentation_by_modality,
    "segmentation_summary": segmentation_summary,
    "segmentation_top_corruptions": segmentation_top_corruptions,
    RANKING_VIEW: strategy_ranking,
}

_OFF_BAND_BUILDERS = {
    "segmentation_by_level": segmentation_by_level,
    "segmentation_summary": segmentation_summary,
    "segmentation_top_corruptions": segmentation_top_corruptions,
}
"""The views whose means follow the off-band rule (rows whose output missed its SSIM band)."""

SUMMARY_VIEWS: dict[str, str] = {
    name + suffix: build(suffix == ALL_SUFFIX) for name, build in _BUILDERS.items() for suffix in ("", ALL_SUFFIX)
}
"""``<view>`` (floor datasets left out) and ``<view>_all`` (kept) of every averaging / ranking view; off-band
rows left out."""


def off_band_summary_views(include_off_band: bool) -> dict[str, str]:
    """The averaging views (both floor variants) built with ``include_off_band``: the mart's
    ``include_off_band`` setting replaces the default :data:`SUMMARY_VIEWS` entries with these."""
    return {name + suffix: build(suffix == ALL_SUFFIX, include_off_band)
            for name, build in _OFF_BAND_BUILDERS.items() for suffix in ("", ALL_SUFFIX)}


__all__ = ["ALL_SUFFIX", "FLOOR_NOTE", "LEVELS_NOTE", "LEVELS_NOTE_TAIL", "SUMMARY_VIEWS", "off_band_summary_views",
           "segmentation_by_level", "segmentation_by_modality", "segmentation_summary", "segmentation_top_corruptions", "strategy_ranking"]
