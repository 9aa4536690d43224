"""Mart views of the VLM results: per level, and the published task table with its drops."""

from __future__ import annotations

from medrobust_lib.store.completeness import complete_filter_sql
from medrobust_lib.store.schema import PRIMARY_METRIC, VLM_TABLE
from medrobust_lib.store.views.common import (
    BAND_ROWS_SQL,
    View,
    off_band_sql,
    static,
    vlm_chance_sql,
    vlm_floor_sql,
)

VLM_SCORED_OUTCOMES: tuple[str, ...] = ("ok", "unparseable", "refused")
"""Outcomes inside the denominators (the last two scored as wrong). ``error`` (infrastructure) and
``excluded:<reason>`` are outside every denominator and only counted."""
VLM_PRIMARY_COLUMN: dict[str, str] = {t: ("acc_50" if m == "acc@0.5" else m) for t, m in PRIMARY_METRIC.items()}
"""Task -> the ``vlm_by_level`` column of its primary metric (``acc@0.5`` is the column ``acc_50``)."""

_SCORED_SQL = "outcome in (" + ", ".join(f"'{o}'" for o in VLM_SCORED_OUTCOMES) + ")"
_PRIMARY_SQL = "case task " + " ".join(f"when '{t}' then {c}" for t, c in VLM_PRIMARY_COLUMN.items()) + " end"
_BLEU_TINY_SQL = "1e-15"
_BLEU_SMALL_SQL = "1e-9"
_BLEU4_SQL = (
    "power(" + " * ".join(f"((c{k} + {_BLEU_TINY_SQL}) / (g{k} + {_BLEU_SMALL_SQL}))" for k in range(1, 5))
    + ", 0.25)"
)
_BLEU_RATIO_SQL = f"((hyp_len + {_BLEU_TINY_SQL}) / (ref_len + {_BLEU_SMALL_SQL}))"

# vlm_by_level: one row per (model, checkpoint, adapter, task, perturbation, level) over image_mode
# 'image' of complete partitions (partition_completeness). Counts: n (all rows), n_scored, n_unparseable,
# n_refused, n_error, n_excluded, n_truncated (answers that hit their token cap; scored as they are). Metrics over
# the scored rows: accuracy in [0, 1] (VQA and grounding, NULL for captions); grounding mean_iou,
# acc_50 (= accuracy), acc_75; captions cider_d (mean, >= 0), rouge_l (mean, [0, 1]) and bleu_4, the
# corpus BLEU-4 from the summed sufficient statistics (medrobust_lib.metrics.caption.bleu_from_stats,
# same constants and brevity penalty); mean_ssim over all rows; chance: the chance level of the primary
# metric (multiple choice: the mean of 1/n_options over the scored rows, medrobust_lib.store.views.common);
# band_miss: rows whose perturbed image missed its level's SSIM band (perturbation_manifest), left out of
# n and every metric unless include_off_band.
def vlm_by_level(include_off_band: bool | str = False) -> str:
    """The ``vlm_by_level`` view; off-band rows enter the counts and metrics only with
    ``include_off_band`` (a bool or a SQL boolean such as ``$include_off_band``)."""
    inc_ob = include_off_band if isinstance(include_off_band, str) else ("true" if include_off_band else "false")
    return f"""
        with band_rows as ({BAND_ROWS_SQL}),
        base_any as (
            select v.*, {_SCORED_SQL} as scored,
                   {off_band_sql("v.perturbation <> 'clean'", "b.band_reached")} as off_band
            from {VLM_TABLE} v
            left join band_rows b on b.dataset = v.dataset and b.sample_id = v.sample_id
                 and b.perturbation = v.perturbation and b.level = v.level
            where v.image_mode = 'image' and {complete_filter_sql(VLM_TABLE, "v")}),
        miss as (
            select model, checkpoint, adapter, task, perturbation, level,
                   cast(count(*) filter (where off_band) as bigint) as band_miss
            from base_any group by model, checkpoint, adapter, task, perturbation, level),
        base as (select * from base_any where {inc_ob} or not off_band),
        agg as (
            select model, checkpoint, adapter, task, perturbation, level,
                   count(*) as n,
                   count(*) filter (where scored) as n_scored,
                   count(*) filter (where outcome = 'unparseable') as n_unparseable,
                   count(*) filter (where outcome = 'refused') as n_refused,
                   count(*) filter (where outcome = 'error') as n_error,
                   count(*) filter (where outcome like 'excluded:%') as n_excluded,
                   count(*) filter (where truncated) as n_truncated,
                   avg(correct) filter (where scored) as mean_correct,
                   avg(iou) filter (where scored) as mean_iou_all,
                   avg(acc_75) filter (where scored) as mean_acc_75,
                   avg(cider_d) filter (where scored) as mean_cider_d,
                   avg(rouge_l) filter (where scored) as mean_rouge_l,
                   sum(bleu_c1) filter (where scored) as c1, sum(bleu_c2) filter (where scored) as c2,
                   sum(bleu_c3) filter (where scored) as c3, sum(bleu_c4) filter (where scored) as c4,
                   sum(bleu_g1) filter (where scored) as g1, sum(bleu_g2) filter (where scored) as g2,
                   sum(bleu_g3) filter (where scored) as g3, sum(bleu_g4) filter (where scored) as g4,
                   sum(hyp_len) filter (where scored) as hyp_len, sum(ref_len) filter (where scored) as ref_len,
                   avg(ssim) as mean_ssim,
                   avg(1.0 / nullif(n_options, 0)) filter (where scored) as inv_options
            from base group by model, checkpoint, adapter, task, perturbation, level),
        cells as (
            select m.model, m.checkpoint, m.adapter, m.task, m.perturbation, m.level, m.band_miss,
                   a.* exclude (model, checkpoint, adapter, task, perturbation, level)
            from miss m
            left join agg a on a.model = m.model and a.checkpoint is not distinct from m.checkpoint
                 and a.adapter is not distinct from m.adapter and a.task = m.task
                 and a.perturbation = m.perturbation and a.level = m.level)
        select model, checkpoint, adapter, task, perturbation, level, coalesce(n, 0) as n,
               coalesce(n_scored, 0) as n_scored, coalesce(n_unparseable, 0) as n_unparseable,
               coalesce(n_refused, 0) as n_refused, coalesce(n_error, 0) as n_error,
               coalesce(n_excluded, 0) as n_excluded,
               case when task <> 'caption' then mean_correct end as accuracy,
               case when task = 'grounding' then mean_iou_all end as mean_iou,
               case when task = 'grounding' then mean_correct end as acc_50,
               case when task = 'grounding' then mean_acc_75 end as acc_75,
               case when task = 'caption' then mean_cider_d end as cider_d,
               case when task = 'caption' then mean_rouge_l end as rouge_l,
               case when task = 'caption' then
                   {_BLEU4_SQL}
                   * case when {_BLEU_RATIO_SQL} < 1 then exp(1 - 1 / {_BLEU_RATIO_SQL}) else 1.0 end
               end as bleu_4,
               mean_ssim, {vlm_chance_sql("inv_options")} as chance, band_miss,
               coalesce(n_truncated, 0) as n_truncated
        from cells
        order by model, checkpoint, adapter, task, perturbation, level"""


_VLM_BY_LEVEL = vlm_by_level()

# vlm_task_drops: the published wide table in long form. Per (model, checkpoint, adapter, task):
# column_name 'Clean' (level 0), one row per perturbation type (the primary metric averaged over the
# per-level values of levels 1..5), 'Avg' (mean over types) and 'ΔTP' (Clean - Avg; positive = worse
# under perturbation). metric names the primary metric column; n_unparseable / n_error / n_truncated are
# the unparseable answers, the infrastructure errors (outside the number) and the answers cut at their
# token cap (inside it) behind each number (Avg: all
# types; ΔTP: Clean plus all types); drop = Clean - value (the ΔTP row: ΔTP itself; Clean: 0) and
# rel_drop = drop / Clean (NULL when Clean is 0 or missing); ord orders the columns (Clean 0, types
# alphabetically, then Avg, ΔTP); chance: the task's chance level on its clean items (vlm_by_level) and
# floor_effect: Clean at or below chance (the drops cannot show a loss), on every row of the task.
_VLM_TASK_DROPS = f"""
        with lv as (
            select model, checkpoint, adapter, task, perturbation, level, {_PRIMARY_SQL} as value,
                   n_unparseable, n_error, n_truncated
            from vlm_by_level),
        clean as (
            select model, checkpoint, adapter, task, 'Clean' as column_name, 0 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from lv where perturbation = 'clean' and level = 0
            group by model, checkpoint, adapter, task),
        per_type as (
            select model, checkpoint, adapter, task, perturbation as column_name, 1 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from lv where perturbation <> 'clean' and level between 1 and 5
            group by model, checkpoint, adapter, task, perturbation),
        avg_row as (
            select model, checkpoint, adapter, task, 'Avg' as column_name, 2 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from per_type group by model, checkpoint, adapter, task),
        delta as (
            select model, checkpoint, adapter, task, 'ΔTP' as column_name, 3 as grp,
                   max(value) filter (where column_name = 'Clean') - max(value) filter (where column_name = 'Avg')
                       as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from (select * from clean union all select * from avg_row)
            group by model, checkpoint, adapter, task),
        rows as (
            select * from clean union all select * from per_type union all select * from avg_row
            union all select * from delta),
        with_clean as (
            select *, max(case when column_name = 'Clean' then value end)
                          over (partition by model, checkpoint, adapter, task) as clean_value
            from rows),
        with_drop as (
            select *, case when column_name = 'ΔTP' then value else clean_value - value end as drop
            from with_clean),
        task_chance as (
            select model, checkpoint, adapter, task, avg(chance) as chance
            from vlm_by_level where perturbation = 'clean' and level = 0
            group by model, checkpoint, adapter, task)
        select d.model, d.checkpoint, d.adapter, d.task, d.column_name,
               case d.task {" ".join(f"when '{t}' then '{c}'" for t, c in VLM_PRIMARY_COLUMN.items())} end as metric,
               d.value, d.drop, d.drop / nullif(d.clean_value, 0) as rel_drop, d.n_unparseable, d.n_error,
               d.n_truncated,
               cast(row_number() over (partition by d.model, d.checkpoint, d.adapter, d.task
                                       order by d.grp, d.column_name) - 1 as integer) as ord,
               c.chance, {vlm_floor_sql("d.clean_value", "c.chance")} as floor_effect
        from with_drop d
        left join task_chance c on d.model = c.model and d.checkpoint is not distinct from c.checkpoint
             and d.adapter is not distinct from c.adapter and d.task = c.task
        order by d.model, d.checkpoint, d.adapter, d.task, ord"""


VIEWS: list[View] = [
    View("vlm_by_level", vlm_by_level,
         doc="""(from `vlm_results`, image mode `image`, complete partitions only): one row per (model, checkpoint,
adapter, task, perturbation, level), clean as (`clean`, 0): `n`, `n_scored`, `n_unparseable`,
`n_refused`, `n_error`, `n_excluded`; over scored rows (`ok`, `unparseable`, `refused`; never
`error`) `accuracy` (VQA and grounding),
grounding `mean_iou`, `acc_50`, `acc_75`, caption `cider_d`, `rouge_l` (means) and `bleu_4`
(corpus BLEU-4 from the summed sufficient statistics); `mean_ssim` (NULL for clean). Metrics of
other tasks are NULL. `chance`: the chance level of the primary metric (multiple choice: the mean
of 1 / `n_options` over the scored rows, 0.25 when they carry no `n_options`; yes/no 0.5;
grounding 0; NULL for captions); `n_truncated`: answers that reached their token cap (scored as they are). `band_miss`: rows whose perturbed image missed its SSIM band, left
out of the counts and metrics unless the suite sets `perturbations.include_off_band`."""),
    View("vlm_task_drops", static(_VLM_TASK_DROPS),
         doc=""": the published VLM table in long form, per (model, checkpoint, adapter, task)
one row per `column_name`: `Clean`, each perturbation type (the primary metric averaged over
levels 1-5), `Avg` (mean over types) and `ΔTP` (Clean - Avg, positive = worse); `metric`
(`accuracy`, `acc_50` or `cider_d`), `value`, `drop` (Clean - value; on the ΔTP row ΔTP itself;
0 on Clean), `rel_drop` (`drop` / Clean, NULL when Clean is 0), `n_unparseable` and `n_error`
(infrastructure errors, outside the number) behind the number, `ord` (column order: Clean, types
alphabetically, Avg, ΔTP), and on every row of the task `chance` (the `vlm_by_level` chance of its
clean items) and `floor_effect` (Clean at or below chance: the drops cannot show a loss);
`n_truncated`: answers cut at their token cap behind the number."""),
]
