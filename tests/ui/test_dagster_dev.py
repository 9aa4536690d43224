"""``dagster dev`` (as ``make ui`` runs it) serves the project's whole asset graph over GraphQL,
and its process group stops on one signal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.ui import HOST, client, free_port, log_tail, non_loopback_ip, server, stop_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0

LOCATIONS_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""
ASSET_NODES_QUERY = "{ assetNodes { assetKey { path } groupName } }"
REPOSITORIES_QUERY = """
{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name sensors { name } } } } }
"""


def _instance_yaml(home: Path) -> None:
    """The project's dagster.yaml with every storage folder moved under ``home``."""
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    cfg["storage"]["sqlite"]["base_dir"] = str(home / "storage")
    cfg["local_artifact_storage"]["config"]["base_dir"] = str(home)
    cfg["compute_logs"]["config"]["base_dir"] = str(home / "logs")
    assert cfg["telemetry"]["enabled"] is False
    (home / "dagster.yaml").write_text(yaml.safe_dump(cfg))


def _graphql(http: Any, port: int, query: str) -> dict[str, Any]:
    r = http.post(f"http://{HOST}:{port}/graphql", json={"query": query})
    r.raise_for_status()
    body = r.json()
    assert not body.get("errors"), body["errors"]
    return dict(body["data"])


def _location_loaded(http: Any, port: int) -> bool:
    ws = _graphql(http, port, LOCATIONS_QUERY)["workspaceOrError"]
    entries = ws["locationEntries"]
    for e in entries:
        err = e["locationOrLoadError"]
        if err and err["__typename"] == "PythonError":
            raise AssertionError(f"code location {e['name']} failed to load: {err['message']}")
    return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)


@pytest.mark.slow  # heavy (a server / the whole loop): .ci/run runs it after make test
def test_dagster_dev_lists_every_asset_and_stops(tmp_path: Path) -> None:
    from medrobust_assets.location import defs  # what workspace.yaml loads: the demo suite's graph

    repo = defs.get_repository_def()
    expected = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    home = tmp_path / "dagster_home"
    home.mkdir()
    _instance_yaml(home)
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home),
           "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    # as `make ui` starts it: dagster dev on a private port behind the UI guard (issue 44, finding 4)
    cmd = [sys.executable, "-m", "medrobust_assets.ui", "-h", HOST, "-p", str(port),
           "-w", str(ROOT / "workspace.yaml")]
    log = tmp_path / "dagster_dev.log"
    # The code server inherits this working directory: relative paths that running sensors read
    # (the MLflow registry under ./mlruns) and runs write (./var) stay inside tmp_path, never the
    # project's own. The workspace file still loads the project (its working_directory is
    # resolved against the file's folder).
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with server(cmd, env, cwd, log) as proc, client() as http:
        wait_until(lambda: http.get(f"http://{HOST}:{port}/server_info").status_code == 200,
                   proc, log, STARTUP_TIMEOUT_S, "/server_info")
        info = http.get(f"http://{HOST}:{port}/server_info").json()
        assert "dagster_webserver_version" in info or "dagit_version" in info, info
        wait_until(lambda: _location_loaded(http, port), proc, log, STARTUP_TIMEOUT_S, "the code location")
        nodes = _graphql(http, port, ASSET_NODES_QUERY)["assetNodes"]
        listed = {"/".join(n["assetKey"]["path"]) for n in nodes}
        assert listed == expected, (sorted(expected - listed), sorted(listed - expected))
        groups = {n["groupName"] for n in nodes}
        assert {"datasets", "perturbations", "marts"} <= groups
        repos = _graphql(http, port, REPOSITORIES_QUERY)["repositoriesOrError"]["nodes"]
        assert {s["name"] for r in repos for s in r["sensors"]} == {s.name for s in repo.sensor_defs}
        # what another site's page could send never reaches the webserver
        mutation = "mutation { launchRun(executionParams: {}) { __typename } }"
        r = http.get(f"http://{HOST}:{port}/graphql", params={"query": mutation})
        assert r.status_code == 405, r.text
        r = http.post(f"http://{HOST}:{port}/graphql", json={"query": mutation},
                      headers={"Origin": "https://evil.example"})
        assert r.status_code == 403, r.text
        r = http.get(f"http://{HOST}:{port}/", headers={"Sec-Fetch-Mode": "navigate"})
        assert r.status_code == 307 and r.headers["location"].startswith("/ui-")
        page = http.get(f"http://{HOST}:{port}{r.headers['location']}")
        assert page.status_code == 200 and r.headers["location"].rstrip("/") in page.text  # assets under the prefix
        other_ip = non_loopback_ip()
        if other_ip:  # bound to loopback only: the same port refuses on another interface
            with pytest.raises((httpx.ConnectError, httpx.ConnectTimeout)):
                http.get(f"http://{other_ip}:{port}/server_info", timeout=3.0)

        survivors = stop_group(proc)
        assert survivors == [], f"processes of the dagster dev group still alive: {survivors}\n{log_tail(log)}"
        assert proc.poll() is not None

