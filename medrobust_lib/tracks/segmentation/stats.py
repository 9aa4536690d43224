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


def robustness_curves(stats: pd.DataFrame, out_dir: str | Path, metric: str = "iou") -> list[Path]:
    """One PNG per model: the paired ``metric`` drop (default IoU, the primary metric) (clean minus condition, so 0 at level 0) vs
    severity level for each corruption type (thin lines), their mean (thick) and the two attacks
    (dashed). Drops, not raw scores, because each type covers its own modalities' images."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    if stats.empty:
        return paths
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drop = f"{metric}_drop"
    for model, g in stats.groupby("model"):
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        corr = g[g["condition"] == "perturbation"]
        for _, t in corr.groupby("perturbation"):
            t = t.sort_values("level")
            ax.plot([0, *t["level"]], [0.0, *t[drop]], color="0.75", lw=0.7)
        mean = corr.groupby("level")[drop].mean()
        ax.plot([0, *mean.index], [0.0, *mean.values], color="C0", lw=2.5, label="corruptions (mean over types)")
        for i, kind in enumerate(["fgsm", "pgd"]):
            t = g[g["perturbation"] == kind].sort_values("level")
            if len(t):
                ax.plot([0, *t["level"]], [0.0, *t[drop]], "--", color=f"C{i + 1}", lw=2, label=kind.upper())
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("severity level (0 = clean; attacks: eps = 2, 4, 6, 8, 10 /255)")
        ax.set_ylabel(f"{_label(metric)} drop (clean - condition, paired)")
        ax.set_title(f"{model}: {_label(metric)} drop under corruption and attack")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        fig.tight_layout()
        p = out / f"{model}_{metric}_curves.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


def _label(metric: str) -> str:
    return {"iou": "IoU", "dice": "Dice"}.get(metric, metric)
