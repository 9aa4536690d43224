"""Figures a reviewer accepts: PNG at 300 dpi plus vector PDF and SVG, one- or two-column widths,
Okabe-Ito colours, no two labels overlapping (checked on the drawn matplotlib figure), level axes
with only the evaluated levels, one correlation line on the scatter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medrobust_lib.report.figures import paper as figs
from medrobust_lib.report.figures import style
from medrobust_lib.report.figures.segmentation import robustness_curves
from medrobust_lib.report.figures.taxonomy import (
    QUADRANT_COLORS,
    _corr_label,
    flip_vs_dangerous_scatter,
    headline_row,
    quadrant_bars,
    transition_heatmaps,
)
from medrobust_lib.store.schema import QUADRANTS

TYPES = [f"type_{i:02d}_with_a_long_name" for i in range(30)]


def _by_level(levels: tuple[int, ...] = (2, 4), n_types: int = 30) -> pd.DataFrame:
    rows = []
    for k, t in enumerate(TYPES[:n_types]):
        for lv in levels:
            rows.append({"model": "m", "strategy": "s", "condition": "perturbation", "perturbation": t, "level": lv,
                         "dice_drop": 0.01 * lv + 0.001 * k, "iou_drop": 0.01 * lv})
    for a in ("fgsm", "pgd"):
        for lv in levels:
            rows.append({"model": "m", "strategy": "s", "condition": a, "perturbation": a, "level": lv,
                         "dice_drop": 0.03 * lv, "iou_drop": 0.03 * lv})
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(style, "RECORD_OVERLAPS", True)
    style.OVERLAPS.clear()


def _check(paths: list[Path], widths: tuple[float, ...] = (style.ONE_COLUMN, style.TWO_COLUMN)) -> None:
    assert paths
    for p in paths:
        assert style.OVERLAPS[str(p)] == [], (p.name, style.OVERLAPS[str(p)][:5])
        with Image.open(p) as im:
            dpi = im.info["dpi"]
            assert round(dpi[0]) == 300
            assert any(abs(im.size[0] / 300 - w) < 0.02 for w in widths), (p.name, im.size)
        assert p.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        svg = p.with_suffix(".svg").read_text()
        assert "<svg" in svg and "<dc:date>" not in svg


def test_overlap_check_finds_overlapping_labels() -> None:
    """The checker itself: two texts at the same place overlap, far apart they do not."""
    with style.paper_style() as plt:
        fig, ax = plt.subplots(figsize=(style.ONE_COLUMN, 2), layout="constrained")
        ax.text(0.5, 0.5, "first label")
        ax.text(0.5, 0.5, "second label")
        assert ("first label", "second label") in style.overlapping_texts(fig)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(style.ONE_COLUMN, 2), layout="constrained")
        ax.text(0.1, 0.1, "first label")
        ax.text(0.6, 0.8, "second label")
        assert style.overlapping_texts(fig) == []
        # crowded tick labels (the old quadrant bars' failure) are caught
        ax.set_xticks(range(30))
        ax.set_xticklabels([f"config-{i}/dataset-{i}" for i in range(30)])
        assert style.overlapping_texts(fig)
        plt.close(fig)


def test_segmentation_figures(tmp_path: Path) -> None:
    df = _by_level()
    fams = {t: f"family{i % 4}" for i, t in enumerate(TYPES)}
    curves = robustness_curves(df, tmp_path)
    _check(curves)
    _check(figs.family_curves(df, fams, tmp_path))
    heat = figs.drop_heatmap(df, tmp_path)
    _check(heat)
    with Image.open(heat[0]) as im:  # 32 rows: two panels, two columns wide
        assert abs(im.size[0] / 300 - style.TWO_COLUMN) < 0.02
    _check(figs.drop_heatmap(_by_level(n_types=8), tmp_path / "small"))
    _check(figs.strategy_bars(pd.DataFrame([
        {"model": "m", "strategy": s, "kind": k, "mean_iou_drop": 0.02 * r, "iou_drop_ci_low": 0.02 * r - 0.005,
         "iou_drop_ci_high": 0.02 * r + 0.005, "rank": r}
        for k in ("corruption", "attack") for r, s in enumerate(["full", "decoder_only", "decoder_prompt",
                                                                  "encoder_partial", "lora", "adapter"], 1)]),
        tmp_path))


def test_level_axis_shows_only_evaluated_levels() -> None:
    from medrobust_lib.types import SSIM_BANDS

    assert figs.level_tick_labels([0, 2, 4], bands=SSIM_BANDS, attack=True, short=True) == [
        "clean", "L2\n.80-.89\nε 4/255", "L4\n.60-.69\nε 8/255"]
    assert figs.level_tick_labels([1], bands=SSIM_BANDS) == ["L1\nSSIM 0.90-0.98"]
    with style.paper_style() as plt:
        fig, ax = plt.subplots()
        figs._level_axis(ax, [0, 2, 4], corruption=True, attack=False)
        assert list(ax.get_xticks()) == [0, 1, 2]  # no tick (and no line segment) for levels 1, 3, 5
        plt.close(fig)


def _points() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    rows = []
    for c in ("cfg-a", "cfg-b", "cfg-c"):
        for d in range(10):
            for mode in ("none", "blank", "noise"):
                for pert, lv in (("clean", 0), ("gaussian_noise", 1), ("gaussian_noise", 3)):
                    rows.append({"config": c, "dataset": f"dataset_{d}", "perturbation": pert, "level": lv,
                                 "image_mode": mode, "flip_rate": rng.random() * 0.4,
                                 "dangerous_share": rng.random(), "n": 10})
    corr = pd.DataFrame([
        {"scope": "headline", "perturbation": "clean", "image_mode": m, "n_points": 90, "r": -0.3, "ci_low": -0.45,
         "ci_high": -0.1, "p_value": 2e-9 if m == "none" else 0.01, "note": None} for m in ("blank", "none", "noise")])
    return pd.DataFrame(rows), corr


def test_scatter_prints_one_correlation_and_distinct_legend_glyphs(tmp_path: Path) -> None:
    points, corr = _points()
    row = headline_row(corr)
    assert row is not None and row["image_mode"] == "none"
    assert _corr_label(row) == "r = -0.30 [-0.45, -0.10], p < 1e-3, n = 90"
    no_headline = corr.assign(scope="pooled_perturbed")  # without headline rows: the first row, said as it is
    chosen = headline_row(no_headline)
    assert chosen is not None and chosen["image_mode"] == "blank"
    p = flip_vs_dangerous_scatter(points, corr, tmp_path)
    _check([p], (style.ONE_COLUMN,))
    svg = p.with_suffix(".svg").read_text()
    assert svg.count("r = -0.30") == 1 and "p &lt; 1e-3" in svg and "cfg-a/dataset" not in svg


def test_scatter_legend_entries_are_distinct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, str]] = []
    orig = style.save_figure

    def spy(fig: object, path: Path) -> Path:
        for leg in fig.legends:  # type: ignore[attr-defined]
            for h, t in zip(leg.legend_handles, leg.get_texts(), strict=True):
                marker = getattr(h, "get_marker", lambda: "patch")()
                fill = getattr(h, "get_markerfacecolor", lambda: "")()
                seen.append((str(marker), str(fill), t.get_text()))
        return orig(fig, path)

    monkeypatch.setattr(style, "save_figure", spy)
    points, corr = _points()
    flip_vs_dangerous_scatter(points, corr, tmp_path)
    glyphs = [(m, f) for m, f, _ in seen if m != "patch"]
    assert len(glyphs) == len(set(glyphs)) and len(seen) == 3 + 3 + 2


def test_taxonomy_bars_and_transitions(tmp_path: Path) -> None:
    rows = []
    for c in ("demo-image-reliant", "demo-shortcut", "demo-consistency-lora"):
        for d in range(10):
            for pert, lv in (("clean", 0), ("gaussian_noise", 2)):
                for q in QUADRANTS:
                    rows.append({"config": c, "dataset": f"demo_dataset_{d}", "perturbation": pert, "level": lv,
                                 "image_mode": "none", "quadrant": q, "share": 0.25})
    paths = quadrant_bars(pd.DataFrame(rows), tmp_path)
    _check(paths, (style.TWO_COLUMN,))
    trans = pd.DataFrame([{"config": "c", "image_mode": m, "from_quadrant": a, "to_quadrant": b, "n": 120}
                          for m in ("none", "blank", "noise") for a in QUADRANTS for b in QUADRANTS])
    _check(transition_heatmaps(trans, tmp_path), (style.TWO_COLUMN,))
    assert set(QUADRANT_COLORS.values()) <= set(style.OKABE_ITO)


def test_parallel_saves_write_the_same_bytes(tmp_path: Path) -> None:
    """Figures handed to worker processes (pickled, drawn there) come out byte-identical to the
    in-process files, the palette's "C0"-style colours included."""
    by_level = _by_level(n_types=6)
    ranking = pd.DataFrame([{"model": "m", "strategy": s, "kind": k, "rank": r, "mean_iou_drop": 0.1 * r,
                             "iou_drop_ci_low": 0.1 * r - 0.02, "iou_drop_ci_high": 0.1 * r + 0.02}
                            for r, s in enumerate(("lora", "full"), start=1) for k in ("corruption", "attack")])

    def draw(out: Path) -> list[Path]:
        return [*figs.drop_heatmap(by_level, out), *figs.family_curves(by_level, {}, out),
                *figs.strategy_bars(ranking, out)]

    serial = draw(tmp_path / "serial")
    with style.parallel_saves(2):
        par = draw(tmp_path / "par")
    assert [p.name for p in par] == [p.name for p in serial] and len(serial) == 3
    for a, b in zip(serial, par, strict=True):
        for x, y in zip(style.twins(a), style.twins(b), strict=True):
            assert x.read_bytes() == y.read_bytes(), x.name


def test_level_labels_show_the_stored_bands_not_the_defaults(tmp_path: Path) -> None:
    """A suite with its own bands: the stored band_low / band_high label the levels (not
    types.SSIM_BANDS); a level without a stored band shows none."""
    manifest = pd.DataFrame({"level": [2, 2, 4, 0], "band_low": [0.85, 0.85, 0.55, None],
                             "band_high": [0.95, 0.95, 0.65, None]})
    bands = figs.stored_bands(manifest)
    assert bands == {2: (0.85, 0.95), 4: (0.55, 0.65)}
    assert figs.level_tick_labels([0, 2, 4], bands=bands, short=True) == ["clean", "L2\n.85-.95", "L4\n.55-.65"]
    assert figs.level_tick_labels([2, 3], bands=bands) == ["L2\nSSIM 0.85-0.95", "L3"]
    assert figs.level_tick_labels([2]) == ["L2"] and figs.stored_bands(pd.DataFrame({"level": [2]})) == {}
    df = _by_level(n_types=3)
    with style.paper_style() as plt:
        fig, ax = plt.subplots()
        figs._level_axis(ax, [0, 2, 4], corruption=True, attack=False, bands=bands)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["clean", "L2\nSSIM 0.85-0.95", "L4\nSSIM 0.55-0.65"]
        plt.close(fig)
    assert figs.drop_heatmap(df, tmp_path, bands=bands)
