"""The report's analyses (issue 46, item 9): the modality-share, IoU-vs-Dice and mCE tables, the
pooled Delta in the summary, the performance-robustness trade-off figure, and ``--mce-baseline``
(defaulting to the suite's ``segmentation.mce_baseline``). The mart is test_paper's."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.config.segmentation import SegmentationConfig
from medrobust_lib.report.entries import ReportSettings, build_tables
from medrobust_lib.report.figures import paper as figs
from medrobust_lib.report.figures import style
from medrobust_lib.report.paper_tables import mce, segmentation_summary
from medrobust_lib.report.table import ReportTable
from tests.report.test_paper import make_mart

runner = CliRunner()


@pytest.fixture(scope="module")
def mart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mart(tmp_path_factory.mktemp("mart") / "marts.duckdb", with_strategy=False)


def _tables(mart: Path, baseline: str | None) -> dict[str, ReportTable | str]:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        tables, skipped = build_tables(ReportSettings(con, mce_baseline=baseline), {"segmentation": None})
    finally:
        con.close()
    return {**{t.name: t for t in tables}, **skipped}


def test_mce_table_shows_the_named_baselines_rows(mart: Path) -> None:
    out = _tables(mart, "sam_b")
    table = out["mce"]
    assert not isinstance(table, str)
    df = table.data.set_index("model")
    assert set(df["baseline"]) == {"sam_b"} and set(df.index) == {"sam_a", "sam_b"}
    assert df.loc["sam_b", "mce_iou"] == pytest.approx(1.0) and df.loc["sam_b", "relative_mce_dice"] == pytest.approx(1.0)
    # sam_a loses half as much per level as sam_b (test_paper's rows) and starts higher: lower errors
    assert (df.loc[["sam_a"], ["relative_mce_iou", "mce_iou"]].to_numpy(float) < 1.0).all()
    assert (df["n_types"] == 2).all()
    assert "MedMNIST-C" in table.title and "sam_b" in table.title
    con = duckdb.connect(str(mart), read_only=True)
    try:
        assert "no mCE baseline named" in str(mce(con, None, None))
        assert "has no segmentation rows" in str(mce(con, None, "nope"))
    finally:
        con.close()


def test_modality_share_and_agreement_tables(mart: Path) -> None:
    out = _tables(mart, None)
    share = out["modality_share"]
    assert not isinstance(share, str)
    # test_paper's two types are generic (noise, blur): none of the top k is modality-specific
    assert set(share.data["k"]) == {5, 10, 15} and (share.data["n_specific"] == 0).all()
    assert (share.data["n_top"] == 2).all() and (share.data["share"] == 0).all()
    agree = out["iou_dice_agreement"]
    assert not isinstance(agree, str)
    assert set(agree.data["model"]) == {"sam_a", "sam_b"} and (agree.data["n_types"] == 2).all()
    assert isinstance(out["mce"], str)


def test_summary_shows_the_pooled_delta(mart: Path) -> None:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        table = segmentation_summary(con, None)
        ok = con.execute("select * from segmentation_results where status = 'ok'").df()
    finally:
        con.close()
    assert not isinstance(table, str)
    assert "ΔIoU pooled" in [c.header for c in table.columns]
    for model, g in ok.groupby("model"):
        clean = g[g["condition"] == "clean"]
        pert = g[g["condition"] == "perturbation"]
        row = table.data.set_index("model").loc[model]
        assert row["corruption_iou_drop_pooled"] == pytest.approx(clean["iou"].mean() - pert["iou"].mean())
        assert row["corruption_dice_drop_pooled"] == pytest.approx(clean["dice"].mean() - pert["dice"].mean())


def test_tradeoff_figure_house_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(style, "RECORD_OVERLAPS", True)
    style.OVERLAPS.clear()
    rows = pd.DataFrame([{"model": m, "strategy": s, "clean_iou": 0.5 + 0.04 * i, "corruption_iou_drop": 0.02 * i,
                          "attack_iou_drop": 0.05 + 0.01 * i if i % 2 else None, "clean_dice": 0.6 + 0.03 * i,
                          "corruption_dice_drop": 0.015 * i, "attack_dice_drop": 0.04 if i % 2 else None,
                          "floor_effect": i == 6}
                         for i, (m, s) in enumerate([("tiny-sam", "pretrained"), ("litemedsam", "pretrained"),
                                                     *[("tiny-sam-" + s, s) for s in ("full", "decoder_only",
                                                                                      "decoder_prompt", "lora",
                                                                                      "adapter")]])])
    paths = figs.tradeoff_scatter(rows, tmp_path)
    assert [p.name for p in paths] == ["tradeoff_clean_vs_drop.png"]
    p = paths[0]
    assert style.OVERLAPS[str(p)] == []
    assert p.with_suffix(".pdf").is_file() and p.with_suffix(".svg").is_file()
    assert figs.tradeoff_scatter(rows.iloc[0:0], tmp_path / "none") == []


def test_mce_baseline_must_name_a_model_of_the_suite() -> None:
    models = [{"id": "a", "family": "sam", "arch": "tiny", "checkpoint": "trained"}]
    assert SegmentationConfig.model_validate({"models": models, "mce_baseline": "a"}).mce_baseline == "a"
    with pytest.raises(ValueError, match="mce_baseline 'b' is not a segmentation model of the suite; valid: a"):
        SegmentationConfig.model_validate({"models": models, "mce_baseline": "b"})


@pytest.mark.usefixtures("png_only")  # two whole reports: their PDF / SVG twins are not the point
def test_cli_mce_baseline_option_and_suite_default(mart: Path, tmp_path: Path) -> None:
    out = tmp_path / "r1"
    res = runner.invoke(app, ["report", "--mart", str(mart), "--out", str(out), "--no-mlflow",
                              "--mce-baseline", "sam_b"])
    assert res.exit_code == 0, res.output
    assert set(pd.read_csv(out / "tables" / "mce.csv")["baseline"]) == {"sam_b"}
    assert 'figures/tradeoff_clean_vs_drop.png' in (out / "index.html").read_text()
    (tmp_path / "w.pth").write_bytes(b"")
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: t\nsegmentation:\n  models:\n"
                     "    - {id: sam_a, family: sam, arch: tiny, checkpoint: w.pth}\n"
                     "    - {id: sam_b, family: sam, arch: tiny, checkpoint: w.pth}\n"
                     "  mce_baseline: sam_a\n")
    out2 = tmp_path / "r2"
    res = runner.invoke(app, ["report", "--suite", str(suite), "--mart", str(mart), "--out", str(out2),
                              "--no-mlflow"])
    assert res.exit_code == 0, res.output
    assert set(pd.read_csv(out2 / "tables" / "mce.csv")["baseline"]) == {"sam_a"}
