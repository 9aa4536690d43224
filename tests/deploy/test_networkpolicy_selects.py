"""deploy/helm/networkpolicy.yaml selects the pods that deploy/helm/values.yaml makes (no cluster,
no helm binary: the pods' labels are computed from the values).

Pod labels of the chart's Deployments, as the official chart (dagster/dagster) writes them into
each pod template (``spec.template.metadata.labels``), read from its source:

* webserver, ``helm/dagster/templates/helpers/_deployment-webserver.tpl``: the selector labels,
  ``component: dagster-webserver``, then ``.Values.dagsterWebserver.labels``;
* daemon, ``helm/dagster/templates/deployment-daemon.yaml``: the selector labels,
  ``component: dagster-daemon``, ``deployment: daemon``, then ``.Values.dagsterDaemon.labels``;
* each user deployment, ``helm/dagster/charts/dagster-user-deployments/templates/deployment-user.yaml``:
  the selector labels, ``component: user-deployments``, ``deployment: <name>``, then the
  deployment's ``labels`` (which ``includeConfigInLaunchedRuns`` also hands to the runs it launches,
  ``templates/helpers/_helpers.tpl``, ``dagsterUserDeployments.k8sContainerContext``).

Run and step pods are not the chart's: their labels come from the installed dagster-k8s itself
(``K8sContainerContext`` merges launcher and code-location context as ``create_for_run`` does;
``construct_dagster_k8s_job`` builds the Job). The policies select only on labels the values set
(``medrobust.io/...``) and on ``dagster/run-id``, which dagster-k8s puts on every run and step pod.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / "deploy" / "helm"
RELEASE = "medrobust"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return _yaml(HELM / "values.yaml")


@pytest.fixture(scope="module")
def policies() -> dict[str, dict[str, Any]]:
    doc = _yaml(HELM / "networkpolicy.yaml")
    return {p["metadata"]["name"]: p["spec"] for p in doc["items"] if p["kind"] == "NetworkPolicy"}


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels AND every matchExpression)."""
    if any(labels.get(k) != str(v) for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr["key"], expr["operator"], [str(v) for v in expr.get("values") or []]
        ok = {"In": key in labels and labels[key] in vals,
              "NotIn": key not in labels or labels[key] not in vals,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _selector_labels(chart_name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": chart_name, "app.kubernetes.io/instance": RELEASE}


def _container_context_of(dep: dict[str, Any]) -> dict[str, Any]:
    """The user deployment's container context as the chart renders it for launched runs (the
    keys that reach a pod's labels)."""
    k8s: dict[str, Any] = {"env_config_maps": [f"{RELEASE}-dagster-user-deployments-{dep['name']}-user-env"],
                           "namespace": RELEASE}
    if dep.get("envSecrets"):
        k8s["env_secrets"] = [s["name"] for s in dep["envSecrets"]]
    if dep.get("labels"):
        k8s["labels"] = dep["labels"]
    return {"k8s": k8s}


def _dagster_k8s_pod_labels(ctx: K8sContainerContext, component: str, labels: dict[str, str]) -> dict[str, str]:
    job_config = DagsterK8sJobConfig(job_image="registry.example.org/medrobust:0.1.0", dagster_home="/opt/dagster",
                                     instance_config_map=f"{RELEASE}-dagster-instance")
    job = construct_dagster_k8s_job(job_config, args=["dagster"], job_name="dagster-run-0123",
                                    user_defined_k8s_config=ctx.run_k8s_config, pod_name="dagster-run-0123",
                                    component=component, labels=labels)
    return dict(job.spec.template.metadata.labels)


def chart_pods(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """name -> pod labels, for every pod the values make."""
    pods: dict[str, dict[str, str]] = {}
    web = values.get("dagsterWebserver") or {}
    pods["webserver"] = {**_selector_labels("dagster"), "component": "dagster-webserver", **(web.get("labels") or {})}
    daemon = values.get("dagsterDaemon") or {}
    if daemon.get("enabled", True):
        pods["daemon"] = {**_selector_labels("dagster"), "component": "dagster-daemon", "deployment": "daemon",
                          **(daemon.get("labels") or {})}
    user = values["dagster-user-deployments"]
    launcher_cfg = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher = K8sContainerContext(labels=launcher_cfg.get("labels"),
                                   env_secrets=[s["name"] for s in launcher_cfg.get("envSecrets") or []])
    executor_cfg = _yaml(HELM / "k8s_job_executor.yaml")["execution"]["config"]
    for dep in user["deployments"] if user.get("enabled") else []:
        pods[f"code:{dep['name']}"] = {**_selector_labels("dagster-user-deployments"), "component": "user-deployments",
                                       "deployment": dep["name"], **(dep.get("labels") or {})}
        ctx = launcher
        if (dep.get("includeConfigInLaunchedRuns") or {"enabled": True}).get("enabled", True):
            ctx = ctx.merge(K8sContainerContext.create_from_config(_container_context_of(dep)))
        run_labels = {"dagster/job": "__ASSET_JOB", "dagster/run-id": "0123", "dagster/code-location": dep["name"]}
        pods[f"run:{dep['name']}"] = _dagster_k8s_pod_labels(ctx, "run_worker", run_labels)
        step_ctx = ctx.merge(K8sContainerContext(
            labels=executor_cfg.get("labels"),
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor_cfg.get("step_k8s_config") or {})))
        pods[f"step:{dep['name']}"] = _dagster_k8s_pod_labels(step_ctx, "step_worker",
                                                              {**run_labels, "dagster/op": "perturbed_samples"})
    return pods


def _selected(selector: dict[str, Any], pods: dict[str, dict[str, str]]) -> set[str]:
    return {name for name, labels in pods.items() if matches(selector, labels)}


def _peers(spec: dict[str, Any], pods: dict[str, dict[str, str]]) -> set[str]:
    """Pods of the release's namespace admitted by some ingress rule (podSelector peers)."""
    return {name for rule in spec["ingress"] for peer in rule["from"] if set(peer) == {"podSelector"}
            for name in _selected(peer["podSelector"], pods)}


def test_the_matcher_follows_label_selector_semantics() -> None:
    pod = {"a": "1", "b": "2"}
    assert matches({"matchLabels": {"a": "1"}}, pod) and not matches({"matchLabels": {"a": "2"}}, pod)
    assert matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, pod)
    assert not matches({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, pod)
    assert matches({"matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]}, pod)
    assert not matches({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]}, pod)
    assert matches({}, pod)  # the empty selector selects everything


def test_run_and_step_pods_carry_the_launcher_and_code_location_labels(values: dict[str, Any]) -> None:
    """The dagster-k8s reference code, not our reading: the labels really reach run/step pods."""
    pods = chart_pods(values)
    launcher_labels = values["runLauncher"]["config"]["k8sRunLauncher"].get("labels") or {}
    assert launcher_labels, "the run launcher sets no labels of ours"
    for name in ("run:medrobust", "step:medrobust"):
        assert launcher_labels.items() <= pods[name].items(), pods[name]
        assert pods[name]["dagster/run-id"] == "0123"


def test_every_policy_selects_exactly_its_component(values: dict[str, Any],
                                                      policies: dict[str, dict[str, Any]]) -> None:
    pods = chart_pods(values)
    code = {f"code:{d['name']}" for d in values["dagster-user-deployments"]["deployments"]}
    assert _selected(policies["medrobust-dagster-webserver"]["podSelector"], pods) == {"webserver"}
    assert _selected(policies["medrobust-code-location"]["podSelector"], pods) == code


def test_the_code_location_admits_every_dagster_pod_and_nothing_else(
        values: dict[str, Any], policies: dict[str, dict[str, Any]]) -> None:
    pods = chart_pods(values)
    admitted = _peers(policies["medrobust-code-location"], pods)
    clients = {"webserver", "daemon"} | {n for n in pods if n.startswith(("run:", "step:"))}
    assert clients <= admitted, clients - admitted
    others = {"notebook": {"app": "jupyter"}, "chart-labelled-lookalike": {**_selector_labels("dagster"),
                                                                           "app": "dagster", "component": "x"}}
    assert not _peers(policies["medrobust-code-location"], others)
    assert not _peers(policies["medrobust-dagster-webserver"], {**others, **pods})  # UI: only labelled clients


def test_policies_select_only_on_labels_the_values_set(values: dict[str, Any],
                                                       policies: dict[str, dict[str, Any]]) -> None:
    """Not on the chart's own labels (``app``, ``component``...), which the chart may change."""
    set_by_values: dict[str, set[str]] = {}
    blocks = [values["dagsterWebserver"].get("labels"), values["dagsterDaemon"].get("labels"),
              values["runLauncher"]["config"]["k8sRunLauncher"].get("labels"),
              *[d.get("labels") for d in values["dagster-user-deployments"]["deployments"]]]
    for block in blocks:
        for k, v in (block or {}).items():
            set_by_values.setdefault(k, set()).add(str(v))
    for name, spec in policies.items():
        selectors = [spec["podSelector"]] + [p["podSelector"] for r in spec["ingress"] for p in r["from"]
                                             if "podSelector" in p]
        for sel in selectors:
            assert sel.get("matchLabels"), f"{name}: an empty podSelector selects every pod"
            for k, v in sel["matchLabels"].items():
                assert k.startswith("medrobust.io/"), f"{name} selects on {k}, a label not ours"
                if k not in ("medrobust.io/dagster-ui-client",):  # set by the operator on UI clients
                    assert str(v) in set_by_values.get(k, set()), f"{name}: no values block sets {k}={v}"
            for expr in sel.get("matchExpressions") or []:
                assert expr == {"key": "dagster/run-id", "operator": "DoesNotExist"}, expr


def test_policy_ports_are_the_ports_the_pods_listen_on(values: dict[str, Any],
                                                       policies: dict[str, dict[str, Any]]) -> None:
    web_port = values["dagsterWebserver"]["service"]["port"]  # the chart runs `dagster-webserver -p <port>`
    ports = {p["port"] for r in policies["medrobust-dagster-webserver"]["ingress"] for p in r["ports"]}
    assert ports == {web_port}
    code_ports = {d["port"] for d in values["dagster-user-deployments"]["deployments"]}
    assert {p["port"] for r in policies["medrobust-code-location"]["ingress"] for p in r["ports"]} == code_ports


def _kubectl_selector(sel: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in sel.get("matchLabels", {}).items()]
    parts += [f"!{e['key']}" for e in sel.get("matchExpressions", []) if e["operator"] == "DoesNotExist"]
    return ",".join(parts)


def test_the_readme_shows_the_kubectl_check_of_each_policy(policies: dict[str, dict[str, Any]]) -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    shown = set(re.findall(r"kubectl get pods[^\n]*? -l '([^']+)'", readme))
    for name, spec in policies.items():
        assert _kubectl_selector(spec["podSelector"]) in shown, f"{name}: no `kubectl get pods -l` line"
