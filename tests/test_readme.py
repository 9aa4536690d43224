"""The README stays true: its perturbation table is the registry's."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from medrobust_cli import app


def test_readme_perturbation_table_matches_registry() -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text()
    start = text.index("<!-- perturbation-table:start")
    start = text.index("\n", start) + 1
    end = text.index("<!-- perturbation-table:end -->")
    res = CliRunner().invoke(app, ["list-perturbations", "--format", "markdown"])
    assert res.exit_code == 0
    assert text[start:end].strip() == res.stdout.strip(), "regenerate: medrobust list-perturbations --format markdown"
    assert "make demo" in text and "make test" in text
