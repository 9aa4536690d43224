"""The fine-tuning strategies and the MLflow registry loop in Dagster: strategy-partitioned
checkpoints registered with aliases, their evaluation and ranking, the registry sensor against a
real SQLite MLflow store (build_sensor_context), the registry evaluation with its robustness gate
check, the mart, and ``medrobust check`` on a degraded candidate."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from medrobust_assets.assets.finetune import parse_version_key, version_key
from medrobust_assets.definitions import definitions_for_file
from medrobust_assets.resources import TrackingResource
from medrobust_assets.sensors import mart_after_evaluation, registry_requests, registry_sensor
from medrobust_cli import app
from medrobust_lib.config import load_suite
from medrobust_lib.store import model_registry
from medrobust_lib.store.marts import connect_readonly
from tests.dagster_helpers import asset_runner
from tests.suite_helpers import write_suite

NAME = "medrobust-seg-tiny-sam-lora"


def _snap(versions: list[int], candidate: int | None) -> dict[str, dict[str, object]]:
    return {NAME: {"versions": versions, "aliases": {} if candidate is None else {"candidate": candidate}}}


def test_registry_requests_cursor_logic() -> None:
    reqs, keys, cur = registry_requests(_snap([1, 2], 2), None)
    assert [r.run_key for r in reqs] == [f"{NAME}:1", f"{NAME}:2"] and keys == [f"{NAME}:1", f"{NAME}:2"]
    assert [r.partition_key for r in reqs] == keys
    assert registry_requests(_snap([1, 2], 2), cur)[:2] == ([], [])  # the cursor prevents a re-launch
    reqs, keys, cur2 = registry_requests(_snap([1, 2, 3], 3), cur)  # a new version (candidate moves with it)
    assert [r.run_key for r in reqs] == [f"{NAME}:3"] and keys == [f"{NAME}:3"]
    reqs, keys, _ = registry_requests(_snap([1, 2, 3], 1), cur2)  # candidate moved back onto version 1
    assert [(r.run_key, r.partition_key) for r in reqs] == [(f"{NAME}:1:candidate", f"{NAME}:1")] and keys == []
    assert json.loads(cur2)[NAME] == {"versions": [1, 2, 3], "candidate": 3}
    assert parse_version_key(version_key("medrobust-seg-a:b", 12)) == ("medrobust-seg-a:b", 12)
    with pytest.raises(ValueError, match="name>:<version"):
        parse_version_key("no-version")


def test_registry_sensor_on_a_real_sqlite_store(tmp_path: Path) -> None:
    mlruns = tmp_path / "mlruns"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"v1")
    model_registry.register_checkpoint(folder, NAME, tags={"strategy": "lora"}, mlruns_dir=mlruns)
    model_registry.register_checkpoint(folder, "other-model", tags={}, mlruns_dir=mlruns)  # not a medrobust-seg-* name
    instance = dg.DagsterInstance.ephemeral()
    res = {"tracking": TrackingResource(mlruns_dir=str(mlruns))}

    def tick(cursor: str | None) -> dg.SensorResult:
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources=res) as ctx:
            out = registry_sensor(ctx)
        assert isinstance(out, dg.SensorResult)
        return out

    first = tick(None)
    assert [r.run_key for r in first.run_requests or []] == [f"{NAME}:1"]
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests or []] == [[f"{NAME}:1"]]
    assert tick(first.cursor).run_requests == []
    (folder / "model.safetensors").write_bytes(b"v2")
    model_registry.register_checkpoint(folder, NAME, tags={"strategy": "lora"}, mlruns_dir=mlruns)
    second = tick(first.cursor)
    assert [(r.run_key, r.tags["medrobust/trigger"]) for r in second.run_requests or []] == [(f"{NAME}:2", "new_version")]
    model_registry.set_alias(NAME, "candidate", 1, mlruns)
    third = tick(second.cursor)
    assert [r.run_key for r in third.run_requests or []] == [f"{NAME}:1:candidate"]
    assert tick(third.cursor).run_requests == []


def test_mart_sensor_requests_a_rebuild() -> None:
    instance = dg.DagsterInstance.ephemeral()

    @dg.op
    def noop() -> None:
        return None

    @dg.job
    def finished() -> None:
        noop()

    result = finished.execute_in_process(instance=instance)
    ctx = dg.build_run_status_sensor_context(sensor_name="mart_after_evaluation", dagster_instance=instance,
                                             dagster_run=result.dagster_run,
                                             dagster_event=result.get_run_success_event())
    req = mart_after_evaluation(ctx)
    assert isinstance(req, dg.RunRequest) and req.run_key == f"mart-after-{result.run_id}"


def _meta(result: dg.ExecuteInProcessResult) -> dict[str, dg.MetadataValue]:
    (event,) = result.get_asset_materialization_events()
    return dict(event.materialization.metadata)


SEG = {"models": [{"id": "tiny-sam", "family": "sam", "arch": "tiny", "checkpoint": "trained"}],
       "train": {"max_steps": 20, "eval_every": 10, "time_budget_s": 60}, "split": "all",
       "attacks": {"kinds": ["fgsm", "pgd"], "max_samples": 2},
       "finetune": {"base": "tiny-sam", "strategies": ["decoder_only", "lora"], "encoder_blocks": 1,
                    "train": {"max_steps": 4, "eval_every": 2, "batch_size": 4, "time_budget_s": 30},
                    "eval": {"levels": [1], "attack_levels": [1]}, "gate": {"min_pairs": 5}}}


@pytest.mark.slow  # heavy (a server / the whole loop): .ci/run runs it after make test
def test_strategies_registry_loop_and_gate(tmp_path: Path, demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.tracks.finetune.strategy_runs import degrade_checkpoint, register_version

    suite_path = write_suite(tmp_path, demo_root, modalities=["ct", "dermoscopy"], segmentation=SEG,
                             perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                            "calibration_subset": 2, "levels": [1]})
    mlruns = tmp_path / "mlruns"
    monkeypatch.setenv("MEDROBUST_MLRUNS", str(mlruns))
    graph = definitions_for_file(suite_path, mlruns_dir=str(mlruns))
    instance = dg.DagsterInstance.ephemeral()

    run = asset_runner(graph, instance)

    run("demo_data")
    for m in ("ct", "dermoscopy"):
        run("clean_samples", m)
        run("perturbed_samples", dg.MultiPartitionKey({"modality": m, "severity": "1"}))
    run("tiny-sam/base_checkpoint")
    for st in ("decoder_only", "lora"):
        meta = _meta(run("tiny-sam/finetuned_checkpoint", st))
        assert meta["registered_version"].value == 1 and meta["new_version"].value is True
        assert meta["n_trainable"].value > 0
        run("tiny-sam/strategy_predictions", st)
    versions = model_registry.list_versions(NAME, mlruns)
    assert [v["version"] for v in versions] == [1] and versions[0]["aliases"] == ["candidate", "champion"]
    tags = versions[0]["tags"]
    assert tags["strategy"] == "lora" and float(tags["val_dice"]) >= 0 and len(tags["base_checkpoint_sha256"]) == 16
    assert tags["dataset"] == "ct,dermoscopy"
    # re-materializing a deterministic fine-tune registers no duplicate version
    run("tiny-sam/finetuned_checkpoint", "lora")
    assert len(model_registry.list_versions(NAME, mlruns)) == 1
    assert _meta(run("tiny-sam/strategy_ranking"))["n_rows"].value == 4

    # the sensor launches both versions; version 1 of lora reuses the strategy rows, its gate has no champion to beat
    with dg.build_sensor_context(instance=instance, resources={"tracking": TrackingResource(mlruns_dir=str(mlruns))}) as ctx:
        tick = registry_sensor(ctx)
    assert isinstance(tick, dg.SensorResult)
    keys = sorted(r.partition_key for r in tick.run_requests or [] if r.partition_key)
    assert keys == ["medrobust-seg-tiny-sam-decoder_only:1", f"{NAME}:1"]
    instance.add_dynamic_partitions("registered_seg_versions", keys)
    r = run("registry_evaluation", f"{NAME}:1")
    assert _meta(r)["reused_rows"].value > 0
    (check,) = r.get_asset_check_evaluations()
    assert check.passed and "nothing to compare" in check.metadata["note"].value

    # a deliberately degraded candidate: evaluated from scratch, the gate check fails with ERROR severity
    s = load_suite(suite_path)
    src = Path(s.results_dir).parent / "checkpoints" / "tiny-sam-lora"
    degrade_checkpoint(src, tmp_path / "degraded", noise=0.5, seed=1)
    version, created = register_version(tmp_path / "degraded", NAME, {"strategy": "lora", "role": "degraded"},
                                        mlruns_dir=mlruns)
    assert (version, created) == (2, True) and model_registry.get_alias_version(NAME, "candidate", mlruns) == 2
    with dg.build_sensor_context(instance=instance, cursor=tick.cursor,
                                 resources={"tracking": TrackingResource(mlruns_dir=str(mlruns))}) as ctx:
        tick2 = registry_sensor(ctx)
    assert isinstance(tick2, dg.SensorResult)
    assert [r.run_key for r in tick2.run_requests or []] == [f"{NAME}:2"]
    instance.add_dynamic_partitions("registered_seg_versions", [f"{NAME}:2"])
    r = run("registry_evaluation", f"{NAME}:2")
    meta = _meta(r)
    assert meta["reused_rows"].value == 0 and meta["n_rows"].value > 0
    # the gate compared version 2 with the champion (version 1) on the same samples. This 20-step
    # model barely segments, so its degraded copy cannot be significantly worse here: the failing
    # verdict is asserted on synthetic rows in tests/tracks/finetune/test_gate.py and on the trained demo
    # model by `medrobust demo` (registry_loop.run_registry_loop raises if the degraded candidate passes).
    (check,) = r.get_asset_check_evaluations()
    assert check.severity == dg.AssetCheckSeverity.ERROR and check.metadata["champion_version"].value == 1
    assert "| group" in check.metadata["differences"].value and "clean" in check.metadata["differences"].value
    verdict = "PASS" if check.passed else "FAIL"
    assert model_registry.version_tags(NAME, 2, mlruns)["medrobust.gate"] == f"{verdict} vs v1"

    run("marts")
    con = connect_readonly(s.mart_path)
    try:
        ranking = con.execute("select strategy, kind, n_samples, mean_iou_drop, iou_drop_ci_low, iou_drop_ci_high, "
                              "rank, n_trainable, floor_effect from strategy_ranking").df()
        ranked_all = con.execute("select rank from strategy_ranking_all").df()
        n_v2 = con.execute(f"select count(*) from segmentation_results where model = '{NAME}-v2'").fetchall()[0][0]
    finally:
        con.close()
    assert sorted(zip(ranking["strategy"], ranking["kind"], strict=True)) == [
        ("decoder_only", "attack"), ("decoder_only", "corruption"), ("lora", "attack"), ("lora", "corruption")]
    # every test image under corruption; attacks.max_samples = 2 per modality
    assert list(ranking.sort_values(["strategy", "kind"])["n_samples"]) == [4, 8, 4, 8]
    # a strategy whose every dataset is at the floor (clean IoU or Dice < 0.1, as these briefly trained tiny
    # models may be) is not ranked by default; strategy_ranking_all ranks every row
    floor = ranking["floor_effect"].astype(bool)
    # the attack rows have 4 samples, below the default stats.min_n of 5: no CI, not ranked
    small = ranking["n_samples"] < load_suite(suite_path).stats.min_n
    assert ranking.loc[small, "rank"].isna().all() and ranking.loc[small, "iou_drop_ci_low"].isna().all()
    assert set(ranking.loc[~floor & ~small, "rank"]) <= {1, 2} and ranking.loc[floor, "rank"].isna().all()
    assert len(ranked_all) == 4 and set(ranked_all["rank"].dropna()) <= {1, 2}
    ci = ranking[~small]
    assert ((ci["iou_drop_ci_low"] <= ci["mean_iou_drop"] + 1e-12)
            & (ci["mean_iou_drop"] <= ci["iou_drop_ci_high"] + 1e-12)).all()
    assert n_v2 > 0

    # the CLI gate reuses the rows the loop wrote (same verdict as the asset check); the champion
    # passes against itself; a version nobody evaluated yet is evaluated by the gate itself
    runner = CliRunner()
    args = ["check", "--suite", str(suite_path), "--mlruns", str(mlruns), "--baseline", f"models:/{NAME}@champion"]
    res = runner.invoke(app, [*args, "--candidate", f"models:/{NAME}@candidate"])
    assert res.exit_code == (0 if check.passed else 1), res.output
    res = runner.invoke(app, [*args, "--candidate", f"models:/{NAME}/1"])
    assert res.exit_code == 0, res.output
    degrade_checkpoint(src, tmp_path / "degraded3", noise=0.8, seed=2)
    assert register_version(tmp_path / "degraded3", NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (3, True)
    res = runner.invoke(app, [*args, "--candidate", f"models:/{NAME}/3", "--format", "json"])
    assert res.exit_code in (0, 1) and f"evaluating {NAME}-v3" in res.stderr, res.output
    assert json.loads(res.stdout)["n_unpaired"] == 0  # the same samples and conditions as the champion
