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
    """One figure per model, one column wide (``<model>_<metric>_curves.png`` + PDF + SVG): the
    paired ``metric`` drop (default IoU, the primary metric; clean minus condition, so 0 at clean) at the levels that were
    evaluated (categorical axis: no line spans a level that was not evaluated), each labelled with
    its SSIM band and attack epsilon; each corruption type (thin grey), their mean (thick) and the
    two attacks (dashed). Drops, not raw scores, because each type covers its own modalities'
    images. A model whose rows carry ``floor_effect`` is drawn in grey and says so."""
    from medrobust_lib.report import style
    from medrobust_lib.report.paper_figures import level_tick_labels

    paths: list[Path] = []
    if stats.empty:
        return paths
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drop = f"{metric}_drop"
    with style.paper_style() as plt:
        for model, g in stats.groupby("model"):
            floor = "floor_effect" in g.columns and bool(g["floor_effect"].fillna(False).astype(bool).all())
            levels = [0, *sorted(int(v) for v in g["level"].unique())]
            pos = {lv: i for i, lv in enumerate(levels)}
            fig, ax = plt.subplots(figsize=(style.ONE_COLUMN, 2.6), layout="constrained")
            corr = g[g["condition"] == "perturbation"]
            for _, t in corr.groupby("perturbation"):
                t = t.sort_values("level")
                ax.plot([0, *(pos[int(v)] for v in t["level"])], [0.0, *t[drop]], color="0.8", lw=0.5)
            mean = corr.groupby("level")[drop].mean()
            main = style.FLOOR_GREY if floor else style.color(0)
            ax.plot([0, *(pos[int(v)] for v in mean.index)], [0.0, *mean.values], color=main, lw=1.8, marker="o",
                    label="corruptions (mean over types)")
            for i, kind in enumerate(["fgsm", "pgd"]):
                t = g[g["perturbation"] == kind].sort_values("level")
                if len(t):
                    ax.plot([0, *(pos[int(v)] for v in t["level"])], [0.0, *t[drop]], ls="--",
                            marker=style.MARKERS[i + 1], color=style.FLOOR_GREY if floor else style.color(i + 1),
                            lw=1.2, label=kind.upper())
            ax.axhline(0, color="k", lw=0.4)
            has_attack = bool(g["condition"].isin(["fgsm", "pgd"]).any())
            ax.set_xticks(range(len(levels)))
            ax.set_xticklabels(level_tick_labels(levels, attack=has_attack, short=True), fontsize=5.5)
            ax.set_xlim(-0.3, len(levels) - 0.7)
            ax.set_xlabel("evaluated level (SSIM band" + ("; attack \u03b5" if has_attack else "") + ")")
            ax.set_ylabel(f"{_label(metric)} drop (paired)")
            ax.set_title(f"{model}: {metric} drop" + (" (clean score at the floor)" if floor else ""))
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left")
            p = out / f"{model}_{metric}_curves.png"
            paths.append(style.save_figure(fig, p))
    return paths


def _label(metric: str) -> str:
    return {"iou": "IoU", "dice": "Dice"}.get(metric, metric)
