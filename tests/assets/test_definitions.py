"""Dagster wiring: the Definitions load, and a small graph materializes with checks and MLflow runs."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from medrobust_assets.definitions import ALL_ASSETS, build_resources, defs
from tests.suite_helpers import write_suite


def test_definitions_load_and_have_groups_and_partitions() -> None:
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"demo_data", "clean_samples", "perturbed_samples", "perturbation_gallery", "marts"} <= keys
    node = repo.asset_graph.get(dg.AssetKey("perturbed_samples"))
    assert isinstance(node.partitions_def, dg.MultiPartitionsDefinition)
    assert {d.name for d in node.partitions_def.partitions_defs} == {"modality", "severity"}
    assert len(node.partitions_def.get_partition_keys()) == 50
    checks = {c.name for c in repo.asset_graph.asset_check_keys if c.asset_key == dg.AssetKey("perturbed_samples")}
    assert checks == {"band_hit_rate", "finite_outputs", "completeness"}


def test_small_graph_materializes(tmp_path: Path, demo_root: Path) -> None:
    suite = write_suite(tmp_path, demo_root, modalities=["ct"],
                        perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                       "calibration_subset": 2})
    mlruns = tmp_path / "mlruns"
    resources = build_resources(suite_path=str(suite), mlruns_dir=str(mlruns))
    instance = dg.DagsterInstance.ephemeral()

    def run(asset: str, partition: str | dg.MultiPartitionKey | None = None) -> dg.ExecuteInProcessResult:
        res = dg.materialize(ALL_ASSETS, selection=[asset], partition_key=partition, instance=instance,
                             resources=resources)
        assert res.success
        return res

    run("demo_data")
    r = run("clean_samples", "ct")
    mat = r.asset_materializations_for_node("clean_samples")[0]
    assert mat.metadata["n_ok"].value == 4 and mat.metadata["n_quarantined"].value == 0
    r = run("perturbed_samples", dg.MultiPartitionKey({"modality": "ct", "severity": "2"}))
    evals = {e.check_name: e for e in r.get_asset_check_evaluations()}
    assert set(evals) == {"band_hit_rate", "finite_outputs", "completeness"}
    assert evals["completeness"].passed and evals["finite_outputs"].passed
    assert evals["completeness"].metadata["n_rows"].value == 8
    run("perturbation_gallery", "ct")
    r = run("marts")
    assert r.asset_materializations_for_node("marts")[0].metadata["rows_perturbation_manifest"].value == 8

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{mlruns / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["perturbed_samples"], output_format="pandas")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["tags.dagster.partition"] == "ct|2" and row["tags.dagster.asset"] == "perturbed_samples"
    assert row["params.level"] == "2" and 0.0 <= row["metrics.band_hit_rate_reachable"] <= 1.0
    gal = mlflow.search_runs(experiment_names=["perturbation_gallery"], output_format="pandas")
    client = mlflow.MlflowClient()
    arts = [a.path for a in client.list_artifacts(gal.iloc[0]["run_id"], "galleries")]
    assert arts == ["galleries/ct_demo.png"]


def test_one_segmentation_family_per_configured_model() -> None:
    from medrobust_assets.assets.segmentation import segmentation_family

    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    # configs/demo.yaml configures tiny-sam, trained by its own base-checkpoint asset
    assert {"tiny-sam/base_checkpoint", "tiny-sam/clean_predictions", "tiny-sam/perturbed_predictions",
            "tiny-sam/attack_predictions", "segmentation_report"} <= keys
    pert = repo.asset_graph.get(dg.AssetKey(["tiny-sam", "perturbed_predictions"]))
    assert isinstance(pert.partitions_def, dg.MultiPartitionsDefinition)
    clean = repo.asset_graph.get(dg.AssetKey(["tiny-sam", "clean_predictions"]))
    assert clean.partitions_def is not None and len(clean.partitions_def.get_partition_keys()) == 10
    # a model with a local checkpoint gets no training asset
    family = segmentation_family("medsam", trained=False)
    assert [a.key.to_user_string() for a in family] == [
        "medsam/clean_predictions", "medsam/perturbed_predictions", "medsam/attack_predictions"]
