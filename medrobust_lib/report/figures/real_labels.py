"""One figure per real-label dataset: what each corruption type does to the real model's Dice.

Inputs are the rows of :func:`medrobust_lib.report.real_labels.real_label_type_stats` (the cells of
``segmentation_real_label_types`` with bootstrap CIs) and of ``segmentation_real_labels`` (the clean
Dice per model and dataset), already filtered to the selected models. matplotlib is imported inside
the functions (:mod:`medrobust_lib.report.figures.style`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.report.figures import style
from medrobust_lib.report.figures.paper import level_tick_labels, slug
from medrobust_lib.report.real_labels import NO_EFFECT_TOL

HURTS_COLOR = style.OKABE_ITO[3]
"""Vermillion: a positive mean drop (the corruption lowered the Dice)."""
HELPS_COLOR = style.OKABE_ITO[0]
"""Blue: a negative mean drop (the corruption raised the Dice)."""
ROW_IN = 0.1
"""Height per bar (inches): the 5 pt type labels need about 7 pt."""


def _subjects(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per (model, checkpoint, strategy), sorted; the label names the model, and the
    strategy when a model has several."""
    out = []
    keys = ["model", "checkpoint", "strategy"]
    for key, g in cells.groupby(keys, dropna=False, sort=True):
        model, _, strategy = key
        several = cells.loc[cells["model"] == model, "strategy"].nunique(dropna=False) > 1
        out.append((f"{model} ({strategy})" if several else str(model), g))
    return out


def _clean_text(clean: pd.DataFrame, g: pd.DataFrame) -> str:
    """``clean Dice 0.912, n=16`` of the subject of ``g`` (its first row's model, checkpoint,
    strategy) in ``clean``; '' when not there."""
    r = g.iloc[0]
    sel = (clean["model"] == r["model"]) & (clean["dataset"] == r["dataset"])
    for k in ("checkpoint", "strategy"):
        sel &= clean[k].isna() if pd.isna(r[k]) else clean[k] == r[k]
    hit = clean[sel]
    if hit.empty or pd.isna(hit["clean_dice"].iloc[0]):
        return ""
    return f"clean Dice {float(hit['clean_dice'].iloc[0]):.3f}, n={int(hit['n_images'].iloc[0])}"


def real_label_bars(cells: pd.DataFrame, clean: pd.DataFrame, out_dir: Path,
                    bands: Mapping[int, tuple[float, float]] | None = None, prefix: str = "real_labels_") -> list[Path]:
    """``<prefix><dataset>.png`` per dataset of ``cells``: one panel per (model, evaluated level)
    (two or three per row), one horizontal bar per corruption type (attacks left out: they are listed in the
    table) at its mean paired Dice drop (clean - perturbed), largest on top; bars below zero (the
    corruption helped) in blue, the others in vermillion; the bootstrap 95 % CI as whiskers (none
    below ``stats.min_n`` images); one x scale for the figure. The title names the dataset and the
    model's clean Dice and n (with several models, each panel names its own). A dataset whose clean
    score is at the floor is drawn in grey and says so. ``bands``: level -> stored SSIM band, shown
    in the panel titles."""
    paths: list[Path] = []
    corr = cells[(cells["condition"] == "perturbation") & cells["dice_drop"].notna()] if len(cells) else cells
    if corr.empty:
        return paths
    from matplotlib.ticker import MaxNLocator

    with style.paper_style() as plt:
        for dataset, d in corr.groupby("dataset", sort=True):
            subjects = _subjects(d)
            panels = [(label, lv, g[g["level"] == lv]) for label, g in subjects
                      for lv in sorted(int(v) for v in g["level"].unique())]
            ncols = min(len(panels), 2 if len(panels) in (2, 4) else 3)  # the full grid's 5 levels: 2 rows
            nrows = -(-len(panels) // ncols)
            n_max = max(len(p) for _, _, p in panels)
            fig, axes = plt.subplots(nrows, ncols, figsize=(style.ONE_COLUMN if ncols == 1 else style.TWO_COLUMN,
                                                            nrows * (ROW_IN * n_max + 0.7) + 0.5),
                                     squeeze=False, sharex=True, layout="constrained")
            floor = bool(d["floor_effect"].fillna(False).astype(bool).any()) if "floor_effect" in d else False
            for i, (label, lv, p) in enumerate(panels):
                ax = axes[i // ncols][i % ncols]
                p = p.sort_values(["dice_drop", "perturbation"], ascending=[False, True])
                est = p["dice_drop"].to_numpy(np.float64)
                lo = np.nan_to_num(np.clip(est - p["dice_drop_ci_low"].to_numpy(np.float64), 0, None))
                hi = np.nan_to_num(np.clip(p["dice_drop_ci_high"].to_numpy(np.float64) - est, 0, None))
                colors = [style.FLOOR_GREY if floor else HELPS_COLOR if v < -NO_EFFECT_TOL else HURTS_COLOR
                          for v in est]
                y = np.arange(len(p))
                ax.barh(y, est, 0.7, xerr=np.vstack([lo, hi]), color=colors, edgecolor="none",
                        error_kw={"elinewidth": 0.5, "capsize": 1.0, "capthick": 0.5, "ecolor": "0.25"})
                ax.axvline(0, color="k", lw=0.4)
                ax.set_yticks(y)
                ax.set_yticklabels([str(t) for t in p["perturbation"]], fontsize=5)
                ax.set_ylim(n_max - 0.5, -0.5)  # largest drop on top; one bar height in every panel
                ax.tick_params(axis="y", length=1.5)
                ax.grid(axis="x", alpha=0.3)
                if i // ncols == nrows - 1 or i + ncols >= len(panels):
                    ax.set_xlabel("Dice drop (clean - perturbed), 95% CI" if ncols < 3 else "Dice drop, 95% CI")
                    ax.xaxis.set_tick_params(labelbottom=True)
                ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
                tick = level_tick_labels([lv], bands=bands or {})[0].replace("\n", ", ")
                n_imgs = int(p["n_ok"].max()) if "n_ok" in p and p["n_ok"].notna().any() else 0
                tick += f"; {n_imgs} perturbed image{'s' if n_imgs != 1 else ''} per type (at most)"
                ax.set_title(tick if len(subjects) == 1 else f"{label}, {tick}\n{_clean_text(clean, p)}", fontsize=6)
            for j in range(len(panels), nrows * ncols):
                axes[j // ncols][j % ncols].set_visible(False)
            from matplotlib.patches import Patch

            handles = [Patch(color=HURTS_COLOR, label="hurts (drop > 0)"),
                       Patch(color=HELPS_COLOR, label="helps (drop < 0)")]
            fig.legend(handles=handles, loc="outside lower center", ncols=2)
            note = "\n(clean score at the floor: drops not informative)" if floor else ""
            label, g = subjects[0]
            who = f"\n{label}: {_clean_text(clean, g)}" if len(subjects) == 1 else ""
            fig.suptitle(f"{dataset}: mean Dice drop per corruption type{who}{note}")
            paths.append(style.save_figure(fig, out_dir / f"{prefix}{slug(dataset)}.png"))
    return paths
