"""Coverage and floor effects: the rule that leaves floor datasets out of the segmentation means,
the VLM chance levels, and the coverage views of the mart (registered in ``MART_VIEWS`` by
:mod:`medrobust_lib.store.marts`).

A drop (clean minus perturbed) means nothing when the clean score is already at the floor: a
model with clean Dice 0.000 "loses" nothing under any corruption and would look perfectly robust.
Such a (model, dataset) or (model, task) is flagged ``floor_effect``; the mart's averaging and
ranking views leave floor datasets out (their ``_all`` companions keep them), and so does the
report unless asked (``medrobust report --include-floor``). The rule, in one place
(:func:`seg_rows_ctes`, used by the mart views and the report alike): the rows of a (model,
checkpoint, strategy, dataset) at the floor are left out, unless every dataset of that (model,
checkpoint, strategy) is at the floor; then they are kept and the model's rows carry
``floor_effect`` (greyed, never ranked by default).

- ``segmentation_floor``: per (model, checkpoint, strategy, dataset) the clean IoU / Dice and
  ``floor_effect`` = clean IoU < :data:`SEG_FLOOR` or clean Dice < :data:`SEG_FLOOR`.
- ``segmentation_coverage``: per (model, checkpoint, strategy) which perturbed conditions the rows
  cover: ``levels`` (evaluated severity levels, e.g. ``'2,4'``), ``n_levels``, ``n_conditions``
  (distinct (condition, perturbation, level) besides clean), ``n_types``, ``n_samples``,
  ``n_datasets``, ``n_floor_datasets`` and ``floor_effect`` (every dataset at the floor). Rows with
  different ``levels`` are not comparable drop for drop.
- ``vlm_floor``: per (model, checkpoint, adapter, task) the clean primary score of the accuracy
  tasks, the task's ``chance`` (:func:`vlm_chance_sql`: multiple choice 1/options of the items
  evaluated) and ``floor_effect`` = clean at or below chance.
"""

from __future__ import annotations

SEG_FLOOR = 0.1
"""Clean IoU or Dice below this: the segmentation drop is at the floor (not informative)."""
VLM_CHANCE: dict[str, float] = {"vqa_yesno": 0.5, "vqa_mc": 0.25, "grounding": 0.0}
"""Fixed chance level of the clean primary metric per VLM task: yes/no 0.5; grounding Acc@0.5 0 (no
box guessed right). Multiple choice: the mart derives it from the data (:func:`vlm_chance_sql`, the
mean of 1/``n_options`` over the items evaluated); 0.25 (four options A-D) is only the fallback for
rows that do not say how many options they had (written before ``n_options`` existed). Captions
(CIDEr-D) have no chance level and are never flagged."""

CHANCE_TOL = 1e-9
"""Slack of "at or below chance": a mean of 1/k and an accuracy of the same value may differ in the
last bits."""

LEVELS_SQL = "array_to_string(list_sort(list_distinct(list(level))), ',')"
"""Aggregate: the distinct severity levels of a group, sorted, comma-separated (e.g. ``'2,4'``)."""

SEGMENTATION_FLOOR_SQL = f"""
        select model, checkpoint, strategy, dataset, any_value(modality) as modality, count(*) as n,
               avg(iou) as clean_iou, avg(dice) as clean_dice,
               coalesce(avg(iou) < {SEG_FLOOR} or avg(dice) < {SEG_FLOOR}, false) as floor_effect
        from segmentation_results where condition = 'clean' and status = 'ok'
        group by model, checkpoint, strategy, dataset
        order by model, checkpoint, strategy, dataset"""


def _sql_bool(value: bool | str) -> str:
    """A Python bool as SQL ``true``/``false``; a string is taken as a SQL expression (e.g. ``$p``)."""
    return value if isinstance(value, str) else ("true" if value else "false")


BAND_ROWS_SQL = """
        select dataset, sample_id, perturbation, level, bool_and(band_reached) as band_reached
        from perturbation_manifest where status = 'ok'
        group by dataset, sample_id, perturbation, level"""
"""Per perturbed output of the manifest (dataset, sample, type, level): ``band_reached``, whether its
SSIM lies in its level's band."""
NO_BAND_ROWS_SQL = """
        select null::varchar as dataset, null::varchar as sample_id, null::varchar as perturbation,
               null::integer as level, null::boolean as band_reached where false"""
""":data:`BAND_ROWS_SQL` for a database without ``perturbation_manifest`` (no row is off-band)."""


def off_band_sql(condition: str, band_reached: str) -> str:
    """SQL boolean: a perturbed row whose output missed its level's SSIM band (``band_reached`` false
    in the manifest; a row the manifest does not describe is not off-band)."""
    return f"coalesce({condition} and not {band_reached}, false)"


def seg_rows_ctes(include_floor: bool | str = False, where: str = "true", include_off_band: bool | str = False,
                  band_rows: str = BAND_ROWS_SQL) -> str:
    """CTEs (without the leading ``with``) of the segmentation rows that enter a mean.

    - ``floor_ds``: :data:`SEGMENTATION_FLOOR_SQL` (per (model, checkpoint, strategy, dataset)).
    - ``floor_model``: per (model, checkpoint, strategy) ``all_floor`` (every dataset with clean
      rows at the floor) and ``n_floor`` (datasets at the floor).
    - ``seg_any``: every ``segmentation_results`` row (any status; alias ``r`` in ``where``) plus
      ``dataset_floor`` (its dataset is at the floor), ``floor_effect`` (``all_floor`` of its
      model) and ``off_band`` (a corruption row whose output missed its SSIM band, from
      ``perturbation_manifest``: :data:`BAND_ROWS_SQL`), except the rows of a floor dataset, which
      are left out unless ``include_floor`` or ``all_floor``.
    - ``seg_rows``: the rows of ``seg_any`` that enter the means: off-band rows left out unless
      ``include_off_band``.
    - ``band_miss``: per (model, checkpoint, strategy, condition, perturbation, level) of
      ``seg_any`` the count ``band_miss`` of its off-band rows (whether or not they are in the means).
    - ``floor_excl``: per (model, checkpoint, strategy) ``n_floor_excluded`` (floor datasets left
      out of ``seg_rows``: 0 when ``include_floor`` or ``all_floor``) and ``floor_effect``.

    ``include_floor``, ``include_off_band``: a bool, or a SQL boolean expression such as the named
    parameter ``$include_floor``. ``band_rows``: the query of the manifest's band flags
    (:data:`NO_BAND_ROWS_SQL` where the database has no manifest).
    """
    inc = _sql_bool(include_floor)
    inc_ob = _sql_bool(include_off_band)
    return f"""floor_ds as ({SEGMENTATION_FLOOR_SQL}),
        floor_model as (
            select model, checkpoint, strategy, bool_and(floor_effect) as all_floor,
                   cast(count(*) filter (where floor_effect) as bigint) as n_floor
            from floor_ds group by model, checkpoint, strategy),
        band_rows as ({band_rows}),
        seg_any as (
            select r.*, coalesce(f.floor_effect, false) as dataset_floor,
                   coalesce(m.all_floor, false) as floor_effect,
                   {off_band_sql("r.condition = 'perturbation'", "b.band_reached")} as off_band
            from segmentation_results r
            left join floor_ds f using (model, checkpoint, strategy, dataset)
            left join floor_model m using (model, checkpoint, strategy)
            left join band_rows b on b.dataset = r.dataset and b.sample_id = r.sample_id
                 and b.perturbation = r.perturbation and b.level = r.level
            where ({inc} or not coalesce(f.floor_effect, false) or coalesce(m.all_floor, false))
              and ({where})),
        seg_rows as (select * from seg_any where {inc_ob} or not off_band),
        band_miss as (
            select model, checkpoint, strategy, condition, perturbation, level,
                   cast(count(*) filter (where off_band) as bigint) as band_miss
            from seg_any group by model, checkpoint, strategy, condition, perturbation, level),
        floor_excl as (
            select model, checkpoint, strategy,
                   cast(case when {inc} or all_floor then 0 else n_floor end as bigint) as n_floor_excluded,
                   all_floor as floor_effect
            from floor_model)"""


def vlm_floor_sql(value: str, chance: str) -> str:
    """SQL boolean: the clean ``value`` is at or below ``chance`` (false when either is NULL)."""
    return f"coalesce({value} <= {chance} + {CHANCE_TOL}, false)"


def vlm_chance_sql(inv_options: str) -> str:
    """SQL expression of a VLM row group's chance level, given ``inv_options``: the group's mean of
    ``1 / n_options`` (NULL when its rows carry no ``n_options``). Multiple choice: that mean (the
    expected accuracy of a uniform guess over each item's own options), else 0.25; yes/no 0.5;
    grounding 0; captions NULL."""
    fixed = " ".join(f"when '{t}' then {c}" for t, c in VLM_CHANCE.items() if t != "vqa_mc")
    return f"case task when 'vqa_mc' then coalesce({inv_options}, {VLM_CHANCE['vqa_mc']}) {fixed} end"


COVERAGE_VIEWS: dict[str, str] = {
    "segmentation_floor": SEGMENTATION_FLOOR_SQL,
    "segmentation_coverage": f"""
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
        order by c.model, c.checkpoint, c.strategy""",
    "vlm_floor": """
        select model, checkpoint, adapter, task, metric, value as clean_value, chance, floor_effect
        from vlm_task_drops where column_name = 'Clean'
        order by model, checkpoint, adapter, task""",
}


__all__ = ["BAND_ROWS_SQL", "NO_BAND_ROWS_SQL", "CHANCE_TOL", "COVERAGE_VIEWS", "LEVELS_SQL", "SEGMENTATION_FLOOR_SQL", "SEG_FLOOR", "VLM_CHANCE", "seg_rows_ctes",
           "off_band_sql", "vlm_chance_sql", "vlm_floor_sql"]
