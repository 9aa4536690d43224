"""VLM statistics and the published table: paired clean vs perturbed tests with bootstrap CIs,
Benjamini-Hochberg over the type x level grid, written as the ``vlm_stats`` table; and the wide
Clean / types / Avg / ΔTP table read from the ``vlm_task_drops`` mart view.

Pairing: a perturbed row (``image_mode='image'``) is paired with the clean row (``perturbation``
``clean``, level 0) of the same model, checkpoint, adapter, task, dataset, sample, record and prompt
variant. Each task is compared on its primary metric (:data:`VLM_PRIMARY_COLUMN`): ``correct`` for
``vqa_mc`` / ``vqa_yesno`` (accuracy) and ``grounding`` (acc_50, IoU >= 0.5), tested with McNemar;
``cider_d`` for ``caption``, tested with the paired Wilcoxon signed-rank test. Unparseable and
refused rows are scored as wrong (0) and paired; ``error`` rows (infrastructure failures) and
excluded rows (``excluded:<reason>``, or no value for the metric) are not paired but counted, each
in its own column. Partitions whose error share exceeds ``max_error_share``
(:mod:`medrobust_lib.store.completeness`) are left out until they are re-run.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.hashing import digest
from medrobust_lib.metrics.stats import (
    benjamini_hochberg,
    bootstrap_ci,
    mcnemar,
    paired_bootstrap_ci,
    wilcoxon_paired,
)
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import results
from medrobust_lib.store.completeness import DEFAULT_MAX_ERROR_SHARE, ERROR_OUTCOME, complete_rows
from medrobust_lib.store.schema import VLM_TABLE, column_names
from medrobust_lib.store.views.vlm import VLM_PRIMARY_COLUMN, VLM_SCORED_OUTCOMES
from medrobust_lib.tracks.off_band import MANIFEST_TABLE, off_band

STATS_TABLE = "vlm_stats"
N_BOOT = 1000
CELL_KEYS: tuple[str, ...] = ("model", "checkpoint", "adapter", "task", "perturbation", "level")
"""One ``vlm_stats`` row per value of these columns (perturbed conditions only)."""
GRID_KEYS: tuple[str, ...] = ("model", "checkpoint", "adapter", "task")
"""Benjamini-Hochberg runs over the type x level grid within each value of these columns."""
PAIR_KEYS: tuple[str, ...] = ("model", "checkpoint", "adapter", "task", "dataset", "sample_id", "record_id",
                              "prompt_id")
"""A perturbed row and its clean row agree on these columns (both with ``image_mode='image'``)."""
BINARY_TASKS: frozenset[str] = frozenset({"vqa_mc", "vqa_yesno", "grounding", "vqa_open"})
STATS_TABLE = "vlm_stats"
STATS_COLUMNS: tuple[str, ...] = column_names(STATS_TABLE)
"""The ``vlm_stats`` columns in declared order (:mod:`medrobust_lib.store.schema`)."""
WIDE_FIXED: tuple[str, ...] = ("Clean", "Avg", "ΔTP")


def _metric_source(task: str) -> str:
    """The ``vlm_results`` column compared for ``task``: ``correct`` or ``cider_d``."""
    return "correct" if task in BINARY_TASKS else "cider_d"


def _scored_values(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (image rows) with ``value`` (the task's metric; 0.0 for unparseable / refused rows
    without one), ``usable`` (scored outcome and a value: the row can be paired) and ``is_error``
    (infrastructure failure: never paired)."""
    out = df.copy()
    binary = out["task"].isin(BINARY_TASKS)
    raw = pd.to_numeric(out["correct"].where(binary, out["cider_d"]), errors="coerce")
    scored = out["outcome"].isin(VLM_SCORED_OUTCOMES)
    failed = scored & (out["outcome"] != "ok")
    out["value"] = raw.mask(failed & raw.isna(), 0.0)
    out["usable"] = scored & out["value"].notna()
    out["is_error"] = out["outcome"] == ERROR_OUTCOME
    return out


def _pair_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per perturbed row with its clean partner: columns
    CELL_KEYS + ``clean``, ``perturbed`` (metric values) + ``status`` in {``paired``, ``error``
    (either side an infrastructure error), ``excluded`` (either side excluded), ``unmatched`` (no
    clean row)}. Raises ValueError on duplicate clean rows."""
    img = _scored_values(df[df["image_mode"] == "image"])
    is_clean = img["perturbation"] == "clean"
    keys = list(PAIR_KEYS)
    clean = img.loc[is_clean, [*keys, "value", "usable", "is_error"]]
    dup = clean.duplicated(subset=keys, keep=False)
    if dup.any():
        raise ValueError(f"{int(dup.sum())} clean vlm_results rows share their pairing key {keys}")
    pert = img.loc[~is_clean, [*CELL_KEYS, *keys[4:], "value", "usable", "is_error"]]
    merged = pert.merge(clean.rename(columns={"value": "clean", "usable": "clean_usable",
                                              "is_error": "clean_is_error"}),
                        how="left", on=keys, indicator=True, validate="many_to_one")
    merged = merged.rename(columns={"value": "perturbed"})
    status = np.where(merged["_merge"] == "left_only", "unmatched",
                      np.where(merged["is_error"] | merged["clean_is_error"].eq(True), "error",
                               np.where(merged["usable"] & merged["clean_usable"].eq(True),
                                        "paired", "excluded")))
    merged["status"] = status
    return merged[[*CELL_KEYS, "clean", "perturbed", "status"]]


def _paired_test(task: str, clean: np.ndarray, pert: np.ndarray) -> tuple[str, float]:
    """(test name, two-sided p): McNemar on binary correctness, Wilcoxon on continuous scores;
    p = 1.0 when every pair is equal, NaN when the test is undefined (a single unequal pair)."""
    if task in BINARY_TASKS:
        return "mcnemar", mcnemar(clean >= 0.5, pert >= 0.5)[1]
    if np.all(clean == pert):
        return "wilcoxon", 1.0
    return "wilcoxon", wilcoxon_paired(clean, pert)[1]


def _cell_row(key: tuple[Hashable, ...], g: pd.DataFrame, seed: int,
              min_n: int = DEFAULT_MIN_N) -> dict[str, Any] | None:
    """One ``vlm_stats`` row for a (model, ..., perturbation, level) cell, or None without pairs;
    fewer than ``min_n`` pairs: the means only (no CI, no p)."""
    rec: dict[str, Any] = dict(zip(CELL_KEYS, key, strict=True))
    paired = g[g["status"] == "paired"]
    if paired.empty:
        return None
    task = str(rec["task"])
    c = paired["clean"].to_numpy(dtype=np.float64)
    p = paired["perturbed"].to_numpy(dtype=np.float64)
    rng = rng_for(seed, "vlmstats", *map(str, key))
    clean_v, clo, chi = bootstrap_ci(c, n_boot=N_BOOT, rng=rng)
    pert_v, plo, phi = bootstrap_ci(p, n_boot=N_BOOT, rng=rng)
    drop, dlo, dhi = paired_bootstrap_ci(c, p, n_boot=N_BOOT, rng=rng)
    test, pval = _paired_test(task, c, p)
    if len(paired) < min_n:  # below the floor: the means only, no CI, no p (so no q)
        clo = chi = plo = phi = dlo = dhi = pval = float("nan")
    rec.update(metric=VLM_PRIMARY_COLUMN.get(task, _metric_source(task)), n_pairs=len(paired),
               n_excluded=int((g["status"] == "excluded").sum()), n_unmatched=int((g["status"] == "unmatched").sum()),
               n_error=int((g["status"] == "error").sum()),
               clean_value=clean_v, clean_ci_low=clo, clean_ci_high=chi, perturbed_value=pert_v,
               perturbed_ci_low=plo, perturbed_ci_high=phi, drop=drop, drop_ci_low=dlo, drop_ci_high=dhi,
               test=test, p_value=pval)
    return rec


def _add_q_values(out: pd.DataFrame) -> pd.DataFrame:
    """``q_value``: Benjamini-Hochberg of ``p_value`` within each GRID_KEYS group (NaN p stays NaN)."""
    out["q_value"] = np.nan
    for _, idx in out.groupby(list(GRID_KEYS), dropna=False, sort=False).groups.items():
        out.loc[idx, "q_value"] = benjamini_hochberg(out.loc[idx, "p_value"].to_numpy(dtype=np.float64))
    return out


def vlm_stats(df: pd.DataFrame, seed: int = 0, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Paired clean vs perturbed statistics from ``vlm_results`` rows.

    One row per (model, checkpoint, adapter, task, perturbation, level) with at least one pair,
    columns :data:`STATS_COLUMNS`:

    - ``metric``: ``accuracy`` (vqa_mc, vqa_yesno), ``acc_50`` (grounding) or ``cider_d`` (caption);
    - ``n_pairs``; ``n_excluded``: perturbed rows not paired because they or their clean partner are
      excluded (``excluded:<reason>`` or no metric value); ``n_unmatched``: perturbed rows without a
      clean row; ``n_error``: perturbed rows not paired because they or their clean partner are an
      infrastructure ``error``;
    - ``clean_value`` / ``perturbed_value``: mean metric over the pairs (accuracy in [0, 1], CIDEr-D
      >= 0) with percentile bootstrap 95% CIs (``*_ci_low`` / ``*_ci_high``);
    - ``drop``: mean of clean - perturbed over pairs (positive = worse under perturbation), with the
      paired bootstrap 95% CI ``drop_ci_low`` / ``drop_ci_high``;
    - ``test``: ``mcnemar`` or ``wilcoxon``; ``p_value`` in [0, 1] (1.0 when all pairs are equal,
      NaN when undefined); ``q_value``: Benjamini-Hochberg within (model, checkpoint, adapter, task).

    Bootstrap generators are ``rng_for(seed, "vlmstats", *cell key)``, so a seed gives identical
    CIs. Unparseable and refused rows count as wrong (0) and are paired; error rows never are.
    A cell with fewer than ``min_n`` pairs (the suite's ``stats.min_n``) keeps its values but gets
    no CI, no p and no q.
    """
    if df.empty:
        return pd.DataFrame(columns=list(STATS_COLUMNS))
    pairs = _pair_rows(df)
    rows = [r for key, g in pairs.groupby(list(CELL_KEYS), dropna=False, sort=True)
            if (r := _cell_row(tuple(key), g, seed, min_n)) is not None]
    if not rows:
        return pd.DataFrame(columns=list(STATS_COLUMNS))
    out = _add_q_values(pd.DataFrame(rows))
    out["level"] = out["level"].astype(int)
    return out[list(STATS_COLUMNS)]


def _read_results(results_dir: str | Path) -> pd.DataFrame:
    """``vlm_results`` with the hive partition columns restored as model (str) and level (int)."""
    df = results.read_table(results_dir, VLM_TABLE)
    if df.empty:
        return df
    df["model"] = df["model"].astype(str)
    df["level"] = pd.to_numeric(df["level"]).astype(int)
    return df


def write_vlm_stats(results_dir: str | Path, seed: int = 0,
                    max_error_share: float = DEFAULT_MAX_ERROR_SHARE, min_n: int = DEFAULT_MIN_N,
                    include_off_band: bool = False) -> pd.DataFrame:
    """Recompute ``vlm_stats`` from the ``vlm_results`` rows of every complete partition (error
    share <= ``max_error_share``): one chunk per model under ``vlm_stats/model=<id>/stats.parquet``;
    folders of models without stats are removed. Perturbed rows whose image missed its level's SSIM
    band (``perturbation_manifest``) are left out, as in ``vlm_by_level``, unless
    ``include_off_band`` (the suite's ``perturbations.include_off_band``)."""
    rows = complete_rows(_read_results(results_dir), VLM_TABLE, max_error_share)
    if not include_off_band and len(rows):
        rows = rows[~off_band(rows, results.read_table(results_dir, MANIFEST_TABLE))]
    stats = vlm_stats(rows, seed, min_n)
    results.write_per_key(results_dir, STATS_TABLE, stats, "model", digest(["vlm_stats", seed, len(stats)]))
    return stats


def _wide_columns(long: pd.DataFrame) -> list[str]:
    """Clean, the perturbation types alphabetically, Avg, ΔTP."""
    return ["Clean", *sorted(set(long["column_name"]) - set(WIDE_FIXED)), "Avg", "ΔTP"]


def vlm_task_drops_wide(con_or_df: duckdb.DuckDBPyConnection | pd.DataFrame) -> pd.DataFrame:
    """The published table: one row per (model, checkpoint, adapter, task) with ``metric``, the
    primary metric under ``Clean``, each perturbation type (mean over levels 1-5), ``Avg`` and
    ``ΔTP`` (Clean - Avg), ``rel_drop`` (ΔTP / Clean, NaN when Clean is 0), ``n_unparseable``
    (unparseable answers behind the row: clean plus all types), ``n_error`` (infrastructure
    errors, outside every number) and ``n_truncated`` (answers cut at their token cap, inside the
    numbers; 0 for a mart built before the column existed). Input: a mart connection (reads the ``vlm_task_drops`` view) or
    that view as a DataFrame. A type missing for a row is NaN."""
    long = (con_or_df.execute("select * from vlm_task_drops").df()
            if isinstance(con_or_df, duckdb.DuckDBPyConnection) else con_or_df)
    keys = list(GRID_KEYS)
    tail = ["rel_drop", "n_unparseable", "n_error", "n_truncated"]
    if long.empty:
        return pd.DataFrame(columns=[*keys, "metric", *WIDE_FIXED, *tail])
    cols = _wide_columns(long)
    rows = []
    for key, g in long.groupby(keys, dropna=False, sort=True):
        rec: dict[str, Any] = dict(zip(keys, key, strict=True))
        rec["metric"] = g["metric"].iloc[0]
        values = dict(zip(g["column_name"], g["value"], strict=True))
        rec.update({c: values.get(c, np.nan) for c in cols})
        delta = g[g["column_name"] == "ΔTP"]
        rec["rel_drop"] = float(delta["rel_drop"].iloc[0]) if len(delta) and pd.notna(delta["rel_drop"].iloc[0]) \
            else np.nan
        for c in ("n_unparseable", "n_error", "n_truncated"):
            rec[c] = int(delta[c].iloc[0]) if len(delta) and c in delta and pd.notna(delta[c].iloc[0]) else 0
        rows.append(rec)
    return pd.DataFrame(rows, columns=[*keys, "metric", *cols, *tail])
