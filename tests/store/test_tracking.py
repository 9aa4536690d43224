"""The MLflow logging helpers of ``store.tracking`` against a real SQLite store in ``tmp_path``:
the one rule for missing metric values, params, artifacts, text and registration, and the
no-op when tracking is disabled (run None)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from medrobust_lib.store import tracking

METRICS: dict[str, Any] = {
    "n_rows": 12, "mean_iou": 0.5, "nan": float("nan"), "none": None, "inf": float("inf"), "ninf": -float("inf"),
    "label": "abc", "np_float": np.float32(0.25), "np_int": np.int64(3), "np_nan": np.float64("nan"),
    "flag": True, "path": Path("x"),
}


@pytest.fixture
def mlruns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(tracking.SERVER_ENV, raising=False)  # the local SQLite store, never a server
    return tmp_path / "mlruns"


def _client(mlruns: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking.tracking_uri(mlruns))


def test_loggable_metrics_keeps_only_finite_real_numbers() -> None:
    got = tracking.loggable_metrics(METRICS)
    assert got == {"n_rows": 12.0, "mean_iou": 0.5, "np_float": 0.25, "np_int": 3.0, "flag": 1.0}
    assert all(type(v) is float for v in got.values())


def test_log_metrics_writes_the_rule_into_the_store(mlruns: Path) -> None:
    with tracking.tracked_run("exp", "r", {"dagster.asset": "a"}, mlruns) as run:
        logged = tracking.log_metrics(run, METRICS)
        run_id = run.info.run_id
    stored = _client(mlruns).get_run(run_id).data.metrics
    assert stored == logged == {"n_rows": 12.0, "mean_iou": 0.5, "np_float": 0.25, "np_int": 3.0, "flag": 1.0}


def test_log_metrics_with_nothing_loggable_logs_nothing(mlruns: Path) -> None:
    with tracking.tracked_run("exp", "r", {}, mlruns) as run:
        assert tracking.log_metrics(run, {"a": float("nan"), "b": None}) == {}
        run_id = run.info.run_id
    assert _client(mlruns).get_run(run_id).data.metrics == {}


def test_params_artifacts_text_and_registration(mlruns: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(b"w")
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"png")
    with tracking.tracked_run("exp", "r", {}, mlruns) as run:
        tracking.log_params(run, {"types": "x" * 600, "api_key": "secret", "level": 2})
        tracking.log_artifact(run, plot, "plots")
        tracking.log_text(run, "a,b\n1,2\n", "ranking/table.csv")
        version = tracking.log_and_register(run, folder, "model", "medrobust-test-model", {"kind": "base"})
        run_id = run.info.run_id
    client = _client(mlruns)
    params = client.get_run(run_id).data.params
    assert params == {"types": "x" * 500, "level": "2"}  # capped; the secret-looking key dropped
    assert [a.path for a in client.list_artifacts(run_id, "plots")] == ["plots/plot.png"]
    assert [a.path for a in client.list_artifacts(run_id, "ranking")] == ["ranking/table.csv"]
    assert sorted(a.path for a in client.list_artifacts(run_id, "model")) == ["model/config.json", "model/sub"]
    assert version == "1"
    mv = client.get_model_version("medrobust-test-model", "1")
    assert mv.run_id == run_id and mv.tags == {"kind": "base"} and mv.source.endswith("/model")


def test_every_helper_is_a_no_op_without_a_run(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"  # never read: nothing is logged
    assert tracking.log_metrics(None, {"a": 1.0}) == {}
    tracking.log_params(None, {"a": 1})
    tracking.log_artifact(None, missing, "x")
    tracking.log_artifacts(None, missing, "x")
    tracking.log_text(None, "t", "t.txt")
    assert tracking.log_and_register(None, missing, "model", "never-registered") is None
    assert not (tmp_path / "mlruns").exists()
