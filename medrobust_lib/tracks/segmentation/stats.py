"""Segmentation statistics and figures: bootstrap CIs, paired Wilcoxon with Benjamini-Hochberg,
robustness curves. Computed from the result rows; written as the ``segmentation_stats`` table.

Off-band rows (issue 30): a corruption row whose perturbed output missed its level's SSIM band
(``band_reached`` false in ``perturbation_manifest``) is left out of the mart's default views, so
the statistics those views show are computed on the same rows: scopes ``in_band`` and
``floor_excluded_in_band`` (written when some row is off-band) leave the off-band rows out, and
scopes ``all`` and ``floor_excluded`` keep every ok row (what ``--include-off-band`` shows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.hashing import digest
from medrobust_lib.metrics.stats import benjamini_hochberg, bootstrap_ci, wilcoxon_paired
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import results
from medrobust_lib.store.views.common import dataset_floors, text_keys
from medrobust_lib.tracks.off_band import MANIFEST_TABLE, off_band

STATS_TABLE = "segmentation_stats"
N_BOOT = 1000


SCOPE_ALL, SCOPE_FLOOR_EXCLUDED = "all", "floor_excluded"
"""``scope`` of a ``segmentation_stats`` row: every dataset, or the datasets at the floor left out."""
IN_BAND_SUFFIX = "_in_band"
SCOPE_IN_BAND, SCOPE_FLOOR_EXCLUDED_IN_BAND = "in_band", SCOPE_FLOOR_EXCLUDED + IN_BAND_SUFFIX
"""The same two scopes with the off-band rows left out (the rows of the mart's default views)."""
def floor_datasets(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, checkpoint, strategy, dataset) with ok clean rows: ``floor_effect`` = mean clean
    IoU or Dice below :data:`~medrobust_lib.store.views.common.SEG_FLOOR`: the mart's rule
    (``SEGMENTATION_FLOOR_SQL``) run by :func:`~medrobust_lib.store.views.common.dataset_floors`."""
    keys = ["model", "checkpoint", "strategy", "dataset"]
    clean = df[(df["condition"] == "clean") & (df["status"] == "ok")]
    if clean.empty:
        return pd.DataFrame(columns=[*keys, "floor_effect"])
    return dataset_floors(clean).rename(columns={"floor": "floor_effect"})[[*keys, "floor_effect"]]


def _floor_excluded_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the mart's default views average: floor datasets left out, except for a model whose
    every dataset is at the floor (kept whole, flagged there); empty when nothing is left out."""
    keys = ["model", "checkpoint", "strategy"]
    floor = floor_datasets(df)
    if floor.empty or not floor["floor_effect"].any():
        return df.iloc[0:0]
    all_floor = floor.groupby(keys, dropna=False)["floor_effect"].transform("all")
    drop = floor[floor["floor_effect"] & ~all_floor]
    if drop.empty:
        return df.iloc[0:0]
    keyed = text_keys(df)
    marked = keyed.merge(drop.assign(_drop=True), on=[*keys, "dataset"], how="left")
    affected = keyed.merge(drop[keys].drop_duplicates().assign(_model=True), on=keys, how="left")["_model"].eq(True)
    keep = marked["_drop"].ne(True).to_numpy() & affected.to_numpy()
    return df[keep]


def _stats_rows(ok: pd.DataFrame, seed: int, scope: str, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    keys = ["model", "checkpoint", "strategy", "condition", "perturbation", "level"]
    rows = []
    nan = float("nan")
    for key, g in ok.groupby(keys, sort=True):
        rec = dict(zip(keys, key, strict=True))
        ilo = ihi = dlo = dhi = p = nan
        if len(g) >= min_n:  # below the floor: the means only, no CI, no p (so no q)
            rng = rng_for(seed, "segstats", *map(str, key)) if scope == SCOPE_ALL else \
                rng_for(seed, "segstats", scope, *map(str, key))
            _, ilo, ihi = bootstrap_ci(g["iou_drop"].to_numpy(), n_boot=N_BOOT, rng=rng)
            _, dlo, dhi = bootstrap_ci(g["dice_drop"].to_numpy(), n_boot=N_BOOT, rng=rng)
            _, p = wilcoxon_paired(g["clean_iou"].to_numpy(), g["iou"].to_numpy())
        rec.update(n=len(g), iou=g["iou"].mean(), dice=g["dice"].mean(), iou_drop=g["iou_drop"].mean(),
                   iou_drop_ci_low=ilo, iou_drop_ci_high=ihi, dice_drop=g["dice_drop"].mean(),
                   dice_drop_ci_low=dlo, dice_drop_ci_high=dhi, wilcoxon_p=p)
        rows.append(rec)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["wilcoxon_q"] = np.nan
    for _, idx in out.groupby(["model", "checkpoint", "strategy"]).groups.items():
        out.loc[idx, "wilcoxon_q"] = benjamini_hochberg(out.loc[idx, "wilcoxon_p"].to_numpy())
    out["scope"] = scope
    return out


def segmentation_stats(df: pd.DataFrame, seed: int = 0, min_n: int = DEFAULT_MIN_N,
                       bands: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (model, checkpoint, strategy, condition, perturbation, level) and ``scope``: n,
    mean IoU and Dice, mean drops with bootstrap 95% CIs over images, paired Wilcoxon p (clean vs
    condition IoU, the primary metric) and the Benjamini-Hochberg q over the model's type x level
    grid. Scope ``all`` pools every dataset; ``floor_excluded`` repeats the statistics without the
    datasets at the floor (:func:`floor_datasets`), for the models that have some (the rows the
    mart's default views average), so those views carry CIs too. A cell with fewer than ``min_n``
    images (the suite's ``stats.min_n``) keeps its n and means but gets no CI, no p and no q.

    ``bands``: the ``perturbation_manifest`` rows (:func:`off_band`). When some corruption row is
    off-band, both scopes are repeated without the off-band rows (``in_band``,
    ``floor_excluded_in_band``: the rows of the mart's default views, whose CIs come from them);
    ``all`` and ``floor_excluded`` keep every ok row (``--include-off-band``)."""
    if df.empty:
        return pd.DataFrame()
    missed = off_band(df, bands)
    out = _scope_rows(df, seed, min_n, "")
    if missed.any():
        out = pd.concat([out, _scope_rows(df[~missed], seed, min_n, IN_BAND_SUFFIX)], ignore_index=True)
    return out


def _scope_rows(df: pd.DataFrame, seed: int, min_n: int, suffix: str) -> pd.DataFrame:
    """The ``all`` and (where floor datasets are left out) ``floor_excluded`` statistics of ``df``;
    ``suffix`` ``_in_band`` names the scopes of the in-band rows (``in_band`` for ``all``)."""
    perturbed = (df["status"] == "ok") & (df["condition"] != "clean")
    out = _stats_rows(df[perturbed], seed, SCOPE_IN_BAND if suffix else SCOPE_ALL, min_n)
    excluded = _floor_excluded_rows(df)
    if len(excluded):
        kept = excluded[(excluded["status"] == "ok") & (excluded["condition"] != "clean")]
        out = pd.concat([out, _stats_rows(kept, seed, SCOPE_FLOOR_EXCLUDED + suffix, min_n)], ignore_index=True)
    return out


def write_segmentation_stats(results_dir: str | Path, seed: int = 0, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Recompute the stats table from every result row (one chunk per model), with the band flags of
    the results' ``perturbation_manifest``."""
    df = results.read_table(results_dir, "segmentation_results")
    stats = segmentation_stats(df, seed, min_n, results.read_table(results_dir, MANIFEST_TABLE))
    results.write_per_key(results_dir, STATS_TABLE, stats, "model", digest(["stats", len(stats)]))
    return stats


def write_model_stats(results_dir: str | Path, model: str, seed: int = 0, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Recompute and write the stats chunk of one ``model`` only (the other models' chunks are left
    alone, so evaluations of different models may write concurrently)."""
    df = results.read_table(results_dir, "segmentation_results")
    stats = segmentation_stats(df[df["model"] == model] if len(df) else df, seed, min_n,
                               results.read_table(results_dir, MANIFEST_TABLE))
    if len(stats):
        results.write_chunk(results.chunk_path(results_dir, STATS_TABLE, {"model": model}, "stats"), stats,
                            digest(["stats", len(stats)]))
    return stats
