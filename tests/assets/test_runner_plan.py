"""The runner derives what runs, and in which order, from the Definitions' asset graph."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from medrobust_assets.definitions import definitions_for
from medrobust_assets.runner import StepFailed, parse_selection, plan, run_suite
from medrobust_lib import runtime

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


def _suite() -> object:
    return runtime.load_suite(DEMO)


defs = definitions_for(runtime.load_suite(DEMO))


def test_plan_follows_the_asset_graph() -> None:
    suite = _suite()
    steps = plan(dg.AssetSelection.all(), defs, dg.DagsterInstance.ephemeral())
    order = [s.key for s in steps]
    graph = defs.resolve_asset_graph()
    pos = {k: i for i, k in reversed(list(enumerate(order)))}  # first run of each asset
    for key in set(order):
        for parent in graph.get(key).parent_keys:
            if parent in pos:
                assert pos[parent] < pos[key], f"{parent} must run before {key}"
    # every partition the suite asks for, once: modality x level partitions of the perturbed data
    n_mod, n_lv = len(suite.modalities), len(suite.perturbations.levels)  # type: ignore[attr-defined]
    labels = [s.label for s in steps]
    assert len(labels) == len(set(labels))
    assert sum(s.key == dg.AssetKey("perturbed_samples") for s in steps) == n_mod * n_lv
    assert sum(s.key == dg.AssetKey("clean_samples") for s in steps) == n_mod
    assert order[0] == dg.AssetKey("demo_data") and order[-1] == dg.AssetKey("marts")


def test_taxonomy_levels_limit_only_the_taxonomy_partitions() -> None:
    """``taxonomy.levels`` plans the taxonomy's perturbed partitions at those levels only; the
    perturbed data and the other tracks keep every perturbed level; a level that is not perturbed
    is refused when the suite loads."""
    from medrobust_lib.config import Suite

    base = _suite()
    data = base.model_dump()  # type: ignore[attr-defined]
    data["taxonomy"]["levels"] = [4]
    for m in data["vlm"]["models"]:
        m["levels"] = None  # the demo's VLMs have their own (4): every perturbed level here
    suite = Suite.model_validate(data)
    assert suite.perturbations.levels == [2, 4] and suite.taxonomy_levels() == [4]
    steps = plan(dg.AssetSelection.all(), definitions_for(suite), dg.DagsterInstance.ephemeral())
    n_mod = len(suite.modalities)
    tax = [s for s in steps if s.key.path[-1] == "taxonomy_perturbed"]
    n_configs = len(suite.taxonomy.configs)
    assert len(tax) == n_configs * n_mod
    assert {s.partition.keys_by_dimension["severity"] for s in tax} == {"4"}  # type: ignore[union-attr]
    assert sum(s.key == dg.AssetKey("perturbed_samples") for s in steps) == 2 * n_mod
    vlm = [s for s in steps if s.key.path[-1] == "vlm_perturbed_predictions"]
    assert {s.partition.keys_by_dimension["severity"] for s in vlm} == {"2", "4"}  # type: ignore[union-attr]
    data["taxonomy"]["levels"] = [3]
    with pytest.raises(ValueError, match=r"taxonomy.levels \[3\] are not perturbed"):
        Suite.model_validate(data)


def test_selection_by_group_asset_and_upstream() -> None:
    suite, inst = _suite(), dg.DagsterInstance.ephemeral()
    seg = plan(parse_selection(["segmentation"], defs), defs, inst)
    assert {s.group for s in seg} == {"segmentation"}
    one = plan(parse_selection(["tiny-sam/clean_predictions"], defs), defs, inst)
    assert {s.key.to_user_string() for s in one} == {"tiny-sam/clean_predictions"}
    up = {s.key.to_user_string() for s in plan(parse_selection(["+tiny-sam/clean_predictions"], defs), defs, inst)}
    assert {"demo_data", "clean_samples", "tiny-sam/base_checkpoint", "tiny-sam/clean_predictions"} <= up
    with pytest.raises(ValueError, match=r"unknown group or asset 'segmentatoin'; groups: .*segmentation"):
        parse_selection(["segmentatoin"], defs)
    assert suite is not None


def test_failure_is_one_line_naming_asset_partition_and_cause(tmp_path: Path) -> None:
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({
        "name": "broken", "results_dir": str(tmp_path / "results"), "mart_path": str(tmp_path / "m.duckdb"),
        "modalities": ["ct"], "datasets": [{"name": "scans", "modality": "ct", "format": "folder",
                                            "root": str(tmp_path / "missing")}]}))
    with pytest.raises(StepFailed) as err:
        run_suite(str(p), ["clean_samples"], instance=dg.DagsterInstance.ephemeral(), log=lambda _: None,
                  mlruns_dir=str(tmp_path / "mlruns"))
    msg = str(err.value)
    assert "\n" not in msg and err.value.label == "clean_samples[ct]"
    assert "missing" in err.value.cause and "Dagster run" in msg


def test_a_suite_runs_its_own_models(tmp_path: Path) -> None:
    """The graph is built from the suite being run (no environment variable): a model only this
    suite names gets its assets, and the demo's models are not in its graph."""
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({
        "name": "mine", "results_dir": str(tmp_path / "results"), "mart_path": str(tmp_path / "m.duckdb"),
        "segmentation": {"models": [{"id": "medsam-x", "family": "medsam", "checkpoint": str(tmp_path / "w.pth")}]}}))
    mine = definitions_for(runtime.load_suite(p))
    steps = plan(parse_selection(["segmentation"], mine), mine, dg.DagsterInstance.ephemeral())
    assert {s.key.path[0] for s in steps if len(s.key.path) == 2} == {"medsam-x"}


def test_steps_share_runs_only_within_a_level_partition_and_partitions_definition() -> None:
    """Runs group the steps of one topological level with the same partitions definition and
    partition; every step runs once, and every run follows the runs of what it depends on."""
    from medrobust_assets.runner import batch_steps

    _suite()
    steps = plan(dg.AssetSelection.all(), defs, dg.DagsterInstance.ephemeral())
    runs = batch_steps(steps)
    assert sorted(s.label for r in runs for s in r) == sorted(s.label for s in steps)
    assert len(runs) < len(steps) * 0.6  # the demo's 270-odd steps need far fewer runs
    for r in runs:
        assert len({s.level for s in r}) == 1 and len({str(s.partition) for s in r}) == 1
        assert len({id(s.partitions_def) for s in r}) == 1 and len({s.key for s in r}) == len(r)
    graph = defs.resolve_asset_graph()
    runs_of: dict[dg.AssetKey, list[int]] = {}
    for i, r in enumerate(runs):
        for s in r:
            runs_of.setdefault(s.key, []).append(i)
    for i, r in enumerate(runs):
        for s in r:
            for parent in graph.get(s.key).parent_keys:
                assert all(j < i for j in runs_of.get(parent, [])), f"every run of {parent} must precede {s.label}"
    # the perturbed data of one (modality, level) and nothing of another partition share a run
    ct4 = next(r for r in runs if any(s.key == dg.AssetKey("perturbed_samples") for s in r)
               and str(r[0].partition) == "ct|4")
    assert {str(s.partition) for s in ct4} == {"ct|4"}
