"""Paper-ready report from the DuckDB mart: tables (CSV, Markdown, LaTeX), PNG figures, one
static ``index.html``, optionally logged to MLflow (one run in the suite's experiment
``<suite>/reports``, or ``reports`` when the caller names no suite).

Layout under ``out_dir``::

    index.html                 every table (HTML) and figure (relative <img>), header with mart/time/models
    tables/<name>.csv|.md|.tex real_labels, real_model_worst_types, segmentation_summary,
                               segmentation_by_level, modality_share, iou_dice_agreement, mce,
                               strategy_ranking, vlm_task_drops, taxonomy_quadrants,
                               taxonomy_correlation, taxonomy_screening
    figures/*.png|.pdf|.svg   every figure as PNG (300 dpi) and vector PDF/SVG, 3.5 or 7.2 in wide
    .medrobust_report.json     the files of the last run; they are removed before the next run writes,
                               so a narrower --models run leaves no stale outputs (nothing else is touched)

A table whose source is missing or empty (for the selection) is not written; the reason is in the
page and in :attr:`ReportSummary.skipped`. The mart is opened read-only.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pandas as pd

from medrobust_lib.report import paper_tables as pt
from medrobust_lib.report import real_labels as real_labels_table
from medrobust_lib.report.entries import ReportSettings, build_tables
from medrobust_lib.report.figures import paper as figs
from medrobust_lib.report.figures.style import parallel_saves, twins
from medrobust_lib.report.html import Figure, render_page
from medrobust_lib.report.latex import to_latex
from medrobust_lib.report.table import ReportTable, to_csv, to_markdown
from medrobust_lib.store.marts import connect_readonly
from medrobust_lib.store.tracking import log_artifact, log_metrics, tracked_run

EXPERIMENT = "reports"
"""MLflow experiment of the report runs (a suite's own is ``paths.experiment_name(suite, EXPERIMENT)``)."""
MANIFEST = ".medrobust_report.json"
EXAMPLE_PREFIX = "worst_"
"""File-name prefix of the worst-type example panels (shown under the real-model table, PNG only)."""
TABLE_FORMATS: tuple[str, ...] = ("csv", "md", "tex")
TRACKS: dict[str, tuple[str, str]] = {
    "segmentation": ("segmentation_results", "model"),
    "strategies": (pt.STRATEGY_VIEW, "model"),
    "vlm": ("vlm_task_drops", "model"),
    "taxonomy": ("taxonomy_quadrants", "config"),
}
"""Track -> (relation, id column) that lists the track's model (or configuration) ids."""


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`build_report` did. ``files``: every file written (sorted, absolute);
    ``tables``: names of the tables written; ``figures``: PNGs written; ``skipped``: table or
    figure name -> why it was not produced; ``models``: track -> ids shown (all of the track's
    ids without ``--models``); ``seconds``: wall time; ``mlflow_run_id``: None without MLflow;
    ``mlflow_error``: one line when logging to MLflow failed (the files are written all the same)."""

    out_dir: Path
    html: Path
    files: tuple[Path, ...]
    tables: tuple[str, ...]
    figures: tuple[Path, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seconds: float = 0.0
    mlflow_run_id: str | None = None
    mlflow_error: str | None = None


def parse_models(text: str | None) -> list[str] | None:
    """``"a, b,a"`` -> ``["a", "b"]`` (order kept, duplicates dropped); None or blank -> None."""
    if text is None:
        return None
    ids = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    return ids or None


def available_models(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Track -> sorted ids present in the mart (taxonomy: configuration ids)."""
    return {track: pt.distinct_ids(con, rel, col) for track, (rel, col) in TRACKS.items()}


REGISTRY_EVAL_ID = re.compile(r"^medrobust-seg-.+-v\d+$")
"""Model ids of registry evaluations (``<registered name>-v<version>``, the ``registry_evaluation``
asset): left out unless named with ``--models``, since their rows repeat a strategy's or are gate
candidates, and they would triple the segmentation figures."""


def select_models(available: dict[str, list[str]], requested: Sequence[str] | None) -> dict[str, list[str] | None]:
    """Track -> ids to keep (None = no filter). Without a request every id is kept except the
    registry evaluations of the segmentation track (:data:`REGISTRY_EVAL_ID`). Raises ValueError
    naming the unknown ids and every available id per track."""
    if requested is None:
        seg = available.get("segmentation", [])
        if any(REGISTRY_EVAL_ID.match(m) for m in seg):
            return {t: ([m for m in seg if not REGISTRY_EVAL_ID.match(m)] if t == "segmentation" else None)
                    for t in available}
        return {t: None for t in available}
    known = {m for ids in available.values() for m in ids}
    unknown = [m for m in requested if m not in known]
    if unknown:
        listing = "; ".join(f"{t}: {', '.join(ids) if ids else '(none)'}" for t, ids in available.items())
        raise ValueError(f"unknown model id(s) {', '.join(unknown)}. Available in the mart: {listing}")
    return {t: [m for m in requested if m in ids] for t, ids in available.items()}


def _clear_previous(out: Path) -> None:
    """Remove the files listed by the previous run's manifest (only inside ``out``)."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        return
    try:
        listed = json.loads(manifest.read_text()).get("files", [])
    except (json.JSONDecodeError, AttributeError):
        return
    root = out.resolve()
    for rel in listed:
        p = (out / str(rel)).resolve()
        if p.is_file() and root in p.parents:
            p.unlink()


def _tables(con: duckdb.DuckDBPyConnection, sel: dict[str, list[str] | None], available: dict[str, list[str]],
            seed: int, include_floor: bool = False, include_off_band: bool = False,
            mce_baseline: str | None = None) -> tuple[list[ReportTable], dict[str, str]]:
    """Every table of :data:`~medrobust_lib.report.entries.REPORT_TABLES` for the selection."""
    return build_tables(ReportSettings(con, seed, include_floor, include_off_band, available, mce_baseline), sel)


def _stored_bands(con: duckdb.DuckDBPyConnection) -> dict[int, tuple[float, float]]:
    """Level -> the SSIM band its perturbed images were calibrated to, as stored in the mart's
    ``perturbation_manifest`` (``band_low`` / ``band_high``), for the figures' level labels; {}
    without a manifest (the labels then show no band rather than a default one)."""
    if not pt.relation_exists(con, "perturbation_manifest"):
        return {}
    rows = con.execute("select level, band_low, band_high from perturbation_manifest "
                       "group by all order by all").df()
    return figs.stored_bands(rows)


def _figures(con: duckdb.DuckDBPyConnection, tables: dict[str, ReportTable], sel: dict[str, list[str] | None],
             fig_dir: Path, include_floor: bool = False, include_off_band: bool = False,
             requested: bool = False, seed: int = 0) -> tuple[list[tuple[Path, str]], dict[str, str]]:
    """(path, caption) of every figure written, and figure name -> reason for those not drawn.
    ``requested``: the models were named (``--models``): every named model gets its own figures;
    otherwise the fine-tuned strategies get only the strategy comparison. ``seed``: the report's,
    for the CIs of the real-label bars (the same as their table's)."""
    from medrobust_lib.report.figures.segmentation import robustness_curves
    from medrobust_lib.report.figures.taxonomy import flip_vs_dangerous_scatter, quadrant_bars

    out: list[tuple[Path, str]] = []
    skipped: dict[str, str] = {}
    if real_labels_table.NAME in tables:  # without the table, its reason is listed already
        out += _real_label_figures(con, sel["segmentation"], fig_dir, seed, include_off_band)
    examples = _example_figures(con, sel["segmentation"], fig_dir)
    if examples:
        out += examples
    else:
        skipped["worst-type examples"] = "no segmentation_examples rows (no real-architecture model evaluated)"
    seg = tables.get("segmentation_by_level")
    if seg is not None:
        # the figures' means leave floor datasets out (as the summary table does) unless asked.
        # IoU is the primary metric (MedFM-Robust): its figures come first; the Dice heatmap stays
        # alongside with its rows in the same IoU-drop order.
        by_level = pt.segmentation_level_means(con, sel["segmentation"], include_floor, include_off_band)
        strategies = set() if requested else _strategy_models(con)
        if strategies & set(by_level["model"]):
            # the strategies are compared by the strategy figure; their own curves and heatmaps on request
            by_level = by_level[~by_level["model"].isin(strategies)]
            skipped["per-strategy curves and heatmaps"] = ("the fine-tuned strategies are compared in the strategy "
                                                          "figure; `medrobust report --models <id>` draws one's own")
        bands = _stored_bands(con)
        band_note = (" Outputs whose SSIM missed the level's band are "
                     + ("kept (--include-off-band)" if include_off_band else "left out of the means")
                     + f"; {figs.BAND_MISS_MARK} marks a cell that had some (band_miss).")
        attacked = set(by_level.loc[by_level["condition"].isin(["fgsm", "pgd"]), "model"]) if len(by_level) else set()
        for p in robustness_curves(by_level, fig_dir, "iou", bands=bands):
            model = p.name.removesuffix('_iou_curves.png')
            out.append((p, f"{model}: paired IoU drop at the evaluated levels (SSIM band"
                           + (" and attack epsilon" if model in attacked else "") + " under each); thin grey lines: "
                           "corruption types, thick: their mean" + (", dashed: FGSM/PGD." if model in attacked
                                                                    else "; no attack was evaluated.")))
        families = _families(con)
        for p in figs.family_curves(by_level, families, fig_dir, "iou", bands=bands):
            out.append((p, f"{p.stem}: IoU drop (clean - perturbed) at the evaluated levels, one panel per "
                           "perturbation family and one for the attacks."))
        for metric in ("iou", "dice"):
            name = "IoU" if metric == "iou" else "Dice"
            for p in figs.drop_heatmap(by_level, fig_dir, metric, rank_by="iou", bands=bands):
                out.append((p, f"{p.stem}: mean {name} drop per perturbation type (rows, ranked by mean IoU drop) "
                               "and evaluated level (columns); orange = worse than clean." + band_note))
    else:
        skipped["robustness curves and heatmaps"] = "no segmentation_by_level table"
    summary = tables.get("segmentation_summary")
    tradeoff = figs.tradeoff_scatter(summary.data, fig_dir) if summary is not None else []
    if tradeoff:
        out += [(p, "Performance-robustness trade-off: clean score (x) vs mean drop under corruptions (y; the mean "
                    "over types of each type's mean paired drop) per model and strategy, IoU left, Dice right; hollow "
                    "markers: the mean attack drop. Lower right: accurate and robust.") for p in tradeoff]
    else:
        skipped["trade-off figure"] = ("no segmentation_summary table" if summary is None
                                       else "no model with both a clean score and a corruption drop")
    strat = tables.get("strategy_ranking")
    if strat is not None:
        out += [(p, "Mean IoU drop per fine-tuning strategy, corruptions vs attacks, bootstrap 95% CI.")
                for p in figs.strategy_bars(strat.data, fig_dir)]
    else:
        skipped["strategy bars"] = "no strategy_ranking table"
    if "taxonomy_quadrants" in tables:
        where, params = pt.where_in("config", sel["taxonomy"])
        quad = con.execute(f"select * from taxonomy_quadrants where {where}", params).df()
        for p in quadrant_bars(quad, fig_dir):
            kind = "clean images, one panel per config, one bar per dataset" if "_clean_" in p.name else \
                "by severity level (0 = clean), mean over types and datasets"
            out.append((p, f"Safety-quadrant shares, {kind} (image removed: {p.stem.rsplit('_', 1)[-1]})."))
        points = pt.taxonomy_points(con, sel["taxonomy"])
        corr = tables["taxonomy_correlation"].data if "taxonomy_correlation" in tables else pd.DataFrame()
        if not points.empty:
            p = flip_vs_dangerous_scatter(points, corr, fig_dir)
            out.append((p, "Headline: flip rate vs Dangerous share on clean images, one point per (config, "
                           "dataset); marker = image-removal mode; r [95% CI], p and n of the headline "
                           "correlation in the corner."))
    else:
        skipped["quadrant bars and flip-rate scatter"] = "no taxonomy_quadrants table"
    return out, skipped


def _real_label_figures(con: duckdb.DuckDBPyConnection, models: list[str] | None, fig_dir: Path, seed: int,
                        include_off_band: bool) -> list[tuple[Path, str]]:
    """The per-dataset bars of the real model on real labels (``real_labels_<dataset>.png``), with
    captions; the numbers of the ``real_labels`` table, every corruption type."""
    from medrobust_lib.report.figures.real_labels import real_label_bars
    from medrobust_lib.store.views.real_labels import segmentation_real_labels

    cells = real_labels_table.real_label_type_stats(con, models, seed, include_off_band)
    if cells.empty:
        return []
    where, params = pt.where_in("model", pt.real_models(con, models))
    clean = con.execute(f"select * from ({segmentation_real_labels(include_off_band, pt.band_rows(con))}) "
                        f"where {where}", params).df()
    paths = real_label_bars(cells, clean, fig_dir, _stored_bands(con), prefix=real_labels_table.FIGURE_PREFIX)
    return [(p, f"{p.stem.removeprefix(real_labels_table.FIGURE_PREFIX)}: mean Dice drop (clean - perturbed, "
                "paired per image) of the real model per corruption type at each evaluated level, largest on top; "
                "blue bars below zero: the corruption raised the Dice; whiskers: bootstrap 95% CI over the images "
                "(none below stats.min_n images). Attacks are in the table.") for p in paths]


def _example_figures(con: duckdb.DuckDBPyConnection, models: list[str] | None, fig_dir: Path
                     ) -> list[tuple[Path, str]]:
    """The ``segmentation_examples`` panels (PNG bytes stored by the segmentation report) of the
    selected models, written as ``worst_<model>_<type>_L<level>.png``, worst first, with captions."""
    if not pt.relation_exists(con, "segmentation_examples"):
        return []
    where, params = pt.where_in("model", models)
    rows = con.execute(f"""select model, perturbation, level, modality, dataset, sample_id, mean_iou_drop, clean_iou,
                                  iou, ssim, png
                           from segmentation_examples where {where} and png is not null
                           order by model, mean_iou_drop desc, perturbation, level""", params).fetchall()
    out: list[tuple[Path, str]] = []
    fig_dir.mkdir(parents=True, exist_ok=True)
    for model, pert, level, modality, ds, sid, mean_drop, ciou, piou, ssim, png in rows:
        p = fig_dir / f"{EXAMPLE_PREFIX}{re.sub(r'[^A-Za-z0-9_.-]', '_', f'{model}_{pert}_L{level}')}.png"
        p.write_bytes(bytes(png))
        out.append((p, f"{model}, {pert} at level {level} (mean IoU drop {mean_drop:.3f} over its images): the image "
                       f"where it hurt most, {ds}/{sid} ({modality}, SSIM {ssim:.3f}). Left to right: clean image "
                       f"with its box prompt, ground truth, clean prediction (IoU {ciou:.3f}), perturbed image, "
                       f"perturbed prediction (IoU {piou:.3f})."))
    return out


def _incomplete(con: duckdb.DuckDBPyConnection) -> str:
    """The partitions the mart marks incomplete, ``table: model/modality/level (share)``, or none."""
    if not pt.relation_exists(con, "incomplete_partitions"):
        return "none"
    rows = con.execute("select source_table, model, modality, level, error_share from incomplete_partitions").fetchall()
    return "; ".join(f"{t}: {m}/{mo}/L{lv} ({share:.1%} errors)" for t, m, mo, lv, share in rows) or "none"


def _strategy_models(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The model ids the fine-tuned strategies were evaluated as (``evaluated_as`` of the strategy
    ranking view; empty when the view is absent)."""
    if not pt.relation_exists(con, pt.STRATEGY_VIEW):
        return set()
    columns = {str(r[0]) for r in con.execute(f"describe {pt.STRATEGY_VIEW}").fetchall()}
    if "evaluated_as" not in columns:  # a mart built before the column existed
        return set()
    return {str(r[0]) for r in con.execute(f"select distinct evaluated_as from {pt.STRATEGY_VIEW}").fetchall()}


def _families(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Perturbation type -> family from ``perturbation_manifest`` ({} when absent)."""
    if not pt.relation_exists(con, "perturbation_manifest"):
        return {}
    rows = con.execute("select perturbation, any_value(family) from perturbation_manifest "
                       "where family is not null group by perturbation").fetchall()
    return {str(t): str(f) for t, f in rows}


def build_report(mart_path: str | Path = "var/marts.duckdb", out_dir: str | Path = "var/reports",
                 models: Sequence[str] | None = None, *, mlruns_dir: str | Path = "mlruns",
                 log_mlflow: bool = True, seed: int = 0, include_floor: bool = False,
                 experiment: str = EXPERIMENT, workers: int = 1, include_off_band: bool = False,
                 mce_baseline: str | None = None) -> ReportSummary:
    """Write the report for ``models`` (model / configuration ids; None = all) into ``out_dir``.

    Raises FileNotFoundError without a mart and ValueError for unknown ids (listing the available
    ones). ``seed`` keys the bootstrap of the pooled taxonomy shares (and a recomputed correlation).
    ``include_floor``: keep datasets whose clean score is at the floor (``store.views.common``) in the
    segmentation averages and figures (default: left out, counted in the summary table).
    ``include_off_band``: keep perturbed outputs whose SSIM missed their level's band in the
    segmentation averages and figures (default: left out, counted per cell as ``band_miss``).
    ``experiment``: the MLflow experiment of the run (the CLI passes the suite's ``<suite>/reports``).
    ``workers``: processes that draw the figure files (:func:`~medrobust_lib.report.figures.style.
    parallel_saves`; 1 = in this process); the files are the same bytes either way.
    ``mce_baseline``: the segmentation model id the ``mce`` table (MedMNIST-C's mCE and relative mCE)
    normalises by (the CLI passes the suite's ``segmentation.mce_baseline``); None: the table is skipped.
    """
    t0 = time.perf_counter()
    mart = Path(mart_path)
    out = Path(out_dir)
    con = connect_readonly(mart)
    try:
        available = available_models(con)
        sel = select_models(available, list(models) if models is not None else None)
        tables, skipped = _tables(con, sel, available, seed, include_floor, include_off_band, mce_baseline)
        out.mkdir(parents=True, exist_ok=True)
        _clear_previous(out)
        fig_dir = out / "figures"
        with parallel_saves(workers):
            figures, fig_skipped = _figures(con, {t.name: t for t in tables}, sel, fig_dir, include_floor,
                                            include_off_band, requested=models is not None, seed=seed)
        incomplete = _incomplete(con)
    finally:
        con.close()

    written: list[Path] = []
    links: dict[str, list[str]] = {}
    (out / "tables").mkdir(exist_ok=True)
    for t in tables:
        stem = out / "tables" / t.name
        to_csv(t, stem.with_suffix(".csv"))
        stem.with_suffix(".md").write_text(to_markdown(t), encoding="utf-8")
        stem.with_suffix(".tex").write_text(to_latex(t), encoding="utf-8")
        paths = [stem.with_suffix(f".{ext}") for ext in TABLE_FORMATS]
        written += paths
        links[t.name] = [p.relative_to(out).as_posix() for p in paths]
    written += [t for p, _ in figures for t in twins(p) if t.is_file()]

    shown = {t: tuple(ids if sel[t] is None else sel[t] or ()) for t, ids in available.items()}
    meta = {
        "Mart": str(mart.resolve()),
        "Generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "Models": "; ".join(f"{t}: {', '.join(ids)}" for t, ids in shown.items() if ids) or "(none)",
        "Filter": ", ".join(models) if models is not None else (
            "all models" if sel.get("segmentation") is None
            else "all models except registry evaluations (<name>-v<version>: name them with --models)"),
    }
    meta["Left out (error share above max_error_share; re-run them)"] = incomplete
    if mce_baseline is not None:
        meta["mCE baseline"] = mce_baseline
    all_skipped = {**skipped, **fig_skipped}
    shown_figures = []
    for p, cap in figures:
        lead = p.name.startswith(EXAMPLE_PREFIX) and "real_model_worst_types" in links
        real = p.name.startswith(real_labels_table.FIGURE_PREFIX) and real_labels_table.NAME in links
        section = real_labels_table.NAME if real else "real_model_worst_types" if lead else None
        shown_figures.append(Figure(p.relative_to(out).as_posix(), cap, section=section,
                                    vector=not p.name.startswith(EXAMPLE_PREFIX)))
    page = render_page("medrobust robustness report", meta, tables, links, shown_figures, all_skipped)
    html_path = out / "index.html"
    html_path.write_text(page, encoding="utf-8")
    written.append(html_path)
    (out / MANIFEST).write_text(json.dumps({"files": sorted(p.relative_to(out).as_posix() for p in written)},
                                           indent=1) + "\n")

    run_id = mlflow_error = None
    if log_mlflow:
        try:
            run_id = _log_mlflow(out, written, mart, models, mlruns_dir, time.perf_counter() - t0, experiment)
        except Exception as exc:  # noqa: BLE001 - any tracking-store fault (disk full, locked SQLite,
            # a server error) leaves the written report intact; it becomes one line, not a traceback
            # chained through MLflow's own failed end_run (issue 44, finding 12)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            mlflow_error = f"{type(exc).__name__}: {first}"
    return ReportSummary(out_dir=out.resolve(), html=html_path.resolve(),
                         files=tuple(sorted(p.resolve() for p in written)), tables=tuple(t.name for t in tables),
                         figures=tuple(p.resolve() for p, _ in figures), skipped=all_skipped, models=shown,
                         seconds=time.perf_counter() - t0, mlflow_run_id=run_id, mlflow_error=mlflow_error)


def _log_mlflow(out: Path, files: Sequence[Path], mart: Path, models: Sequence[str] | None,
                mlruns_dir: str | Path, seconds: float, experiment: str) -> str:
    """One run in ``experiment`` with every file as an artifact (same relative layout as ``out``);
    returns the run id."""
    params = {"mart": str(mart.resolve()), "models": ",".join(models) if models is not None else "all",
              "out_dir": str(out.resolve())}
    with tracked_run(experiment, "paper_report", {"medrobust.kind": "paper_report"}, mlruns_dir, params) as run:
        for f in files:
            parent = f.relative_to(out).parent.as_posix()
            log_artifact(run, f, None if parent == "." else parent)
        log_metrics(run, {"seconds": seconds, "n_files": len(files)})
        return str(run.info.run_id)
