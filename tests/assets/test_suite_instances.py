"""Each suite has its own Dagster world (issue 43, item 8): its own instance (runs, asset history)
under ``var/<suite name>/dagster``, the demo keeps the project's dagster.yaml, an explicit
``$DAGSTER_HOME`` is used as given; and the runs the runner launches are named after the suite and
the selection (job name and tags), not ``__ephemeral_asset_job__``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pytest
import yaml
from PIL import Image

from medrobust_assets.location_files import suite_instance_home
from medrobust_assets.runner import run_suite
from medrobust_assets.tags import SELECTION_TAG, SUITE_NAME_TAG, run_job_name

ROOT = Path(__file__).resolve().parents[2]


def _suite(name: str, results_dir: str | None = None) -> SimpleNamespace:
    results = results_dir or f"var/{name}/results"
    return SimpleNamespace(name=name, results_dir=results, mart_path=str(Path(results).parent / "marts.duckdb"))


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(ROOT / "dagster.yaml", root / "dagster.yaml")
    return root


def test_each_suite_gets_its_own_instance_the_demo_the_projects(tmp_path: Path) -> None:
    root = _project(tmp_path)
    env = {"DAGSTER_HOME": str(root)}  # as the Makefile exports it
    assert suite_instance_home(_suite("demo", "var/results"), root, env) == root.resolve()
    assert suite_instance_home(_suite("demo", "var/results"), root, {}) == root.resolve()
    a = suite_instance_home(_suite("alpha"), root, env)
    b = suite_instance_home(_suite("beta"), root, {})
    assert a == (root / "var" / "alpha" / "dagster").resolve() and b == (root / "var" / "beta" / "dagster").resolve()
    cfg = yaml.safe_load((a / "dagster.yaml").read_text())
    project = yaml.safe_load((root / "dagster.yaml").read_text())
    assert cfg["storage"]["sqlite"]["base_dir"] == str(a / "storage")
    assert cfg["compute_logs"]["config"]["base_dir"] == str(a / "logs")
    assert cfg["local_artifact_storage"]["config"]["base_dir"] == str(a)
    for same in ("run_queue", "run_monitoring", "telemetry", "nux"):  # the project's settings, kept
        assert cfg[same] == project[same], same
    assert cfg["nux"] == {"enabled": False} and cfg["telemetry"] == {"enabled": False}
    with dg.DagsterInstance.from_config(str(a)) as inst:
        assert not inst.nux_enabled and inst.run_monitoring_enabled
    # an explicit instance elsewhere (a deployment's, a test's) is used as given
    other = tmp_path / "elsewhere"
    assert suite_instance_home(_suite("alpha"), root, {"DAGSTER_HOME": str(other)}) == other


def test_the_projects_instance_has_no_community_dialog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(ROOT))
    with dg.DagsterInstance.get() as inst:
        assert not inst.nux_enabled  # GraphQL shouldShowNux: false, so the UI shows no "Join the community"


def test_run_job_names_say_suite_and_selection() -> None:
    assert run_job_name("demo", ["litemedsam/perturbed_predictions"]) == "demo__litemedsam__perturbed_predictions"
    assert run_job_name("suite-a", ["tiny-sam/clean_predictions"]) == "suite_a__tiny_sam__clean_predictions"
    five = [f"m{i}/clean_predictions" for i in range(5)]
    assert run_job_name("x", five) == "x__m0__clean_predictions__m1__clean_predictions__m2__clean_predictions_and_2_more"
    assert run_job_name("9lives", ["marts"]) == "suite_9lives__marts"
    with pytest.raises(ValueError):
        run_job_name("x", [])


def _gray_folder(root: Path) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    mask = np.zeros((32, 32), np.uint8)
    mask[8:24, 8:24] = 255
    for i in range(2):
        Image.fromarray((mask // 2 + 40 + 10 * i).astype(np.uint8)).save(root / "images" / f"s{i}.png")
        Image.fromarray(mask).save(root / "masks" / f"s{i}.png")
    return root


def _write_suite(root: Path, name: str) -> Path:
    data = _gray_folder(root / "data" / name)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "seed": 1, "workers": 1, "modalities": ["dermoscopy"],  # results: var/<name>/ (default)
        "datasets": [{"name": "gray", "modality": "dermoscopy", "format": "folder", "root": str(data), "size": 32}],
        "perturbations": {"include": ["gaussian_noise"], "levels": [1], "split": "all", "calibration_subset": 2},
    }))
    return path


def test_two_suites_runs_stay_in_their_own_instances_with_readable_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both suites materialize ``clean_samples`` (one asset key): each instance holds only its own
    suite's runs and materializations, and every run is named after its suite and selection."""
    root = _project(tmp_path)
    monkeypatch.chdir(root)  # the CLI runs from the project root
    monkeypatch.setenv("DAGSTER_HOME", str(root))  # as `make` exports it
    suites = {name: _write_suite(root, name) for name in ("alpha", "beta")}
    for path in suites.values():
        run_suite(str(path), ["clean_samples"], log=lambda _: None, mlruns_dir=str(tmp_path / "mlruns"))
    key = dg.AssetKey("clean_samples")
    for name in suites:
        home = root / "var" / name / "dagster"
        assert (home / "dagster.yaml").is_file()
        with dg.DagsterInstance.from_config(str(home)) as inst:
            runs = inst.get_runs()
            assert runs, name
            assert {r.tags.get(SUITE_NAME_TAG) for r in runs} == {name}
            assert {r.job_name for r in runs} == {f"{name}__clean_samples"}
            assert all(r.tags[SELECTION_TAG] == "clean_samples" and r.tags["dagster/partition"] == "dermoscopy"
                       for r in runs)
            events = inst.fetch_materializations(key, limit=100).records
            assert events and {inst.get_run_by_id(e.run_id).tags[SUITE_NAME_TAG] for e in events} == {name}  # type: ignore[union-attr]
    assert not (root / "var" / "dagster" / "storage").exists()  # the demo's instance saw neither


def test_medrobust_ui_serves_the_suites_own_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`medrobust ui --suite` (and `make ui SUITE=...`, which exports DAGSTER_HOME=<project root>)
    starts dagster dev with the suite's instance, whose dagster.yaml has no community dialog."""
    from typer.testing import CliRunner

    import medrobust_assets.ui as ui
    from medrobust_cli import app

    root = _project(tmp_path)
    suite = _write_suite(root, "alpha")
    seen: dict[str, str] = {}

    def fake_main(argv: list[str]) -> int:
        seen["home"], seen["workspace"] = os.environ["DAGSTER_HOME"], argv[argv.index("-w") + 1]
        return 0

    monkeypatch.setattr(ui, "main", fake_main)
    monkeypatch.setenv("MEDROBUST_HOME", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(root))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["ui", "--suite", str(suite)])
    assert res.exit_code == 0, res.output
    home = (root / "var" / "alpha" / "dagster").resolve()
    assert Path(seen["home"]) == home and seen["workspace"].endswith("var/locations/alpha/workspace.yaml")
    assert yaml.safe_load((home / "dagster.yaml").read_text())["nux"] == {"enabled": False}
