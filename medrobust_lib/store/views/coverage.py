"""Mart views of coverage and floor effects (the rule itself is in
:mod:`medrobust_lib.store.views.common`).

- ``segmentation_floor``: per (model, checkpoint, strategy, dataset) the clean IoU / Dice and
  ``floor_effect`` = clean IoU < ``SEG_FLOOR`` or clean Dice < ``SEG_FLOOR``.
- ``segmentation_coverage``: per (model, checkpoint, strategy) which perturbed conditions the rows
  cover. Rows with different ``levels`` are not comparable drop for drop.
- ``vlm_floor``: per (model, checkpoint, adapter, task) the clean primary score, the task's
  ``chance`` and ``floor_effect`` (reads ``vlm_task_drops``: registered after the VLM views).
"""

from __future__ import annotations

from medrobust_lib.store.views.common import SEGMENTATION_FLOOR_SQL, View, static

SEGMENTATION_COVERAGE_SQL = f"""
        with cov as (
            select model, checkpoint, strategy,
                   array_to_string(list_sort(list_distinct(list(level) filter (where condition <> 'clean'))), ',')
                       as levels,
                   cast(count(distinct level) filter (where condition <> 'clean') as bigint) as n_levels,
                   cast(count(distinct (condition, perturbation, level)) filter (where condition <> 'clean')
                        as bigint) as n_conditions,
                   cast(count(distinct perturbation) filter (where condition <> 'clean') as bigint) as n_types,
                   cast(count(distinct (dataset, sample_id)) as bigint) as n_samples,
                   cast(count(distinct dataset) as bigint) as n_datasets
            from segmentation_results group by model, checkpoint, strategy),
        floor_ds as ({SEGMENTATION_FLOOR_SQL}),
        fl as (
            select model, checkpoint, strategy, cast(count(*) filter (where floor_effect) as bigint) as n_floor,
                   cast(count(*) as bigint) as n_clean_datasets
            from floor_ds group by model, checkpoint, strategy)
        select c.model, c.checkpoint, c.strategy, c.levels, c.n_levels, c.n_conditions, c.n_types, c.n_samples,
               c.n_datasets, coalesce(f.n_floor, 0) as n_floor_datasets,
               coalesce(f.n_floor = f.n_clean_datasets and f.n_floor > 0, false) as floor_effect
        from cov c left join fl f using (model, checkpoint, strategy)
        order by c.model, c.checkpoint, c.strategy"""
VLM_FLOOR_SQL = """
        select model, checkpoint, adapter, task, metric, value as clean_value, chance, floor_effect
        from vlm_task_drops where column_name = 'Clean'
        order by model, checkpoint, adapter, task"""

VIEWS: list[View] = [
    View("segmentation_floor", static(SEGMENTATION_FLOOR_SQL),
         doc=""": one row per (model, checkpoint, strategy, dataset) of the clean ok rows:
`modality`, `n`, `clean_iou`, `clean_dice` and `floor_effect` (clean IoU or Dice below 0.1: a
drop there is not informative; the default summary views and the report leave such datasets
out of their averages, the `_all` views and `--include-floor` keep them)."""),
    View("segmentation_coverage", static(SEGMENTATION_COVERAGE_SQL),
         doc=""": one row per (model, checkpoint, strategy): what its rows cover,
`levels` (the evaluated severity levels, e.g. `2,4`), `n_levels`, `n_conditions` (distinct
non-clean (condition, perturbation, level)), `n_types`, `n_samples`, `n_datasets`,
`n_floor_datasets` and `floor_effect` (every dataset at the floor). Rows with different `levels`
are not comparable drop for drop."""),
    View("vlm_floor", static(VLM_FLOOR_SQL),
         doc=""": one row per (model, checkpoint, adapter, task) from the `Clean` column of
`vlm_task_drops`: `metric`, `clean_value`, `chance` (yes/no 0.5, multiple choice 1 / the options
of each item averaged over the items evaluated, grounding 0; NULL for captions) and
`floor_effect` (clean at or below chance)."""),
]
