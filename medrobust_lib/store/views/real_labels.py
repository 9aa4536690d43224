"""Mart views of the real-architecture models on the datasets with real labels.

The demo evaluates its ten generated datasets (masks drawn with the image: exact by construction)
next to real images with labels drawn by people or derived from an atlas. A robustness number on a
synthetic lesion says little about a real label, so these views keep only the datasets whose
``clean_samples.synthetic_labels`` is false (:class:`~medrobust_lib.config.datasets.DatasetConfig`
``synthetic_labels``; NULL, an index written before the column existed, is not taken for real) and
only the rows of real architectures (``arch`` set and not the demo's ``tiny``, as
:func:`medrobust_lib.report.paper_tables.real_models`).

Every dataset is its own row, so no floor dataset is left out: ``floor_effect`` flags a dataset
whose clean IoU or Dice is below the floor (its drops are not informative). Off-band perturbed
outputs (SSIM outside the level's band) are left out of the means unless the suite's
``perturbations.include_off_band``, and counted in ``band_miss``, as in
:mod:`medrobust_lib.store.views.segmentation`. The bootstrap CIs of these cells are computed by the
report (:func:`medrobust_lib.report.real_labels.real_label_type_stats`) from the per-image rows of
:func:`real_label_rows_sql`, the rows the means are taken over.
"""

from __future__ import annotations

from medrobust_lib.store.schema import SEG_NO_MASK, SEG_NOT_APPLICABLE, seg_failed_sql
from medrobust_lib.store.views.common import BAND_ROWS_SQL, View, seg_rows_ctes, sql_bool

REAL_ARCH_SQL = "r.arch is not null and r.arch <> 'tiny'"
"""A row (alias ``r``) of a real architecture: the one test :func:`~medrobust_lib.report.paper_tables.real_models` uses."""
REAL_LABEL_DATASETS_SQL = """
        select dataset from clean_samples group by dataset having bool_or(synthetic_labels) = false"""
"""The datasets the clean index records with real labels (``synthetic_labels`` false on its rows)."""

CELL_KEYS: tuple[str, ...] = ("model", "checkpoint", "strategy", "dataset", "condition", "perturbation", "level")
"""One cell of ``segmentation_real_label_types``."""


def real_label_ctes(include_off_band: bool | str = False, band_rows: str = BAND_ROWS_SQL) -> str:
    """:func:`~medrobust_lib.store.views.common.seg_rows_ctes` over the real-architecture rows of the
    real-label datasets, every dataset kept (``dataset_floor`` flags the floor ones)."""
    where = f"{REAL_ARCH_SQL} and r.dataset in ({REAL_LABEL_DATASETS_SQL})"
    return seg_rows_ctes(True, where, include_off_band, band_rows)


def real_label_rows_sql(include_off_band: bool | str = False, band_rows: str = BAND_ROWS_SQL) -> str:
    """The per-image rows behind ``segmentation_real_label_types``: the ok perturbed rows (any
    non-clean condition) that enter its means, columns :data:`CELL_KEYS`, ``sample_id``,
    ``iou_drop``, ``dice_drop`` (the report resamples them for the CIs)."""
    return f"""
        with {real_label_ctes(include_off_band, band_rows)}
        select {", ".join(CELL_KEYS)}, sample_id, iou_drop, dice_drop
        from seg_rows where condition <> 'clean' and status = 'ok'
        order by {", ".join(CELL_KEYS)}, sample_id"""


def segmentation_real_labels(include_off_band: bool | str = False, band_rows: str = BAND_ROWS_SQL) -> str:
    """Per (model, checkpoint, strategy, dataset) of the real-architecture rows on real-label
    datasets: the clean scores and what was evaluated (see the view's doc)."""
    clean_ok = "condition = 'clean' and status = 'ok'"
    return f"""
        with {real_label_ctes(include_off_band, band_rows)}
        select model, checkpoint, strategy, dataset, any_value(modality) as modality,
               any_value(family) as family, any_value(arch) as arch,
               cast(count(*) filter (where {clean_ok}) as bigint) as n_images,
               avg(dice) filter (where {clean_ok}) as clean_dice,
               avg(iou) filter (where {clean_ok}) as clean_iou,
               avg(instance_dice) filter (where {clean_ok}) as clean_instance_dice,
               cast(count(instance_dice) filter (where {clean_ok}) as bigint) as n_instance_images,
               cast(sum(n_instances) filter (where {clean_ok}) as bigint) as n_instances,
               cast(count(*) filter (where condition = 'clean' and {seg_failed_sql()}) as bigint) as n_clean_failed,
               cast(count(*) filter (where condition = 'clean' and status = '{SEG_NO_MASK}') as bigint)
                   as n_clean_no_mask,
               array_to_string(list_sort(list_distinct(list(level) filter (where condition <> 'clean'))), ',')
                   as levels,
               cast(count(distinct (condition, perturbation, level)) filter (where condition <> 'clean')
                    as bigint) as n_conditions,
               coalesce(bool_or(dataset_floor), false) as floor_effect
        from seg_any
        group by model, checkpoint, strategy, dataset
        order by model, checkpoint, strategy, dataset"""


def segmentation_real_label_types(include_off_band: bool | str = False, band_rows: str = BAND_ROWS_SQL) -> str:
    """Per (model, checkpoint, strategy, dataset, condition, perturbation, level) of the
    real-architecture rows on real-label datasets: the signed mean drops (see the view's doc)."""
    kept = f"({sql_bool(include_off_band)} or not off_band)"
    ok = f"{kept} and status = 'ok'"
    return f"""
        with {real_label_ctes(include_off_band, band_rows)},
        agg as (
            select {", ".join(CELL_KEYS)}, any_value(modality) as modality,
                   cast(count(*) filter (where {kept}) as bigint) as n,
                   cast(count(*) filter (where {ok}) as bigint) as n_ok,
                   cast(count(*) filter (where {kept} and {seg_failed_sql()}) as bigint) as n_failed,
                   cast(count(*) filter (where {kept} and status = '{SEG_NOT_APPLICABLE}') as bigint)
                       as n_not_applicable,
                   avg(dice_drop) filter (where {ok}) as dice_drop, avg(iou_drop) filter (where {ok}) as iou_drop,
                   avg(clean_dice) filter (where {ok}) as clean_dice, avg(clean_iou) filter (where {ok}) as clean_iou,
                   avg(dice) filter (where {ok}) as dice, avg(iou) filter (where {ok}) as iou,
                   avg(ssim) filter (where {kept}) as mean_ssim, any_value(epsilon) as epsilon,
                   cast(count(*) filter (where off_band) as bigint) as band_miss,
                   coalesce(bool_or(dataset_floor), false) as floor_effect
            from seg_any where condition <> 'clean'
            group by {", ".join(CELL_KEYS)})
        select {", ".join(CELL_KEYS)}, modality, n, n_ok, n_failed, n_not_applicable, dice_drop, iou_drop,
               dice_drop / nullif(clean_dice, 0) as dice_rel_drop, iou_drop / nullif(clean_iou, 0) as iou_rel_drop,
               clean_dice, clean_iou, dice, iou, mean_ssim, epsilon, band_miss, floor_effect
        from agg
        order by {", ".join(CELL_KEYS)}"""


VIEWS: list[View] = [
    View("segmentation_real_labels", lambda include_off_band: segmentation_real_labels(include_off_band),
         """: one row per (model, checkpoint, strategy, dataset) of the real-architecture
models (`arch` set and not the demo's `tiny`) on the datasets with real labels (`clean_samples.synthetic_labels`
false: not the demo's generated lesions; NULL, an index written before the column existed, does not count):
`modality`, `family`, `arch`, `n_images` (clean ok rows), mean `clean_dice` and `clean_iou` over them,
`clean_instance_dice` (the mean per-instance Dice of the clean images that have instances; NULL without) with
`n_instance_images` and `n_instances`, `n_clean_failed`, `n_clean_no_mask`, `levels` and `n_conditions` (the
perturbed conditions evaluated) and `floor_effect` (clean IoU or Dice below 0.1: the dataset's drops are not
informative; kept and flagged, every dataset being its own row). The report's first table (`real_labels`)
reads it."""),
    View("segmentation_real_label_types", lambda include_off_band: segmentation_real_label_types(include_off_band),
         """: one row per (model, checkpoint, strategy, dataset, condition,
perturbation, level) of the non-clean rows of `segmentation_real_labels`' models and datasets: `modality`,
`n` (rows), `n_ok`, `n_failed`, `n_not_applicable`, the signed mean paired `dice_drop` and `iou_drop` over the
ok rows (clean minus perturbed: negative = the corruption raised the score), `dice_rel_drop` / `iou_rel_drop`
(drop / the mean clean score of the same rows; NULL when that is 0), `clean_dice`, `clean_iou`, `dice`,
`iou`, `mean_ssim`, `epsilon`, `band_miss` (rows whose perturbed output missed its SSIM band: left out of `n`
and the means unless the suite sets `perturbations.include_off_band`) and the dataset's `floor_effect`. No CIs
here: the report bootstraps them over the same images, seeded by its `--seed`."""),
]
