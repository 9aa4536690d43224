"""A suite's code location, as ``medrobust ui --suite`` writes it: a module whose ``defs`` is
``definitions_for`` of that suite, and a workspace file that loads it from the project root."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medrobust_assets.location_files import write_location


def _suite(tmp_path: Path) -> Path:
    p = tmp_path / "suites" / "mine.yaml"
    p.parent.mkdir(parents=True)
    p.write_text(yaml.safe_dump({
        "name": "mine", "results_dir": str(tmp_path / "results"), "mart_path": str(tmp_path / "m.duckdb"),
        "modalities": ["ct"], "perturbations": {"levels": [3]},
        "segmentation": {"models": [{"id": "medsam-x", "family": "medsam", "checkpoint": str(tmp_path / "w.pth")}]}}))
    return p


def test_the_written_location_serves_the_suite(tmp_path: Path) -> None:
    suite, root = _suite(tmp_path), tmp_path / "project"
    workspace = write_location(suite, "mine", root)
    assert workspace == root / "var" / "locations" / "mine" / "workspace.yaml"
    [entry] = yaml.safe_load(workspace.read_text())["load_from"]
    loc = entry["python_file"]
    assert loc["location_name"] == "mine" and loc["working_directory"] == str(root.resolve())
    spec = importlib.util.spec_from_file_location("generated_location", loc["relative_path"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = module.defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert "medsam-x/perturbed_predictions" in keys and "tiny-sam/clean_predictions" not in keys
    node = graph.get(next(k for k in graph.get_all_asset_keys() if k.to_user_string() == "perturbed_samples"))
    assert [str(k) for k in node.partitions_def.get_partition_keys()] == ["ct|3"]
    assert module.defs.resources["suite"].suite_path == str(suite.resolve())


def test_ui_no_start_writes_the_location_and_prints_its_workspace(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_cli import app

    suite, root = _suite(tmp_path), tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEDROBUST_HOME", str(root))
    res = CliRunner().invoke(app, ["ui", "--suite", str(suite), "--no-start"])
    assert res.exit_code == 0, res.output
    workspace = Path(res.stdout.strip())
    assert workspace == root / "var" / "locations" / "mine" / "workspace.yaml" and workspace.is_file()
    assert f"SUITE = {str(suite.resolve())!r}" in (workspace.parent / "location.py").read_text()
