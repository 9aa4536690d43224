"""Mart views of the segmentation results: by level, by modality, the published summary, the
corruption ranking and the per-model summary the report shows, each in two variants: ``<view>``
leaves floor datasets out (:func:`medrobust_lib.store.views.common.seg_rows_ctes`) and
``<view>_all`` keeps them.

Every row says what it covers: ``n_datasets`` (datasets in its means), ``n_floor_excluded`` (floor
datasets of its (model, checkpoint, strategy) left out; 0 in the ``_all`` views) and
``floor_effect`` (every dataset of the model at the floor: kept, flagged, never ranked by default);
summaries add ``levels`` (the severity levels they pool). Rankings rank a row only among rows with
the same ``levels`` and say so in ``note`` when a group mixes coverages.

The SQL reads only tables (``segmentation_results``, ``segmentation_stats``,
``perturbation_manifest``), so a view can be created in any order, in any mart that has them.
"""

from __future__ import annotations

from medrobust_lib.store.schema import SEG_NO_MASK, SEG_NOT_APPLICABLE, seg_failed_sql
from medrobust_lib.store.views.common import (
    ALL_SUFFIX,
    BAND_ROWS_SQL,
    LEVELS_SQL,
    View,
    floor_pair,
    rank_note,
    seg_rows_ctes,
)

_STATS_COLUMNS = ("iou_drop_ci_low", "iou_drop_ci_high", "dice_drop_ci_low", "dice_drop_ci_high", "wilcoxon_p",
                  "wilcoxon_q")
"""``segmentation_stats`` columns the by-level views take: from the stats of scope ``all`` where every
dataset is averaged, from those of scope ``floor_excluded`` where the floor datasets were left out
(NULL when a mart predates that scope), and from ``in_band`` / ``floor_excluded_in_band`` where the
cell's off-band rows were left out."""


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
               {rank_note("model, strategy", ranked)} as note
        from flagged order by model, strategy, rank nulls last, perturbation"""


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


def segmentation_model_summary(include_floor: bool | str, include_off_band: bool | str = False,
                               band_rows: str = BAND_ROWS_SQL) -> str:
    """Per (model, checkpoint, strategy), the report's summary table: ``clean_iou`` / ``clean_dice``
    (mean over clean images, [0, 1]); ``corruption_iou_drop`` / ``corruption_dice_drop``: the mean
    over corruption types of each type's mean paired drop (clean - perturbed; positive = worse);
    ``corruption_iou_drop_pooled`` / ``corruption_dice_drop_pooled``: the reference's Delta (MedFM-Robust),
    the clean mean minus the mean over every perturbed row pooled (types weighted by their rows, clean and
    perturbed means over different images where a type covers only some of them);
    ``attack_*_drop``: the same over the attack types; relative drops (drop / clean score, NULL when
    that is 0); ``n_corruption_types``, ``n_attack_types``; ``n_images`` (clean rows), ``n`` (all
    rows), ``n_failed``, ``n_not_applicable``, ``n_no_mask``; ``levels`` and ``n_conditions``
    (every row, floor datasets included), ``n_floor_datasets`` and ``floor_effect``. Floor datasets
    and off-band rows are left out of the scores and drops unless ``include_floor`` /
    ``include_off_band`` (bools or SQL booleans such as ``$include_floor``); ``band_rows``: the
    manifest's band flags (:data:`~medrobust_lib.store.views.common.NO_BAND_ROWS_SQL` for a database
    without them)."""
    return f"""
        with {seg_rows_ctes(include_floor, "true", include_off_band, band_rows)},
        kept as (select * from seg_rows where status = 'ok'),
        per_type as (
            select model, checkpoint, strategy,
                   case when condition = 'perturbation' then 'corruption' else 'attack' end as kind,
                   perturbation, avg(iou_drop) as iou_drop, avg(dice_drop) as dice_drop
            from kept where condition <> 'clean' group by all),
        per as (
            select model, checkpoint, strategy,
                   avg(iou_drop) filter (where kind = 'corruption') as corruption_iou_drop,
                   avg(dice_drop) filter (where kind = 'corruption') as corruption_dice_drop,
                   avg(iou_drop) filter (where kind = 'attack') as attack_iou_drop,
                   avg(dice_drop) filter (where kind = 'attack') as attack_dice_drop,
                   count(*) filter (where kind = 'corruption') as n_corruption_types,
                   count(*) filter (where kind = 'attack') as n_attack_types
            from per_type group by model, checkpoint, strategy),
        pooled as (
            -- the reference's rule (MedFM-Robust): every perturbed row pooled, whatever its type
            select model, checkpoint, strategy, avg(iou) as iou, avg(dice) as dice
            from kept where condition = 'perturbation' group by model, checkpoint, strategy),
        clean as (
            select model, checkpoint, strategy, avg(iou) as clean_iou, avg(dice) as clean_dice,
                   bool_or(floor_effect) as floor_effect
            from kept where condition = 'clean' group by model, checkpoint, strategy),
        cov as (
            select model, checkpoint, strategy,
                   array_to_string(list_sort(list_distinct(list(level) filter (where condition <> 'clean'))), ',')
                       as levels,
                   count(distinct (condition, perturbation, level)) filter (where condition <> 'clean')
                       as n_conditions
            from segmentation_results group by model, checkpoint, strategy),
        nfl as (select model, checkpoint, strategy, n_floor as n_floor_datasets from floor_model),
        counts as (
            select model, checkpoint, strategy, count(*) filter (where condition = 'clean') as n_images,
                   count(*) as n, count(*) filter (where {seg_failed_sql()}) as n_failed,
                   count(*) filter (where status = '{SEG_NOT_APPLICABLE}') as n_not_applicable,
                   count(*) filter (where status = '{SEG_NO_MASK}') as n_no_mask
            from segmentation_results group by model, checkpoint, strategy)
        select c.model, c.checkpoint, c.strategy, cl.clean_iou, p.corruption_iou_drop,
               p.corruption_iou_drop / nullif(cl.clean_iou, 0) as corruption_iou_rel_drop,
               cl.clean_iou - po.iou as corruption_iou_drop_pooled,
               p.attack_iou_drop, p.attack_iou_drop / nullif(cl.clean_iou, 0) as attack_iou_rel_drop,
               cl.clean_dice, p.corruption_dice_drop,
               p.corruption_dice_drop / nullif(cl.clean_dice, 0) as corruption_dice_rel_drop,
               cl.clean_dice - po.dice as corruption_dice_drop_pooled,
               p.attack_dice_drop, p.attack_dice_drop / nullif(cl.clean_dice, 0) as attack_dice_rel_drop,
               coalesce(p.n_corruption_types, 0) as n_corruption_types,
               coalesce(p.n_attack_types, 0) as n_attack_types, c.n_images, c.n, c.n_failed,
               c.n_not_applicable, c.n_no_mask,
               coalesce(cv.levels, '') as levels, coalesce(cv.n_conditions, 0) as n_conditions,
               coalesce(nfl.n_floor_datasets, 0) as n_floor_datasets,
               coalesce(cl.floor_effect, false) as floor_effect
        from counts c left join per p using (model, checkpoint, strategy)
        left join pooled po using (model, checkpoint, strategy)
        left join clean cl using (model, checkpoint, strategy)
        left join cov cv using (model, checkpoint, strategy)
        left join nfl using (model, checkpoint, strategy)
        order by c.model, c.strategy, c.checkpoint"""


def segmentation_level_means(include_floor: bool | str, include_off_band: bool | str = False,
                             band_rows: str = BAND_ROWS_SQL) -> str:
    """The figures' by-level data: per (model, checkpoint, strategy, condition, perturbation, level)
    of the non-clean ok rows ``n``, mean ``iou`` / ``dice`` / ``iou_drop`` / ``dice_drop``,
    ``floor_effect`` and ``band_miss`` (the cell's rows whose perturbed output missed its SSIM band);
    floor datasets and off-band rows left out as in :func:`segmentation_model_summary`."""
    return f"""
        with {seg_rows_ctes(include_floor, "true", include_off_band, band_rows)},
        kept as (select * from seg_rows where status = 'ok'),
        means as (
            select model, checkpoint, strategy, condition, perturbation, level, count(*) as n,
                   avg(iou) as iou, avg(dice) as dice, avg(iou_drop) as iou_drop, avg(dice_drop) as dice_drop,
                   bool_or(floor_effect) as floor_effect
            from kept where condition <> 'clean'
            group by model, checkpoint, strategy, condition, perturbation, level)
        select m.*, coalesce(b.band_miss, 0) as band_miss
        from means m
        left join band_miss b on b.model = m.model and b.checkpoint is not distinct from m.checkpoint
             and b.strategy is not distinct from m.strategy and b.condition = m.condition
             and b.perturbation = m.perturbation and b.level = m.level
        order by m.model, m.strategy, m.checkpoint, m.condition, m.perturbation, m.level"""


def segmentation_type_ranks(include_floor: bool) -> str:
    """Per (model, level) every corruption type of ``segmentation_by_level`` (``_all`` with
    ``include_floor``) ranked by mean IoU drop, 1 = worst."""
    return f"""
        select model, level, perturbation, n, iou_drop, iou_drop_ci_low, iou_drop_ci_high, clean_iou, iou,
               rank() over (partition by model, level order by iou_drop desc nulls last) as rank
        from segmentation_by_level{ALL_SUFFIX if include_floor else ""} where condition = 'perturbation'
        order by model, level, rank, perturbation"""


VIEWS: list[View] = [
    *floor_pair("segmentation_by_level", segmentation_by_level,
                 """: one row per (model, checkpoint, strategy, condition, perturbation,
level) of the non-clean conditions, floor datasets left out: `n`, `n_failed`, `n_not_applicable`,
`n_no_mask` (the last two are not failures), mean `iou` / `dice`
/ `iou_drop` / `dice_drop` over ok rows, relative drops `iou_rel_drop` / `dice_rel_drop` (mean drop
/ mean clean score of the same rows; NULL when that is 0), `clean_iou` / `clean_dice`,
`mean_ssim`, `epsilon`, from `segmentation_stats` the drop CIs (IoU first), `wilcoxon_p`,
`wilcoxon_q` (of the same rows: `segmentation_stats` of scope `floor_excluded` where floor
datasets were left out, else `all`, and of scope `in_band` / `floor_excluded_in_band` where the
cell's off-band rows were left out; NULL in a mart whose stats predate the scopes), then
`n_datasets`, `n_floor_excluded`, `floor_effect`, `band_miss` (rows whose perturbed output missed
its SSIM band: left out of `n`, the means and the CIs unless the suite sets
`perturbations.include_off_band`; docs/perturbations.md). The report's by-level table reads this view
(`--include-floor`: the `_all` one).""",
                 """: `segmentation_by_level` with the floor datasets kept (stats of
scope `all`)."""),
    *floor_pair("segmentation_by_modality", segmentation_by_modality,
                 """: the per-modality breakdown of `segmentation_by_level`, floor
datasets left out: per (model, checkpoint, strategy, condition, perturbation, level, modality)
`n`, `n_ok`, mean `iou_drop` / `dice_drop` / `clean_iou` / `clean_dice` over ok rows, `family`,
`arch`, `real_architecture` (arch is not the demo's `tiny`), `n_datasets`. No CIs: a modality's
cell is often a handful of images. The report's `real_model_worst_types` table reads it.""",
                 """: `segmentation_by_modality` with the floor datasets kept.""", off_band=False),
    *floor_pair("segmentation_summary", segmentation_summary,
                 """: the published table in long form, per (model, checkpoint, strategy) one
row per `row_kind`: `Clean`, `corruption` (one per type, pooled over levels and images),
`attack` (`fgsm`, `pgd`, pooled over levels), `Avg` (mean over corruption types) and `Delta`
(mean paired drop over corruption types; its `iou` / `dice` columns also hold the drops, since
types cover different modalities and Clean - Avg would compare different images); columns
`perturbation`, `iou`, `dice`, `iou_drop`, `dice_drop`, `iou_rel_drop`, `dice_rel_drop` (drop /
the mean clean score of the same rows, for Avg and Delta the mean drop over types / the mean
clean score over types; 0 on Clean; NULL when the clean score is 0), `n` (rows), `sort_key`,
`levels` (the levels the row pools: `0` on Clean, the type's levels, for Avg and Delta those of
every corruption type), `n_datasets`, `n_floor_excluded`, `floor_effect`; floor datasets left out.""",
                 """: `segmentation_summary` with the floor datasets kept."""),
    *floor_pair("segmentation_top_corruptions", segmentation_top_corruptions,
                 """: one row per (model, strategy, corruption type), ranked by IoU,
floor datasets left out: mean `iou_drop`, `iou_rel_drop`, `dice_drop`, `dice_rel_drop`,
`clean_iou`, `clean_dice` over ok rows of every level, `n`, `rank` (1 = largest mean IoU drop
among the types of the model and strategy with the same `levels`; NULL when `floor_effect`),
`levels`, `n_datasets`, `n_floor_excluded` (summed over checkpoints), `floor_effect`, `note` (why
a row is not ranked, or that its model mixes levels; else NULL).""",
                 """: `segmentation_top_corruptions` with the floor datasets kept,
every row ranked."""),
    *floor_pair("segmentation_model_summary", segmentation_model_summary,
                 """: one row per (model, checkpoint, strategy), the report's summary table:
`clean_iou`, `corruption_iou_drop` (the mean over corruption types of each type's mean paired drop:
the project's rule), `corruption_iou_rel_drop`, `corruption_iou_drop_pooled` (the reference's Delta:
`clean_iou` minus the mean IoU over every perturbed row pooled, so a type weighs by its rows and the
two means may cover different images), `attack_iou_drop` (the same as `corruption_iou_drop` over
FGSM / PGD at every eps), `attack_iou_rel_drop`, the same six for Dice, `n_corruption_types`, `n_attack_types`, `n_images`
(clean rows), `n` (every row), `n_failed`, `n_not_applicable`, `n_no_mask`, `levels` and
`n_conditions` (distinct non-clean (condition, perturbation, level)) over every row,
`n_floor_datasets` and `floor_effect`; floor datasets and off-band rows left out of the scores and
drops. The report's `segmentation_summary` table reads it (`--include-floor`: the `_all` one).""",
                 """: `segmentation_model_summary` with the floor datasets kept."""),
    *floor_pair("segmentation_level_means", segmentation_level_means,
                 """: one row per (model, checkpoint, strategy, condition, perturbation,
level) of the non-clean ok rows, floor datasets and off-band rows left out: `n` (ok rows), mean
`iou`, `dice`, `iou_drop`, `dice_drop`, `floor_effect`, `band_miss`. The data of the report's
robustness curves and heatmaps.""",
                 """: `segmentation_level_means` with the floor datasets kept."""),
    *floor_pair("segmentation_type_ranks", segmentation_type_ranks,
                 """ (from `segmentation_by_level`): one row per (model, level, corruption type): `n`,
`iou_drop` with `iou_drop_ci_low` / `iou_drop_ci_high`, `clean_iou`, `iou` and `rank` (1 = the largest
mean IoU drop among the model's types at that level). The report's `real_model_worst_types` table
reads it.""",
                 """ (from `segmentation_by_level_all`): `segmentation_type_ranks` with the floor
datasets kept.""", off_band=False),
]
