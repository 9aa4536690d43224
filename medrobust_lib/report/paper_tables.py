"""The paper tables, read from the DuckDB mart (read-only connection).

Every number comes from a mart view of :mod:`medrobust_lib.store.views`; this module only selects,
filters by the selected ids, orders and labels (no analysis SQL of its own; the one exception,
:func:`real_model_worst_types` on the synthetic-lesion datasets of a mart that also has real labels,
runs the views' own row rules, :func:`~medrobust_lib.store.views.common.seg_rows_ctes`, on them). Where the report has
settings of its own (``--include-floor``, ``--include-off-band``) or must read a mart built before a
view existed, it selects from the registered view's SQL run with those settings (the same SQL the
mart's view holds). The tables are listed in :mod:`medrobust_lib.report.entries`.

Each builder takes the connection and the selected ids of its track (``None``: all) and returns a
:class:`~medrobust_lib.report.table.ReportTable`, or a string saying why there is no table (the
source view is missing or has no rows for the selection). Values are the mart's, unrounded; the
renderers round them for display.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.metrics.stats import bootstrap_ci
from medrobust_lib.report.table import FLOOR_MARK, Column, ReportTable
from medrobust_lib.seeding import rng_for
from medrobust_lib.store.completeness import COMPLETENESS_TABLE, complete_filter_sql
from medrobust_lib.store.schema import QUADRANTS, RANKING_VIEW
from medrobust_lib.store.views.analyses import (
    TOP_K,
    segmentation_iou_dice_agreement,
    segmentation_mce_summary,
    segmentation_modality_share,
)
from medrobust_lib.store.views.common import (
    ALL_SUFFIX,
    BAND_ROWS_SQL,
    CHANCE_TOL,
    GENERIC_FAMILIES,
    NO_BAND_ROWS_SQL,
    SEG_FLOOR,
    SEGMENTATION_FLOOR_SQL,
    VLM_CHANCE,
    seg_rows_ctes,
)
from medrobust_lib.store.views.segmentation import segmentation_by_level as by_level_sql
from medrobust_lib.store.views.segmentation import segmentation_level_means as level_means_sql
from medrobust_lib.store.views.segmentation import segmentation_model_summary as model_summary_sql
from medrobust_lib.store.views.segmentation import segmentation_type_ranks as type_ranks_sql
from medrobust_lib.store.views.taxonomy import TAXONOMY_QUADRANTS_POOLED_SQL
from medrobust_lib.store.views.taxonomy import taxonomy_quadrant_images as quadrant_images_sql

STRATEGY_VIEW = RANKING_VIEW
SMALL_N_TEXT = ("A drop without a CI or q: the cell has fewer images (pairs, samples) than the suite's stats.min_n "
                "(default 5), too few for an interval or a test (docs/statistics.md).")
"""The sentence under a table whose CIs and tests stop below the ``stats.min_n`` floor."""

STRATEGY_COLUMNS: tuple[str, ...] = (
    "model", "strategy", "kind", "n_samples", "n_conditions", "mean_iou_drop", "iou_drop_ci_low",
    "iou_drop_ci_high", "mean_dice_drop", "dice_drop_ci_low", "dice_drop_ci_high", "clean_iou", "clean_dice",
    "n_trainable", "rank", "iou_rel_drop", "dice_rel_drop",
)
"""Columns the report needs from the ``strategy_ranking`` view (more are ignored)."""
N_BOOT = 1000
"""Bootstrap resamples of the pooled quadrant-share CIs."""

TableResult = ReportTable | str


def relation_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the mart has a table or view called ``name``."""
    rows = con.execute("select count(*) from information_schema.tables where table_name = ?", [name]).fetchall()
    return bool(rows[0][0])


def relation_columns(con: duckdb.DuckDBPyConnection, name: str) -> set[str]:
    rows = con.execute("select column_name from information_schema.columns where table_name = ?", [name]).fetchall()
    return {str(r[0]) for r in rows}


def distinct_ids(con: duckdb.DuckDBPyConnection, relation: str, column: str) -> list[str]:
    """Sorted distinct non-null values of ``relation.column``; [] when the relation is missing."""
    if not relation_exists(con, relation) or column not in relation_columns(con, relation):
        return []
    rows = con.execute(f"select distinct {column} from {relation} where {column} is not null").fetchall()
    return sorted(str(r[0]) for r in rows)


def complete_only(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """SQL predicate keeping the rows of ``table`` whose partition the mart marks complete
    (``true`` for a mart built before completeness was recorded)."""
    return complete_filter_sql(table, table) if relation_exists(con, COMPLETENESS_TABLE) else "true"


def where_in(column: str, ids: Sequence[str] | None) -> tuple[str, list[object]]:
    """A SQL predicate on ``column`` and its parameters (``true`` for no filter)."""
    if ids is None:
        return "true", []
    return f"list_contains(?, {column})", [list(ids)]


def identity_columns(df: pd.DataFrame, key: str, extra: Sequence[tuple[str, str]]) -> list[Column]:
    """Display columns for identity fields (``(column, header)`` pairs) that vary within a value of
    ``key``: a checkpoint hash is noise unless one model has several."""
    cols = []
    for c, header in extra:
        if c in df.columns and len(df) and (df.groupby(key, dropna=False)[c].nunique(dropna=False) > 1).any():
            cols.append(Column(header, c))
    return cols


def band_rows(con: duckdb.DuckDBPyConnection) -> str:
    """The manifest's band flags, or no rows for a database without ``perturbation_manifest``."""
    has = relation_exists(con, "perturbation_manifest") and "band_reached" in relation_columns(
        con, "perturbation_manifest")
    return BAND_ROWS_SQL if has else NO_BAND_ROWS_SQL


def segmentation_summary(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None,
                         include_floor: bool = False, include_off_band: bool = False) -> TableResult:
    """Per (model, checkpoint, strategy): ``clean_iou`` / ``clean_dice`` (mean over clean images, in
    [0, 1]); ``corruption_iou_drop`` / ``corruption_dice_drop``: the mean over corruption types of
    each type's mean paired drop (clean - perturbed; positive = worse; the mart's ``Delta`` row);
    ``corruption_*_drop_pooled``: the reference's Delta (clean mean minus the mean over every perturbed
    row pooled); ``attack_*_drop``: the same mean over the attack types (FGSM, PGD; all eps levels);
    ``n_corruption_types``, ``n_attack_types``; ``n_images`` (clean rows), ``n`` (all result rows,
    every condition), ``n_failed`` (rows that failed), ``n_not_applicable`` and ``n_no_mask`` (rows
    that are neither scored nor failures; :data:`~medrobust_lib.store.schema.SEG_NOT_SCORED`).

    Coverage: ``levels`` (the evaluated severity levels, e.g. ``2,4``) and ``n_conditions``
    (distinct non-clean (condition, perturbation, level)) from ``segmentation_coverage``; rows with
    different levels get a note. Floors: datasets whose clean IoU or Dice is below ``SEG_FLOOR``
    (``segmentation_floor``) are left out of the clean scores and drops (``n_floor_datasets`` says
    how many) unless ``include_floor``; a model with every dataset at the floor keeps them and is
    flagged ``floor_effect`` (greyed). The rows are the ``segmentation_model_summary`` view's."""
    where, params = where_in("model", models)
    df = con.execute(f"""
        select * from ({model_summary_sql("$include_floor", "$include_off_band", band_rows(con))})
        where {where.replace("?", "$ids")} order by model, strategy, checkpoint""",
                     {"include_floor": include_floor, "include_off_band": include_off_band, **_named(params)}).df()
    if df.empty:
        return "no segmentation_results rows for the selected models"
    for c in ("n_corruption_types", "n_attack_types", "n_images", "n", "n_failed", "n_not_applicable", "n_no_mask",
              "n_conditions",
              "n_floor_datasets"):
        df[c] = df[c].astype("int64")
    cols = [Column("Model", "model"), *identity_columns(df, "model", [("strategy", "Strategy"),
                                                                      ("checkpoint", "Checkpoint")]),
            Column("Levels", "levels"), Column("Cond.", "n_conditions", "int"),
            Column("IoU", "clean_iou", "float"),
            Column("ΔIoU corr.", "corruption_iou_drop", "float"),
            Column("rel. corr.", "corruption_iou_rel_drop", "float"),
            Column("ΔIoU pooled", "corruption_iou_drop_pooled", "float"),
            Column("ΔIoU att.", "attack_iou_drop", "float"),
            Column("rel. att.", "attack_iou_rel_drop", "float"),
            Column("Dice", "clean_dice", "float"),
            Column("ΔDice corr.", "corruption_dice_drop", "float"),
            Column("ΔDice att.", "attack_dice_drop", "float"),
            Column("Images", "n_images", "int"), Column("n", "n", "int"), Column("Failed", "n_failed", "int")]
    # not failures, counted apart (shown when any row has some, so the table keeps its width otherwise)
    cols += [Column(h, k, "int") for h, k in (("Not applicable", "n_not_applicable"), ("No mask", "n_no_mask"))
             if int(df[k].sum())]
    if int(df["n_floor_datasets"].sum()):
        cols.append(Column("Floor", "n_floor_datasets", "int"))
    notes = ["IoU (the primary metric) first, Dice alongside. IoU, Dice: clean scores. Δ: drops, clean minus "
             "perturbed (positive = worse), paired per image; rel.: the IoU drop divided by the clean IoU (empty "
             "when that is 0; the Dice relative drops are in the CSV); "
             "corruption drops (corr.) are the mean "
             "over corruption types of each type's mean drop (the project's rule), attack drops (att.) the mean over FGSM "
             "and PGD at all eps; pooled: the reference's Delta (MedFM-Robust), the clean mean minus the mean over every "
             "perturbed row pooled (a type weighs by its rows; the two means may cover different images; the Dice one "
             "is in the CSV). "
             "Levels: the evaluated severity levels; Cond.: perturbed conditions (type x level). n counts every "
             "result row (images x conditions); Failed: rows that failed (error, perturbation error, mask moved out "
             "of view); Not applicable (shown when there are any): a type that does not apply to the image (e.g. "
             "an RGB-only type on a grayscale image); No mask (likewise): images without a ground-truth mask. None "
             "of the three enters a mean; only Failed counts as a failure."]
    levels = df["levels"].unique()
    if len(levels) > 1:
        cov = "; ".join(f"{m}: {lv or 'none'}" for m, lv in zip(df["model"], df["levels"], strict=True))
        notes.append(f"Rows cover different levels ({cov}): their drops are not comparable and are not ranked "
                     "together.")
    if int(df["n_floor_datasets"].sum()):
        notes.append(f"Floor: datasets whose clean IoU or Dice is below {SEG_FLOOR:g} (a drop there is not "
                     + ("informative); they are included (--include-floor)." if include_floor else
                        "informative); they are left out of these means.")
                     + f" {FLOOR_MARK} / grey: every dataset of the model is at the floor."
                     + " " + floor_datasets_note(con, models))
    return ReportTable("segmentation_summary", "Segmentation robustness per model", df, tuple(cols), " ".join(notes),
                       grey_key="floor_effect")


def floor_datasets_note(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None) -> str:
    """``Floor datasets: <model>: <dataset> (modality, clean IoU x, Dice y); ...``: every dataset at the
    floor of the selected models, by name with its clean scores (the ``segmentation_floor`` rule), so
    a reader sees which datasets the means leave out; empty when there are none."""
    where, params = where_in("model", models)
    rows = con.execute(f"""
        select model, strategy, dataset, modality, clean_iou, clean_dice from ({SEGMENTATION_FLOOR_SQL})
        where floor_effect and {where} order by model, strategy, dataset""", params).fetchall()
    if not rows:
        return ""
    parts = [f"{m}{f' ({st})' if st else ''}: {ds} ({mod}, clean IoU {iou:.3f}, Dice {dice:.3f})"
             for m, st, ds, mod, iou, dice in rows]
    return "Floor datasets: " + "; ".join(parts) + "."


def _named(params: list[object]) -> dict[str, object]:
    """Positional ``where_in`` parameters as the named parameter ``$ids`` (no filter: none)."""
    return {"ids": params[0]} if params else {}


def segmentation_level_means(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None,
                             include_floor: bool = False, include_off_band: bool = False) -> pd.DataFrame:
    """The figures' by-level data: per (model, checkpoint, strategy, condition, perturbation,
    level) the mean ``iou`` / ``dice`` / ``iou_drop`` / ``dice_drop`` over ok rows, floor datasets
    left out as in :func:`segmentation_summary` (a model with only floor datasets keeps them, with
    ``floor_effect`` true), off-band rows left out unless ``include_off_band``; ``band_miss``: the
    cell's rows whose perturbed output missed its SSIM band."""
    where, params = where_in("model", models)
    df = con.execute(f"""
        select * from ({level_means_sql("$include_floor", "$include_off_band", band_rows(con))})
        where {where.replace("?", "$ids")} order by model, strategy, checkpoint, condition, perturbation, level""",
                     {"include_floor": include_floor, "include_off_band": include_off_band, **_named(params)}).df()
    return df


BY_LEVEL_VIEW = "segmentation_by_level"
"""The by-level view: floor datasets left out (its ``_all`` companion keeps them; a mart built
before the companions existed has only this name, holding every dataset)."""


def segmentation_by_level(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None,
                          include_floor: bool = False, include_off_band: bool = False) -> TableResult:
    """The by-level view (:data:`BY_LEVEL_VIEW`, or its ``_all`` companion with ``include_floor``), the
    datasets at the floor left out of its means and CIs as in :func:`segmentation_summary` (a model
    with only floor datasets keeps them, greyed): per (model, checkpoint, strategy, condition, perturbation,
    level) ``n``, ``n_failed``, mean ``iou`` / ``dice`` in [0, 1], mean paired ``iou_drop`` /
    ``dice_drop`` with bootstrap 95 % CIs, relative drops ``iou_rel_drop`` / ``dice_rel_drop`` (drop /
    clean score, NULL when that is 0), ``wilcoxon_q`` (Benjamini-Hochberg). IoU columns first.
    ``kind`` is ``corruption`` or ``attack``. Corruptions first, then attacks, each by type and level.
    ``band_miss``: the cell's outputs that missed their level's SSIM band, left out of ``n``, the means
    and the CIs (computed without them; blank in a mart written before such stats) unless
    ``include_off_band``. The view's SQL is run with the
    report's own settings (the mart's views follow the suite's); a mart too old for it falls back to
    the view, without ``band_miss``."""
    where, params = where_in("model", models)
    cols_sql = """model, checkpoint, strategy, condition,
               case when condition = 'perturbation' then 'corruption' else 'attack' end as kind,
               perturbation, level, n, n_failed, iou, dice, iou_drop, iou_drop_ci_low, iou_drop_ci_high,
               iou_rel_drop, dice_drop, dice_drop_ci_low, dice_drop_ci_high, dice_rel_drop, wilcoxon_q"""
    order = """order by model, strategy, checkpoint, case when condition = 'perturbation' then 0 else 1 end,
                 perturbation, level"""
    try:
        df = con.execute(f"""
            select {cols_sql}, floor_effect, band_miss
            from ({by_level_sql(include_floor, "$include_off_band")}) where {where.replace("?", "$ids")}
            {order}""", {"include_off_band": include_off_band, **_named(params)}).df()
    except duckdb.Error:  # a mart built before the tables had the columns the view's SQL reads
        view = BY_LEVEL_VIEW + ALL_SUFFIX if include_floor and relation_exists(con, BY_LEVEL_VIEW + ALL_SUFFIX) \
            else BY_LEVEL_VIEW
        floor = "floor_effect" if "floor_effect" in relation_columns(con, view) else "false as floor_effect"
        df = con.execute(f"select {cols_sql}, {floor} from {view} where {where} {order}", params).df()
    if df.empty:
        return "no segmentation_by_level rows for the selected models"
    cols = [Column("Model", "model"), *identity_columns(df, "model", [("strategy", "Strategy"),
                                                                      ("checkpoint", "Checkpoint")]),
            Column("Kind", "kind"), Column("Perturbation", "perturbation"), Column("Level", "level", "int"),
            Column("n", "n", "int"), Column("IoU", "iou", "float"),
            Column("IoU drop [95% CI]", "iou_drop", "ci", "iou_drop_ci_low", "iou_drop_ci_high"),
            Column("IoU rel. drop", "iou_rel_drop", "float"), Column("Dice", "dice", "float"),
            Column("Dice drop [95% CI]", "dice_drop", "ci", "dice_drop_ci_low", "dice_drop_ci_high"),
            Column("Dice rel. drop", "dice_rel_drop", "float"),
            Column("q", "wilcoxon_q", "pvalue")]
    notes = ""
    if "band_miss" in df.columns:
        df["band_miss"] = df["band_miss"].astype("int64")
        if int(df["band_miss"].sum()):
            cols.insert(cols.index(Column("n", "n", "int")) + 1, Column("Band miss", "band_miss", "int"))
        notes = (" Band miss: perturbed outputs whose SSIM missed the level's band ("
                 + ("kept in n and the means, --include-off-band)." if include_off_band else
                    "left out of n, the means, the CIs and q; --include-off-band keeps them).")
                 + f" {int(df['band_miss'].sum())} in this table.")
    grouped = tuple(c.key for c in cols if c.key in ("model", "strategy", "checkpoint", "kind"))
    return ReportTable(
        "segmentation_by_level", "Segmentation by perturbation type and severity level", df, tuple(cols),
        "Drop = clean minus perturbed, paired per image, percentile bootstrap 95% CI over images; relative drop = "
        "drop / clean score of the same images; q: paired Wilcoxon (clean vs perturbed IoU) with "
        "Benjamini-Hochberg over the model's type x level grid. "
        "Attack levels 1-5 are eps = 2, 4, 6, 8, 10 /255. Grey rows: clean IoU or Dice below the floor. "
        f"{SMALL_N_TEXT}" + notes,
        grey_key="floor_effect", group_by=grouped)


def strategy_ranking(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None,
                     include_floor: bool = False) -> TableResult:
    """The ``strategy_ranking`` view (fine-tuning strategies ranked by mean IoU drop, 1 = most
    robust) per (model, kind): drops with bootstrap 95 % CIs, clean IoU/Dice, trainable parameters.
    Floor datasets are left out of the view's means (``strategy_ranking_all``, which keeps them,
    with ``include_floor`` when the mart has it); the view's ``note`` (a strategy not ranked since
    every dataset is at the floor, or ranked only among strategies of its levels) goes under the
    table."""
    if not relation_exists(con, STRATEGY_VIEW):
        return f"the mart has no {STRATEGY_VIEW} view (fine-tuning strategies not evaluated)"
    view = STRATEGY_VIEW + ALL_SUFFIX if include_floor and relation_exists(con, STRATEGY_VIEW + ALL_SUFFIX) \
        else STRATEGY_VIEW
    missing = [c for c in STRATEGY_COLUMNS if c not in relation_columns(con, view)]
    if missing:
        return f"the {view} view lacks columns {missing}"
    where, params = where_in("model", models)
    tied = "tied" if "tied" in relation_columns(con, view) else "cast(null as boolean) as tied"
    df = con.execute(f"""
        select {", ".join(STRATEGY_COLUMNS)}, {tied} from {view} where {where}
        order by model, kind, rank, strategy""", params).df()
    if df.empty:
        return f"the {view} view has no rows" + ("" if models is None else " for the selected models")
    df["rank_label"] = ["" if pd.isna(r) else f"{int(r)}=" if not pd.isna(t) and bool(t) else str(int(r))
                        for r, t in zip(df["rank"], df["tied"].astype(object), strict=True)]
    cols = (Column("Model", "model"), Column("Kind", "kind"), Column("Rank", "rank_label"),
            Column("Strategy", "strategy"), Column("Params", "n_trainable", "int"),
            Column("IoU", "clean_iou", "float"), Column("Dice", "clean_dice", "float"),
            Column("IoU drop [95% CI]", "mean_iou_drop", "ci", "iou_drop_ci_low", "iou_drop_ci_high"),
            Column("rel.", "iou_rel_drop", "float"),
            Column("Dice drop [95% CI]", "mean_dice_drop", "ci", "dice_drop_ci_low", "dice_drop_ci_high"),
            Column("Samples", "n_samples", "int"), Column("Cond.", "n_conditions", "int"))
    return ReportTable(
        "strategy_ranking", "Fine-tuning strategies ranked by robustness", df, cols,
        "Rank 1 = smallest mean IoU drop within (model, kind); '=' marks a tie: strategies whose 95% CIs of the "
        "IoU drop overlap (directly or through a chain of overlaps) share the rank of the best of them, since the "
        "data cannot order them; an empty rank: too few samples for a CI. "
        "Drops are clean minus perturbed with percentile "
        "bootstrap 95% CIs over test samples; rel. = IoU drop / clean IoU of the same samples (the Dice "
        "relative drop is in the CSV). Params: "
        "trainable parameters; IoU, Dice: clean scores; Cond.: perturbed conditions averaged. " + SMALL_N_TEXT
        + _ranking_notes(con, view, where, params))


def _ranking_notes(con: duckdb.DuckDBPyConnection, view: str, where: str, params: list[object]) -> str:
    """The distinct ``note`` values of the selected rows of ``view`` as sentences ("" when the view
    has no ``note`` column or no row has one)."""
    if "note" not in relation_columns(con, view):
        return ""
    rows = con.execute(f"""
        select model, kind, strategy, note from {view} where note is not null and {where}
        order by model, kind, strategy""", params).fetchall()
    return "".join(f" {m} / {k} / {st}: {n}." for m, k, st, n in rows)


_FIXED_CHANCE_SQL = "case task " + " ".join(f"when '{t}' then {c}" for t, c in VLM_CHANCE.items()) + " end"
"""The chance level of a mart built before ``vlm_task_drops`` carried ``chance`` (multiple choice 0.25)."""


def _vlm_levels(con: duckdb.DuckDBPyConnection, where: str, params: Sequence[object]) -> str:
    """The severity levels the selected models were evaluated at (``levels 2, 4``; ``levels 1-5`` for a full grid;
    ``the evaluated levels`` when the mart has no ``vlm_results``)."""
    if not relation_exists(con, "vlm_results"):
        return "the evaluated levels"
    levels = [int(r[0]) for r in con.execute(
        f"select distinct level from vlm_results where level > 0 and {where} order by 1", params).fetchall()]
    return "levels " + ("1-5" if levels == [1, 2, 3, 4, 5] else ", ".join(map(str, levels)) or "(none)")


def vlm_task_drops(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None) -> TableResult:
    """The ``vlm_task_drops`` view in long form (fits a page; the published wide table has one
    column per type): one row per (model, checkpoint, adapter, task, perturbation type) with
    ``metric`` (the task's primary metric: accuracy / acc_50 in [0, 1], CIDEr-D >= 0), ``clean``,
    ``perturbed`` (the type's mean over the evaluated levels), ``drop`` (clean - perturbed, positive =
    worse), ``rel_drop`` (drop / clean, empty when clean is 0), ``n_unparseable``, ``n_error``
    (infrastructure errors, outside every number) and ``n_truncated`` (answers cut at their token
    cap, scored as they are; 0 for a mart without the column); then one ``Avg`` row per (model, task) whose ``perturbed`` is the
    mean over types and ``drop`` is ΔTP. ``floor_effect``: the clean score is at or below the task's
    chance level (the view's ``chance``: multiple choice 1 / the options of its items; a mart without
    it: ``store.views.common.VLM_CHANCE``); such rows are greyed, since their drops cannot show a loss."""

    where, params = where_in("model", models)
    view_cols = relation_columns(con, "vlm_task_drops")
    chance = "chance" if "chance" in view_cols else _FIXED_CHANCE_SQL
    truncated = "n_truncated" if "n_truncated" in view_cols else "0"
    long = con.execute(f"""
        select model, checkpoint, coalesce(adapter, '') as adapter, task, metric, column_name, value,
               rel_drop, n_unparseable, n_error, {truncated} as n_truncated, {chance} as chance
        from vlm_task_drops where {where}""", params).df()
    if long.empty:
        return "no vlm_task_drops rows for the selected models"
    keys = ["model", "checkpoint", "adapter", "task", "metric"]
    clean = long[long["column_name"] == "Clean"].set_index(keys)["value"].rename("clean")
    delta = long[long["column_name"] == "ΔTP"].set_index(keys)["value"].rename("delta_tp")
    body = long[~long["column_name"].isin(["Clean", "ΔTP"])].rename(
        columns={"column_name": "perturbation", "value": "perturbed"})
    body = body.join(clean, on=keys).join(delta, on=keys)
    body["drop"] = np.where(body["perturbation"] == "Avg", body["delta_tp"], body["clean"] - body["perturbed"])
    body["rel_drop"] = body["drop"] / body["clean"].where(body["clean"] != 0)
    body["is_avg"] = (body["perturbation"] == "Avg").astype(int)
    body["floor_effect"] = (body["clean"] <= body["chance"].astype(float) + CHANCE_TOL).fillna(False).astype(bool)
    df = body.sort_values([*keys[:4], "is_avg", "perturbation"], kind="stable").reset_index(drop=True)
    df = df[[*keys, "perturbation", "clean", "perturbed", "drop", "rel_drop", "n_unparseable", "n_error",
             "n_truncated", "floor_effect"]]
    for c in ("n_unparseable", "n_error", "n_truncated"):
        df[c] = df[c].astype("Int64")
    cols = [Column("Model", "model"), *identity_columns(df, "model", [("checkpoint", "Checkpoint"),
                                                                      ("adapter", "Adapter")]),
            Column("Task", "task"), Column("Metric", "metric"), Column("Perturbation", "perturbation"),
            Column("Clean", "clean", "float"), Column("Perturbed", "perturbed", "float"),
            Column("Drop", "drop", "float"), Column("Rel.", "rel_drop", "float"),
            Column("Unparseable", "n_unparseable", "int"), Column("Errors", "n_error", "int"),
            Column("Truncated", "n_truncated", "int")]
    note = ("Primary metric per task (accuracy for VQA, Acc@0.5 for grounding, CIDEr-D for captions); Perturbed is "
            f"the type's mean over {_vlm_levels(con, where, params)}, Drop = Clean - Perturbed (positive = worse); the Avg row is the mean "
            "over types and its drop is ΔTP; Rel. = Drop / Clean. Unparseable: answers that could not be parsed "
            "(counted wrong); Errors: infrastructure failures (transport, out of memory), outside every number; "
            "Truncated: answers that hit their token cap (scored as they are).")
    if df["floor_effect"].any():
        note += (f" {FLOOR_MARK} / grey: clean score at or below chance (yes/no {VLM_CHANCE['vqa_yesno']:g}, "
                 f"multiple choice 1 / the options of its items, grounding {VLM_CHANCE['grounding']:g}): the drops "
                 "cannot show a loss.")
    return ReportTable(
        "vlm_task_drops", "Vision-language tasks: clean, per perturbation type, average and drop", df, tuple(cols),
        note, grey_key="floor_effect")


def _pooled_share_ci(counts: np.ndarray, rng: np.random.Generator, n_boot: int = N_BOOT,
                     alpha: float = 0.05) -> np.ndarray:
    """Percentile bootstrap CI of the pooled quadrant shares, resampling clusters (images).

    ``counts``: (n_clusters, 4) rows per cluster and quadrant. Returns (4, 2) [low, high]; NaN
    when there is no cluster. Resampling whole images keeps the CI honest when one image
    contributes many rows (every perturbation type and level)."""
    out = np.full((counts.shape[1], 2), np.nan)
    if counts.shape[0] == 0:
        return out
    idx = rng.integers(0, counts.shape[0], size=(n_boot, counts.shape[0]))
    boot = counts[idx].sum(axis=1)  # (n_boot, 4)
    totals = boot.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = boot / totals
    out[:, 0] = np.nanquantile(shares, alpha / 2, axis=0)
    out[:, 1] = np.nanquantile(shares, 1 - alpha / 2, axis=0)
    return out


def taxonomy_quadrants(con: duckdb.DuckDBPyConnection, configs: Sequence[str] | None,
                       seed: int = 0, include_off_band: bool = False) -> TableResult:
    """Quadrant table per (config, image_mode, condition, quadrant), condition ``clean`` or
    :data:`PERTURBED` (every type and level pooled), from the ``taxonomy_quadrants`` view pooled
    over datasets: ``n`` (samples in the quadrant), ``n_total``, ``share = n / n_total`` in [0, 1],
    ``accuracy`` and ``mean_entropy`` (bits) weighted by each cell's ``n``, ``n_error``; the share's
    95 % CI (``share_ci_low`` / ``share_ci_high``) is a percentile bootstrap over images
    (``dataset``, ``sample_id``) from the ``taxonomy_results`` ok rows (:func:`_pooled_share_ci`).
    Beside the shares, per (config, image_mode, condition): ``flip_rate`` (share of samples whose
    answers differ across the question and its paraphrases), ``text_only_accuracy`` and the oracle
    ``dangerous_floor`` (share of samples whose label equals the text-only answer), each pooled
    with the groups' ``n_total`` as weights; ``share_abstention`` is the labelled sensitivity
    analysis (text-only |margin| < tau counts as changed), never the primary quadrant. ``n_error``
    (infrastructure failures) is outside every denominator. ``band_miss``: records whose perturbed
    image missed its SSIM band, left out of the shares (``taxonomy_quadrant_stats``) and of their
    CI unless ``include_off_band``."""
    where, params = where_in("config", configs)
    df = con.execute(f"select * from ({TAXONOMY_QUADRANTS_POOLED_SQL}) where {where}", params).df()
    if df.empty:
        return "no taxonomy_quadrants rows for the selected configurations"
    qorder = {q: i for i, q in enumerate(QUADRANTS)}
    df["_q"] = df["quadrant"].map(qorder).fillna(len(QUADRANTS))
    df["_c"] = (df["condition"] != "clean").astype(int)
    df = df.sort_values(["config", "image_mode", "_c", "_q"], kind="stable").drop(columns=["_q", "_c"])
    df = df.reset_index(drop=True)
    for c in ("n", "n_total", "n_error", "band_miss"):
        df[c] = df[c].fillna(0).astype("int64")
    df = _add_share_ci(con, df, where, params, seed, include_off_band)
    cols = (Column("Config", "config"), Column("No image", "image_mode"), Column("Cond.", "condition"),
            Column("Quadrant", "quadrant"),
            Column("Share [95% CI]", "share", "ci", "share_ci_low", "share_ci_high"),
            Column("Acc.", "accuracy", "float"), Column("H", "mean_entropy", "float"),
            Column("n", "n", "int"), Column("Total", "n_total", "int"), Column("Err.", "n_error", "int"),
            Column("Off-band", "band_miss", "int"), Column("Flip", "flip_rate", "float"),
            Column("Text acc.", "text_only_accuracy", "float"),
            Column("Floor", "dangerous_floor", "float"),
            Column("Abst.", "share_abstention", "float"))
    return ReportTable(
        "taxonomy_quadrants", "Safety quadrants: clean and pooled over all perturbations", df, cols,
        "Pooled over datasets (perturbed: also over every type and level); share = n / total ok samples with a "
        "percentile bootstrap 95% CI resampling images; Acc. and H (entropy, bits) are means within the "
        "quadrant. No image: the image-removal mode; Cond.: clean or perturbed. Ideal = consistent and "
        "image-reliant, Dangerous = consistent but not image-reliant. Err.: infrastructure failures, in no "
        "denominator. Off-band: records whose perturbed image missed its level's SSIM band, left out of the "
        "shares unless the suite's perturbations.include_off_band (the CI follows --include-off-band). "
        "Flip = flip rate, the share of samples whose answers are not all identical across the "
        "question and its paraphrases (negations excluded). Text acc. = accuracy without the image; Floor = "
        "the oracle Dangerous floor, the share of samples whose label equals the text-only answer, i.e. the "
        "Dangerous share of an accurate, consistent model (about 0.5 on label-balanced questions). Abst. is a "
        "sensitivity analysis, not the quadrant: the share when a text-only answer with |margin| < tau "
        "(tau = ln 2 by default) counts as changed.")


def _add_share_ci(con: duckdb.DuckDBPyConnection, df: pd.DataFrame, where: str, params: list[object],
                  seed: int, include_off_band: bool = False) -> pd.DataFrame:
    """``df`` with ``share_ci_low`` / ``share_ci_high`` from image-level counts of ok rows (NaN
    without a ``taxonomy_results`` table); off-band records left out unless ``include_off_band``."""
    df["share_ci_low"] = np.nan
    df["share_ci_high"] = np.nan
    if not relation_exists(con, "taxonomy_results"):
        return df
    complete = relation_exists(con, COMPLETENESS_TABLE)
    sql = quadrant_images_sql(complete, include_off_band, band_rows(con))
    counts = con.execute(f"select * from ({sql}) where {where}", params).df()
    if counts.empty:
        return df
    for (cfg, mode, cond), g in counts.groupby(["config", "image_mode", "condition"], sort=True):
        mat = (g.pivot_table(index=["dataset", "sample_id"], columns="quadrant", values="n", aggfunc="sum",
                             fill_value=0)
               .reindex(columns=list(QUADRANTS), fill_value=0).sort_index())
        ci = _pooled_share_ci(mat.to_numpy(dtype=np.float64),
                              rng_for(seed, "report", "taxonomy_quadrants", str(cfg), str(mode), str(cond)))
        for i, quad in enumerate(QUADRANTS):
            sel = (df["config"] == cfg) & (df["image_mode"] == mode) & (df["condition"] == cond) & (
                df["quadrant"] == quad)
            df.loc[sel, "share_ci_low"] = ci[i, 0]
            df.loc[sel, "share_ci_high"] = ci[i, 1]
    return df


def taxonomy_points(con: duckdb.DuckDBPyConnection, configs: Sequence[str] | None,
                    clean_only: bool = True) -> pd.DataFrame:
    """Scatter points from ``taxonomy_results`` via
    :func:`medrobust_lib.taxonomy.aggregates.correlation_points`: one row per (config, dataset,
    perturbation, level, image_mode) with ``flip_rate``, ``dangerous_share`` (both in [0, 1]), ``n``
    and ``n_error``. ``clean_only`` (default): the headline points, clean, one per (config,
    dataset)."""
    from medrobust_lib.taxonomy.aggregates import correlation_points

    if not relation_exists(con, "taxonomy_results"):
        return correlation_points(pd.DataFrame())
    where, params = where_in("config", configs)
    rows = con.execute(f"""
        select config, dataset, perturbation, level, image_mode, outcome, quadrant, consistent
        from taxonomy_results where {where} and {complete_only(con, "taxonomy_results")}""", params).df()
    return correlation_points(rows, clean_only=clean_only)


def taxonomy_correlation(con: duckdb.DuckDBPyConnection, configs: Sequence[str] | None,
                         all_configs: Sequence[str], seed: int = 0) -> TableResult:
    """The headline correlation, as the paper computes it: Pearson r of the flip rate with the
    Dangerous share over clean (configuration, dataset) points, one row per image mode (scope
    ``headline`` of ``taxonomy_correlation``): ``n_points`` (= n), ``n_configs``, ``r`` in [-1, 1]
    with its bootstrap 95 % CI over points, two-sided ``p_value``, ``n_error``, ``note``. The
    pooled perturbed analysis is not the headline and stays in the mart (scope
    ``pooled_perturbed``). When ``configs`` selects a strict subset of ``all_configs``, r is
    recomputed over the selected configurations' clean points with the library's
    :func:`~medrobust_lib.taxonomy.aggregates.flip_dangerous_correlation` (same bootstrap keys and
    ``n_boot`` as the mart), and ``source`` says so."""
    subset = configs is not None and set(configs) != set(all_configs)
    if not subset:
        if not relation_exists(con, "taxonomy_correlation"):
            return "the mart has no taxonomy_correlation view"
        df = con.execute(f"""
            select {", ".join(_CORR_COLUMNS)}
            from taxonomy_correlation where scope = 'headline' order by image_mode""").df()
        df["source"] = "mart"
    else:
        df = _recomputed_correlation(con, list(configs or []), seed)
    if df.empty:
        return "no headline rows in taxonomy_correlation (no clean taxonomy results)"
    from medrobust_lib.report.figures.taxonomy import headline_rows

    df = headline_rows(df).reset_index(drop=True)
    cols = (Column("Image removed", "image_mode"), Column("n (clean config x dataset points)", "n_points", "int"),
            Column("Configs", "n_configs", "int"), Column("r [95% CI]", "r", "ci", "ci_low", "ci_high"),
            Column("p", "p_value", "pvalue"), Column("Errors", "n_error", "int"), Column("Note", "note"),
            Column("Source", "source"))
    return ReportTable(
        "taxonomy_correlation", "Flip rate vs Dangerous share: headline correlation on clean data", df, cols,
        "As in the paper: one point per (configuration, dataset) on clean images, n = number of points; flip "
        "rate = share of samples whose answers differ across the question and its paraphrases; r with a "
        "percentile bootstrap 95% CI over points and a two-sided p. Perturbed points pooled over conditions are "
        "a secondary analysis (mart view taxonomy_correlation, scope pooled_perturbed, CI resampling whole "
        "configurations), never this headline. Source 'mart': every configuration; 'recomputed': the selected "
        "ones.")


_CORR_COLUMNS: tuple[str, ...] = ("scope", "perturbation", "image_mode", "n_points", "n_configs", "n_error", "r",
                                  "ci_low", "ci_high", "p_value", "note")


def _recomputed_correlation(con: duckdb.DuckDBPyConnection, configs: list[str], seed: int) -> pd.DataFrame:
    from medrobust_lib.taxonomy.aggregates import HEADLINE, flip_dangerous_correlation

    where, params = where_in("config", configs)
    rows = con.execute(f"""
        select config, dataset, perturbation, level, image_mode, outcome, quadrant, consistent
        from taxonomy_results where perturbation = 'clean' and {where}
        and {complete_only(con, "taxonomy_results")}""", params).df()
    if rows.empty:
        return pd.DataFrame()
    corr = flip_dangerous_correlation(rows, seed)
    out = corr[corr["scope"] == HEADLINE][list(_CORR_COLUMNS)].copy()
    out["source"] = f"recomputed ({', '.join(configs)})"
    return out.reset_index(drop=True)


def label_kinds_missing(con: duckdb.DuckDBPyConnection) -> str | None:
    """Why the mart cannot tell real labels from synthetic ones (None when it can)."""
    if not relation_exists(con, "clean_samples"):
        return "the mart has no clean_samples table (it tells real labels from synthetic ones)"
    if "synthetic_labels" not in relation_columns(con, "clean_samples"):
        return ("the mart's clean_samples has no synthetic_labels column (built before it existed): rebuild the "
                "clean sample index and the mart")
    return None


def dataset_label_kinds(con: duckdb.DuckDBPyConnection) -> dict[str, bool | None]:
    """Dataset -> ``synthetic_labels`` as the clean index records it (None: not recorded); {} when
    the mart cannot tell (:func:`label_kinds_missing`)."""
    if label_kinds_missing(con) is not None:
        return {}
    rows = con.execute("select dataset, bool_or(synthetic_labels) from clean_samples group by dataset").fetchall()
    return {str(d): (None if k is None else bool(k)) for d, k in rows}


BY_MODALITY_VIEW = "segmentation_by_modality"


def real_models(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None) -> list[str]:
    """Segmentation models (of the selection) with a real architecture: ``arch`` is not the demo's
    from-scratch ``tiny`` (LiteMedSAM, SAM ViT-B/L/H, MedSAM, SAM-Med2D and their fine-tunes)."""
    if not relation_exists(con, "segmentation_results") or "arch" not in relation_columns(con, "segmentation_results"):
        return []
    where, params = where_in("model", models)
    rows = con.execute(f"select distinct model from segmentation_results where {where} and arch is not null "
                       "and arch <> 'tiny' order by model", params).fetchall()
    return [str(r[0]) for r in rows]


def real_model_worst_types(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None,
                           include_floor: bool = False, seed: int = 0,
                           include_off_band: bool = False) -> TableResult:
    """What hurts the real models most on the synthetic lesions: per real model (:func:`real_models`)
    and level, every corruption type ranked by mean paired IoU drop (1 = worst) with its bootstrap
    95 % CI, the clean IoU of the same images, and the mean IoU drop per modality as one column per
    modality, ``n`` images in brackets.

    Which datasets (``clean_samples.synthetic_labels``, :func:`dataset_label_kinds`): when the real models' datasets mix synthetic-lesion and real-label (or
    unrecorded) ones, only the synthetic-lesion datasets, since the real labels lead the report in
    their own table (``real_labels``) and pooling them here would count them twice and mix two kinds
    of ground truth; the means, ranks and CIs are then computed here from those rows (CIs bootstrapped
    over images, seeded by ``seed``; the report's ``include_off_band``). Otherwise every dataset (all
    of one kind) from the mart's ``segmentation_type_ranks`` and ``segmentation_by_modality`` views,
    the numbers of ``segmentation_by_level``; the title says which."""

    real = real_models(con, models)
    if not real:
        return "no segmentation rows of a real architecture (every evaluated model is the demo's tiny SAM)"
    where, params = where_in("model", real)
    kinds = dataset_label_kinds(con)
    datasets = [str(r[0]) for r in con.execute(
        f"select distinct dataset from segmentation_results where {where} order by 1", params).fetchall()]
    synthetic = [d for d in datasets if kinds.get(d) is True]
    if synthetic and len(synthetic) < len(datasets):
        df, mod = _synthetic_type_ranks(con, real, synthetic, include_floor, include_off_band, seed)
        scope = "synthetic"
    else:
        suffix = ALL_SUFFIX if include_floor else ""
        df = con.execute(f"select * from ({type_ranks_sql(include_floor)}) where {where}", params).df()
        mod = con.execute(f"""
            select model, level, perturbation, modality, iou_drop, n_ok
            from {BY_MODALITY_VIEW}{suffix} where condition = 'perturbation' and {where}""", params).df()
        scope = "synthetic" if synthetic else ("real" if datasets and all(kinds.get(d) is False for d in datasets)
                                               else "unknown")
    if df.empty:
        return "no perturbed rows for the real models" + (" on the synthetic-lesion datasets" if scope == "synthetic"
                                                          and len(synthetic) < len(datasets) else "")
    modalities = sorted(mod["modality"].unique()) if len(mod) else []
    for m in modalities:
        sub = mod[mod["modality"] == m].set_index(["model", "level", "perturbation"])
        key = df.set_index(["model", "level", "perturbation"]).index
        df[f"drop_{m}"] = sub["iou_drop"].reindex(key).to_numpy()
        df[f"n_{m}"] = sub["n_ok"].reindex(key).to_numpy()
        df[f"cell_{m}"] = [
            "–" if pd.isna(d) else f"{d:.3f} ({int(n)})" for d, n in zip(df[f"drop_{m}"], df[f"n_{m}"], strict=True)]
    cols = [Column("Model", "model"), Column("Level", "level", "int"), Column("Rank", "rank", "int"),
            Column("Corruption", "perturbation"), Column("n", "n", "int"), Column("Clean IoU", "clean_iou", "float"),
            Column("IoU drop [95% CI]", "iou_drop", "ci", "iou_drop_ci_low", "iou_drop_ci_high"),
            *[Column(m, f"cell_{m}") for m in modalities]]
    title, which = {
        "synthetic": ("What hurts the real model most on the synthetic-lesion datasets: corruption types ranked by "
                      "IoU drop",
                      "Synthetic-lesion datasets only (masks generated with the image: the demo's "
                      + ("generated datasets; the real-label datasets are in the first table, not pooled here)."
                         if len(synthetic) < len(datasets) else "generated datasets).")),
        "real": ("What hurts the real model most on real labels: corruption types ranked by IoU drop",
                 "Every dataset (all with real labels)."),
        "unknown": ("What hurts the real model most: corruption types ranked by IoU drop, every dataset",
                    "Every dataset pooled (the mart does not record which labels are synthetic: clean_samples."
                    "synthetic_labels)."),
    }[scope]
    return ReportTable(
        "real_model_worst_types", title, df, tuple(cols),
        f"{which} Real architectures only (not the demo's from-scratch tiny SAM). Drop = clean minus perturbed "
        "IoU, paired per image; 95% CI: percentile bootstrap over images (pooled over modalities). Modality "
        "columns: mean IoU drop on that modality's images (number of images in brackets; no CI: too few images "
        "per cell).",
        group_by=("model", "level"))


def _synthetic_type_ranks(con: duckdb.DuckDBPyConnection, real: Sequence[str], datasets: Sequence[str],
                          include_floor: bool, include_off_band: bool, seed: int,
                          min_n: int = DEFAULT_MIN_N) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`real_model_worst_types` on ``datasets`` only: the rows ``segmentation_by_level`` would
    average (:func:`~medrobust_lib.store.views.common.seg_rows_ctes`: floor datasets and off-band
    rows left out unless asked) restricted to them, as (ranks, per-modality means) in the columns of
    ``segmentation_type_ranks`` and ``segmentation_by_modality``. ``n`` counts every row of a cell,
    the means and the CI (``min_n`` images or more) take its ok rows."""
    ctes = seg_rows_ctes(include_floor, "list_contains($datasets, r.dataset)", include_off_band, band_rows(con))
    rows = con.execute(f"""
        with {ctes}
        select model, level, perturbation, modality, status, iou, iou_drop, clean_iou
        from seg_rows where condition = 'perturbation' and list_contains($models, model)
        order by model, level, perturbation, dataset, sample_id""",
                       {"datasets": list(datasets), "models": list(real)}).df()
    keys = ["model", "level", "perturbation"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, "n", "iou_drop", "rank"]), pd.DataFrame(
            columns=[*keys, "modality", "iou_drop", "n_ok"])
    ok = rows[rows["status"] == "ok"]
    out = []
    for key, g in rows.groupby(keys, sort=True):
        o = ok.loc[ok.index.intersection(g.index)]
        rec = dict(zip(keys, key, strict=True))
        lo = hi = float("nan")
        if len(o) >= min_n:
            _, lo, hi = bootstrap_ci(o["iou_drop"].to_numpy(np.float64), n_boot=N_BOOT,
                                     rng=rng_for(seed, "report", "real_model_worst_types", *map(str, key)))
        rec.update(n=len(g), iou_drop=o["iou_drop"].mean(), iou_drop_ci_low=lo, iou_drop_ci_high=hi,
                   clean_iou=o["clean_iou"].mean(), iou=o["iou"].mean())
        out.append(rec)
    df = pd.DataFrame(out)
    df["rank"] = df.groupby(["model", "level"])["iou_drop"].rank(method="min", ascending=False,
                                                                 na_option="bottom").astype("int64")
    df = df.sort_values(["model", "level", "rank", "perturbation"], kind="stable").reset_index(drop=True)
    mod = (ok.groupby([*keys, "modality"], sort=True)
           .agg(iou_drop=("iou_drop", "mean"), n_ok=("iou_drop", "size")).reset_index())
    return df[["model", "level", "perturbation", "n", "iou_drop", "iou_drop_ci_low", "iou_drop_ci_high",
               "clean_iou", "iou", "rank"]], mod


def _analysis_rows(con: duckdb.DuckDBPyConnection, sql: str, models: Sequence[str] | None,
                   needs: Sequence[str] = ("segmentation_results",), where_extra: str = "true",
                   extra_params: dict[str, object] | None = None) -> pd.DataFrame | str:
    """The rows of an analysis view's SQL (run with the report's settings) for the selected models,
    or why there are none to read (a relation missing, a mart too old for the SQL)."""
    missing = [r for r in needs if not relation_exists(con, r)]
    if missing:
        return f"the mart has no {', '.join(missing)}"
    where, params = where_in("model", models)
    try:
        return con.execute(f"select * from ({sql}) where {where.replace('?', '$ids')} and {where_extra}",
                           {**_named(params), **(extra_params or {})}).df()
    except duckdb.Error as exc:  # a mart built before the tables had the columns the SQL reads
        return f"the mart's tables lack what the view needs ({str(exc).splitlines()[0][:200]})"


def modality_share(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None, include_floor: bool = False,
                   include_off_band: bool = False) -> TableResult:
    """The ``segmentation_modality_share`` view (its ``_all`` variant with ``include_floor``): per
    (model, strategy, levels) and k, how many of the k corruption types with the largest mean IoU
    drop are modality-specific (MedFM-Robust: "9 of 15")."""
    df = _analysis_rows(con, segmentation_modality_share(include_floor, include_off_band), models,
                        ("segmentation_results", "perturbation_manifest"))
    if isinstance(df, str):
        return df
    if df.empty:
        return "no ranked corruption types for the selected models"
    for c in ("k", "n_types", "n_top", "n_specific", "n_generic", "n_unknown"):
        df[c] = df[c].astype("int64")
    df["specific_of_top"] = [f"{s} of {n}" for s, n in zip(df["n_specific"], df["n_top"], strict=True)]
    cols = [Column("Model", "model"), *identity_columns(df, "model", [("strategy", "Strategy"), ("levels", "Levels")]),
            Column("k", "k", "int"), Column("Modality-specific", "specific_of_top"),
            Column("Share", "share", "float"), Column("Types ranked", "n_types", "int"),
            Column("Modality-specific types (by rank)", "specific_types")]
    if int(df["n_unknown"].sum()):
        cols.insert(5, Column("Unknown", "n_unknown", "int"))
    return ReportTable(
        "modality_share", "Modality-specific types among the worst corruptions", df, tuple(cols),
        f"Per model, the corruption types ranked 1 to k by mean IoU drop (segmentation_top_corruptions; k = "
        f"{', '.join(map(str, TOP_K))}; ties at the k-th place all kept, so the count can exceed k, and a model with "
        f"fewer types counts them all) and how many are modality-specific: registered for some modalities only, "
        f"i.e. not of the generic families {', '.join(GENERIC_FAMILIES)}. Share = modality-specific / types of "
        "known family. MedFM-Robust reports 9 of the top 15.",
        group_by=("model",))


def iou_dice_agreement(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None, include_floor: bool = False,
                       include_off_band: bool = False) -> TableResult:
    """The ``segmentation_iou_dice_agreement`` view: per (model, checkpoint, strategy) Spearman's rank
    correlation of the corruption types' IoU and Dice drops, with the worst type by each."""
    df = _analysis_rows(con, segmentation_iou_dice_agreement(include_floor, include_off_band), models)
    if isinstance(df, str):
        return df
    if df.empty:
        return "no corruption rows for the selected models"
    df["n_types"] = df["n_types"].astype("int64")
    cols = (Column("Model", "model"), *identity_columns(df, "model", [("strategy", "Strategy"),
                                                                       ("checkpoint", "Checkpoint")]),
            Column("Levels", "levels"), Column("Types", "n_types", "int"),
            Column("Spearman ρ", "spearman_rho", "float"), Column("Worst by IoU", "worst_by_iou"),
            Column("Worst by Dice", "worst_by_dice"))
    return ReportTable(
        "iou_dice_agreement", "IoU vs Dice: do they rank the corruption types alike?", df, cols,
        "Spearman's rank correlation between the corruption types' mean IoU drops and mean Dice drops (each type's "
        "mean over its images and levels; tied drops share their mean rank, as scipy.stats.spearmanr). 1: both "
        "metrics order the types the same; empty: one of the drops is the same for every type.")


def mce(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None, baseline: str | None,
        include_floor: bool = False, include_off_band: bool = False) -> TableResult:
    """The ``segmentation_mce_summary`` view's rows of ``baseline`` (a segmentation model id): per
    (model, checkpoint, strategy) MedMNIST-C's mCE (mBE) and relative mCE (mRBE) for IoU and Dice;
    why there is no table when no baseline is named or the mart has no rows of it."""
    if baseline is None:
        return ("no mCE baseline named: set segmentation.mce_baseline in the suite or give medrobust report "
                "--mce-baseline <segmentation model id> (the mart's segmentation_mce_summary has every pair)")
    df = _analysis_rows(con, segmentation_mce_summary(include_floor, include_off_band), models,
                        where_extra="baseline = $baseline", extra_params={"baseline": baseline})
    if isinstance(df, str):
        return df
    if df.empty:
        known = distinct_ids(con, "segmentation_results", "model")
        if baseline not in known:
            return f"the mCE baseline {baseline!r} has no segmentation rows in the mart (models: {', '.join(known)})"
        return f"no corruption type shared with the mCE baseline {baseline!r} at a common level"
    for c in ("n_types", "n_undefined"):
        df[c] = df[c].astype("int64")
    cols = [Column("Model", "model"), *identity_columns(df, "model", [("strategy", "Strategy"),
                                                                      ("checkpoint", "Checkpoint")]),
            *identity_columns(df, "baseline", [("baseline_strategy", "Baseline strategy"),
                                               ("baseline_checkpoint", "Baseline checkpoint")]),
            Column("Levels", "levels"), Column("Types", "n_types", "int"),
            Column("mCE IoU", "mce_iou", "float"), Column("rel. mCE IoU", "relative_mce_iou", "float"),
            Column("mCE Dice", "mce_dice", "float"), Column("rel. mCE Dice", "relative_mce_dice", "float")]
    if int(df["n_undefined"].sum()):
        cols.append(Column("Undefined", "n_undefined", "int"))
    return ReportTable(
        "mce", f"Mean corruption error relative to {baseline} (MedMNIST-C)", df, tuple(cols),
        f"As MedMNIST-C defines them (medmnistc/eval.py), with error = 1 - IoU (1 - Dice): per corruption type c, "
        f"E_c = the mean over levels of the error; BE_c = E_c / E_c({baseline}); relative "
        f"RBE_c = (E_c - E_clean) / (E_c({baseline}) - E_clean({baseline})); mCE = mean BE_c, rel. mCE = mean "
        "RBE_c over the types both models have, at the levels both have. 1 = the baseline's; lower is more "
        "robust. E_clean is the clean error of the type's own images (a type covers only its modalities). "
        "Per type: the mart's segmentation_mce view.")
