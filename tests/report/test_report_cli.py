"""``medrobust report``: writes the report, prints the page path, refuses unknown ids."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from medrobust_cli import app
from tests.report.test_paper import make_mart

runner = CliRunner()


def test_report_command_writes_the_page_and_filters(tmp_path: Path) -> None:
    mart = make_mart(tmp_path / "marts.duckdb", with_strategy=False)
    out = tmp_path / "reports"
    res = runner.invoke(app, ["report", "--mart", str(mart), "--out", str(out), "--no-mlflow",
                              "--models", "sam_a,cfg_b"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str((out / "index.html").resolve())
    assert "skipped strategy_ranking" in res.stderr and "skipped vlm_task_drops" in res.stderr
    assert set(pd.read_csv(out / "tables" / "segmentation_summary.csv")["model"]) == {"sam_a"}
    assert set(pd.read_csv(out / "tables" / "taxonomy_quadrants.csv")["config"]) == {"cfg_b"}
    assert not (out / "tables" / "vlm_task_drops.csv").exists()
    assert not (tmp_path / "mlruns").exists()


def test_report_command_errors(tmp_path: Path) -> None:
    mart = make_mart(tmp_path / "marts.duckdb", with_strategy=False)
    res = runner.invoke(app, ["report", "--mart", str(mart), "--out", str(tmp_path / "o"), "--no-mlflow",
                              "--models", "sam_a,missing_model"])
    assert res.exit_code == 2
    assert "unknown model id(s) missing_model" in res.stderr and "segmentation: sam_a, sam_b" in res.stderr
    res = runner.invoke(app, ["report", "--mart", str(tmp_path / "none.duckdb"), "--no-mlflow"])
    assert res.exit_code == 2 and "no mart at" in res.stderr
