"""``mlflow ui`` (as ``make mlflow-ui`` runs it) on a SQLite store: tracking and registry REST APIs
answer on 127.0.0.1, and the process group stops on one signal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ui import HOST, client, free_port, log_tail, non_loopback_ip, server, stop_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0
MODEL = "medrobust-ui-check"


def _ok_json(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:500]}"
    return dict(r.json())


@pytest.mark.slow  # heavy (a server / the whole loop): .ci/run runs it after make test
def test_mlflow_ui_serves_tracking_and_registry_on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    db = tmp_path / "mlflow.db"
    artifacts = tmp_path / "artifacts"
    port = free_port()
    base = f"http://{HOST}:{port}"
    api = f"{base}/api/2.0/mlflow"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [str(Path(sys.executable).parent / "mlflow"), "ui", "--host", HOST, "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{db}", "--default-artifact-root", str(artifacts)]
    log = tmp_path / "mlflow_ui.log"
    with server(cmd, env, tmp_path, log) as proc, client() as http:
        wait_until(lambda: http.get(f"{base}/health").status_code == 200, proc, log, STARTUP_TIMEOUT_S, "/health")
        assert db.is_file()

        exps = _ok_json(http.get(f"{api}/experiments/search", params={"max_results": 10}))["experiments"]
        default = [e for e in exps if e["name"] == "Default"]
        assert len(default) == 1 and default[0]["experiment_id"] == "0", exps

        created = _ok_json(http.post(f"{api}/registered-models/create", json={"name": MODEL}))
        assert created["registered_model"]["name"] == MODEL
        dup = http.post(f"{api}/registered-models/create", json={"name": MODEL})
        assert dup.status_code == 400 and dup.json()["error_code"] == "RESOURCE_ALREADY_EXISTS", dup.text
        listed = _ok_json(http.get(f"{api}/registered-models/search", params={"max_results": 10}))
        assert [m["name"] for m in listed["registered_models"]] == [MODEL]
        got = _ok_json(http.get(f"{api}/registered-models/get", params={"name": MODEL}))
        assert got["registered_model"]["name"] == MODEL

        other_ip = non_loopback_ip()
        if other_ip:  # bound to loopback only: the same port refuses on another interface
            with pytest.raises((httpx.ConnectError, httpx.ConnectTimeout)):
                http.get(f"http://{other_ip}:{port}/health", timeout=3.0)

        survivors = stop_group(proc)
        assert survivors == [], f"processes of the mlflow ui group still alive: {survivors}\n{log_tail(log)}"
        assert proc.poll() is not None

    # the registry lives in the SQLite file itself: a plain client reads it after the server is gone
    import mlflow

    reg = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    assert [m.name for m in reg.search_registered_models()] == [MODEL]
