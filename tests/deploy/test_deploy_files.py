"""deploy/: every file parses and validates against the schema of the tool that reads it.

Nothing here starts a container, a pod or a SLURM job: the Dagster instance config goes through
Dagster's own loader, run configs through the executors' config schemas (and the run config
schema of the real asset job), the SLURM worker job through dask-jobqueue's script generator.
"""

import importlib.resources
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import dask
import jsonschema
import pytest
import yaml
from dagster._config import validate_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster._serdes.config_class import ConfigurableClassData, class_from_code_pointer
from dagster_dask import dask_executor
from dagster_dask.executor import DaskExecutor
from dagster_k8s import k8s_job_executor
from dagster_k8s.job import get_user_defined_k8s_config
from dask_jobqueue import SLURMCluster

from medrobust_assets.tags import GPU_OP_TAGS, GPU_RESOURCE, K8S_CONFIG_TAG

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
IMAGE_ROOT = "/opt/medrobust"  # the project root inside the `app` image

REQUIRED_SERVICES = {"postgres", "minio", "minio-create-bucket", "mlflow", "dagster-webserver",
                     "dagster-daemon", "medrobust-code"}
# host ports each service publishes, as documented in deploy/README.md
PUBLISHED = {"minio": {9000, 9001}, "mlflow": {5000}, "dagster-webserver": {3000}}
GPU_SERVICES = {"medrobust-code"}

_COMPOSE_VAR = re.compile(r"(?<!\$)\$(?:\{([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_]*))")
_CREDENTIAL_KEY = re.compile(r"PASSWORD|SECRET|ACCESS_KEY")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _deploy_files() -> list[Path]:
    """Every file under deploy/ that belongs to the project (no caches, no real .env)."""
    return sorted(p for p in DEPLOY.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.name != ".env")


def _strings(node: Any) -> Iterator[str]:
    """Every string (keys and values) inside a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deploy_{path.parent.name}_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE_DIR / "docker-compose.yml")


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example line without '=': {line!r}"
            out[key.strip()] = value.strip()
    return out


# ---------------------------------------------------------------- every file


@pytest.mark.parametrize("path", [p for p in _deploy_files() if p.suffix in (".yml", ".yaml")],
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses_to_a_mapping(path: Path) -> None:
    doc = _yaml(path)
    assert isinstance(doc, dict) and doc, f"{path} is empty or not a mapping"


def test_readme_mentions_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    missing = [str(p.relative_to(DEPLOY)) for p in _deploy_files()
               if p.name != "README.md" and str(p.relative_to(DEPLOY)) not in readme]
    assert not missing, f"deploy/README.md does not mention {missing}"


def test_shell_scripts_parse() -> None:
    for script in [DEPLOY / "slurm" / "launch.sh", COMPOSE_DIR / "postgres-init" / "create-databases.sh"]:
        subprocess.run(["bash", "-n", str(script)], check=True)


# ---------------------------------------------------------------- compose


def test_compose_has_the_services(services: dict[str, Any]) -> None:
    assert REQUIRED_SERVICES <= set(services), REQUIRED_SERVICES - set(services)


def test_compose_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    """The Compose Specification's JSON schema (as vendored by check-jsonschema) catches
    misspelt or misplaced keys that compose would reject."""
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors
    broken = {**compose, "services": {**compose["services"], "postgres": {**compose["services"]["postgres"],
                                                                         "restrat": "always"}}}
    assert any(True for _ in validator.iter_errors(broken))


def _published(service: dict[str, Any]) -> list[tuple[str, int]]:
    """(host ip, host port) of every published port, short or long syntax."""
    out: list[tuple[str, int]] = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append((str(entry.get("host_ip", "")), int(entry["published"])))
            continue
        parts = str(entry).split(":")
        # "container" alone or "host:container" publish on every interface: host ip ""
        ip = parts[0] if len(parts) == 3 else ""
        out.append((ip, int(parts[-2]) if len(parts) >= 2 else int(parts[0])))
    return out


def test_published_ports_only_on_localhost(services: dict[str, Any]) -> None:
    for name, service in services.items():
        ports = _published(service)
        assert all(ip == "127.0.0.1" for ip, _ in ports), f"{name} publishes beyond 127.0.0.1: {ports}"
        assert {port for _, port in ports} == PUBLISHED.get(name, set()), name


def test_gpu_reserved_for_the_code_location_only(services: dict[str, Any]) -> None:
    with_gpu = set()
    for name, service in services.items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if devices:
            with_gpu.add(name)
            assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
                       and d.get("count", "all") in (1, "all") for d in devices), devices
    assert with_gpu == GPU_SERVICES


def test_code_location_serves_the_definitions(services: dict[str, Any]) -> None:
    command = services["medrobust-code"]["command"]
    assert command[:3] == ["dagster", "code-server", "start"] or command[:3] == ["dagster", "api", "grpc"]
    assert command[command.index("-m") + 1] == "medrobust_assets.location"
    port = int(command[command.index("-p") + 1])
    [location] = _yaml(COMPOSE_DIR / "workspace.yaml")["load_from"]
    assert location["grpc_server"]["host"] == "medrobust-code"
    assert location["grpc_server"]["port"] == port
    assert not _published(services["medrobust-code"]), "the gRPC port stays on the compose network"


def test_mlflow_uses_postgres_and_minio(services: dict[str, Any]) -> None:
    mlflow = services["mlflow"]
    command = " ".join(mlflow["command"])
    env = mlflow["environment"]
    assert "mlflow server" in command and "--backend-store-uri" in command
    assert re.search(r"--artifacts-destination \"?s3://", command)
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert env["MLFLOW_BACKEND_STORE_URI"].endswith("@postgres:5432/mlflow")
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert mlflow["depends_on"]["minio-create-bucket"]["condition"] == "service_completed_successfully"
    bucket_job = services["minio-create-bucket"]
    assert bucket_job["image"].startswith("minio/mc")
    assert "mc mb" in " ".join(bucket_job["command"])


def test_postgres_init_creates_both_databases(services: dict[str, Any]) -> None:
    assert "./postgres-init:/docker-entrypoint-initdb.d:ro" in services["postgres"]["volumes"]
    script = (COMPOSE_DIR / "postgres-init" / "create-databases.sh").read_text()
    assert re.search(r"for db in dagster mlflow", script)
    assert "CREATE DATABASE" in script


def test_every_compose_variable_is_in_env_example(compose: dict[str, Any], env_example: dict[str, str]) -> None:
    used = {m.group(1) or m.group(2) for s in _strings(compose) for m in _COMPOSE_VAR.finditer(s)}
    assert used, "the compose file reads no variable: the test lost its subject"
    assert used <= set(env_example), f"missing from .env.example: {sorted(used - set(env_example))}"
    assert set(env_example) <= used, f"unused in compose: {sorted(set(env_example) - used)}"


def test_secrets_only_from_the_environment(services: dict[str, Any], env_example: dict[str, str]) -> None:
    for name, service in services.items():
        env = service.get("environment", {})
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        for key, value in env.items():
            if _CREDENTIAL_KEY.search(key):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:[?-][^}]*)?\}", str(value)), f"{name}.{key} = {value!r}"
    for key, value in env_example.items():
        if _CREDENTIAL_KEY.search(key):
            assert "change-me" in value, f".env.example {key} must be a placeholder"
    assert (COMPOSE_DIR / ".gitignore").read_text().splitlines().count(".env") == 1


def test_dockerfile_targets_and_torch_index(services: dict[str, Any]) -> None:
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11.13-slim" in dockerfile
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, flags=re.MULTILINE))
    for name, service in services.items():
        if "build" in service:
            assert service["build"]["target"] in targets, name
            assert (COMPOSE_DIR / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for pin in re.findall(r"(torch==\S+|torchvision==\S+)", dockerfile):
        assert f'"{pin}"' in pyproject, f"Dockerfile pin {pin} differs from pyproject.toml"
    assert re.search(r'pip install --index-url "\$\{TORCH_INDEX_URL\}" torch==', dockerfile)


# ---------------------------------------------------------------- Dagster instance


def _class_config_errors(data: ConfigurableClassData) -> list[str]:
    cls: Any = class_from_code_pointer(data.module_name, data.class_name)
    result = validate_config(cls.config_type(), data.config_dict)
    return [e.message for e in result.errors or []]


def test_instance_config_validates(tmp_path: Path) -> None:
    config, custom_class = dagster_instance_config(str(COMPOSE_DIR), config_filename="dagster.yaml")
    assert custom_class is None
    assert config["telemetry"] == {"enabled": False}
    assert config["concurrency"]["pools"]["default_limit"] >= 1
    postgres = config["storage"]["postgres"]["postgres_db"]
    for key in ("username", "password", "hostname", "db_name"):
        assert set(postgres[key]) == {"env"}, f"postgres {key} must come from an env var"
    # each configurable class imports and accepts its config (Postgres storage included)
    ref = InstanceRef.from_dir(str(tmp_path), config_dir=str(COMPOSE_DIR), config_filename="dagster.yaml")
    assert ref.storage_data is not None and ref.storage_data.class_name == "DagsterPostgresStorage"
    assert ref.run_coordinator_data is not None
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    assert ref.run_launcher_data is not None
    assert ref.run_launcher_data.class_name in ("DefaultRunLauncher", "DockerRunLauncher")
    for data in (ref.storage_data, ref.run_coordinator_data, ref.run_launcher_data,
                 ref.compute_logs_data, ref.local_artifact_storage_data):
        assert not _class_config_errors(data), data


def test_instance_validation_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = _yaml(COMPOSE_DIR / "dagster.yaml")
    broken["concurrency"]["pools"]["default_limitt"] = broken["concurrency"]["pools"].pop("default_limit")
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(str(tmp_path))


# ---------------------------------------------------------------- Helm + k8s_job_executor


@pytest.fixture(scope="module")
def helm() -> dict[str, Any]:
    return _yaml(DEPLOY / "helm" / "values.yaml")


def test_helm_values(helm: dict[str, Any]) -> None:
    assert helm["runLauncher"]["type"] == "K8sRunLauncher"
    assert helm["dagsterDaemon"]["enabled"] is True
    coordinator = helm["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] is True and coordinator["type"] == "QueuedRunCoordinator"
    assert helm["postgresql"]["enabled"] is True or helm["postgresql"]["postgresqlHost"]
    assert helm["telemetry"]["enabled"] is False
    [deployment] = helm["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    served = Path(args[args.index("--python-file") + 1])
    assert (ROOT / served.relative_to(IMAGE_ROOT)).is_file(), served
    secret = {"name": "medrobust-credentials"}
    assert secret in deployment["envSecrets"]
    assert secret in helm["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]
    # no password in the values: Postgres reads an existing Secret
    assert not any(re.search(r"password", k, re.IGNORECASE) for k in _strings(helm["postgresql"]))
    assert helm["generatePostgresqlPasswordSecret"] is False


def test_helm_concurrency_renders_a_valid_instance(helm: dict[str, Any], tmp_path: Path) -> None:
    """The chart writes concurrency.* and the queued coordinator into dagster.yaml; the same
    mapping must pass Dagster's instance validation."""
    pools, runs = helm["concurrency"]["pools"], helm["concurrency"]["runs"]
    qrc = helm["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    instance = {
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator",
                            "config": {"dequeue_interval_seconds": qrc["dequeueIntervalSeconds"]}},
        "concurrency": {"pools": {"default_limit": pools["defaultLimit"], "granularity": pools["granularity"]},
                        "runs": {"max_concurrent_runs": runs["maxConcurrentRuns"]}},
    }
    assert helm["concurrency"]["enabled"] is True and pools["defaultLimit"] >= 1
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance))
    dagster_instance_config(str(tmp_path))


def test_k8s_job_executor_run_config_validates() -> None:
    run_config = _yaml(DEPLOY / "helm" / "k8s_job_executor.yaml")
    result = validate_config(k8s_job_executor.config_schema.config_type, run_config["execution"]["config"])
    assert result.success, [e.message for e in result.errors or []]
    bad = {**run_config["execution"]["config"], "max_concurent": 2}
    assert not validate_config(k8s_job_executor.config_schema.config_type, bad).success


def _k8s_job(launcher_security: dict[str, Any] | None, pod_spec: dict[str, Any],
             container: dict[str, Any]) -> Any:
    """The Kubernetes Job dagster-k8s builds from these settings (as the run launcher / executor do)."""
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    cfg = DagsterK8sJobConfig(job_image="img", dagster_home="/opt/dagster/dagster_home",
                              security_context=launcher_security)
    user = UserDefinedDagsterK8sConfig(pod_spec_config=pod_spec, container_config=container)
    return construct_dagster_k8s_job(cfg, ["dagster"], "job-x", user_defined_k8s_config=user)


def _assert_restricted(job: Any) -> None:
    pod, ctr = job.spec.template.spec.security_context, job.spec.template.spec.containers[0].security_context
    assert pod.run_as_non_root is True and pod.run_as_user == 1000 and pod.seccomp_profile.type == "RuntimeDefault"
    assert ctr.allow_privilege_escalation is False and ctr.capabilities.drop == ["ALL"]


def test_every_pod_runs_non_root_without_privilege_escalation(helm: dict[str, Any]) -> None:
    """Issue 44, finding 12: the chart's pods (webserver, daemon, code location) and the run and step
    pods dagster-k8s builds get a restricted security context; the run/step ones are parsed by
    dagster-k8s itself into the Job it would submit."""
    [deployment] = helm["dagster-user-deployments"]["deployments"]
    for component in (helm["dagsterWebserver"], helm["dagsterDaemon"], deployment):
        pod, ctr = component["podSecurityContext"], component["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0 and pod["seccompProfile"]["type"] == "RuntimeDefault"
        assert ctr["allowPrivilegeEscalation"] is False and ctr["capabilities"]["drop"] == ["ALL"]
    launcher = helm["runLauncher"]["config"]["k8sRunLauncher"]
    _assert_restricted(_k8s_job(launcher["securityContext"], launcher["runK8sConfig"]["podSpecConfig"],
                                launcher["runK8sConfig"]["containerConfig"]))
    step = _yaml(DEPLOY / "helm" / "k8s_job_executor.yaml")["execution"]["config"]["step_k8s_config"]
    _assert_restricted(_k8s_job(None, step["pod_spec_config"], step["container_config"]))


def test_gpu_op_tags_request_one_gpu() -> None:
    @dg.asset(op_tags=GPU_OP_TAGS, pool="gpu")
    def gpu_asset() -> None: ...

    # Dagster stores the dict as JSON; dagster-k8s must read it back into a valid pod config
    k8s = get_user_defined_k8s_config(gpu_asset.op.tags)
    assert str(k8s.container_config["resources"]["limits"][GPU_RESOURCE]) == "1"
    tolerations = k8s.pod_spec_config["tolerations"]
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert set(GPU_OP_TAGS) == {K8S_CONFIG_TAG}


# ---------------------------------------------------------------- SLURM + dask_executor


@pytest.fixture(scope="module")
def jobqueue() -> dict[str, Any]:
    return _yaml(DEPLOY / "slurm" / "jobqueue.yaml")["jobqueue"]["slurm"]


@pytest.fixture(scope="module")
def dask_run_config() -> dict[str, Any]:
    return _yaml(DEPLOY / "slurm" / "dask_executor.yaml")


def test_jobqueue_has_the_slurm_keys(jobqueue: dict[str, Any]) -> None:
    for key in ("cores", "memory", "processes", "walltime", "job-extra-directives", "local-directory"):
        assert key in jobqueue, key
    assert "--gres=gpu:1" in jobqueue["job-extra-directives"]
    assert jobqueue["cores"] // jobqueue["processes"] == 1, "one thread per worker: one GPU step at a time"
    # keys dask-jobqueue does not know would be ignored silently
    known = set(dask.config.get("jobqueue.slurm"))
    assert set(jobqueue) <= known, set(jobqueue) - known


def test_dask_executor_run_config_validates(dask_run_config: dict[str, Any]) -> None:
    schema = dask_executor.config_schema.config_type
    config = dask_run_config["execution"]["config"]
    assert list(config["cluster"]) == ["slurm"]
    result = validate_config(schema, config)
    assert result.success, [e.message for e in result.errors or []]
    assert not validate_config(schema, {"cluster": {"slurmm": {}}}).success


def test_slurm_job_script(jobqueue: dict[str, Any], dask_run_config: dict[str, Any],
                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker job the Dask executor would submit, built exactly as it builds the cluster
    (with n_workers=0, so nothing is submitted)."""
    monkeypatch.chdir(tmp_path)  # log-directory is created relative to the working directory
    (tmp_path / jobqueue["shared-temp-directory"]).mkdir(parents=True)  # TLS credentials (launch.sh makes it)
    cluster_config = {**dask_run_config["execution"]["config"]["cluster"]["slurm"], "n_workers": 0,
                      "scheduler_options": {"host": "127.0.0.1", "dashboard": False}}
    kwargs = DaskExecutor("slurm", cluster_config).build_dict("__ASSET_JOB")
    with dask.config.set({f"jobqueue.slurm.{k}": v for k, v in jobqueue.items()}):
        with SLURMCluster(**kwargs) as cluster:
            script = cluster.job_script()
    assert "#SBATCH --gres=gpu:1" in script
    assert f"#SBATCH --cpus-per-task={jobqueue['job-cpu']}" in script
    assert f"#SBATCH -t {jobqueue['walltime']}" in script
    assert "--nthreads 1" in script
    assert f"--local-directory {jobqueue['local-directory']}" in script
    assert 'cd "$MEDROBUST_ROOT"' in script


# ---------------------------------------------------------------- executors on the real graph


@pytest.mark.parametrize(("definitions", "run_config", "executor"), [
    ("helm/definitions_k8s.py", "helm/k8s_job_executor.yaml", "k8s"),
    ("slurm/definitions_dask.py", "slurm/dask_executor.yaml", "dask"),
])
def test_run_config_fits_the_asset_job(definitions: str, run_config: str, executor: str) -> None:
    """The deploy definitions swap only the executor, and the run config file is valid run
    config for the whole asset job (not just for the executor's own schema)."""
    from medrobust_assets.location import defs as base_defs

    module = _load_module(DEPLOY / definitions)
    job = module.defs.resolve_implicit_global_asset_job_def()
    assert job.executor_def.name == executor
    base_keys = base_defs.resolve_implicit_global_asset_job_def().asset_layer.executable_asset_keys
    assert job.asset_layer.executable_asset_keys == base_keys
    result = validate_config(job.run_config_schema.config_type, _yaml(DEPLOY / run_config))
    assert result.success, [e.message for e in result.errors or []]
