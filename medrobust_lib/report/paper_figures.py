"""Paper figures (PNG, matplotlib Agg, deterministic: fixed sizes, sorted inputs, no timestamps).

Inputs are mart rows already filtered to the selected models: ``segmentation_by_level`` rows for
the robustness curves and the heatmap, ``strategy_ranking`` rows for the strategy bars,
``taxonomy_quadrants`` rows for the quadrant bars and the points of
:func:`medrobust_lib.tracks.taxonomy.stats.correlation_points` for the scatter. Every function
returns the paths it wrote (none for empty input). matplotlib is imported inside the functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.report.table import fmt_float

ATTACK = "attack"
"""Panel / family name of the adversarial attacks (conditions ``fgsm`` and ``pgd``)."""
DPI = 120


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def slug(name: object) -> str:
    """A file-name-safe version of a model, strategy or mode name."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", str(name)) or "_"


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None}, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _model_groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(file stem, rows) per model; per (model, strategy) when a model has several strategies."""
    out: list[tuple[str, pd.DataFrame]] = []
    for model, g in df.groupby("model", sort=True):
        strategies = sorted(g["strategy"].dropna().unique()) if "strategy" in g.columns else []
        if len(strategies) > 1:
            out += [(f"{model}_{s}", g[g["strategy"] == s]) for s in strategies]
        else:
            out.append((str(model), g))
    return out


def _label(metric: str) -> str:
    """Display name of a metric column prefix: ``iou`` -> IoU, ``dice`` -> Dice."""
    return {"iou": "IoU", "dice": "Dice"}.get(metric, metric)


def family_curves(by_level: pd.DataFrame, families: Mapping[str, str], out_dir: Path,
                  metric: str = "iou") -> list[Path]:
    """``<model>_<metric>_drop_by_family.png``: one panel per perturbation family (from
    ``families``: type -> family; unknown types go to ``other``) plus one for the attacks, one line
    per type: mean paired ``<metric>_drop`` (clean - perturbed, 0 at level 0) vs severity level."""
    paths: list[Path] = []
    if by_level.empty:
        return paths
    plt = _pyplot()
    drop = f"{metric}_drop"
    for stem, g in _model_groups(by_level):
        g = g.copy()
        g["family"] = np.where(g["condition"] == "perturbation",
                               g["perturbation"].map(lambda t: families.get(str(t), "other")), ATTACK)
        fams = sorted(f for f in g["family"].unique() if f != ATTACK)
        fams += [ATTACK] if (g["family"] == ATTACK).any() else []
        ncols = min(4, len(fams))
        nrows = -(-len(fams) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False, sharex=True,
                                 sharey=True)
        for i, fam in enumerate(fams):
            ax = axes[i // ncols][i % ncols]
            f = g[g["family"] == fam]
            for j, (ptype, t) in enumerate(f.groupby("perturbation", sort=True)):
                t = t.groupby("level", sort=True)[drop].mean()
                ax.plot([0, *t.index], [0.0, *t.to_numpy()], marker="o", ms=2.5, lw=1.2, color=f"C{j % 10}",
                        ls="-" if j < 10 else "--", label=str(ptype))
            ax.axhline(0, color="k", lw=0.5)
            ax.set_title(fam, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, loc="upper left")
            if i % ncols == 0:
                ax.set_ylabel(f"{_label(metric)} drop")
            if i // ncols == nrows - 1:
                ax.set_xlabel("severity level")
        for j in range(len(fams), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        fig.suptitle(f"{stem}: {_label(metric)} drop (clean - perturbed) by family and type", fontsize=10)
        fig.tight_layout()
        paths.append(_save(fig, out_dir / f"{slug(stem)}_{metric}_drop_by_family.png"))
    return paths


def drop_heatmap(by_level: pd.DataFrame, out_dir: Path, metric: str = "iou", rank_by: str = "iou") -> list[Path]:
    """``<model>_<metric>_drop_heatmap.png``: rows = perturbation types (corruptions by their mean
    ``<rank_by>_drop`` over levels, largest first: IoU, the primary metric, by default, so the IoU and
    Dice heatmaps list the types in the same order; then the attacks), columns = levels 1-5, cell =
    mean paired ``<metric>_drop``, diverging colours centred at 0 (red = worse than clean), values
    printed in the cells."""
    paths: list[Path] = []
    if by_level.empty:
        return paths
    plt = _pyplot()
    drop = f"{metric}_drop"
    for stem, g in _model_groups(by_level):
        mat = g.pivot_table(index="perturbation", columns="level", values=drop, aggfunc="mean")
        order = g.groupby("perturbation")[f"{rank_by}_drop"].mean()
        attacks = sorted(set(g.loc[g["condition"] != "perturbation", "perturbation"]))
        corr = mat.drop(index=[a for a in attacks if a in mat.index])
        corr = corr.loc[sorted(corr.index, key=lambda t: (-_nan_last(order.get(t)), t))]
        mat = pd.concat([corr, mat.loc[[a for a in attacks if a in mat.index]]])
        vals = mat.to_numpy(dtype=np.float64)
        vmax = float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 1.0
        vmax = vmax or 1.0
        fig, ax = plt.subplots(figsize=(5.2, 0.24 * len(mat) + 1.6))
        im = ax.imshow(np.ma.masked_invalid(vals), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
        for i in range(vals.shape[0]):
            for j in range(vals.shape[1]):
                if np.isfinite(vals[i, j]):
                    ax.text(j, i, fmt_float(vals[i, j], 2), ha="center", va="center", fontsize=5.5,
                            color="white" if abs(vals[i, j]) > 0.6 * vmax else "black")
        ax.set_xticks(range(len(mat.columns)))
        ax.set_xticklabels([str(int(c)) for c in mat.columns], fontsize=8)
        ax.set_yticks(range(len(mat)))
        ax.set_yticklabels([f"{t} (attack)" if t in attacks else str(t) for t in mat.index], fontsize=6.5)
        ax.set_xlabel("severity level")
        ax.set_title(f"{stem}: {_label(metric)} drop by type and level (rows by mean {_label(rank_by)} drop)",
                     fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.6, label=f"{_label(metric)} drop (clean - perturbed)")
        fig.tight_layout()
        paths.append(_save(fig, out_dir / f"{slug(stem)}_{metric}_drop_heatmap.png"))
    return paths


def _nan_last(v: object) -> float:
    """A sort value for a mean drop: NaN / missing sorts after every number (descending order)."""
    x = float(v) if v is not None else float("nan")  # type: ignore[arg-type]
    return float("-inf") if np.isnan(x) else x


def strategy_bars(ranking: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``strategy_iou_drop.png``: one panel per model, strategies on x (ordered by their corruption
    rank), side-by-side bars of the mean IoU drop under corruptions and under attacks with the
    bootstrap 95 % CI as asymmetric error bars."""
    if ranking.empty:
        return []
    plt = _pyplot()
    models = sorted(ranking["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(max(5.0, 0.9 * ranking["strategy"].nunique() + 2.5)
                                                      * len(models), 4.0), squeeze=False)
    kinds = sorted(ranking["kind"].unique(), key=lambda k: (k != "corruption", k))  # corruption first
    width = 0.8 / max(len(kinds), 1)
    for ax, model in zip(axes[0], models, strict=True):
        g = ranking[ranking["model"] == model]
        first = g[g["kind"] == kinds[0]].sort_values(["rank", "strategy"])
        strategies = [*first["strategy"], *sorted(set(g["strategy"]) - set(first["strategy"]))]
        x = np.arange(len(strategies))
        for k, kind in enumerate(kinds):
            r = g[g["kind"] == kind].set_index("strategy").reindex(strategies)
            est = r["mean_iou_drop"].to_numpy(np.float64)
            lo = np.clip(est - r["iou_drop_ci_low"].to_numpy(np.float64), 0, None)
            hi = np.clip(r["iou_drop_ci_high"].to_numpy(np.float64) - est, 0, None)
            ax.bar(x + (k - (len(kinds) - 1) / 2) * width, est, width, yerr=np.vstack([lo, hi]), capsize=3,
                   color="C0" if kind == "corruption" else f"C{k + 2}", label=kind)
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xticks(x)
        ax.set_xticklabels(strategies, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("mean IoU drop (clean - perturbed)")
        ax.set_title(str(model), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Fine-tuning strategies: IoU drop with bootstrap 95% CI", fontsize=10)
    fig.tight_layout()
    return [_save(fig, out_dir / "strategy_iou_drop.png")]
