"""Mart views of the analyses the papers draw from the segmentation results (issue 46, item 9):

- ``segmentation_modality_share``: how many of a model's k worst corruption types are
  modality-specific (MedFM-Robust: "9 of the 15 most damaging corruptions");
- ``segmentation_iou_dice_agreement``: whether IoU and Dice order the corruption types alike
  (Spearman's rank correlation of the per-type drops);
- ``segmentation_mce`` / ``segmentation_mce_summary``: MedMNIST-C's normalised corruption errors
  (``medmnistc/eval.py``: BE and relative BE per type, their means mBE / mRBE) of every model
  against every other one as the baseline, for IoU and Dice.

Each comes in two variants like the views of :mod:`medrobust_lib.store.views.segmentation`:
``<view>`` leaves floor datasets out, ``<view>_all`` keeps them; off-band rows follow the suite's
``perturbations.include_off_band``. The SQL reads only tables (``segmentation_results``,
``perturbation_manifest``), so the views can be created in any order.
"""

from __future__ import annotations

from collections.abc import Callable

from medrobust_lib.store.views.common import (
    GENERIC_FAMILIES,
    LEVELS_SQL,
    PERTURBATION_KINDS_SQL,
    View,
    floor_pair,
    seg_rows_ctes,
)
from medrobust_lib.store.views.segmentation import segmentation_top_corruptions

TOP_K: tuple[int, ...] = (5, 10, 15)
"""The k of ``segmentation_modality_share`` (MedFM-Robust reports the top 15)."""

_LEVELS_UNION_SQL = "array_to_string(list_sort(list_distinct(flatten(list(string_split(levels, ','))))), ',')"
"""The union of the comma-separated ``levels`` strings of a group (each a :data:`LEVELS_SQL`), in the same form."""


def segmentation_modality_share(include_floor: bool, include_off_band: bool = False) -> str:
    """Per (model, strategy, levels) and k of :data:`TOP_K`: the corruption types ranked k or better
    by ``segmentation_top_corruptions`` (mean IoU drop; ties at the k-th place all kept, so ``n_top``
    may exceed k, and is the number of ranked types when there are fewer than k) and how many of them
    are modality-specific (their family is not one of
    :data:`~medrobust_lib.store.views.common.GENERIC_FAMILIES`)."""
    return f"""
        with top as ({segmentation_top_corruptions(include_floor, include_off_band)}),
        kinds as ({PERTURBATION_KINDS_SQL}),
        ranked as (
            select t.model, t.strategy, t.levels, t.perturbation, t.rank, kd.generic,
                   count(*) over (partition by t.model, t.strategy, t.levels) as n_types
            from top t left join kinds kd using (perturbation) where t.rank is not null),
        ks as (select unnest({list(TOP_K)}) as k)
        select r.model, r.strategy, r.levels, ks.k, any_value(r.n_types) as n_types, count(*) as n_top,
               count(*) filter (where r.generic = false) as n_specific,
               count(*) filter (where r.generic) as n_generic,
               count(*) filter (where r.generic is null) as n_unknown,
               count(*) filter (where r.generic = false)
                   / nullif(count(*) filter (where r.generic is not null), 0) as share,
               string_agg(r.perturbation, ',' order by r.rank, r.perturbation) filter (where r.generic = false)
                   as specific_types
        from ranked r join ks on r.rank <= ks.k
        group by r.model, r.strategy, r.levels, ks.k
        order by r.model, r.strategy, r.levels, ks.k"""


def segmentation_iou_dice_agreement(include_floor: bool, include_off_band: bool = False) -> str:
    """Per (model, checkpoint, strategy): Spearman's rank correlation ``spearman_rho`` between the
    corruption types' mean IoU drops and their mean Dice drops (each type's mean over its ok rows of
    every level, as ``segmentation_top_corruptions`` averages), computed as the Pearson correlation of
    the average ranks (tied drops share the mean of their ranks, as ``scipy.stats.spearmanr`` does);
    NULL when either drop is the same for every type. ``n_types``: the types with both drops."""
    rank = ("rank() over (partition by model, checkpoint, strategy order by {c}) "
            "+ (count(*) over (partition by model, checkpoint, strategy, {c}) - 1) / 2.0")
    return f"""
        with {seg_rows_ctes(include_floor, include_off_band=include_off_band)},
        per_type as (
            select model, checkpoint, strategy, perturbation, avg(iou_drop) as iou_drop,
                   avg(dice_drop) as dice_drop, {LEVELS_SQL} as levels
            from seg_rows where condition = 'perturbation' and status = 'ok'
            group by model, checkpoint, strategy, perturbation),
        ranked as (
            select *, {rank.format(c="iou_drop")} as iou_rank, {rank.format(c="dice_drop")} as dice_rank
            from per_type where iou_drop is not null and dice_drop is not null),
        agg as (
            select model, checkpoint, strategy, count(*) as n_types, corr(iou_rank, dice_rank) as rho,
                   {_LEVELS_UNION_SQL} as levels,
                   arg_max(perturbation, iou_drop) as worst_by_iou, arg_max(perturbation, dice_drop) as worst_by_dice
            from ranked group by model, checkpoint, strategy)
        select model, checkpoint, strategy, n_types,
               case when isnan(rho) then null else rho end as spearman_rho, worst_by_iou, worst_by_dice, levels
        from agg order by model, strategy, checkpoint"""


_CELL_KEYS = "model, checkpoint, strategy, perturbation, level"


def segmentation_mce(include_floor: bool, include_off_band: bool = False) -> str:
    """Per (model, checkpoint, strategy) x baseline (``baseline``, ``baseline_checkpoint``,
    ``baseline_strategy``: every evaluated model, itself included) x corruption type both have at a
    common level: MedMNIST-C's errors (``medmnistc/eval.py``, with error = 1 - IoU and 1 - Dice).

    A cell (model, type, level) has the error ``1 - mean score`` of its ok rows and the clean error
    ``1 - mean clean score`` of the same rows; ``error_iou`` (E_c) and ``clean_error_iou`` are their
    means over the ``levels`` the model and the baseline both have for the type, and likewise for the
    baseline. ``be_iou`` = E_c / E_c(baseline) and ``rbe_iou`` = (E_c - E_clean) / (E_c(baseline) -
    E_clean(baseline)) (NULL where the denominator is 0); the same for Dice. MedMNIST-C subtracts the
    clean error of the whole dataset, which every one of its corruptions covers; here a type covers
    only its modalities' images (and a suite may perturb a subset), so the clean error is that of
    the type's own rows: the two agree when the type covers every clean image."""
    errors = ", ".join(f"avg(1 - {s}) as err_{m}, avg(1 - clean_{s}) as clean_err_{m}"
                       for m, s in (("iou", "iou"), ("dice", "dice")))
    pair_means = ", ".join(f"avg({side}.{col}_{m}) as {prefix}{name}_{m}"
                           for side, prefix in (("m", ""), ("b", "baseline_"))
                           for m in ("iou", "dice")
                           for col, name in (("err", "error"), ("clean_err", "clean_error")))
    per_metric = ", ".join(
        f"error_{m}, clean_error_{m}, baseline_error_{m}, baseline_clean_error_{m}, "
        f"error_{m} / nullif(baseline_error_{m}, 0) as be_{m}, "
        f"(error_{m} - clean_error_{m}) / nullif(baseline_error_{m} - baseline_clean_error_{m}, 0) as rbe_{m}"
        for m in ("iou", "dice"))
    return f"""
        with {seg_rows_ctes(include_floor, include_off_band=include_off_band)},
        cells as (
            select {_CELL_KEYS}, {errors}, count(*) as n
            from seg_rows where condition = 'perturbation' and status = 'ok'
            group by {_CELL_KEYS}),
        pairs as (
            select m.model, m.checkpoint, m.strategy, b.model as baseline, b.checkpoint as baseline_checkpoint,
                   b.strategy as baseline_strategy, m.perturbation, {pair_means},
                   array_to_string(list_sort(list(m.level)), ',') as levels,
                   cast(sum(m.n) as bigint) as n, cast(sum(b.n) as bigint) as baseline_n
            from cells m join cells b on b.perturbation = m.perturbation and b.level = m.level
            group by m.model, m.checkpoint, m.strategy, b.model, b.checkpoint, b.strategy, m.perturbation)
        select model, checkpoint, strategy, baseline, baseline_checkpoint, baseline_strategy, perturbation,
               {per_metric}, levels, n, baseline_n
        from pairs order by model, strategy, checkpoint, baseline, baseline_strategy, baseline_checkpoint,
                 perturbation"""


def segmentation_mce_summary(include_floor: bool, include_off_band: bool = False) -> str:
    """Per (model, checkpoint, strategy) x baseline of :func:`segmentation_mce`: ``mce_iou`` (mBE,
    the mean over types of ``be_iou``; 1 = as robust as the baseline, lower is better),
    ``relative_mce_iou`` (mRBE, the mean of ``rbe_iou``), the same for Dice, ``n_types`` (types both
    have), ``n_undefined`` (types whose BE or RBE is NULL for IoU or Dice, left out of that mean)
    and ``levels`` (every level compared)."""
    return f"""
        with t as ({segmentation_mce(include_floor, include_off_band)})
        select model, checkpoint, strategy, baseline, baseline_checkpoint, baseline_strategy,
               avg(be_iou) as mce_iou, avg(rbe_iou) as relative_mce_iou,
               avg(be_dice) as mce_dice, avg(rbe_dice) as relative_mce_dice, count(*) as n_types,
               count(*) filter (where be_iou is null or rbe_iou is null or be_dice is null or rbe_dice is null)
                   as n_undefined,
               {_LEVELS_UNION_SQL} as levels
        from t group by model, checkpoint, strategy, baseline, baseline_checkpoint, baseline_strategy
        order by model, strategy, checkpoint, baseline, baseline_strategy, baseline_checkpoint"""


def _pair(name: str, build: Callable[[bool, bool], str], doc: str) -> list[View]:
    """:func:`~medrobust_lib.store.views.common.floor_pair` with the ``_all`` variant's standard doc."""
    return floor_pair(name, build, doc, f": `{name}` with the floor datasets kept.")


_GENERIC = ", ".join(f"`{f}`" for f in GENERIC_FAMILIES)

VIEWS: list[View] = [
    *_pair("segmentation_modality_share", segmentation_modality_share,
           f""" (from `segmentation_top_corruptions` and `perturbation_types`): per (model,
strategy, `levels`) and `k` in {", ".join(map(str, TOP_K))}: `n_types` (ranked corruption types), `n_top`
(types of `rank` <= k: ties at the k-th place are all kept, so it may exceed k, and it is `n_types`
when there are fewer), `n_specific` (modality-specific types among them: family not one of
{_GENERIC}), `n_generic`, `n_unknown` (types the manifest does not list), `share` (`n_specific` /
(`n_specific` + `n_generic`); MedFM-Robust: 9 of the top 15), `specific_types` (comma-separated, by
rank). Floor datasets left out (a model entirely at the floor is not ranked, so has no rows)."""),
    *_pair("segmentation_iou_dice_agreement", segmentation_iou_dice_agreement,
           """: per (model, checkpoint, strategy), whether IoU and Dice order the
corruption types alike: `n_types` (types with both mean drops; each type's mean over its ok rows of
every level), `spearman_rho` (Spearman's rank correlation of the per-type IoU and Dice drops: the
Pearson correlation of their average ranks, ties sharing the mean rank as in
`scipy.stats.spearmanr`; NULL when either drop is the same for every type), `worst_by_iou` /
`worst_by_dice` (the type with the largest mean drop by each), `levels`. Floor datasets and off-band
rows left out."""),
    *_pair("segmentation_mce", segmentation_mce,
           """: MedMNIST-C's corruption errors (`medmnistc/eval.py`, error = 1 - IoU and
1 - Dice) of every (model, checkpoint, strategy) against every one as the baseline (`baseline`,
`baseline_checkpoint`, `baseline_strategy`; filter `where baseline = '<model id>'`), one row per
corruption type both have at a common level: `error_iou` (E_c: the mean over the common `levels` of
1 - the cell's mean IoU), `clean_error_iou` (the same with the clean IoU of the same rows),
`baseline_error_iou`, `baseline_clean_error_iou`, `be_iou` (E_c / E_c(baseline)), `rbe_iou`
((E_c - E_clean) / (E_c(baseline) - E_clean(baseline)); NULL where a denominator is 0), the same
six for Dice, `levels`, `n` and `baseline_n` (ok rows). The clean error is that of the type's own
rows (MedMNIST-C's whole-dataset clean error, where every corruption covers every image). Floor
datasets and off-band rows left out."""),
    *_pair("segmentation_mce_summary", segmentation_mce_summary,
           """: per (model, checkpoint, strategy) x baseline of `segmentation_mce`:
`mce_iou` (MedMNIST-C's mBE: the mean over types of `be_iou`; 1 = the baseline's errors, lower is more
robust), `relative_mce_iou` (mRBE: the mean of `rbe_iou`), `mce_dice`, `relative_mce_dice`,
`n_types` (types both have), `n_undefined` (types with a NULL ratio, left out of that mean),
`levels`. The report's `mce` table shows the rows of the suite's `segmentation.mce_baseline`
(`medrobust report --mce-baseline`)."""),
]
