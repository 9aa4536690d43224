"""``$MEDROBUST_TRACKING_URI``: runs, artifacts and the registry go to a real MLflow tracking
server (as in deploy/), started here on 127.0.0.1 with proxied artifacts; a registered checkpoint
comes back through the server into the local cache, byte for byte."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.ui import HOST, client, free_port, server, stop_group, wait_until


@pytest.mark.slow  # heavy (a server / the whole loop): .ci/run runs it after make test
def test_registry_and_runs_through_a_tracking_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    base = f"http://{HOST}:{port}"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MEDROBUST_TRACKING_URI", None)
    served = tmp_path / "server_artifacts"
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", HOST, "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--serve-artifacts",
           "--artifacts-destination", served.as_uri()]
    log = tmp_path / "mlflow_server.log"
    with server(cmd, env, tmp_path, log) as proc, client() as http:
        wait_until(lambda: http.get(f"{base}/health").status_code == 200, proc, log, 120.0, "/health")
        monkeypatch.setenv("MEDROBUST_TRACKING_URI", base)
        from medrobust_lib.store import model_registry
        from medrobust_lib.store.tracking import ensure_experiment, tracked_run

        local = tmp_path / "mlruns"  # only the lock file and the download cache live here now
        with tracked_run("segmentation_eval", "run-1", {"dagster.asset": "x"}, local) as run:
            import mlflow

            mlflow.log_metric("mean_iou", 0.5)
        folder = tmp_path / "ckpt"
        folder.mkdir()
        weights = os.urandom(4096)
        (folder / "model.safetensors").write_bytes(weights)
        (folder / "config.json").write_text('{"family": "sam", "arch": "tiny"}')
        rv = model_registry.register_checkpoint(folder, "medrobust-seg-x-lora", tags={"strategy": "lora"}, mlruns_dir=local)
        assert rv.source.startswith("mlflow-artifacts:/"), rv.source
        got = model_registry.resolve_model_uri("models:/medrobust-seg-x-lora@candidate", local)
        assert got.read_bytes() == weights and got.is_relative_to(local.resolve() / ".cache")
        assert got.with_name("config.json").is_file()
        assert model_registry.snapshot("medrobust-seg-", local) == {
            "medrobust-seg-x-lora": {"versions": [1], "aliases": {"candidate": 1}}}
        # what the server holds: the experiment, the run's metric, the registered model, the files
        exp = http.get(f"{base}/api/2.0/mlflow/experiments/get-by-name",
                       params={"experiment_name": "segmentation_eval"}).json()["experiment"]
        assert exp["experiment_id"] == ensure_experiment("segmentation_eval", local)
        r = http.get(f"{base}/api/2.0/mlflow/runs/get", params={"run_id": run.info.run_id}).json()["run"]
        assert [m["value"] for m in r["data"]["metrics"] if m["key"] == "mean_iou"] == [0.5]
        assert any(p.name == "model.safetensors" for p in served.rglob("*"))
        assert not (local / "mlflow.db").exists()  # nothing went to a local SQLite store
        assert stop_group(proc) == []
    monkeypatch.setenv("MEDROBUST_TRACKING_URI", "sqlite:///nope.db")
    from medrobust_lib.store.tracking import tracking_uri

    with pytest.raises(ValueError, match="http"):
        tracking_uri(tmp_path)
