"""``TrackingResource``: the assets' only way to MLflow. One run per materialization, tagged with
the Dagster run, asset and partition; its ``log_*`` methods write into that run and do nothing when
tracking is disabled."""

from pathlib import Path

import dagster as dg
import pytest

from medrobust_assets.resources import TrackingResource
from medrobust_lib.config import Suite
from medrobust_lib.store.tracking import SERVER_ENV, tracking_uri


@pytest.fixture(autouse=True)
def _local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVER_ENV, raising=False)


def test_disabled_tracking_yields_no_run_and_logs_nothing(tmp_path: Path) -> None:
    res = TrackingResource(mlruns_dir=str(tmp_path / "mlruns"), enabled=False)
    ctx = dg.build_asset_context()
    with res.run(ctx, Suite(name="unit"), "exp", {"a": 1}) as run:
        assert run is None
        assert res.log_metrics(run, {"x": 1.0}) == {}
        res.log_params(run, {"a": 1})
        res.log_artifact(run, tmp_path / "missing.png", "plots")
        res.log_files(run, [tmp_path / "missing.png"], "plots")
        res.log_artifacts(run, tmp_path / "missing", "model")
        res.log_text(run, "t", "t.txt")
        assert res.log_and_register(run, tmp_path / "missing", "model", "never") is None
    assert not (tmp_path / "mlruns").exists()


def test_enabled_tracking_logs_into_the_tagged_run(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    mlruns = tmp_path / "mlruns"
    plots = [tmp_path / "a.png", tmp_path / "b.png"]
    for p in plots:
        p.write_bytes(b"png")
    seen: dict[str, str] = {}

    @dg.asset(key=["m", "clean_predictions"], partitions_def=dg.StaticPartitionsDefinition(["ct"]))
    def asset(context: dg.AssetExecutionContext, tracking: TrackingResource) -> None:
        with tracking.run(context, Suite(name="unit"), "exp", {"model": "m"}) as run:
            logged = tracking.log_metrics(run, {"n_rows": 3, "mean_iou": float("nan"), "label": "x"})
            assert logged == {"n_rows": 3.0}
            tracking.log_files(run, plots, "plots")
            seen["run_id"] = run.info.run_id

    res = dg.materialize([asset], partition_key="ct", resources={"tracking": TrackingResource(mlruns_dir=str(mlruns))})
    assert res.success
    client = MlflowClient(tracking_uri=tracking_uri(mlruns))
    got = client.get_run(seen["run_id"])
    assert got.data.metrics == {"n_rows": 3.0}
    assert got.data.params == {"model": "m"}
    assert got.data.tags["dagster.asset"] == "m/clean_predictions" and got.data.tags["dagster.partition"] == "ct"
    assert got.data.tags["dagster.run_id"] == res.run_id and got.info.status == "FINISHED"
    assert got.data.tags["medrobust.suite"] == "unit"
    assert client.get_experiment(got.info.experiment_id).name == "unit/exp"  # the suite's own experiment
    assert sorted(a.path for a in client.list_artifacts(seen["run_id"], "plots")) == ["plots/a.png", "plots/b.png"]


def test_two_suites_log_into_separate_experiments(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    mlruns = tmp_path / "mlruns"
    for name in ("alpha", "beta"):
        @dg.asset(name="clean_samples")
        def asset(context: dg.AssetExecutionContext, tracking: TrackingResource) -> None:
            with tracking.run(context, Suite(name=name), "clean_samples") as run:  # noqa: B023 (run at once)
                tracking.log_metrics(run, {"n_ok": 1})

        assert dg.materialize([asset], resources={"tracking": TrackingResource(mlruns_dir=str(mlruns))}).success
    client = MlflowClient(tracking_uri=tracking_uri(mlruns))
    exps = {e.name: e.experiment_id for e in client.search_experiments() if e.name != "Default"}
    assert set(exps) == {"alpha/clean_samples", "beta/clean_samples"}
    for name, exp_id in exps.items():
        runs = client.search_runs([exp_id])
        assert len(runs) == 1 and runs[0].data.tags["medrobust.suite"] == name.split("/")[0]
