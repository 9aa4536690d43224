"""The report's first table: the real model on real labels (``real_labels``).

The demo evaluates its generated datasets (synthetic lesions, masks exact by construction) next to
real images with real labels. What a reader of a robustness benchmark wants first is how the real
model (a real architecture: LiteMedSAM, SAM, ...) does on the real labels: its clean Dice, the
official inference's clean Dice on the same dataset where it is known
(the ``dataset_info`` table: a dataset config's ``reference_dice``), and per evaluated level the corruption types that hurt it
most and those that help it (a negative drop: the corruption raised the Dice), each with a
percentile bootstrap 95 % CI over the dataset's images.

The means come from the mart views of :mod:`medrobust_lib.store.views.real_labels` (run with the
report's ``--include-off-band``); the CIs are bootstrapped here from the per-image rows of the same
views (:func:`real_label_type_stats`; the mart computes every CI in Python, never in SQL), seeded
by the report's ``--seed`` and the cell, so a re-run gives the same numbers. Cells with fewer images
than :data:`~medrobust_lib.config.common.DEFAULT_MIN_N` get no CI (the ``stats.min_n`` rule).

Dice, not IoU, ranks this table (the design's primary metric is IoU): the official LiteMedSAM
evaluation reports Dice, and the first table compares with it; the IoU drop is shown alongside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.metrics.stats import bootstrap_ci
from medrobust_lib.report import paper_tables as pt
from medrobust_lib.report.table import FLOOR_MARK, Column, ReportTable
from medrobust_lib.seeding import rng_for
from medrobust_lib.store.views.common import SEG_FLOOR
from medrobust_lib.store.views.real_labels import (
    CELL_KEYS,
    real_label_rows_sql,
    segmentation_real_label_types,
    segmentation_real_labels,
)

NAME = "real_labels"
TITLE = "The real model on real labels"
TOP_TYPES = 3
"""Types listed per level and direction: the ``TOP_TYPES`` that hurt most and that help most."""
FIGURE_PREFIX = "real_labels_"
"""File-name prefix of the per-dataset bar charts (``real_labels_<dataset>.png``)."""
HURTS, HELPS, ATTACK = "hurts", "helps", "attack"
NO_EFFECT_TOL = 1e-9
"""A mean drop within this of 0 neither hurts nor helps (a type that left the images unchanged
averages to 0 up to the last bits)."""


def _key(values: Sequence[object]) -> tuple[str, ...]:
    """A cell key as text (missing values as ''), the same from the cell rows and the image rows."""
    out = []
    for k, v in zip(CELL_KEYS, values, strict=True):
        if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
            out.append("")
        else:
            out.append(str(int(v)) if k == "level" else str(v))  # type: ignore[call-overload]
    return tuple(out)


def real_label_type_stats(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None, seed: int = 0,
                          include_off_band: bool = False, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Every row of ``segmentation_real_label_types`` (its SQL run with ``include_off_band``) of the
    selected real-architecture models, with percentile bootstrap 95 % CIs of the mean drops
    (``dice_drop_ci_low`` / ``_high``, ``iou_drop_ci_low`` / ``_high``) over the cell's images;
    NaN below ``min_n`` images. Empty when there is no such row or the mart cannot tell real labels."""
    real = pt.real_models(con, models)
    if not real or pt.label_kinds_missing(con) is not None:
        return pd.DataFrame()
    band = pt.band_rows(con)
    where, params = pt.where_in("model", real)
    cells = con.execute(f"select * from ({segmentation_real_label_types(include_off_band, band)}) where {where}",
                        params).df()
    if cells.empty:
        return cells
    images = con.execute(f"select * from ({real_label_rows_sql(include_off_band, band)}) where {where}", params).df()
    drops: dict[tuple[str, ...], pd.DataFrame] = {
        _key(k): g for k, g in images.groupby(list(CELL_KEYS), dropna=False, sort=False)}
    for c in ("dice_drop_ci_low", "dice_drop_ci_high", "iou_drop_ci_low", "iou_drop_ci_high"):
        cells[c] = np.nan
    for i, vals in enumerate(cells[list(CELL_KEYS)].itertuples(index=False, name=None)):
        key = _key(vals)
        g = drops.get(key)
        if g is None or len(g) < min_n:
            continue
        rng = rng_for(seed, "report", NAME, *key)
        _, lo, hi = bootstrap_ci(g["dice_drop"].to_numpy(np.float64), n_boot=pt.N_BOOT, rng=rng)
        cells.loc[cells.index[i], ["dice_drop_ci_low", "dice_drop_ci_high"]] = (lo, hi)
        _, lo, hi = bootstrap_ci(g["iou_drop"].to_numpy(np.float64), n_boot=pt.N_BOOT, rng=rng)
        cells.loc[cells.index[i], ["iou_drop_ci_low", "iou_drop_ci_high"]] = (lo, hi)
    return cells


def pick_types(cells: pd.DataFrame, top: int = TOP_TYPES) -> pd.DataFrame:
    """The listed rows of one (model, checkpoint, strategy, dataset)'s cells, per level (ascending):
    the ``top`` corruption types with the largest positive mean Dice drop (``effect`` ``hurts``,
    largest first), the ``top`` with the most negative one (``helps``, most negative first), then
    every attack (``attack``). ``rank`` counts within (level, effect); attacks have none. Ties are
    broken by type name; a type whose mean drop is 0 (within :data:`NO_EFFECT_TOL`) or missing is
    in neither list."""
    out = []
    for level in sorted(cells["level"].dropna().unique()):
        at = cells[cells["level"] == level]
        corr = at[(at["condition"] == "perturbation") & at["dice_drop"].notna()]
        hurts = corr[corr["dice_drop"] > NO_EFFECT_TOL].sort_values(["dice_drop", "perturbation"], ascending=[False, True])
        helps = corr[corr["dice_drop"] < -NO_EFFECT_TOL].sort_values(["dice_drop", "perturbation"], ascending=[True, True])
        for effect, rows in ((HURTS, hurts.head(top)), (HELPS, helps.head(top))):
            out.append(rows.assign(effect=effect, rank=np.arange(1, len(rows) + 1)))
        attacks = at[at["condition"] != "perturbation"].sort_values(["perturbation", "condition"])
        out.append(attacks.assign(effect=ATTACK, rank=np.nan))
    return pd.concat(out, ignore_index=True) if out else cells.iloc[0:0].assign(effect=None, rank=np.nan)


def _cell(value: object, n: object) -> str:
    """``0.912 (16)``; '' when the value is missing."""
    if value is None or pd.isna(value):  # type: ignore[call-overload]
        return ""
    return f"{float(value):.3f} ({int(n)})" if n is not None and not pd.isna(n) else f"{float(value):.3f}"  # type: ignore[arg-type, call-overload]


def real_labels(con: duckdb.DuckDBPyConnection, models: Sequence[str] | None, seed: int = 0,
                include_off_band: bool = False) -> pt.TableResult:
    """Per real-architecture model (:func:`~medrobust_lib.report.paper_tables.real_models`) and
    real-label dataset (``segmentation_real_labels``): the clean Dice over ``n_images`` images, the
    mean per-instance Dice where the dataset has instances, the official inference's clean Dice
    (``official_dice`` over ``official_n`` samples: the ``dataset_info`` reference of the model's
    family, where the dataset's config gives one), then per evaluated level the
    rows of :func:`pick_types` with the signed mean ``dice_drop`` / ``iou_drop`` (clean minus
    perturbed: negative = the corruption helped), their 95 % CIs and ``n_ok`` (the paired images of
    the mean). A dataset without perturbed rows has one row with its clean scores."""
    real = pt.real_models(con, models)
    if not real:
        return "no segmentation rows of a real architecture (every evaluated model is the demo's tiny SAM)"
    why = pt.label_kinds_missing(con)
    if why is not None:
        return why
    where, params = pt.where_in("model", real)
    clean = con.execute(f"select * from ({segmentation_real_labels(include_off_band, pt.band_rows(con))}) "
                        f"where {where}", params).df()
    if clean.empty:
        return ("no rows of a real-architecture model on a dataset with real labels (clean_samples.synthetic_labels "
                "false: the demo's real datasets or a suite's own)")
    cells = real_label_type_stats(con, real, seed, include_off_band)
    info = _dataset_info(con)
    parts = []
    group = ["model", "checkpoint", "strategy", "dataset"]
    for _, c in clean.iterrows():
        sub = cells
        if len(cells):
            sub = cells[np.logical_and.reduce([
                (cells[k].isna() if pd.isna(c[k]) else cells[k] == c[k]) for k in group])]
        rows = pick_types(sub) if len(sub) else sub
        if rows.empty:
            rows = pd.DataFrame([{k: c[k] for k in group}]).assign(effect="no perturbed rows")
        off = info["refs"].get((str(c["dataset"]), str(c["family"])))
        rows = rows.assign(**{k: c[k] for k in group}, modality=c["modality"], family=c["family"], arch=c["arch"],
                           clean_dice=c["clean_dice"], clean_iou=c["clean_iou"], n_images=c["n_images"],
                           clean_instance_dice=c["clean_instance_dice"], n_instances=c["n_instances"],
                           official_dice=np.nan if off is None else off[0],
                           official_n=np.nan if off is None else off[1], floor_effect=bool(c["floor_effect"]))
        first = np.arange(len(rows)) == 0  # the clean cells on the group's first row only
        rows["clean_cell"] = np.where(first, _cell(c["clean_dice"], c["n_images"]), "")
        rows["official_cell"] = np.where(first, "" if off is None else _cell(off[0], off[1]), "")
        rows["instance_cell"] = np.where(first, _cell(c["clean_instance_dice"], c["n_instances"]), "")
        parts.append(rows)
    df = pd.concat(parts, ignore_index=True)
    front = [*group, "modality", "family", "arch", "clean_dice", "clean_iou", "n_images", "clean_instance_dice",
             "n_instances", "official_dice", "official_n", "level", "effect", "rank", "condition", "perturbation",
             "dice_drop", "dice_drop_ci_low", "dice_drop_ci_high", "iou_drop", "iou_drop_ci_low", "iou_drop_ci_high",
             "n_ok", "band_miss"]
    df = df.reindex(columns=[*front, *[c for c in df.columns if c not in front]])
    cols = [Column("Model", "model"), *pt.identity_columns(df, "model", [("strategy", "Strategy"),
                                                                         ("checkpoint", "Checkpoint")]),
            Column("Dataset", "dataset"), Column("Clean Dice (n)", "clean_cell")]
    shown_instances = bool((df["instance_cell"] != "").any())
    if shown_instances:
        cols.append(Column("Inst. Dice (inst.)", "instance_cell"))
    shown_official = bool((df["official_cell"] != "").any())
    if shown_official:
        cols.append(Column("Official Dice (n)", "official_cell"))
    cols += [Column("Level", "level", "int"), Column("Effect", "effect"), Column("#", "rank", "int"),
             Column("Type", "perturbation"),
             Column("Dice drop [95% CI]", "dice_drop", "ci", "dice_drop_ci_low", "dice_drop_ci_high"),
             Column("IoU drop [95% CI]", "iou_drop", "ci", "iou_drop_ci_low", "iou_drop_ci_high"),
             Column("n", "n_ok", "int")]
    if df["band_miss"].fillna(0).sum():
        cols.append(Column("Off-band", "band_miss", "int"))
    sources = sorted({v[2] for (d, _), v in info["refs"].items() if d in set(df["dataset"])})
    return ReportTable(NAME, TITLE, df, tuple(cols), _note(df, "; ".join(sources), shown_official, shown_instances,
                                                           info["descriptions"]),
                       grey_key="floor_effect", group_by=("model", "dataset"))


def _dataset_info(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """From ``dataset_info``: ``descriptions`` (dataset -> text) and ``refs`` ((dataset, family) ->
    (reference Dice, n, source)); empty in a mart without the table."""
    out: dict[str, Any] = {"descriptions": {}, "refs": {}}
    if not pt.relation_exists(con, "dataset_info"):
        return out
    for d, desc, fam, dice, n, src in con.execute(
            "select dataset, description, reference_family, reference_dice, reference_n, reference_source "
            "from dataset_info").fetchall():
        if desc:
            out["descriptions"][str(d)] = str(desc)
        if fam is not None and dice is not None:
            out["refs"][(str(d), str(fam))] = (float(dice), int(n), str(src))
    return out


def _note(df: pd.DataFrame, official_source: str, shown_official: bool, shown_instances: bool,
          descriptions: dict[str, str]) -> str:
    """Definitions, then one sentence per dataset shown on what it is (its source and licence)."""
    note = ("Real architectures only, on the datasets whose labels are not generated with the image "
            "(clean_samples.synthetic_labels false; the demo's synthetic-lesion datasets follow in the next table). "
            "Clean Dice: mean union Dice (the masks of the image's box prompts against its whole mask) over the "
            "dataset's clean images (n). "
            + ("Inst. Dice: mean Dice of each box's own mask against its own instance, over the images with "
               "instances (number of instances). " if shown_instances else "")
            + f"Per evaluated level, the {TOP_TYPES} corruption types that hurt most (largest mean Dice drop) and the {TOP_TYPES} "
            "that help most (most negative drop: the perturbed image scored higher than the clean one), then the "
            "attacks. Drop = clean minus perturbed, paired per image, signed; ranked by Dice (the official "
            "LiteMedSAM evaluation's metric), the IoU drop alongside. 95% CI: percentile bootstrap over the "
            "images (seeded by the report's --seed). " + pt.SMALL_N_TEXT)
    if shown_official:
        note += (" Official Dice: the mean union Dice of the model family's official inference on the same samples "
                 f"(n samples; measured by {official_source}), fp32; the model's own rows use the arithmetic in their "
                 "precision column (bf16 where the CPU computes it natively), which moves single slices by a few "
                 "hundredths of Dice.")
    if df["floor_effect"].any():
        note += (f" {FLOOR_MARK} / grey: clean IoU or Dice below {SEG_FLOOR}: the dataset's drops are not "
                 "informative.")
    if "band_miss" in df.columns and df["band_miss"].fillna(0).sum():
        note += (" Off-band: perturbed images whose SSIM missed the level's band, left out of the means unless "
                 "--include-off-band.")
    about = [descriptions[str(n)] for n in dict.fromkeys(df["dataset"]) if str(n) in descriptions]
    if about:
        note += " Datasets. " + " ".join(about)
    return note
