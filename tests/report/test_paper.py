"""The paper report: table contents against the mart, renderers, --models, missing views, MLflow.

The mart is a small DuckDB file written here from pandas frames (tables with the mart's declared
columns, the real view SQL from ``MART_VIEWS``; ``vlm_task_drops`` as a plain table), so the
tests stay fast and offline.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from medrobust_lib.report.latex import escape, to_latex
from medrobust_lib.report.paper import ReportSummary, build_report, parse_models
from medrobust_lib.report.paper_tables import _recomputed_correlation, taxonomy_quadrants
from medrobust_lib.report.table import fmt_ci, fmt_float, fmt_pvalue, to_markdown
from medrobust_lib.store.marts import MART_TABLES, MART_VIEWS
from medrobust_lib.store.schema import (
    QUADRANTS,
    TAXONOMY_CORRELATION_STATS_COLUMNS,
    TAXONOMY_QUADRANT_STATS_COLUMNS,
    TAXONOMY_SCREENING_COLUMNS,
)
from medrobust_lib.taxonomy.aggregates import flip_dangerous_correlation, quadrant_stats
from medrobust_lib.taxonomy.confidence_screening import screening_stats
from medrobust_lib.tracks.segmentation.stats import segmentation_stats

SEG_MODELS = ("sam_a", "sam_b")
VLM_MODELS = ("vlm_a", "vlm_b")
CONFIGS = ("cfg_a", "cfg_b", "cfg_c")
TYPES = ("gaussian_noise", "motion_blur")
ALL_TABLES = ("real_model_worst_types", "segmentation_summary", "segmentation_by_level", "modality_share",
              "iou_dice_agreement", "strategy_ranking", "vlm_task_drops", "taxonomy_quadrants",
              "taxonomy_correlation", "taxonomy_screening")


# --- the test mart ---------------------------------------------------------------------------

def _seg_rows() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for mi, model in enumerate(SEG_MODELS):
        for s in range(6):
            ciou = 0.6 + 0.05 * s - 0.1 * mi
            base = {"model": model, "checkpoint": f"ck{mi}", "strategy": "pretrained", "dataset": "d1",
                    "modality": "ct", "sample_id": f"s{s}", "prompt": "box", "error": None,
                    "empty_gt_policy": "both_empty_1_else_0", "clean_iou": ciou, "clean_dice": 2 * ciou / (1 + ciou),
                    "family": "sam", "arch": "vit_b" if model == "sam_a" else "tiny", "precision": "fp32"}
            rows.append({**base, "condition": "clean", "perturbation": "clean", "level": 0, "iou": ciou,
                         "dice": base["clean_dice"], "iou_drop": 0.0, "dice_drop": 0.0, "status": "ok"})
            for cond, ptype in [("perturbation", TYPES[0]), ("perturbation", TYPES[1]), ("fgsm", "fgsm")]:
                for level in (1, 2):
                    iou = max(0.0, ciou - 0.03 * level * (1 + mi) - 0.02 * rng.random())
                    dice = 2 * iou / (1 + iou)
                    failed = model == "sam_b" and s == 0 and ptype == "motion_blur" and level == 2
                    rows.append({**base, "condition": cond, "perturbation": ptype, "level": level,
                                 "epsilon": level * 2 / 255 if cond == "fgsm" else None, "iou": iou, "dice": dice,
                                 "iou_drop": ciou - iou, "dice_drop": base["clean_dice"] - dice,
                                 "status": "mask_out_of_view" if failed else "ok"})
    return pd.DataFrame(rows)


def _vlm_rows() -> pd.DataFrame:
    rows = []
    for mi, model in enumerate(VLM_MODELS):
        for task, metric in (("vqa_mc", "accuracy"), ("caption", "cider_d")):
            clean = 0.7 - 0.1 * mi
            per = {t: clean - 0.05 * (i + 1) for i, t in enumerate(TYPES)}
            avg = float(np.mean(list(per.values())))
            cols = [("Clean", clean), *per.items(), ("Avg", avg), ("ΔTP", clean - avg)]
            for ord_, (name, value) in enumerate(cols):
                drop = value if name == "ΔTP" else clean - value
                rows.append({"model": model, "checkpoint": "ck", "adapter": "ad1" if mi else None, "task": task,
                             "column_name": name, "metric": metric, "value": value, "drop": drop,
                             "rel_drop": drop / clean, "n_unparseable": mi + ord_, "n_error": 2 * mi + ord_,
                             "ord": ord_})
    return pd.DataFrame(rows)


def _taxonomy_rows() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for ci, cfg in enumerate(CONFIGS):
        for ds in ("d1", "d2"):
            for s in range(8):
                for pert, level in (("clean", 0), ("gaussian_noise", 1), ("gaussian_noise", 2)):
                    flip = float(rng.choice([0.0, 0.2, 0.4]))
                    consistent = flip == 0.0
                    reliant = bool(rng.random() < 0.3 + 0.2 * ci)
                    quad = {(True, True): "Ideal", (False, True): "Fragile", (True, False): "Dangerous",
                            (False, False): "Worst"}[(consistent, reliant)]
                    rows.append({"config": cfg, "dataset": ds, "sample_id": f"{ds}_{s}", "record_id": f"r{s}",
                                 "perturbation": pert, "level": level, "image_mode": "none",
                                 "quadrant": quad, "correct_original": float(rng.random() < 0.6),
                                 "entropy_original": float(rng.random()), "pairwise_disagreement": flip,
                                 "answer": "yes" if s % 2 else "no", "pred_removed": "yes" if s % 3 else "no",
                                 "margin_removed": float(rng.normal(0.0, 1.5)),
                                 "consistent": consistent, "image_reliant": reliant, "outcome": "ok"})
    df = pd.DataFrame(rows)
    # the answer's confidence, from a generator of its own (the other columns keep their values)
    margin = np.random.default_rng(2).normal(0.0, 2.0, len(df))
    return df.assign(margin_original=margin, p_yes_original=1.0 / (1.0 + np.exp(-margin)))


def _strategy_rows() -> pd.DataFrame:
    rows = []
    for model in SEG_MODELS:
        for kind in ("corruption", "attack"):
            for rank, strat in enumerate(("lora", "full", "decoder_only"), start=1):
                d = 0.01 * rank + (0.02 if kind == "attack" else 0.0)
                rows.append({"model": model, "strategy": strat, "kind": kind, "n_samples": 6, "n_conditions": 4,
                             "mean_iou_drop": d, "iou_drop_ci_low": d - 0.005, "iou_drop_ci_high": d + 0.005,
                             "mean_dice_drop": d / 2, "dice_drop_ci_low": d / 2 - 0.002,
                             "dice_drop_ci_high": d / 2 + 0.002, "clean_iou": 0.6, "clean_dice": 0.75,
                             "n_trainable": 1000 * rank, "rank": rank, "with_floor": False})
    return pd.DataFrame(rows)


def _example_rows() -> pd.DataFrame:
    """One worst-type panel of the real-architecture model ``sam_a`` (a 4 x 4 PNG)."""
    import cv2

    png = cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes()
    return pd.DataFrame([{"model": "sam_a", "perturbation": TYPES[1], "level": 2, "modality": "ct", "dataset": "d1",
                          "sample_id": "s3", "mean_iou_drop": 0.09, "clean_iou": 0.75, "iou": 0.6, "ssim": 0.85,
                          "png": png}])


def _declared(name: str) -> list[tuple[str, str]]:
    return list(next(t.columns for t in MART_TABLES if t.name == name))


def _create(con: duckdb.DuckDBPyConnection, name: str, cols: list[tuple[str, str]], df: pd.DataFrame) -> None:
    con.execute(f"create table {name} ({', '.join(f'{c} {t}' for c, t in cols)})")
    frame = df.reindex(columns=[c for c, _ in cols])  # noqa: F841 - read by DuckDB's replacement scan
    con.execute(f"insert into {name} select * from frame")


def make_mart(path: Path, with_strategy: bool = True) -> Path:
    seg = _seg_rows()
    tax = _taxonomy_rows()
    con = duckdb.connect(str(path))
    try:
        _create(con, "segmentation_results", _declared("segmentation_results"), seg)
        _create(con, "segmentation_stats", _declared("segmentation_stats"), segmentation_stats(seg, seed=0))
        manifest = pd.DataFrame({"perturbation": list(TYPES), "family": ["noise", "blur"]})
        _create(con, "perturbation_manifest", _declared("perturbation_manifest"), manifest)
        for view in ("segmentation_by_level", "segmentation_summary", "segmentation_by_modality"):
            con.execute(f"create view {view} as {MART_VIEWS[view]}")
        _create(con, "segmentation_examples", _declared("segmentation_examples"), _example_rows())
        vlm = _vlm_rows()  # noqa: F841 - read by DuckDB's replacement scan
        con.execute("create table vlm_task_drops as select * from vlm")
        _create(con, "taxonomy_results", _declared("taxonomy_results"), tax)
        _create(con, "taxonomy_quadrant_stats", list(TAXONOMY_QUADRANT_STATS_COLUMNS), quadrant_stats(tax, 0, 200))
        _create(con, "taxonomy_correlation_stats", list(TAXONOMY_CORRELATION_STATS_COLUMNS),
                flip_dangerous_correlation(tax, seed=0, n_boot=2000))
        _create(con, "taxonomy_screening_stats", list(TAXONOMY_SCREENING_COLUMNS), screening_stats(tax))
        for view in ("taxonomy_quadrants", "taxonomy_correlation", "taxonomy_screening"):
            con.execute(f"create view {view} as {MART_VIEWS[view]}")
        if with_strategy:
            _create(con, "strategy_ranking_stats", [(c, "DOUBLE" if "drop" in c or "clean" in c else
                                                     ("VARCHAR" if c in ("model", "strategy", "kind") else "BIGINT"))
                                                    for c in _strategy_rows().columns], _strategy_rows())
            con.execute(f"create view strategy_ranking as {MART_VIEWS['strategy_ranking']}")
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def mart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mart(tmp_path_factory.mktemp("mart") / "marts.duckdb")


@pytest.fixture(scope="module")
def report(mart: Path, tmp_path_factory: pytest.TempPathFactory) -> ReportSummary:
    return build_report(mart, tmp_path_factory.mktemp("report") / "out", log_mlflow=False)


def _sql(mart: Path, query: str) -> pd.DataFrame:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        return con.execute(query).df()
    finally:
        con.close()


def _csv(report: ReportSummary, name: str) -> pd.DataFrame:
    return pd.read_csv(report.out_dir / "tables" / f"{name}.csv", keep_default_na=True)


def _latex_rows(tex: str) -> list[str]:
    """Data rows of a booktabs table or longtable (lines ending in ``\\\\`` after the header; group
    heading lines, ``\\multicolumn``, left out)."""
    lines = tex.splitlines()
    start = lines.index("\\endfoot") + 1 if "\\endfoot" in lines else lines.index("\\midrule") + 1
    end = lines.index("\\end{longtable}") if "\\end{longtable}" in lines else lines.index("\\bottomrule")
    return [ln for ln in lines[start:end] if ln.endswith("\\\\") and not ln.startswith("\\multicolumn")]


# --- tests -----------------------------------------------------------------------------------

def test_writes_every_table_in_three_formats_and_the_figures(report: ReportSummary) -> None:
    # no real-label datasets here, and no mCE baseline named
    assert report.tables == ALL_TABLES and list(report.skipped) == ["real_labels", "mce"]
    assert "no mCE baseline named" in report.skipped["mce"]
    for name in ALL_TABLES:
        for ext in ("csv", "md", "tex"):
            assert (report.out_dir / "tables" / f"{name}.{ext}") in report.files
    names = {p.name for p in report.figures}
    for m in SEG_MODELS:
        assert {f"{m}_iou_curves.png", f"{m}_iou_drop_by_family.png", f"{m}_iou_drop_heatmap.png",
                f"{m}_dice_drop_heatmap.png"} <= names
    assert {"strategy_iou_drop.png", "tradeoff_clean_vs_drop.png", "taxonomy_flip_vs_dangerous.png", "taxonomy_quadrants_clean_none.png",
            "taxonomy_quadrants_by_level_none.png", f"worst_sam_a_{TYPES[1]}_L2.png"} <= names


def test_the_first_section_is_the_real_models(report: ReportSummary) -> None:
    worst = _csv(report, "real_model_worst_types")
    assert set(worst["model"]) == {"sam_a"}  # sam_b is the demo's tiny architecture
    for _, g in worst.groupby("level"):
        assert list(g["rank"]) == list(range(1, len(g) + 1))
        assert g["iou_drop"].is_monotonic_decreasing
    assert {"cell_ct"} <= set(worst.columns)
    page = report.html.read_text()
    first, panel = page.index('id="real_model_worst_types"'), page.index(f"figures/worst_sam_a_{TYPES[1]}_L2.png")
    assert first < panel < page.index('id="segmentation_summary"')
    assert (report.out_dir / "figures" / f"worst_sam_a_{TYPES[1]}_L2.png").read_bytes()[:4] == b"\x89PNG"
    for p in report.figures:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.parent == report.out_dir / "figures"
    assert report.mlflow_run_id is None and report.seconds > 0
    assert report.models["segmentation"] == SEG_MODELS and report.models["taxonomy"] == CONFIGS


def test_segmentation_summary_csv_equals_direct_sql(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "segmentation_summary").set_index("model")
    exp = _sql(mart, """
        with ok as (select * from segmentation_results where status = 'ok'),
        per_type as (select model, condition, perturbation, avg(iou_drop) as iou_drop, avg(dice_drop) as dice_drop
                     from ok where condition <> 'clean' group by all)
        select r.model,
               (select avg(iou) from ok where ok.model = r.model and condition = 'clean') as clean_iou,
               (select avg(dice) from ok where ok.model = r.model and condition = 'clean') as clean_dice,
               (select avg(iou_drop) from per_type p where p.model = r.model and condition = 'perturbation')
                   as corruption_iou_drop,
               (select avg(dice_drop) from per_type p where p.model = r.model and condition = 'perturbation')
                   as corruption_dice_drop,
               (select avg(iou_drop) from per_type p where p.model = r.model and condition <> 'perturbation')
                   as attack_iou_drop,
               count(*) filter (where condition = 'clean') as n_images, count(*) as n,
               count(*) filter (where status <> 'ok') as n_failed
        from segmentation_results r group by r.model order by r.model""").set_index("model")
    assert list(got.index) == list(SEG_MODELS)
    for col in exp.columns:
        np.testing.assert_allclose(got[col].to_numpy(float), exp[col].to_numpy(float), rtol=1e-12, err_msg=col)
    assert got.loc["sam_b", "n_failed"] == 1 and got.loc["sam_a", "n_failed"] == 0
    assert (got["n"] == 6 * 7).all() and (got["n_corruption_types"] == 2).all() and (got["n_attack_types"] == 1).all()


def test_segmentation_by_level_csv_equals_the_view(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "segmentation_by_level")
    exp = _sql(mart, "select * from segmentation_by_level")
    keys = ["model", "perturbation", "level"]
    m = got.merge(exp, on=keys, suffixes=("", "_view"), validate="one_to_one")
    assert len(m) == len(exp) == len(got) == 2 * 3 * 2
    for col in ("n", "iou", "dice", "iou_drop", "iou_drop_ci_low", "dice_drop_ci_high", "wilcoxon_q"):
        np.testing.assert_allclose(m[col].to_numpy(float), m[f"{col}_view"].to_numpy(float), rtol=1e-12)
    assert set(got.loc[got["perturbation"] == "fgsm", "kind"]) == {"attack"}
    assert set(got.loc[got["perturbation"] != "fgsm", "kind"]) == {"corruption"}
    # corruptions come first, then attacks
    assert list(got[got["model"] == "sam_a"]["kind"]) == ["corruption"] * 4 + ["attack"] * 2


def test_markdown_and_latex_render_the_same_rows(report: ReportSummary) -> None:
    md = (report.out_dir / "tables" / "segmentation_summary.md").read_text()
    header = ("| Model | Levels | Cond. | IoU | ΔIoU corr. | rel. corr. | ΔIoU pooled | ΔIoU att. | rel. att. | Dice | ΔDice corr. "
              "| ΔDice att. | Images | n | Failed |")
    lines = md.splitlines()
    assert lines[0] == "**Segmentation robustness per model**" and lines[2] == header
    assert lines[3] == "|---|---|" + "---:|" * 13
    csv_rows = _csv(report, "segmentation_summary")
    first = csv_rows.iloc[0]
    assert lines[4].startswith(f"| sam_a | 1,2 | 6 | {fmt_float(first['clean_iou'])} | "
                               f"{fmt_float(first['corruption_iou_drop'])} |")
    assert first["corruption_iou_rel_drop"] == pytest.approx(first["corruption_iou_drop"] / first["clean_iou"])
    for name in ALL_TABLES:
        tex = (report.out_dir / "tables" / f"{name}.tex").read_text()
        data = _csv(report, name)
        rows = _latex_rows(tex)
        assert len(rows) == len(data), name
        assert "\\toprule" in tex and "\\bottomrule" in tex and "\\midrule" in tex
        assert not re.search(r"(?<!\\)_", "\n".join(rows)), f"unescaped underscore in {name}"
        md_rows = [ln for ln in (report.out_dir / "tables" / f"{name}.md").read_text().splitlines()
                   if ln.startswith("| ")]
        assert len(md_rows) == len(data) + 1, name
    tex = (report.out_dir / "tables" / "segmentation_summary.tex").read_text()
    assert "sam\\_a &" in tex and "\\label{tab:medrobust-segmentation-summary}" in tex
    # a CI in Markdown/LaTeX: "est [low, high]" from the separate CSV columns
    lvl = _csv(report, "segmentation_by_level").iloc[0]
    ci = fmt_ci(lvl["iou_drop"], lvl["iou_drop_ci_low"], lvl["iou_drop_ci_high"])
    assert re.fullmatch(r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]", ci)
    assert ci in (report.out_dir / "tables" / "segmentation_by_level.md").read_text()
    assert ci in (report.out_dir / "tables" / "segmentation_by_level.tex").read_text()


def test_formatters_and_latex_escape() -> None:
    assert escape("a_b 5% & $x #1 {y} ~^\\ ΔTP") == (
        "a\\_b 5\\% \\& \\$x \\#1 \\{y\\} \\textasciitilde{}\\textasciicircum{}\\textbackslash{} $\\Delta$TP")
    assert fmt_float(0.12345) == "0.123" and fmt_float(-0.0001) == "0.000" and fmt_float(float("nan")) == "–"
    assert fmt_ci(0.1234, 0.1, 0.15) == "0.123 [0.100, 0.150]" and fmt_ci(0.5, None, None) == "0.500"
    assert fmt_pvalue(2e-9) == "<0.001" and fmt_pvalue(0.0412) == "0.041" and fmt_pvalue(None) == "–"
    assert parse_models(" a, b,a ,") == ["a", "b"] and parse_models(" ") is None and parse_models(None) is None


def test_latex_groups_long_identity_columns_into_heading_lines() -> None:
    """``group_by`` columns become one italic heading line per run of equal values in LaTeX (not
    columns), while Markdown keeps them as columns; the width estimate counts only the body."""
    from medrobust_lib.report.latex import estimated_width_in, group_headings
    from medrobust_lib.report.table import Column, ReportTable

    df = pd.DataFrame({"model": ["models:/a-very-long-registry-name@champion"] * 2 + ["b"],
                       "kind": ["corruption", "attack", "attack"], "x": [0.5, 0.25, 1.0]})
    cols = (Column("Model", "model"), Column("Kind", "kind"), Column("x", "x", "float"))
    flat = ReportTable("t", "T", df, cols)
    grouped = ReportTable("t", "T", df, cols, group_by=("model", "kind"))
    assert group_headings(flat) == [None] * 3
    assert group_headings(grouped) == ["Model: models:/a-very-long-registry-name@champion, Kind: corruption",
                                       "Model: models:/a-very-long-registry-name@champion, Kind: attack",
                                       "Model: b, Kind: attack"]
    tex = to_latex(grouped)
    assert "\\begin{tabular}{r}" in tex and "x \\\\" in tex.splitlines()
    heads = [ln for ln in tex.splitlines() if ln.startswith("\\multicolumn")]
    assert heads[0] == "\\multicolumn{1}{l}{\\textit{Model: models:/a-very-long-registry-name@champion, Kind: corruption}} \\\\"
    assert len(heads) == 3 and tex.count("\\addlinespace") == 2
    assert _latex_rows(tex) == ["0.500 \\\\", "0.250 \\\\", "1.000 \\\\"]
    assert estimated_width_in(grouped) < estimated_width_in(flat)
    assert "| models:/a-very-long-registry-name@champion | corruption | 0.500 |" in to_markdown(grouped)


def test_vlm_long_table_equals_the_view(report: ReportSummary, mart: Path) -> None:
    """One row per (model, task, type) plus an Avg row, not one column per type (it fits a page)."""
    got = _csv(report, "vlm_task_drops")
    assert list(got.columns) == ["model", "checkpoint", "adapter", "task", "metric", "perturbation", "clean",
                                 "perturbed", "drop", "rel_drop", "n_unparseable", "n_error", "n_truncated",
                                 "floor_effect"]
    assert len(got) == 4 * (len(TYPES) + 1)
    assert got["n_truncated"].eq(0).all()  # this mart's view predates the column: none counted
    long = _sql(mart, "select * from vlm_task_drops")
    for rec in long.to_dict("records"):
        sel = got[(got["model"] == rec["model"]) & (got["task"] == rec["task"])]
        if rec["column_name"] == "Clean":
            assert sel["clean"].to_numpy() == pytest.approx([rec["value"]] * len(sel), rel=1e-12)
        elif rec["column_name"] == "ΔTP":
            avg = sel[sel["perturbation"] == "Avg"].iloc[0]
            assert avg["drop"] == pytest.approx(rec["value"], rel=1e-12)
            assert avg["rel_drop"] == pytest.approx(rec["rel_drop"], rel=1e-12)
        else:
            row = sel[sel["perturbation"] == rec["column_name"]].iloc[0]
            assert row["perturbed"] == pytest.approx(rec["value"], rel=1e-12)
            assert row["n_unparseable"] == rec["n_unparseable"] and row["n_error"] == rec["n_error"]
            if rec["column_name"] != "Avg":
                assert row["drop"] == pytest.approx(row["clean"] - row["perturbed"], rel=1e-12)
    assert not got["floor_effect"].any()  # vqa_mc 0.6/0.7 > 0.25; captions have no chance level
    tex = (report.out_dir / "tables" / "vlm_task_drops.tex").read_text()
    assert "$\\Delta$TP" in tex and "vlm\\_a" in tex and "gaussian\\_noise" in tex
    assert "resizebox" not in tex
    # the adapter differs between models but not within one: not a display column
    assert "Adapter" not in (report.out_dir / "tables" / "vlm_task_drops.md").read_text()


def test_latex_tables_fit_two_columns_without_resizebox(report: ReportSummary) -> None:
    from medrobust_lib.report.latex import TWO_COLUMN_IN

    for name in ALL_TABLES:
        tex = (report.out_dir / "tables" / f"{name}.tex").read_text()
        assert "resizebox" not in tex, name
        width = float(re.search(r"about (\d+\.\d) in wide", tex).group(1))  # type: ignore[union-attr]
        assert width <= TWO_COLUMN_IN, (name, width)


def test_taxonomy_quadrants_pool_the_view(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "taxonomy_quadrants")
    exp = _sql(mart, """
        select config, image_mode, case when perturbation = 'clean' then 'clean' else 'perturbed' end as condition,
               quadrant, sum(n) as n, sum(n_total) as n_total, sum(n) / sum(n_total) as share
        from taxonomy_quadrants group by all""")
    m = got.merge(exp, on=["config", "image_mode", "condition", "quadrant"], suffixes=("", "_sql"),
                  validate="one_to_one")
    assert len(m) == len(got) == len(CONFIGS) * 2 * len(QUADRANTS)
    np.testing.assert_array_equal(m["n"], m["n_sql"])
    np.testing.assert_array_equal(m["n_total"], m["n_total_sql"])
    np.testing.assert_allclose(m["share"], m["share_sql"], rtol=1e-12)
    sums = got.groupby(["config", "image_mode", "condition"])["share"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0)
    ok = got[got["share"] > 0]
    assert ((ok["share_ci_low"] <= ok["share"] + 1e-12) & (ok["share"] <= ok["share_ci_high"] + 1e-12)).all()
    # pooled clean n equals the row count straight from taxonomy_results
    raw = _sql(mart, "select config, quadrant, count(*) as n from taxonomy_results where perturbation = 'clean' "
                     "group by all")
    merged = got[got["condition"] == "clean"].merge(raw, on=["config", "quadrant"], suffixes=("", "_raw"))
    np.testing.assert_array_equal(merged["n"], merged["n_raw"])
    assert list(got["quadrant"][:4]) == list(QUADRANTS)


def test_taxonomy_quadrants_show_text_only_accuracy_and_the_floor(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "taxonomy_quadrants")
    raw = _sql(mart, """
        select config, case when perturbation = 'clean' then 'clean' else 'perturbed' end as condition,
               avg(case when pred_removed = answer then 1.0 else 0.0 end) as acc,
               avg(case when consistent then 0.0 else 1.0 end) as flip
        from taxonomy_results where outcome = 'ok' group by all""")
    m = got.merge(raw, on=["config", "condition"], validate="many_to_one")
    np.testing.assert_allclose(m["text_only_accuracy"], m["acc"], rtol=1e-12)
    np.testing.assert_allclose(m["dangerous_floor"], m["acc"], rtol=1e-12)
    np.testing.assert_allclose(m["flip_rate"], m["flip"], rtol=1e-12)
    text = (report.out_dir / "tables" / "taxonomy_quadrants.md").read_text()
    assert "Text acc." in text and "Dangerous floor" in text and "sensitivity analysis" in text


def test_taxonomy_correlation_from_mart_and_recomputed(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "taxonomy_correlation")
    exp = _sql(mart, "select * from taxonomy_correlation where scope = 'headline'")
    assert len(got) == len(exp) == 1 and got.loc[0, "source"] == "mart"
    assert got.loc[0, "n_points"] == len(CONFIGS) * 2  # clean points: configs x datasets
    assert got.loc[0, "scope"] == "headline" and got.loc[0, "perturbation"] == "clean"
    assert got.loc[0, "r"] == pytest.approx(exp.loc[0, "r"], rel=1e-12)
    # recomputing over every configuration reproduces the mart's numbers (same keys and n_boot)
    con = duckdb.connect(str(mart), read_only=True)
    try:
        again = _recomputed_correlation(con, list(CONFIGS), seed=0)
    finally:
        con.close()
    for col in ("n_points", "r", "ci_low", "ci_high", "p_value"):
        assert again.loc[0, col] == pytest.approx(exp.loc[0, col], rel=1e-9), col


def test_html_shows_every_table_and_figure(report: ReportSummary, mart: Path) -> None:
    page = report.html.read_text()
    assert report.html == report.out_dir / "index.html"
    for p in (report.out_dir / "figures").glob("*.png"):
        assert f'<img src="figures/{p.name}"' in page
        if p.name.startswith("worst_"):  # the worst-type panels are PNG only (stored in the mart)
            continue
        assert f'href="figures/{p.stem}.pdf"' in page and f'href="figures/{p.stem}.svg"' in page
        assert p.with_suffix(".pdf").is_file() and p.with_suffix(".svg").is_file()
    assert page.count("<img ") == len(report.figures)
    for name in ALL_TABLES:
        assert f'id="{name}"' in page
        for ext in ("csv", "md", "tex"):
            assert f'href="tables/{name}.{ext}"' in page
    n_rows = sum(len(_csv(report, n)) for n in ALL_TABLES)
    assert page.count("<tr>") == n_rows + len(ALL_TABLES)  # data rows + one header row per table
    assert str(mart.resolve()) in page and "Generated" in page and "sam_a" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    # the ones not produced: no real labels, no mCE baseline named
    assert page.count("<li><b>") == 2 and "<li><b>real_labels</b>" in page and "<li><b>mce</b>" in page


@pytest.mark.usefixtures("png_only")
def test_models_filter_every_table_and_figure(mart: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    full = build_report(mart, out, log_mlflow=False)
    assert any("sam_b" in p.name for p in full.figures)
    rep = build_report(mart, out, ["sam_a", "vlm_b", "cfg_a", "cfg_b"], log_mlflow=False)
    for name, col, keep in [("segmentation_summary", "model", {"sam_a"}), ("segmentation_by_level", "model", {"sam_a"}),
                            ("strategy_ranking", "model", {"sam_a"}), ("vlm_task_drops", "model", {"vlm_b"}),
                            ("taxonomy_quadrants", "config", {"cfg_a", "cfg_b"})]:
        assert set(_csv(rep, name)[col]) == keep, name
        for fmt in ("md", "tex"):
            text = (rep.out_dir / "tables" / f"{name}.{fmt}").read_text()
            assert "sam_b" not in text and "sam\\_b" not in text and "vlm\\_a" not in text and "cfg_c" not in text
    # the previous run's figures of sam_b are gone; the new ones are sam_a only
    files = {p.name for p in (out / "figures").iterdir()}
    assert not any("sam_b" in f for f in files) and any("sam_a" in f for f in files)
    corr = _csv(rep, "taxonomy_correlation")
    assert corr.loc[0, "source"] == "recomputed (cfg_a, cfg_b)"
    assert corr.loc[0, "n_points"] == 2 * 2  # clean headline: configs x datasets
    assert rep.models["segmentation"] == ("sam_a",) and rep.models["taxonomy"] == ("cfg_a", "cfg_b")
    page = rep.html.read_text()
    assert "sam_b" not in page and "cfg_c" not in page

    only_seg = build_report(mart, tmp_path / "seg", ["sam_b"], log_mlflow=False)
    assert set(only_seg.tables) == {"segmentation_summary", "segmentation_by_level", "modality_share",
                                    "iou_dice_agreement", "strategy_ranking"}
    assert "vlm_task_drops" in only_seg.skipped and "taxonomy_quadrants" in only_seg.skipped

    with pytest.raises(ValueError, match="unknown model id") as err:
        build_report(mart, tmp_path / "bad", ["sam_a", "nope"], log_mlflow=False)
    for known in (*SEG_MODELS, *VLM_MODELS, *CONFIGS):
        assert known in str(err.value)
    assert "nope" in str(err.value) and not (tmp_path / "bad").exists()


@pytest.mark.usefixtures("png_only")
def test_strategy_table_missing(tmp_path: Path) -> None:
    mart = make_mart(tmp_path / "nostrat.duckdb", with_strategy=False)
    rep = build_report(mart, tmp_path / "out", log_mlflow=False)
    assert "strategy_ranking" not in rep.tables
    assert "no strategy_ranking view" in rep.skipped["strategy_ranking"]
    assert not list((rep.out_dir / "tables").glob("strategy_ranking.*"))
    assert not (rep.out_dir / "figures" / "strategy_iou_drop.png").exists()
    page = rep.html.read_text()
    assert "Not produced" in page and "no strategy_ranking view" in page and 'id="strategy_ranking"' not in page


def test_strategy_table_present_equals_the_view(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "strategy_ranking")
    exp = _sql(mart, "select * from strategy_ranking order by model, kind, rank")
    assert len(got) == len(exp) == 12
    for col in ("strategy", "kind", "rank", "n_trainable"):
        assert list(got[col]) == list(exp[col]), col
    np.testing.assert_allclose(got["mean_iou_drop"], exp["mean_iou_drop"], rtol=1e-12)
    np.testing.assert_allclose(got["iou_drop_ci_high"], exp["iou_drop_ci_high"], rtol=1e-12)
    md = (report.out_dir / "tables" / "strategy_ranking.md").read_text()
    # IoU first: clean IoU, clean Dice, IoU drop [CI], relative IoU drop (0.03 / 0.6)
    assert "| sam_a | attack | 1 | lora | 1000 | 0.600 | 0.750 | 0.030 [0.025, 0.035] | 0.050 |" in md


@pytest.mark.usefixtures("png_only")
def test_empty_strategy_view_is_skipped(tmp_path: Path) -> None:
    mart = make_mart(tmp_path / "m.duckdb", with_strategy=False)
    con = duckdb.connect(str(mart))
    con.execute("create table strategy_ranking_stats as select * from (select 'm' as model, 's' as strategy, "
                "'corruption' as kind, 1 as n_samples, 1 as n_conditions, 0.0 as mean_iou_drop, "
                "0.0 as iou_drop_ci_low, 0.0 as iou_drop_ci_high, 0.0 as mean_dice_drop, 0.0 as dice_drop_ci_low, "
                "0.0 as dice_drop_ci_high, 0.0 as clean_iou, 0.0 as clean_dice, 1 as n_trainable, 1 as rank, "
                "false as with_floor) "
                "where false")
    con.execute(f"create view strategy_ranking as {MART_VIEWS['strategy_ranking']}")
    con.close()
    rep = build_report(mart, tmp_path / "out", log_mlflow=False)
    assert rep.skipped["strategy_ranking"] == "the strategy_ranking view has no rows"


def test_figures_are_deterministic(mart: Path, report: ReportSummary, tmp_path: Path) -> None:
    again = build_report(mart, tmp_path / "again", log_mlflow=False)
    assert [p.name for p in again.figures] == [p.name for p in report.figures]
    for a, b in zip(again.figures, report.figures, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    for name in ALL_TABLES:
        for ext in ("csv", "md", "tex"):
            assert ((tmp_path / "again" / "tables" / f"{name}.{ext}").read_text()
                    == (report.out_dir / "tables" / f"{name}.{ext}").read_text())


@pytest.mark.usefixtures("png_only")
def test_logs_one_mlflow_run_with_every_file(mart: Path, tmp_path: Path) -> None:
    rep = build_report(mart, tmp_path / "out", ["sam_a"], mlruns_dir=tmp_path / "mlruns")
    assert rep.mlflow_run_id
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(rep.mlflow_run_id)
    assert client.get_experiment(run.info.experiment_id).name == "reports"
    assert run.data.params["models"] == "sam_a"
    logged = {f.path for f in client.list_artifacts(rep.mlflow_run_id)}
    logged |= {f.path for d in ("tables", "figures") for f in client.list_artifacts(rep.mlflow_run_id, d)}
    assert logged >= {p.relative_to(rep.out_dir).as_posix() for p in rep.files}
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()


@pytest.mark.usefixtures("png_only")
def test_logs_into_the_given_experiment(mart: Path, tmp_path: Path) -> None:
    """The CLI passes the suite's experiment (``<suite>/reports``)."""
    rep = build_report(mart, tmp_path / "out", ["sam_a"], mlruns_dir=tmp_path / "mlruns", experiment="alpha/reports")
    from mlflow import MlflowClient

    client = MlflowClient()
    run = client.get_run(rep.mlflow_run_id)
    assert client.get_experiment(run.info.experiment_id).name == "alpha/reports"


def test_taxonomy_quadrants_builder_reports_no_rows(mart: Path) -> None:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        assert isinstance(taxonomy_quadrants(con, ["cfg_none"]), str)
    finally:
        con.close()


def test_csv_is_plain_utf8(report: ReportSummary) -> None:
    with open(report.out_dir / "tables" / "vlm_task_drops.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "model"  # no byte-order mark before the first header
    assert (report.out_dir / "tables" / "vlm_task_drops.csv").read_bytes()[:3] != b"\xef\xbb\xbf"


def test_registry_evaluations_are_left_out_unless_named() -> None:
    from medrobust_lib.report.paper import select_models

    available = {"segmentation": ["medrobust-seg-tiny-sam-lora-v1", "medrobust-seg-tiny-sam-lora-v3", "tiny-sam",
                                  "tiny-sam-lora"], "strategies": ["tiny-sam"], "vlm": ["tiny-llava"], "taxonomy": []}
    sel = select_models(available, None)
    assert sel == {"segmentation": ["tiny-sam", "tiny-sam-lora"], "strategies": None, "vlm": None, "taxonomy": None}
    sel = select_models(available, ["medrobust-seg-tiny-sam-lora-v3", "tiny-sam"])
    assert sel["segmentation"] == ["medrobust-seg-tiny-sam-lora-v3", "tiny-sam"] and sel["vlm"] == []
    assert select_models({k: [m for m in v if "-v" not in m] for k, v in available.items()}, None)["segmentation"] is None


@pytest.mark.usefixtures("png_only")
def test_page_names_the_partitions_left_out(tmp_path: Path) -> None:
    from medrobust_lib.store.completeness import COMPLETENESS_COLUMNS

    mart = make_mart(tmp_path / "m.duckdb")
    con = duckdb.connect(str(mart))
    con.execute(f"create table partition_completeness ({', '.join(f'{c} {t}' for c, t in COMPLETENESS_COLUMNS)})")
    con.execute("insert into partition_completeness values ('vlm_results', 'vlm_a', 'ct', 2, 10, 0, 10, 1, 0.1, "
                "0.02, false), ('vlm_results', 'vlm_a', 'ct', 1, 10, 0, 10, 0, 0.0, 0.02, true)")
    con.execute(f"create view incomplete_partitions as {MART_VIEWS['incomplete_partitions']}")
    con.close()
    html = build_report(mart, tmp_path / "out", log_mlflow=False).html.read_text()
    assert "vlm_results: vlm_a/ct/L2 (10.0% errors)" in html and "vlm_a/ct/L1" not in html


@pytest.mark.usefixtures("png_only")
def test_floor_datasets_are_left_out_and_flagged(tmp_path: Path) -> None:
    """A dataset whose clean IoU is ~0 (every drop 0) would make a model look robust: it is left out of
    the summary's means and the figures' data unless asked, counted, and a model entirely at the floor
    is greyed out."""
    from medrobust_lib.report import paper_tables as pt

    seg = _seg_rows()
    floor = seg[seg["model"] == "sam_a"].copy()
    floor["dataset"] = "d_floor"
    for c in ("iou", "dice", "clean_iou", "clean_dice", "iou_drop", "dice_drop"):
        floor[c] = 0.0
    only_floor = floor.assign(model="sam_z", checkpoint="ckz")
    path = tmp_path / "m.duckdb"
    con = duckdb.connect(str(path))
    try:
        _create(con, "segmentation_results", _declared("segmentation_results"), pd.concat([seg, floor, only_floor]))
    finally:
        con.close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        base = pt.segmentation_summary(con, ["sam_a", "sam_b"])
        assert not isinstance(base, str)
        con2 = duckdb.connect(":memory:")
        frame = seg  # noqa: F841 - read by DuckDB's replacement scan
        con2.execute("create table segmentation_results as select * from frame")
        clean_only = pt.segmentation_summary(con2, ["sam_a", "sam_b"])
        con2.close()
        assert not isinstance(clean_only, str)
        a = base.data.set_index("model").loc["sam_a"]
        ref = clean_only.data.set_index("model").loc["sam_a"]
        # the floor dataset is left out: the same means as without it, and counted
        assert a["corruption_dice_drop"] == pytest.approx(ref["corruption_dice_drop"], rel=1e-12)
        assert a["clean_iou"] == pytest.approx(ref["clean_iou"], rel=1e-12)
        assert a["n_floor_datasets"] == 1 and not a["floor_effect"]
        assert "Floor" in base.headers and "left out" in base.note
        # named, with its clean scores (issue 43, item 6: not only "Floor 1")
        assert "Floor datasets: sam_a" in base.note and "d_floor (" in base.note
        assert "clean IoU 0.000, Dice 0.000" in base.note and "sam_z" not in base.note
        asked = pt.segmentation_summary(con, ["sam_a"], include_floor=True)
        assert not isinstance(asked, str)
        assert asked.data.iloc[0]["corruption_dice_drop"] < a["corruption_dice_drop"]  # diluted by the zeros
        z = pt.segmentation_summary(con, ["sam_z"])
        assert not isinstance(z, str) and bool(z.data.iloc[0]["floor_effect"]) and z.greyed() == [True]
        md = to_markdown(z)
        assert "| sam_z † |" in md
        tex = to_latex(z)
        assert "\\textcolor{gray}{sam\\_z}" in tex and "xcolor" in tex.splitlines()[0]
        lv = pt.segmentation_level_means(con, ["sam_a", "sam_z"])
        assert set(lv.loc[lv["floor_effect"], "model"]) == {"sam_z"}
        both = pt.segmentation_level_means(con, ["sam_a"], include_floor=True)
        assert (both["n"] > lv[lv["model"] == "sam_a"]["n"].to_numpy()).all()
    finally:
        con.close()


def test_summary_rows_say_their_coverage(report: ReportSummary) -> None:
    data = _csv(report, "segmentation_summary")
    assert list(data["levels"].astype(str)) == ["1,2", "1,2"] and list(data["n_conditions"]) == [6, 6]


@pytest.mark.usefixtures("png_only")
def test_vlm_floor_uses_the_chance_the_view_derives(tmp_path: Path) -> None:
    """A view with ``chance`` decides the flag: vlm_a's clean accuracy 0.7 is above a fixed 0.25 but at
    or below the chance 0.75 its items would give (4/3-option mix made up here)."""
    from medrobust_lib.report import paper_tables as pt

    mart = make_mart(tmp_path / "m.duckdb")
    con = duckdb.connect(str(mart))
    con.execute("create table drops_with_chance as select *, case when task = 'vqa_mc' and model = 'vlm_a' "
                "then 0.75 when task = 'vqa_mc' then 0.25 end as chance from vlm_task_drops")
    con.execute("drop table vlm_task_drops")
    con.execute("alter table drops_with_chance rename to vlm_task_drops")
    con.close()
    con = duckdb.connect(str(mart), read_only=True)
    try:
        t = pt.vlm_task_drops(con, None)
    finally:
        con.close()
    assert not isinstance(t, str)
    flagged = t.data.groupby(["model", "task"])["floor_effect"].all()
    assert flagged.to_dict() == {("vlm_a", "caption"): False, ("vlm_a", "vqa_mc"): True,
                                 ("vlm_b", "caption"): False, ("vlm_b", "vqa_mc"): False}
    assert "multiple choice 1 / the options of its items" in t.note and "chance" not in t.data.columns


def _floor_mart(path: Path) -> Path:
    """The test mart plus sam_a's floor dataset, with every segmentation view (both variants) and a
    ranking table holding both variants, one strategy entirely at the floor."""
    from medrobust_lib.store.views.common import FLOOR_NOTE

    mart = make_mart(path)
    seg = _seg_rows()
    floor = seg[seg["model"] == "sam_a"].assign(dataset="d_floor")
    for c in ("iou", "dice", "clean_iou", "clean_dice", "iou_drop", "dice_drop"):
        floor[c] = 0.0
    strat = _strategy_rows()
    strat = pd.concat([strat, strat.assign(with_floor=True)], ignore_index=True)
    zero = (strat["strategy"] == "decoder_only") & (strat["model"] == "sam_a") & (strat["kind"] == "corruption")
    strat["note"] = None
    strat.loc[zero & ~strat["with_floor"], ["rank", "note"]] = [None, FLOOR_NOTE]
    strat.loc[zero & strat["with_floor"], "mean_iou_drop"] = 0.0
    frame = floor  # noqa: F841 - read by DuckDB's replacement scan
    con = duckdb.connect(str(mart))
    try:
        con.execute("insert into segmentation_results by name select * from frame")
        stats = segmentation_stats(con.execute("select * from segmentation_results").df(), seed=0)  # noqa: F841
        con.execute("delete from segmentation_stats")
        con.execute("insert into segmentation_stats by name select * from stats")
        con.execute("drop view strategy_ranking")
        con.execute("drop table strategy_ranking_stats")
        cols = [(c, "DOUBLE" if "drop" in c or "clean" in c else "BOOLEAN" if c == "with_floor" else
                 "VARCHAR" if c in ("model", "strategy", "kind", "note") else "BIGINT") for c in strat.columns]
        _create(con, "strategy_ranking_stats", cols, strat)
        for view in ("segmentation_by_level", "segmentation_by_level_all", "strategy_ranking", "strategy_ranking_all"):
            con.execute(f"create or replace view {view} as {MART_VIEWS[view]}")
    finally:
        con.close()
    return mart


@pytest.mark.usefixtures("png_only")
def test_report_reads_the_floor_views(tmp_path: Path) -> None:
    """By level and strategy ranking: the floor-free views (with CIs of their own rows), the ``_all``
    views with ``include_floor``, the ranking view's notes under the table."""
    from medrobust_lib.report import paper_tables as pt

    con = duckdb.connect(str(_floor_mart(tmp_path / "m.duckdb")), read_only=True)
    try:
        lv = pt.segmentation_by_level(con, ["sam_a"])
        lv_all = pt.segmentation_by_level(con, ["sam_a"], include_floor=True)
        assert not isinstance(lv, str) and not isinstance(lv_all, str)
        exp = con.execute("select * from segmentation_by_level where model = 'sam_a'").df()
        exp_all = con.execute("select * from segmentation_by_level_all where model = 'sam_a'").df()
        assert sorted(lv.data["n"]) == sorted(exp["n"]) and sorted(lv_all.data["n"]) == sorted(exp_all["n"])
        assert (lv_all.data["n"] == 12).all() and (lv.data["n"] < 12).all()
        assert lv.data["iou_drop_ci_low"].notna().all() and lv_all.data["iou_drop_ci_low"].notna().all()
        assert not lv.data["iou_drop_ci_low"].equals(lv_all.data["iou_drop_ci_low"])
        default = pt.strategy_ranking(con, ["sam_a"])
        asked = pt.strategy_ranking(con, ["sam_a"], include_floor=True)
    finally:
        con.close()
    assert not isinstance(default, str) and not isinstance(asked, str)
    d = default.data.set_index(["kind", "strategy"])
    a = asked.data.set_index(["kind", "strategy"])
    assert pd.isna(d.loc[("corruption", "decoder_only"), "rank"])
    assert a.loc[("corruption", "decoder_only"), "mean_iou_drop"] == 0.0
    assert "sam_a / corruption / decoder_only: every dataset at the floor" in default.note
    assert "every dataset at the floor" not in asked.note


def test_taxonomy_screening_is_the_clean_rows_of_the_view(report: ReportSummary, mart: Path) -> None:
    got = _csv(report, "taxonomy_screening")
    exp = screening_stats(_taxonomy_rows())
    exp = exp[exp["perturbation"] == "clean"]
    assert len(got) == len(exp) == len(CONFIGS) * 2 * 3  # configs x datasets x signals
    merged = got.merge(exp, on=["config", "dataset", "image_mode", "signal"], suffixes=("", "_lib"))
    assert len(merged) == len(got)
    for c in ("auroc", "dangerous_pass", "threshold"):
        assert np.allclose(merged[c], merged[f"{c}_lib"], equal_nan=True)
    assert list(got["signal"][:3]) == ["max_p", "margin", "entropy"]


@pytest.mark.usefixtures("png_only")
def test_strategy_models_get_the_comparison_figure_not_their_own(tmp_path: Path) -> None:
    """A fine-tuned strategy's model (``evaluated_as`` in the strategy ranking) is compared in the
    strategy figure; its own curves and heatmaps are drawn only when ``--models`` names it."""
    mart = make_mart(tmp_path / "m.duckdb")
    con = duckdb.connect(str(mart))
    con.execute("create or replace table strategy_ranking_stats as select *, "
                "case when model = 'sam_b' then 'sam_b' else model || '-' || strategy end as evaluated_as "
                "from strategy_ranking_stats")
    con.close()
    rep = build_report(mart, tmp_path / "all", None, log_mlflow=False)
    names = {p.name for p in rep.figures}
    assert "sam_a_iou_curves.png" in names and "sam_b_iou_curves.png" not in names
    assert "strategy_iou_drop.png" in names
    assert "--models" in rep.skipped["per-strategy curves and heatmaps"]
    named = build_report(mart, tmp_path / "named", parse_models("sam_b"), log_mlflow=False)
    assert "sam_b_iou_curves.png" in {p.name for p in named.figures}


@pytest.mark.usefixtures("png_only")
def test_a_full_disk_while_logging_to_mlflow_is_one_line_and_keeps_the_report(
        mart: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44, finding 12: a tracking store that fails mid-way (disk full) used to print two chained
    tracebacks (91 lines); now the written report stays and the failure is one line, exit 1."""
    from typer.testing import CliRunner

    import medrobust_lib.report.paper as paper
    from medrobust_cli import app

    def disk_full(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paper, "log_artifact", disk_full)
    rep = build_report(mart, tmp_path / "out", ["sam_a"], mlruns_dir=tmp_path / "mlruns")
    assert rep.mlflow_run_id is None and rep.mlflow_error == "OSError: [Errno 28] No space left on device"
    assert rep.html.is_file() and all(f.is_file() for f in rep.files)

    res = CliRunner().invoke(app, ["report", "--mart", str(mart), "--out", str(tmp_path / "cli"),
                                   "--mlruns", str(tmp_path / "mlruns2"), "--models", "sam_a"])
    errors = [line for line in res.output.splitlines() if line.startswith("error")]
    assert res.exit_code == 1, res.output
    assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in res.output
    assert (tmp_path / "cli" / "index.html").is_file()
