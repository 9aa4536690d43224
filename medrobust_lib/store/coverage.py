"""Coverage and floor-effect views of the mart (registered in ``MART_VIEWS`` by
:mod:`medrobust_lib.store.marts`).

A drop (clean minus perturbed) means nothing when the clean score is already at the floor: a
model with clean Dice 0.000 "loses" nothing under any corruption and would look perfectly robust.
Such a (model, dataset) or (model, task) is flagged ``floor_effect``; the report greys it out and
leaves it out of its averages unless asked (``medrobust report --include-floor``).

- ``segmentation_floor``: per (model, checkpoint, strategy, dataset) the clean IoU / Dice and
  ``floor_effect`` = clean IoU < :data:`SEG_FLOOR` or clean Dice < :data:`SEG_FLOOR`.
- ``segmentation_coverage``: per (model, checkpoint, strategy) which perturbed conditions the rows
  cover: ``levels`` (evaluated severity levels, e.g. ``'2,4'``), ``n_levels``, ``n_conditions``
  (distinct (condition, perturbation, level) besides clean), ``n_types``, ``n_samples``,
  ``n_datasets``, ``n_floor_datasets`` and ``floor_effect`` (every dataset at the floor). Rows with
  different ``levels`` are not comparable drop for drop.
- ``vlm_floor``: per (model, checkpoint, adapter, task) the clean primary score of the accuracy
  tasks, the task's ``chance`` (:data:`VLM_CHANCE`) and ``floor_effect`` = clean at or below chance.
"""

from __future__ import annotations

SEG_FLOOR = 0.1
"""Clean IoU or Dice below this: the segmentation drop is at the floor (not informative)."""
VLM_CHANCE: dict[str, float] = {"vqa_yesno": 0.5, "vqa_mc": 0.25, "grounding": 0.0}
"""Chance level of the clean primary metric per VLM task: yes/no 0.5; multiple choice 1/4 (the
demo's and the published sets' four options A-D); grounding Acc@0.5 0 (no box guessed right).
Captions (CIDEr-D) have no chance level and are never flagged."""

_CHANCE_SQL = "case task " + " ".join(f"when '{t}' then {c}" for t, c in VLM_CHANCE.items()) + " end"

COVERAGE_VIEWS: dict[str, str] = {
    "segmentation_floor": f"""
        select model, checkpoint, strategy, dataset, any_value(modality) as modality, count(*) as n,
               avg(iou) as clean_iou, avg(dice) as clean_dice,
               coalesce(avg(iou) < {SEG_FLOOR} or avg(dice) < {SEG_FLOOR}, false) as floor_effect
        from segmentation_results where condition = 'clean' and status = 'ok'
        group by model, checkpoint, strategy, dataset
        order by model, checkpoint, strategy, dataset""",
    "segmentation_coverage": """
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
        fl as (
            select model, checkpoint, strategy, cast(count(*) filter (where floor_effect) as bigint) as n_floor,
                   cast(count(*) as bigint) as n_clean_datasets
            from segmentation_floor group by model, checkpoint, strategy)
        select c.model, c.checkpoint, c.strategy, c.levels, c.n_levels, c.n_conditions, c.n_types, c.n_samples,
               c.n_datasets, coalesce(f.n_floor, 0) as n_floor_datasets,
               coalesce(f.n_floor = f.n_clean_datasets and f.n_floor > 0, false) as floor_effect
        from cov c left join fl f using (model, checkpoint, strategy)
        order by c.model, c.checkpoint, c.strategy""",
    "vlm_floor": f"""
        select model, checkpoint, adapter, task, metric, value as clean_value, {_CHANCE_SQL} as chance,
               coalesce(value <= {_CHANCE_SQL}, false) as floor_effect
        from vlm_task_drops where column_name = 'Clean'
        order by model, checkpoint, adapter, task""",
}


__all__ = ["COVERAGE_VIEWS", "SEG_FLOOR", "VLM_CHANCE"]
