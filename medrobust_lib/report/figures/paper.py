"""Paper figures (matplotlib Agg, deterministic: fixed sizes, sorted inputs, no timestamps).

Every figure is written three times by :func:`medrobust_lib.report.figures.style.save_figure`: PNG at
300 dpi plus PDF and SVG (vector), sized for a one-column (3.5 in) or two-column (7.2 in) layout,
Okabe-Ito colours (:mod:`medrobust_lib.report.figures.style`). The functions return the PNG paths.

Inputs are mart rows already filtered to the selected models: ``segmentation_by_level`` rows for
the robustness curves and the heatmap, ``strategy_ranking`` rows for the strategy bars,
``taxonomy_quadrants`` rows for the quadrant bars and the points of
:func:`medrobust_lib.taxonomy.aggregates.correlation_points` for the scatter. Level axes show
only the levels that were evaluated, each labelled with its SSIM band as stored with the
perturbed rows (``band_low`` / ``band_high``: :func:`stored_bands`; the suite may change the
default bands) for corruptions and its epsilon for attacks (:func:`level_tick_labels`). Rows flagged ``floor_effect`` (clean score at the floor: a
drop cannot be measured) are drawn in grey. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.report.figures import style
from medrobust_lib.report.table import fmt_float
from medrobust_lib.types import ATTACK_EPSILONS as EPSILONS

ATTACK = "attack"
"""Panel / family name of the adversarial attacks (conditions ``fgsm`` and ``pgd``)."""
DPI = style.DPI
HEATMAP_ROWS_PER_PANEL = 25
"""The type x level heatmap splits its rows into side-by-side panels of at most this many."""


def slug(name: object) -> str:
    """A file-name-safe version of a model, strategy or mode name."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", str(name)) or "_"


def _save(fig: Any, path: Path) -> Path:
    return style.save_figure(fig, path)


Bands = Mapping[int, tuple[float, float]]
"""Level -> (band_low, band_high) of the SSIM band the level's perturbed images were calibrated to."""


def stored_bands(rows: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """The SSIM band of each level as stored with the rows (columns ``level``, ``band_low``,
    ``band_high``, e.g. ``perturbation_manifest``; per level the lowest ``band_low`` and highest
    ``band_high``); {} when the rows carry no bands. Level 0 (clean) has none."""
    if rows.empty or not {"level", "band_low", "band_high"} <= set(rows.columns):
        return {}
    g = (rows.dropna(subset=["band_low", "band_high"]).groupby("level")
         .agg(lo=("band_low", "min"), hi=("band_high", "max")))
    return {int(lv): (float(lo), float(hi)) for lv, lo, hi in zip(g.index, g["lo"], g["hi"], strict=True)
            if int(lv) > 0}


def level_tick_labels(levels: Sequence[int], *, bands: Bands | None = None, corruption: bool = True,
                      attack: bool = False, short: bool = False) -> list[str]:
    """Tick labels of the evaluated ``levels`` (0 = clean): the level, its SSIM band from
    ``bands`` (``.80-.89``: the stored ``band_low`` / ``band_high``, :func:`stored_bands`; a level
    without a stored band shows none rather than a default) for corruptions and its L-infinity
    epsilon (``4/255``, ``types.ATTACK_EPSILONS``) for attacks, one per line."""

    out = []
    for lv in levels:
        lv = int(lv)
        if lv == 0:
            out.append("clean")
            continue
        parts = [f"L{lv}"]
        if corruption and bands and lv in bands:
            lo, hi = bands[lv]
            parts.append(f"{lo:.2f}-{hi:.2f}".replace("0.", ".") if short else f"SSIM {lo:.2f}-{hi:.2f}")
        if attack and lv in EPSILONS:
            parts.append(f"\u03b5 {EPSILONS[lv] * 255:.0f}/255")
        out.append("\n".join(parts))
    return out


def _floor_models(df: pd.DataFrame) -> set[str]:
    """Models whose rows carry ``floor_effect`` (every row of the model at the floor)."""
    if "floor_effect" not in df.columns or df.empty:
        return set()
    f = df.groupby("model")["floor_effect"].agg(lambda v: bool(pd.Series(v).fillna(False).astype(bool).all()))
    return {str(m) for m, v in f.items() if v}


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


def _level_axis(ax: Any, levels: Sequence[int], *, corruption: bool, attack: bool, short: bool = False,
                labels: bool = True, bands: Bands | None = None) -> None:
    """Categorical x axis: one tick per evaluated level (0 = clean), nothing in between."""
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels(level_tick_labels(levels, bands=bands, corruption=corruption, attack=attack, short=short)
                       if labels else [])
    ax.set_xlim(-0.3, len(levels) - 0.7)


def family_curves(by_level: pd.DataFrame, families: Mapping[str, str], out_dir: Path,
                  metric: str = "iou", bands: Bands | None = None) -> list[Path]:
    """``<model>_<metric>_drop_by_family.png`` (two-column width): one panel per perturbation
    family (from ``families``: type -> family; unknown types go to ``other``) plus one for the
    attacks, one line per type: mean paired ``<metric>_drop`` (clean - perturbed, 0 at clean) at
    the evaluated levels only (categorical axis, SSIM band / epsilon under each level)."""
    paths: list[Path] = []
    if by_level.empty:
        return paths
    drop = f"{metric}_drop"
    floor = _floor_models(by_level)
    with style.paper_style() as plt:
        for stem, g in _model_groups(by_level):
            g = g.copy()
            g["family"] = np.where(g["condition"] == "perturbation",
                                   g["perturbation"].map(lambda t: families.get(str(t), "other")), ATTACK)
            fams = sorted(f for f in g["family"].unique() if f != ATTACK)
            fams += [ATTACK] if (g["family"] == ATTACK).any() else []
            levels = [0, *sorted(int(v) for v in g["level"].unique())]
            ncols = min(3, len(fams))
            nrows = -(-len(fams) // ncols)
            fig, axes = plt.subplots(nrows, ncols, figsize=(style.TWO_COLUMN, 1.75 * nrows + 0.5), squeeze=False,
                                     sharey=True, layout="constrained")
            grey = str(g["model"].iloc[0]) in floor
            for i, fam in enumerate(fams):
                ax = axes[i // ncols][i % ncols]
                f = g[g["family"] == fam]
                for j, (ptype, t) in enumerate(f.groupby("perturbation", sort=True)):
                    t = t.groupby("level", sort=True)[drop].mean()
                    xs = [0, *(levels.index(int(lv)) for lv in t.index)]
                    st = style.series_style(j)
                    if grey:
                        st["color"] = style.FLOOR_GREY
                    ax.plot(xs, [0.0, *t.to_numpy()], ms=2.5, lw=1.0, label=str(ptype), **st)
                ax.axhline(0, color="k", lw=0.4)
                ax.set_title(fam)
                ax.grid(alpha=0.3)
                ax.legend(loc="upper left", handlelength=2.2, borderaxespad=0.2, labelspacing=0.2)
                _level_axis(ax, levels, corruption=fam != ATTACK, attack=fam == ATTACK, short=True,
                            bands=stored_bands(by_level) if bands is None else bands)
                ax.tick_params(axis="x", labelsize=5)
                if i % ncols == 0:
                    ax.set_ylabel(f"{_label(metric)} drop")
            for j in range(len(fams), nrows * ncols):
                axes[j // ncols][j % ncols].set_visible(False)
            note = " (clean score at the floor: drops not informative)" if grey else ""
            fig.suptitle(f"{stem}: {_label(metric)} drop (clean - perturbed) by family{note}")
            paths.append(_save(fig, out_dir / f"{slug(stem)}_{metric}_drop_by_family.png"))
    return paths


def _heatmap_order(g: pd.DataFrame, drop: str, rank_by: str) -> tuple[pd.DataFrame, list[str]]:
    """Rows: corruptions by their mean ``<rank_by>_drop`` over levels, largest first (IoU, the
    primary metric, by default, so the IoU and Dice heatmaps list the types in the same order),
    then the attacks."""
    mat = g.pivot_table(index="perturbation", columns="level", values=drop, aggfunc="mean")
    order = g.groupby("perturbation")[f"{rank_by}_drop"].mean()
    attacks = sorted(set(g.loc[g["condition"] != "perturbation", "perturbation"]) & set(mat.index))
    corr = mat.drop(index=attacks)
    corr = corr.loc[sorted(corr.index, key=lambda t: (-_nan_last(order.get(t)), t))]
    return pd.concat([corr, mat.loc[attacks]]), attacks


BAND_MISS_MARK = "*"
"""Heatmap mark of a cell with outputs that missed their level's SSIM band (left out of its mean by default)."""


def drop_heatmap(by_level: pd.DataFrame, out_dir: Path, metric: str = "iou", rank_by: str = "iou",
                 bands: Bands | None = None) -> list[Path]:
    """``<model>_<metric>_drop_heatmap.png``: rows = perturbation types (corruptions by mean
    ``<rank_by>_drop``, largest first, then the attacks), columns = the evaluated levels (SSIM band below), cell =
    mean paired ``<metric>_drop`` printed at 5.5 pt; diverging Okabe-Ito-compatible colours centred
    at 0 (PuOr: orange = worse than clean). More than :data:`HEATMAP_ROWS_PER_PANEL` rows are
    split into side-by-side panels (two-column width); fewer fit one column (3.5 in). A cell whose
    ``band_miss`` (outputs that missed the level's SSIM band, when ``by_level`` has the column) is
    above 0 is marked with :data:`BAND_MISS_MARK` after its value."""
    paths: list[Path] = []
    if by_level.empty:
        return paths
    drop = f"{metric}_drop"
    floor = _floor_models(by_level)
    with style.paper_style() as plt:
        for stem, g in _model_groups(by_level):
            mat, attacks = _heatmap_order(g, drop, rank_by)
            miss = (g.pivot_table(index="perturbation", columns="level", values="band_miss", aggfunc="sum")
                    .reindex(index=mat.index, columns=mat.columns).fillna(0)
                    if "band_miss" in g.columns else pd.DataFrame(0, index=mat.index, columns=mat.columns))
            vals_all = mat.to_numpy(dtype=np.float64)
            vmax = float(np.nanmax(np.abs(vals_all))) if np.isfinite(vals_all).any() else 1.0
            vmax = vmax or 1.0
            n_panels = -(-len(mat) // HEATMAP_ROWS_PER_PANEL)
            per = -(-len(mat) // n_panels)
            width = style.ONE_COLUMN if n_panels == 1 else style.TWO_COLUMN
            fig, axes = plt.subplots(1, n_panels, figsize=(width, 0.15 * per + 1.2), squeeze=False,
                                     layout="constrained")
            grey = str(g["model"].iloc[0]) in floor
            im = None
            for k in range(n_panels):
                ax = axes[0][k]
                part = mat.iloc[k * per:(k + 1) * per]
                vals = part.to_numpy(dtype=np.float64)
                missed = miss.iloc[k * per:(k + 1) * per].to_numpy(dtype=np.float64) > 0
                im = ax.imshow(np.ma.masked_invalid(vals), cmap="Greys" if grey else "PuOr_r", vmin=-vmax,
                               vmax=vmax, aspect="auto")
                for i in range(vals.shape[0]):
                    for j in range(vals.shape[1]):
                        if np.isfinite(vals[i, j]):
                            mark = BAND_MISS_MARK if missed[i, j] else ""
                            ax.text(j, i, fmt_float(vals[i, j], 2) + mark, ha="center", va="center", fontsize=5,
                                    color="white" if abs(vals[i, j]) > 0.6 * vmax else "black")
                levels = [int(c) for c in part.columns]
                ax.set_xticks(range(len(levels)))
                ax.set_xticklabels(level_tick_labels(levels, bands=stored_bands(by_level) if bands is None else bands,
                                                     short=True), fontsize=5)
                ax.set_yticks(range(len(part)))
                ax.set_yticklabels([f"{t} (attack)" if t in attacks else str(t) for t in part.index], fontsize=5.5)
                ax.tick_params(length=2)
            note = " (floor)" if grey else ""
            fig.suptitle(f"{stem}: {_label(metric)} drop by type and level (rows by {_label(rank_by)} drop){note}")
            if im is not None:
                fig.colorbar(im, ax=list(axes[0]), shrink=0.6, aspect=30,
                             label=f"{_label(metric)} drop (clean - perturbed)")
            paths.append(_save(fig, out_dir / f"{slug(stem)}_{metric}_drop_heatmap.png"))
    return paths


def _nan_last(v: object) -> float:
    """A sort value for a mean drop: NaN / missing sorts after every number (descending order)."""
    x = float(v) if v is not None else float("nan")  # type: ignore[arg-type]
    return float("-inf") if np.isnan(x) else x


def _strategy_label(rows: pd.DataFrame, strategy: str) -> str:
    """A strategy's tick label: ``lora (tie)`` when its corruption rank is shared (overlapping CIs),
    ``lora (no CI: small n)`` when it has no CI (fewer samples than ``stats.min_n``)."""
    r = rows[rows["strategy"] == strategy]
    if r.empty:
        return strategy
    row = r.iloc[0]
    if "tied" in r.columns and not pd.isna(row["tied"]) and bool(row["tied"]):
        return f"{strategy} (tie)"
    if pd.isna(row.get("iou_drop_ci_low")) and not pd.isna(row.get("mean_iou_drop")):
        return f"{strategy} (no CI: small n)"
    return strategy


def strategy_bars(ranking: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``strategy_iou_drop.png`` (one column per model, 3.5 in each up to two columns' width): one
    panel per model, strategies on y (ordered by their corruption rank, rank 1 on top), horizontal
    bars of the mean IoU drop under corruptions and under attacks with the bootstrap 95 % CI as
    asymmetric error bars; a strategy tied with another (overlapping CIs) is labelled ``(tie)``, one
    without a CI (fewer samples than ``stats.min_n``) ``(no CI: small n)``."""
    if ranking.empty:
        return []
    models = sorted(ranking["model"].unique())
    kinds = sorted(ranking["kind"].unique(), key=lambda k: (k != "corruption", k))  # corruption first
    width = 0.8 / max(len(kinds), 1)
    with style.paper_style() as plt:
        fig, axes = plt.subplots(1, len(models), figsize=(min(style.ONE_COLUMN * len(models), style.TWO_COLUMN), 2.6),
                                 squeeze=False, layout="constrained")
        for ax, model in zip(axes[0], models, strict=True):
            g = ranking[ranking["model"] == model]
            first = g[g["kind"] == kinds[0]].sort_values(["rank", "strategy"])
            strategies = [*first["strategy"], *sorted(set(g["strategy"]) - set(first["strategy"]))]
            y = np.arange(len(strategies))
            for k, kind in enumerate(kinds):
                r = g[g["kind"] == kind].set_index("strategy").reindex(strategies)
                est = r["mean_iou_drop"].to_numpy(np.float64)
                lo = np.clip(est - r["iou_drop_ci_low"].to_numpy(np.float64), 0, None)
                hi = np.clip(r["iou_drop_ci_high"].to_numpy(np.float64) - est, 0, None)
                ax.barh(y + (k - (len(kinds) - 1) / 2) * width, est, width, xerr=np.vstack([lo, hi]), capsize=1.5,
                        color=style.color(k), hatch=None if k == 0 else "//", edgecolor="white", lw=0.3,
                        error_kw={"elinewidth": 0.6}, label=kind)
            ax.axvline(0, color="k", lw=0.4)
            ax.set_yticks(y)
            ax.set_yticklabels([_strategy_label(first, st) for st in strategies])
            ax.invert_yaxis()  # rank 1 on top
            ax.set_xlabel("mean IoU drop (95% CI)")
            ax.set_title(str(model))
            ax.grid(axis="x", alpha=0.3)
            ax.legend(loc="lower right")
        return [_save(fig, out_dir / "strategy_iou_drop.png")]


TRADEOFF_STEM = "tradeoff_clean_vs_drop"
"""File stem of the performance-robustness trade-off figure."""


def tradeoff_scatter(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``tradeoff_clean_vs_drop.png`` (two-column width): the performance-robustness trade-off, one
    panel per metric (IoU, then Dice): x = the clean score, y = the mean corruption drop (the mean over
    corruption types of each type's mean paired drop, ``segmentation_model_summary``), one point per
    (model, checkpoint, strategy) row of ``summary`` (filled; a hollow twin at its mean attack drop
    where it was attacked), told apart by colour and marker and named in the legend below. Rows with
    ``floor_effect`` are grey. A point up and right is accurate but fragile, down and right accurate
    and robust. [] when no row has both a clean score and a corruption drop."""
    need = {"model", "clean_iou", "corruption_iou_drop", "clean_dice", "corruption_dice_drop"}
    if summary.empty or not need <= set(summary.columns):
        return []
    rows = summary.dropna(subset=["clean_iou", "corruption_iou_drop"]).reset_index(drop=True)
    if rows.empty:
        return []
    strategies = rows["strategy"].astype(object).where(rows["strategy"].notna(), None) \
        if "strategy" in rows.columns else pd.Series([None] * len(rows))
    several = rows["model"].duplicated(keep=False)
    labels = [f"{m} ({s})" if dup and s else str(m)
              for m, s, dup in zip(rows["model"], strategies, several, strict=True)]
    floor = rows["floor_effect"].fillna(False).astype(bool) if "floor_effect" in rows.columns \
        else pd.Series(False, index=rows.index)
    attack = {m: (pd.to_numeric(rows[f"attack_{m}_drop"], errors="coerce").to_numpy(np.float64)
                  if f"attack_{m}_drop" in rows.columns else np.full(len(rows), np.nan)) for m in ("iou", "dice")}
    attacked = bool(np.isfinite(attack["iou"]).any())
    with style.paper_style() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(style.TWO_COLUMN, 2.9), squeeze=False, layout="constrained")
        handles = []
        for ax, metric in zip(axes[0], ("iou", "dice"), strict=True):
            for i, label in enumerate(labels):
                st = style.series_style(i)
                col = style.FLOOR_GREY if floor.iloc[i] else st["color"]
                x, y = rows.at[i, f"clean_{metric}"], rows.at[i, f"corruption_{metric}_drop"]
                h = ax.scatter([x], [y], marker=st["marker"], color=col, s=18, zorder=3,
                               label=label + (" (floor)" if floor.iloc[i] else ""))
                if metric == "iou":
                    handles.append(h)
                a = attack[metric][i]
                if np.isfinite(a):
                    ax.scatter([x], [a], marker=st["marker"], facecolors="none", edgecolors=col, s=18, lw=0.7,
                               zorder=3)
            ax.axhline(0, color="k", lw=0.4)
            ax.set_xlabel(f"clean {_label(metric)}")
            ax.set_ylabel(f"mean {_label(metric)} drop (clean - perturbed)")
            ax.set_title(f"{_label(metric)}: clean score vs robustness")
            ax.grid(alpha=0.3)
        ncol = min(4, len(handles))
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, handletextpad=0.3, columnspacing=1.0)
        if attacked:
            fig.suptitle("Filled: corruptions (mean over types); hollow: attacks (FGSM/PGD, mean over eps)")
        return [_save(fig, out_dir / f"{TRADEOFF_STEM}.png")]
