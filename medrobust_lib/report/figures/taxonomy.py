"""Safety-taxonomy figures: stacked quadrant-share bars (:func:`quadrant_bars`, from the
``taxonomy_quadrants`` view), clean -> perturbed quadrant transition heatmaps
(:func:`transition_heatmaps`, from ``taxonomy_transitions``) and the flip rate vs Dangerous share
scatter of the headline (:func:`flip_vs_dangerous_scatter`: clean points from
:func:`medrobust_lib.taxonomy.aggregates.correlation_points`, r from the ``headline`` correlation rows).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from medrobust_lib.report.figures import style
from medrobust_lib.store.schema import QUADRANTS
from medrobust_lib.taxonomy.aggregates import POINT_KEYS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

QUADRANT_COLORS: dict[str, str] = {
    "Ideal": "#009E73", "Fragile": "#E69F00", "Dangerous": "#D55E00", "Worst": "#000000",
}
"""Fixed quadrant colours used by every figure (Okabe-Ito, colour-blind safe): bluish green,
orange, vermillion, black."""
QUADRANT_HATCHES: dict[str, str | None] = {"Ideal": None, "Fragile": "///", "Dangerous": "...", "Worst": None}
"""Hatches that tell the quadrants apart in greyscale print too."""
_MARKERS: dict[str, str] = {"none": "o", "blank": "s", "noise": "^"}
_CONDITION_MARKER = "h"
"""Marker of the clean (filled) / perturbed (hollow) legend entries: no image mode uses it."""


def _slug(name: object) -> str:
    """A file-name-safe version of a configuration or mode name."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", str(name)) or "_"


def _share_table(stats: pd.DataFrame) -> pd.DataFrame:
    """Quadrant shares wide: one row per (config, dataset, perturbation, level, image_mode), one
    column per quadrant (missing quadrants 0); cells without any share (no ok rows) are dropped."""
    keys = list(POINT_KEYS)
    s = stats[stats["share"].notna()].copy()
    if s.empty:
        return pd.DataFrame(columns=[*keys, *QUADRANTS])
    s["config"] = s["config"].astype(str)
    s["level"] = pd.to_numeric(s["level"]).astype(int)
    s["share"] = s["share"].astype(float)
    wide = s.pivot_table(index=keys, columns="quadrant", values="share", aggfunc="sum", fill_value=0.0)
    wide = wide.reindex(columns=list(QUADRANTS), fill_value=0.0)
    wide.columns.name = None
    return wide.reset_index()


def _stacked(ax: Axes, labels: Sequence[str], shares: pd.DataFrame, horizontal: bool = False) -> None:
    """Stacked bars of the four quadrant shares (rows of ``shares``, columns QUADRANTS);
    ``horizontal``: one bar per row of the y axis (long labels never collide)."""
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for q in QUADRANTS:
        vals = shares[q].to_numpy(dtype=float)
        kw: dict[str, Any] = {"color": QUADRANT_COLORS[q], "label": q, "edgecolor": "white", "lw": 0.3,
                              "hatch": QUADRANT_HATCHES[q]}
        if horizontal:
            ax.barh(x, vals, left=bottom, height=0.8, **kw)
        else:
            ax.bar(x, vals, bottom=bottom, width=0.8, **kw)
        bottom += vals
    if horizontal:
        ax.set_yticks(x)
        ax.set_yticklabels(labels)
        ax.set_xlim(0, 1)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xticks(x)
        ax.set_xticklabels(labels)
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)


def _quadrant_legend(fig: Any, ax: Any) -> None:
    handles, labels_ = ax.get_legend_handles_labels()
    fig.legend(handles, labels_, loc="outside lower center", ncol=len(QUADRANTS))


def quadrant_bars(stats_df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Stacked quadrant-share bars from ``taxonomy_quadrant_stats`` rows, per image-removal mode,
    two columns wide, PNG (300 dpi) + PDF + SVG:
    ``taxonomy_quadrants_clean_<mode>.png`` (one panel per config, one horizontal bar per dataset,
    clean condition) and ``taxonomy_quadrants_by_level_<mode>.png`` (one panel per config, one bar
    per severity level: level 0 = clean, levels 1..5 averaged over perturbation types and
    datasets)."""

    paths: list[Path] = []
    wide = _share_table(stats_df) if not stats_df.empty else pd.DataFrame()
    if wide.empty:
        return paths
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with style.paper_style() as plt:
        for mode, g in wide.groupby("image_mode", sort=True):
            clean = g[g["perturbation"] == "clean"].sort_values(["config", "dataset"])
            if len(clean):
                configs = sorted(clean["config"].unique())
                datasets = sorted(clean["dataset"].astype(str).unique())
                fig, axes = plt.subplots(1, len(configs), figsize=(style.TWO_COLUMN, 0.14 * len(datasets) + 1.1),
                                         squeeze=False, sharey=True, layout="constrained")
                for ax, cfg in zip(axes[0], configs, strict=True):
                    c = clean[clean["config"] == cfg].set_index(clean[clean["config"] == cfg]["dataset"].astype(str))
                    c = c.reindex(datasets).fillna(0.0)
                    _stacked(ax, datasets, c, horizontal=True)
                    ax.set_title(str(cfg))
                    ax.set_xlabel("share of samples")
                    ax.tick_params(axis="x", labelsize=5.5)
                _quadrant_legend(fig, axes[0][0])
                fig.suptitle(f"Safety quadrants on clean images (image removed: {mode})")
                paths.append(style.save_figure(fig, out / f"taxonomy_quadrants_clean_{_slug(mode)}.png"))
            by_level = g.groupby(["config", "level"], sort=True)[list(QUADRANTS)].mean().reset_index()
            configs = sorted(by_level["config"].unique())
            ncols = min(3, len(configs))
            nrows = -(-len(configs) // ncols)
            fig, axes = plt.subplots(nrows, ncols, figsize=(style.TWO_COLUMN, 1.8 * nrows + 0.6), squeeze=False,
                                     sharey=True, layout="constrained")
            for i, cfg in enumerate(configs):
                ax = axes[i // ncols][i % ncols]
                c = by_level[by_level["config"] == cfg].sort_values("level")
                _stacked(ax, ["clean" if int(lv) == 0 else f"L{int(lv)}" for lv in c["level"]], c)
                ax.set_title(str(cfg))
                if i % ncols == 0:
                    ax.set_ylabel("share of samples")
            for j in range(len(configs), nrows * ncols):
                axes[j // ncols][j % ncols].set_visible(False)
            _quadrant_legend(fig, axes[0][0])
            fig.suptitle(f"Safety quadrants by evaluated severity level, mean over types (image removed: {mode})")
            paths.append(style.save_figure(fig, out / f"taxonomy_quadrants_by_level_{_slug(mode)}.png"))
    return paths


def transition_matrix(transitions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(counts, row shares) 4x4 in QUADRANTS order, rows = clean (from) quadrant, columns =
    perturbed (to) quadrant, pooled over every row of ``transitions`` (``taxonomy_transitions``
    view rows); a from-quadrant without pairs has a NaN share row."""
    counts = (transitions.groupby(["from_quadrant", "to_quadrant"])["n"].sum().unstack(fill_value=0)
              .reindex(index=list(QUADRANTS), columns=list(QUADRANTS), fill_value=0))
    n = counts.to_numpy(dtype=float)
    totals = n.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(totals > 0, n / np.where(totals > 0, totals, 1.0), np.nan)
    return n, share


def transition_heatmaps(transitions_df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """One figure per config (``<config>_taxonomy_transitions.png`` + PDF + SVG, two columns
    wide): the 4x4 clean -> perturbed quadrant matrix of row shares (annotated with the counts),
    pooled over datasets, perturbation types and levels, one panel per image-removal mode. Input:
    ``taxonomy_transitions`` rows."""

    paths: list[Path] = []
    if transitions_df.empty:
        return paths
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with style.paper_style() as plt:
        for cfg, g in transitions_df.groupby("config", sort=True):
            modes = sorted(g["image_mode"].unique())
            fig, axes = plt.subplots(1, len(modes), figsize=(style.TWO_COLUMN if len(modes) > 1 else style.ONE_COLUMN,
                                                             2.6), squeeze=False, layout="constrained")
            im = None
            for ax, mode in zip(axes[0], modes, strict=True):
                n, share = transition_matrix(g[g["image_mode"] == mode])
                im = ax.imshow(np.nan_to_num(share), vmin=0.0, vmax=1.0, cmap="Blues")
                for i in range(len(QUADRANTS)):
                    for j in range(len(QUADRANTS)):
                        txt = "–" if np.isnan(share[i, j]) else f"{share[i, j]:.2f}\n({int(n[i, j])})"
                        colour = "white" if not np.isnan(share[i, j]) and share[i, j] > 0.6 else "black"
                        ax.text(j, i, txt, ha="center", va="center", fontsize=5, color=colour)
                ax.set_xticks(range(len(QUADRANTS)))
                ax.set_xticklabels(QUADRANTS, fontsize=5)
                ax.set_yticks(range(len(QUADRANTS)))
                ax.set_xlabel("perturbed (to)")
                if mode == modes[0]:
                    ax.set_yticklabels(QUADRANTS, fontsize=5)
                    ax.set_ylabel("clean (from)")
                else:
                    ax.set_yticklabels([])
                ax.set_title(f"image removed: {mode}")
            if im is not None:
                fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="share of the clean quadrant (count)")
            fig.suptitle(f"{cfg}: quadrant transitions clean -> perturbed (all types and levels)")
            paths.append(style.save_figure(fig, out / f"{_slug(cfg)}_taxonomy_transitions.png"))
    return paths


def fmt_p(p: float) -> str:
    """``p < 1e-3`` when tiny, else three significant digits (``p = 0.0123``)."""
    return "p < 1e-3" if p < 1e-3 else f"p = {p:.3g}"


def correlation_label(row: pd.Series | dict[str, Any]) -> str:
    """One correlation row as text: ``headline (clean), image removed: none: r = 0.42 [0.10, 0.70],
    p = 0.03, n = 30 points`` (scope ``pooled_perturbed`` reads ``secondary: pooled perturbed,
    cluster bootstrap over configurations``; the note when r is NaN)."""
    scope = str(row.get("scope", "headline"))
    head = {"headline": "headline (clean)",
            "pooled_perturbed": "secondary: pooled perturbed, CI resamples configurations"}.get(scope, scope)
    for k in ("perturbation", "level"):
        v = row.get(k)
        if scope == "condition" and v is not None and not pd.isna(v):
            head += f" {k}={v}"
    mode = row.get("image_mode")
    if mode is not None and not pd.isna(mode):
        head += f", image removed: {mode}"
    return f"{head}: {_corr_label(row, n_unit=' points')}"


def _corr_label(row: pd.Series | dict[str, Any], n_unit: str = "") -> str:
    """``r = 0.42 [0.10, 0.70], p = 0.03, n = 12`` (or the note when r is NaN); ``n_unit`` follows n."""
    n = row.get("n_points")
    n_txt = "" if n is None or pd.isna(n) else f", n = {int(n)}{n_unit}"
    r = row.get("r")
    if r is None or pd.isna(r):
        note = row.get("note")
        return f"r = n/a{n_txt}" + ("" if note is None or pd.isna(note) else f" ({note})")
    lo, hi, p = row.get("ci_low"), row.get("ci_high"), row.get("p_value")
    ci = "" if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else f" [{lo:.2f}, {hi:.2f}]"
    p_txt = "" if p is None or pd.isna(p) else f", {fmt_p(float(p))}"
    note = row.get("note")
    why = "" if ci or note is None or pd.isna(note) else f" ({note})"  # e.g. too few points for a CI
    return f"r = {r:.2f}{ci}{p_txt}{n_txt}{why}"


def headline_rows(corr_df: pd.DataFrame) -> pd.DataFrame:
    """The headline correlation rows (scope ``headline``: clean points, one per configuration and
    dataset) of ``taxonomy_correlation`` rows, in image-mode order ``none``, ``blank``, ``noise``."""
    if corr_df.empty or "scope" not in corr_df.columns:
        return corr_df.iloc[0:0]
    h = corr_df[corr_df["scope"] == "headline"]
    order = {m: i for i, m in enumerate(("none", "blank", "noise"))}
    return h.assign(_o=h["image_mode"].map(order).fillna(len(order))).sort_values(["_o", "image_mode"]).drop(
        columns="_o")


def headline_row(corr_df: pd.DataFrame) -> pd.Series | None:
    """The one correlation the scatter prints: the first headline row (scope ``headline``, image
    mode ``none`` first, :func:`headline_rows`), else the first row; None for an empty frame."""
    if corr_df.empty:
        return None
    head = headline_rows(corr_df)
    return head.iloc[0] if len(head) else corr_df.reset_index(drop=True).iloc[0]


def flip_vs_dangerous_scatter(points_df: pd.DataFrame, corr_df: pd.DataFrame, out_dir: str | Path,
                              headline: pd.Series | None = None) -> Path:
    """``taxonomy_flip_vs_dangerous.png`` (+ PDF, SVG; one column wide): x = flip rate (share of inconsistent samples),
    y = Dangerous share, one point per row of ``points_df`` (columns ``config``,
    ``flip_rate``, ``dangerous_share``, ``perturbation``; optional ``image_mode``): colour =
    config, marker = image mode, filled = clean, hollow = perturbed. No per-point text labels;
    every legend entry has its own glyph. One line of statistics, once: r with its CI, p (``p <
    1e-3`` when tiny) and n of ``headline`` (default :func:`headline_row` of ``corr_df``)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch


    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with style.paper_style() as plt:
        fig, ax = plt.subplots(figsize=(style.ONE_COLUMN, 3.4), layout="constrained")
        if points_df.empty:
            ax.text(0.5, 0.5, "no taxonomy results", ha="center", va="center", transform=ax.transAxes)
        else:
            configs = sorted(points_df["config"].astype(str).unique())
            colours = {c: style.color(i) for i, c in enumerate(configs)}
            pts = points_df.assign(config=points_df["config"].astype(str),
                                   image_mode=points_df.get("image_mode", pd.Series("none", index=points_df.index))
                                   .astype(str),
                                   clean=points_df["perturbation"] == "clean")
            modes = sorted(set(pts["image_mode"]))
            markers = {m: _MARKERS.get(m, style.MARKERS[(3 + i) % len(style.MARKERS)]) for i, m in enumerate(modes)}
            # one scatter call per (config, mode, clean/perturbed): thousands of points stay fast
            for (cfg, mode, clean), g in pts.groupby(["config", "image_mode", "clean"], sort=True):
                colour = colours[str(cfg)]
                ax.scatter(g["flip_rate"], g["dangerous_share"], marker=markers[str(mode)], s=14 if clean else 9,
                           facecolors=colour if clean else "none", edgecolors=colour, linewidths=0.6,
                           alpha=0.9 if clean else 0.6, zorder=3 if clean else 2)
            handles: list[Any] = [Patch(color=colours[c], label=c) for c in configs]
            if len(modes) > 1 or modes != ["none"]:
                handles += [Line2D([], [], ls="", marker=markers[m], mfc="none", mec="0.2", label=f"no image: {m}")
                            for m in modes]
            handles += [Line2D([], [], ls="", marker=_CONDITION_MARKER, color="0.2", label="clean"),
                        Line2D([], [], ls="", marker=_CONDITION_MARKER, mfc="none", mec="0.2", label="perturbed")]
            fig.legend(handles=handles, loc="outside lower center", ncol=2)
        ax.set_xlabel("flip rate (share of inconsistent samples)")
        ax.set_ylabel("Dangerous share")
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.03, 1.05)
        ax.grid(alpha=0.3)
        ax.set_title("Flip rate vs Dangerous share (consistent, not image-reliant)")
        row = headline if headline is not None else headline_row(corr_df)
        if row is not None:
            ax.text(0.98, 0.97, _corr_label(row), transform=ax.transAxes, ha="right", va="top", fontsize=6,
                    bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.7", "lw": 0.4})
        return style.save_figure(fig, out / "taxonomy_flip_vs_dangerous.png")
