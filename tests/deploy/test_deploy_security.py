"""Safe deploy defaults: Dask over TLS with the dashboard on 127.0.0.1 (SLURM), MLflow behind its
basic-auth app with a bucket-only MinIO user, placeholder secrets refused at start, pinned images,
NetworkPolicies for the Helm release, DELETE journaling for the response cache on shared volumes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import dask
import pytest
import yaml
from dagster_dask.executor import DaskExecutor
from dask_jobqueue import SLURMCluster

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return _yaml(COMPOSE / "docker-compose.yml")["services"]


def _compose_sh(command: str) -> str:
    """A compose command string as the shell receives it ($$ is compose's escape for $)."""
    return command.replace("$$", "$")


# ------------------------------------------------------------------ SLURM / Dask


def test_dask_scheduler_uses_tls_and_a_local_dashboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobqueue = _yaml(DEPLOY / "slurm" / "jobqueue.yaml")["jobqueue"]["slurm"]
    run_cfg = _yaml(DEPLOY / "slurm" / "dask_executor.yaml")["execution"]["config"]["cluster"]["slurm"]
    assert run_cfg["security"] is True
    assert jobqueue["scheduler-options"]["dashboard_address"].startswith("127.0.0.1:")
    monkeypatch.chdir(tmp_path)
    (tmp_path / jobqueue["shared-temp-directory"]).mkdir(parents=True)
    kwargs = DaskExecutor("slurm", {**run_cfg, "n_workers": 0}).build_dict("__ASSET_JOB")
    jq = {**jobqueue, "scheduler-options": {**jobqueue["scheduler-options"], "host": "127.0.0.1"}}
    with dask.config.set({f"jobqueue.slurm.{k}": v for k, v in jq.items()}):
        with SLURMCluster(**kwargs) as cluster:
            script = cluster.job_script()
            address = cluster.scheduler_address
            dashboard = cluster.dashboard_link
    assert address.startswith("tls://")  # the scheduler only speaks TLS
    assert "--tls-ca-file" in script and "--tls-cert" in script and "--tls-key" in script
    assert "tls://" in script
    assert "127.0.0.1" in dashboard


def test_launch_script_keeps_the_tls_folder_private_and_uses_delete_journaling() -> None:
    script = (DEPLOY / "slurm" / "launch.sh").read_text()
    assert "chmod 700 var/dask-tls" in script
    assert "MEDROBUST_CACHE_JOURNAL_MODE" in script and "DELETE" in script


# ------------------------------------------------------------------ compose


def test_every_pulled_image_is_pinned_to_a_release(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        if "build" in svc:
            continue
        image = svc["image"]
        repo, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", dockerfile)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim", base.group(1))
    assert "latest" not in (COMPOSE / "docker-compose.yml").read_text()


def _depends(services: dict[str, Any], name: str) -> set[str]:
    dep = services[name].get("depends_on", {})
    return set(dep) if isinstance(dep, (dict, list)) else set()


def test_every_service_waits_for_the_secret_check(services: dict[str, Any]) -> None:
    def reaches(name: str, seen: set[str]) -> bool:
        deps = _depends(services, name)
        return "check-secrets" in deps or any(reaches(d, seen | {d}) for d in deps - seen)

    for name in services:
        if name != "check-secrets":
            assert reaches(name, {name}), f"{name} may start before the secrets are checked"
    assert services["postgres"]["depends_on"]["check-secrets"]["condition"] == "service_completed_successfully"


def _run_secret_check(services: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    svc = services["check-secrets"]
    return subprocess.run(["sh", "-c", _compose_sh(svc["command"][0])], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True)


def _distinct_secrets(services: dict[str, Any]) -> dict[str, str]:
    """A strong, distinct value for every secret the check reads."""
    return {k: f"4f1c0a9d3e7b62c8a5d0e1f2-{i}" for i, k in enumerate(services["check-secrets"]["environment"])}


@pytest.mark.parametrize(("secret", "accepted"), [
    ("change-me", False), ("change-me-too-but-long", False), ("short-9ab", False),
    ("CHANGE-ME-abcdef", False), ("Change-Me-0123456789abcdef", False), ("CHANGEME0123456789abcd", False),
    ("PASSWORD-0123456789abcd", False), ("Secret-0123456789abcdef", False),
    ("4f1c0a9d3e7b62c", False),  # 15 characters
    ("4f1c0a9d3e7b62c8", True),  # 16
    ("4f1c0a9d3e7b62c8a5d0e1f2", True),
])
def test_the_secret_check_refuses_placeholders(services: dict[str, Any], secret: str, accepted: bool) -> None:
    env = _distinct_secrets(services)
    name = next(iter(env))
    env[name] = secret
    res = _run_secret_check(services, env)
    assert (res.returncode == 0) == accepted, res.stderr
    if not accepted:
        assert "refusing to start" in res.stderr and name in res.stderr


def test_the_secret_check_accepts_distinct_strong_values(services: dict[str, Any]) -> None:
    res = _run_secret_check(services, _distinct_secrets(services))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("shared", ["all", "two"])
def test_the_secret_check_refuses_a_value_reused_across_secrets(services: dict[str, Any], shared: str) -> None:
    env = _distinct_secrets(services)
    names = list(env)
    reused = names if shared == "all" else names[-2:]
    for k in reused:
        env[k] = "7d2e9a41c0b36f58e1a4"  # strong on its own
    res = _run_secret_check(services, env)
    assert res.returncode == 1, res.stderr
    assert "refusing to start" in res.stderr and "same value" in res.stderr
    assert all(k in res.stderr for k in reused), res.stderr
    assert not any(f"{k}(same value" in res.stderr for k in names if k not in reused), res.stderr


def test_mlflow_requires_authentication_and_uses_the_bucket_user(services: dict[str, Any]) -> None:
    mlflow = services["mlflow"]
    command = _compose_sh(mlflow["command"][-1])
    assert "--app-name basic-auth" in command
    assert "authenticate_request_basic_auth" in command and "admin_password" in command
    env = mlflow["environment"]
    assert "MINIO_ROOT" not in json.dumps(env), "MLflow must not hold the MinIO root credentials"
    assert env["AWS_ACCESS_KEY_ID"].startswith("${MLFLOW_S3_ACCESS_KEY")
    assert env["MLFLOW_AUTH_DATABASE_URI"].endswith("@postgres:5432/mlflow_auth")
    code_env = services["medrobust-code"]["environment"]
    assert code_env["MLFLOW_TRACKING_USERNAME"].startswith("${MLFLOW_ADMIN_USERNAME")
    assert "mlflow[auth]==" in (COMPOSE / "Dockerfile").read_text()
    assert re.search(r"for db in dagster mlflow mlflow_auth", (COMPOSE / "postgres-init" / "create-databases.sh")
                     .read_text())


def test_the_minio_user_is_limited_to_the_artifact_bucket(services: dict[str, Any]) -> None:
    command = _compose_sh(services["minio-create-bucket"]["command"][0])
    policy_fmt = re.search(r"printf '(\{.*?\})'", command)
    assert policy_fmt is not None
    policy = json.loads(policy_fmt.group(1).replace("%s", "mlflow"))
    resources = {r for st in policy["Statement"] for r in st["Resource"]}
    assert resources == {"arn:aws:s3:::mlflow", "arn:aws:s3:::mlflow/*"}
    actions = {a for st in policy["Statement"] for a in st["Action"]}
    assert not any(a.startswith("admin:") or a == "s3:*" for a in actions)
    assert "mc admin user add" in command and "mc admin policy attach local mlflow-bucket-only" in command
    subprocess.run(["sh", "-n", "-c", command], check=True)


def test_compose_instance_has_run_monitoring() -> None:
    assert _yaml(COMPOSE / "dagster.yaml")["run_monitoring"]["enabled"] is True


# ------------------------------------------------------------------ Helm


def test_network_policies_limit_the_webserver_and_the_code_location() -> None:
    doc = _yaml(DEPLOY / "helm" / "networkpolicy.yaml")
    policies = {p["metadata"]["name"]: p["spec"] for p in doc["items"] if p["kind"] == "NetworkPolicy"}
    web, code = policies["medrobust-dagster-webserver"], policies["medrobust-code-location"]
    # which pods these select: tests/deploy/test_networkpolicy_selects.py
    assert web["podSelector"]["matchLabels"]["medrobust.io/component"] == "dagster-webserver"
    assert code["podSelector"]["matchLabels"]["medrobust.io/code-location"] == "medrobust"
    for spec in (web, code):
        assert spec["policyTypes"] == ["Ingress"]
        for rule in spec["ingress"]:
            assert rule.get("from"), "an ingress rule without `from` admits every pod"
            for peer in rule["from"]:
                assert any(sel.get("matchLabels") for sel in peer.values()), peer  # no empty selector
    values = _yaml(DEPLOY / "helm" / "values.yaml")
    [dep] = values["dagster-user-deployments"]["deployments"]
    assert {p["port"] for r in code["ingress"] for p in r["ports"]} == {dep["port"]}
    assert {"name": "MEDROBUST_CACHE_JOURNAL_MODE", "value": "DELETE"} in dep["env"]
    assert "MEDROBUST_CACHE_JOURNAL_MODE=DELETE" in values["runLauncher"]["config"]["k8sRunLauncher"]["envVars"]
    assert values["dagsterDaemon"]["runMonitoring"]["enabled"] is True
