"""Dagster wiring: the Definitions load, and a small graph materializes with checks and MLflow runs."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from medrobust_assets.definitions import definitions_for_file
from medrobust_lib import runtime
from tests.dagster_helpers import asset_runner
from tests.suite_helpers import write_suite

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
DEMO_FULL = ROOT / "configs" / "demo_full.yaml"
defs = definitions_for_file(DEMO)  # the demo's graph, as its code location builds it


def test_definitions_load_and_have_groups_and_partitions() -> None:
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"demo_data", "clean_samples", "perturbed_samples", "perturbation_gallery", "marts"} <= keys
    node = repo.asset_graph.get(dg.AssetKey("perturbed_samples"))
    assert isinstance(node.partitions_def, dg.MultiPartitionsDefinition)
    assert {d.name for d in node.partitions_def.partitions_defs} == {"modality", "severity"}
    suite = runtime.load_suite(DEMO)
    assert {str(k) for k in node.partitions_def.get_partition_keys()} == {
        f"{m}|{lv}" for m in suite.modalities for lv in suite.perturbations.levels}
    checks = {c.name for c in repo.asset_graph.asset_check_keys if c.asset_key == dg.AssetKey("perturbed_samples")}
    assert checks == {"band_hit_rate", "finite_outputs", "completeness"}


def test_small_graph_materializes(tmp_path: Path, demo_root: Path) -> None:
    suite = write_suite(tmp_path, demo_root, modalities=["ct"],
                        perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                       "calibration_subset": 2})
    mlruns = tmp_path / "mlruns"
    graph = definitions_for_file(suite, mlruns_dir=str(mlruns))
    instance = dg.DagsterInstance.ephemeral()

    run = asset_runner(graph, instance)

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
    runs = mlflow.search_runs(experiment_names=["tiny/perturbed_samples"], output_format="pandas")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["tags.dagster.partition"] == "ct|2" and row["tags.dagster.asset"] == "perturbed_samples"
    assert row["params.level"] == "2" and 0.0 <= row["metrics.band_hit_rate_reachable"] <= 1.0
    gal = mlflow.search_runs(experiment_names=["tiny/perturbation_gallery"], output_format="pandas")
    client = mlflow.MlflowClient()
    arts = [a.path for a in client.list_artifacts(gal.iloc[0]["run_id"], "galleries")]
    assert arts == ["galleries/ct_demo.png"]


def test_one_segmentation_family_per_configured_model() -> None:
    from medrobust_assets.assets.segmentation import segmentation_family

    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    from medrobust_assets.partitions import partitions_for

    # configs/demo.yaml configures tiny-sam, trained by its own base-checkpoint asset
    assert {"tiny-sam/base_checkpoint", "tiny-sam/clean_predictions", "tiny-sam/perturbed_predictions",
            "tiny-sam/attack_predictions", "segmentation_report"} <= keys
    pert = repo.asset_graph.get(dg.AssetKey(["tiny-sam", "perturbed_predictions"]))
    assert isinstance(pert.partitions_def, dg.MultiPartitionsDefinition)
    clean = repo.asset_graph.get(dg.AssetKey(["tiny-sam", "clean_predictions"]))
    assert clean.partitions_def is not None and len(clean.partitions_def.get_partition_keys()) == 10
    # a model with a local checkpoint gets no training asset
    family = segmentation_family("medsam", partitions_for(runtime.load_suite(DEMO)), trained=False)
    assert [a.key.to_user_string() for a in family] == [
        "medsam/clean_predictions", "medsam/perturbed_predictions", "medsam/attack_predictions"]


def test_vlm_and_taxonomy_families_follow_the_suite() -> None:
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"tiny-llava/base_checkpoint", "tiny-llava/vlm_clean_predictions", "tiny-llava/vlm_perturbed_predictions",
            "tiny-llava-lora/finetuned_adapter", "vlm_report"} <= keys
    assert "tiny-llava-lora/base_checkpoint" not in keys  # it builds on tiny-llava's weights
    for c in ("demo-image-reliant", "demo-shortcut", "demo-consistency-lora"):
        assert {f"{c}/taxonomy_model", f"{c}/text_only_baselines", f"{c}/taxonomy_clean"} <= keys
        assert f"{c}/taxonomy_perturbed" not in keys  # the fast demo: taxonomy.levels [] (clean images only)
    # the VLMs' perturbed answers over their own levels (the fast demo: 4), the full grid over 1-5
    vlm = repo.asset_graph.get(dg.AssetKey(["tiny-llava", "vlm_perturbed_predictions"]))
    assert {k.keys_by_dimension["severity"] for k in vlm.partitions_def.get_partition_keys()} == {"4"}
    full = definitions_for_file(DEMO_FULL).get_repository_def().asset_graph
    assert dg.AssetKey(["demo-shortcut", "taxonomy_perturbed"]) in full.get_all_asset_keys()
    vlm_full = full.get(dg.AssetKey(["tiny-llava", "vlm_perturbed_predictions"]))
    assert {k.keys_by_dimension["severity"] for k in vlm_full.partitions_def.get_partition_keys()} == set("12345")
    lora = repo.asset_graph.get(dg.AssetKey(["tiny-llava-lora", "finetuned_adapter"]))
    assert dg.AssetKey(["tiny-llava", "base_checkpoint"]) in lora.parent_keys
    cons = repo.asset_graph.get(dg.AssetKey(["demo-consistency-lora", "taxonomy_model"]))
    assert dg.AssetKey(["demo-image-reliant", "taxonomy_model"]) in cons.parent_keys
    pert = full.get(dg.AssetKey(["demo-shortcut", "taxonomy_perturbed"]))
    assert isinstance(pert.partitions_def, dg.MultiPartitionsDefinition)


def test_vlm_and_taxonomy_assets_materialize(tmp_path: Path, demo_root: Path) -> None:
    vlm = {"models": [{"id": "tiny-llava", "source": "trained", "box_scale": "0-1"}], "split": "all",
           "train": {"max_steps": 10, "eval_every": 5, "time_budget_s": 30, "batch_size": 8}}
    tax = {"configs": [{"id": "demo-shortcut", "demo_training": "shortcut"}], "image_modes": ["none", "noise"],
           "split": "all", "train": {"max_steps": 10, "eval_every": 5, "time_budget_s": 30}}
    suite = write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm, taxonomy=tax,
                        perturbations={"include": ["gaussian_noise"], "split": "all", "calibration_subset": 2})
    mlruns = tmp_path / "mlruns"
    graph = definitions_for_file(suite, mlruns_dir=str(mlruns))
    instance = dg.DagsterInstance.ephemeral()

    run = asset_runner(graph, instance)

    ct2 = dg.MultiPartitionKey({"modality": "ct", "severity": "2"})
    run("demo_data")
    run("clean_samples", "ct")
    run("perturbed_samples", ct2)
    r = run("tiny-llava/base_checkpoint")
    assert r.asset_materializations_for_node("tiny_llava__base_checkpoint")[0].metadata["steps"].value <= 10
    r = run("tiny-llava/vlm_clean_predictions", "ct")
    meta = r.asset_materializations_for_node("tiny_llava__vlm_clean_predictions")[0].metadata
    assert meta["n_rows"].value == 7 * 4 and meta["n_vision_calls"].value > 0
    (check,) = r.get_asset_check_evaluations()
    assert check.check_name == "error_share" and check.passed and check.metadata["n_error"].value == 0
    run("tiny-llava/vlm_perturbed_predictions", ct2)
    run("demo-shortcut/taxonomy_model")
    run("demo-shortcut/text_only_baselines", "ct")
    r = run("demo-shortcut/taxonomy_clean", "ct")
    meta = r.asset_materializations_for_node("demo_shortcut__taxonomy_clean")[0].metadata
    assert meta["n_vision_calls"].value == meta["n_images"].value == 4  # the tower runs once per image
    assert meta["n_rows"].value == 2 * 4 * 2  # 2 questions per image x 4 images x 2 image modes
    run("demo-shortcut/taxonomy_perturbed", ct2)
    run("vlm_report")
    run("taxonomy_report")
    r = run("marts")
    assert r.asset_materializations_for_node("marts")[0].metadata["rows_taxonomy_results"].value > 0

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{mlruns / 'mlflow.db'}")
    client = mlflow.MlflowClient(registry_uri=f"sqlite:///{mlruns / 'mlflow.db'}")
    versions = client.search_model_versions("name='medrobust-vlm-tiny-llava'")
    assert len(versions) == 1 and versions[0].source.endswith("/model")
    files = {a.path for a in client.list_artifacts(versions[0].run_id, "model")}
    assert "model/model.safetensors" in files


GROUPS = {"datasets", "perturbations", "segmentation", "vlm", "taxonomy", "finetune", "marts"}


def test_every_asset_is_described_grouped_and_kinded() -> None:
    from medrobust_assets.tags import GPU_OP_TAGS

    graph = defs.get_repository_def().asset_graph
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        name = key.to_user_string()
        assert node.description and len(node.description) > 40, name
        assert node.group_name in GROUPS, (name, node.group_name)
        assert node.kinds, name
        if "gpu" in (node.pools or set()):
            tags = node.assets_def.op.tags  # the k8s executor reads the GPU request from the op tags
            assert json.loads(tags["dagster-k8s/config"]) == GPU_OP_TAGS["dagster-k8s/config"], name
    assert {g for k in graph.get_all_asset_keys() if (g := graph.get(k).group_name)} == GROUPS


def test_jobs_sensors_and_nightly_schedule() -> None:
    from medrobust_assets.sensors import nightly_requests

    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {"registry_sensor", "mart_after_evaluation"}
    (sched,) = repo.schedule_defs
    assert sched.name == "nightly_reevaluation" and sched.cron_schedule == "0 2 * * *"
    assert sched.default_status == dg.DefaultScheduleStatus.RUNNING
    snap = {"medrobust-seg-a-lora": {"versions": [1, 2, 3], "aliases": {"champion": 1, "candidate": 3}},
            "medrobust-seg-a-full": {"versions": [1], "aliases": {"champion": 1, "candidate": 1}}}
    reqs = nightly_requests(snap, {"medrobust-seg-a-lora:1", "medrobust-seg-a-lora:3", "medrobust-seg-a-full:1"},
                            "2026-11-26")
    assert [(r.partition_key, r.run_key, r.tags["medrobust/trigger"]) for r in reqs] == [
        ("medrobust-seg-a-lora:1", "medrobust-seg-a-lora:1:nightly:2026-11-26", "nightly"),
        ("medrobust-seg-a-lora:3", "medrobust-seg-a-lora:3:nightly:2026-11-26", "nightly"),
        ("medrobust-seg-a-full:1", "medrobust-seg-a-full:1:nightly:2026-11-26", "nightly")]
    # a version the sensor has not added as a partition yet is left to the sensor
    assert nightly_requests(snap, {"medrobust-seg-a-full:1"}, "d") and len(nightly_requests(snap, set(), "d")) == 0


def test_error_share_check_fails_and_the_mart_leaves_the_partition_out(tmp_path: Path, demo_root: Path) -> None:
    """An API model whose endpoint refuses every connection: every row is an infrastructure
    error, the partition's ERROR-severity check fails (the run itself succeeds) and the mart marks
    it incomplete."""
    vlm = {"models": [{"id": "down", "kind": "api", "api": {
        "model": "down", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None, "max_retries": 0,
        "timeout_s": 2}}], "split": "all"}
    suite = write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm,
                        perturbations={"include": ["gaussian_noise"], "split": "all", "calibration_subset": 2})
    graph = definitions_for_file(suite, mlruns_dir=str(tmp_path / "mlruns"))
    assets, resources = list(graph.assets or []), graph.resources
    instance = dg.DagsterInstance.ephemeral()
    for asset, part in (("demo_data", None), ("clean_samples", "ct"), ("down/vlm_clean_predictions", "ct")):
        res = dg.materialize(assets, selection=[asset], partition_key=part, instance=instance, resources=resources)
        assert res.success
    (check,) = res.get_asset_check_evaluations()
    assert check.check_name == "error_share" and not check.passed
    assert check.severity == dg.AssetCheckSeverity.ERROR
    assert check.metadata["error_share"].value == 1.0 and check.metadata["n_error"].value > 0
    res = dg.materialize(assets, selection=["marts"], instance=instance, resources=resources)
    assert "down" in res.asset_materializations_for_node("marts")[0].metadata["incomplete_partitions"].value
