"""Segmentation figures: robustness curves per model (paired drop vs the evaluated levels)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from medrobust_lib.report.figures import style


def robustness_curves(stats: pd.DataFrame, out_dir: str | Path, metric: str = "iou",
                      bands: Mapping[int, tuple[float, float]] | None = None) -> list[Path]:
    """One figure per model, one column wide (``<model>_<metric>_curves.png`` + PDF + SVG): the
    paired ``metric`` drop (default IoU, the primary metric; clean minus condition, so 0 at clean) at the levels that were
    evaluated (categorical axis: no line spans a level that was not evaluated), each labelled with
    its SSIM band (``bands``: the stored ``band_low`` / ``band_high`` per level, by default those
    of ``stats`` itself, :func:`~medrobust_lib.report.figures.paper.stored_bands`) and attack epsilon; each corruption type (thin grey), their mean (thick) and the
    two attacks (dashed). Drops, not raw scores, because each type covers its own modalities'
    images. A model whose rows carry ``floor_effect`` is drawn in grey and says so."""
    from medrobust_lib.report.figures.paper import level_tick_labels, stored_bands

    paths: list[Path] = []
    if stats.empty:
        return paths
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drop = f"{metric}_drop"
    bands = stored_bands(stats) if bands is None else bands
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
            ax.set_xticklabels(level_tick_labels(levels, bands=bands, attack=has_attack, short=True), fontsize=5.5)
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
