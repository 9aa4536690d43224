"""Segmentation statistics and figures: bootstrap CIs, paired Wilcoxon with Benjamini-Hochberg,
robustness curves. Computed from the result rows; written as the ``segmentation_stats`` table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.metrics.stats import benjamini_hochberg, bootstrap_ci, wilcoxon_paired
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import results

STATS_TABLE = "segmentation_stats"
N_BOOT = 1000


def segmentation_stats(df: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per (model, checkpoint, strategy, condition, perturbation, level): n, mean IoU and
    Dice, mean drops with bootstrap 95% CIs over images, paired Wilcoxon p (clean vs condition
    IoU, the primary metric) and the Benjamini-Hochberg q over the model's type x level grid."""
    if df.empty:
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & (df["condition"] != "clean")]
    keys = ["model", "checkpoint", "strategy", "condition", "perturbation", "level"]
    rows = []
    for key, g in ok.groupby(keys, sort=True):
        rec = dict(zip(keys, key, strict=True))
        rng = rng_for(seed, "segstats", *map(str, key))
        _, ilo, ihi = bootstrap_ci(g["iou_drop"].to_numpy(), n_boot=N_BOOT, rng=rng)
        _, dlo, dhi = bootstrap_ci(g["dice_drop"].to_numpy(), n_boot=N_BOOT, rng=rng)
        _, p = wilcoxon_paired(g["clean_iou"].to_numpy(), g["iou"].to_numpy())
        rec.update(n=len(g), iou=g["iou"].mean(), dice=g["dice"].mean(), iou_drop=g["iou_drop"].mean(),
                   iou_drop_ci_low=ilo, iou_drop_ci_high=ihi, dice_drop=g["dice_drop"].mean(),
                   dice_drop_ci_low=dlo, dice_drop_ci_high=dhi, wilcoxon_p=p)
        rows.append(rec)
    out = pd.DataFrame(rows)
    out["wilcoxon_q"] = np.nan
    for _, idx in out.groupby(["model", "checkpoint", "strategy"]).groups.items():
        out.loc[idx, "wilcoxon_q"] = benjamini_hochberg(out.loc[idx, "wilcoxon_p"].to_numpy())
    return out


def write_segmentation_stats(results_dir: str | Path, seed: int = 0) -> pd.DataFrame:
    """Recompute the stats table from every result row (one chunk per model)."""
    df = results.read_table(results_dir, "segmentation_results")
    stats = segmentation_stats(df, seed)
    results.write_per_key(results_dir, STATS_TABLE, stats, "model", results.fingerprint(["stats", len(stats)]))
    return stats
