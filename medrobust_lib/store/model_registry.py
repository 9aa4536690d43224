"""The MLflow model registry for segmentation checkpoints (docs/design.md, section 6).

A fine-tuned checkpoint folder (``model.safetensors`` + ``config.json``, as written by
``finetune.train.save_checkpoint``) is logged as the ``checkpoint`` artifact folder of a run and
registered as a new version of ``medrobust-seg-<model>-<strategy>``; the ``candidate`` alias moves
to it. ``models:/<name>/<version>``, ``models:/<name>@<alias>`` and ``models:/<name>/latest``
resolve to the local ``model.safetensors`` of that version. Only the local store is read: nothing
is ever fetched from the network.

``mlflow`` is imported lazily (it costs seconds), like in :mod:`medrobust_lib.store.tracking`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from medrobust_lib.store.tracking import (
    ensure_experiment,
    ensure_registered_model,
    init_store,
    safe_params,
    server_uri,
    tracking_uri,
)

MLRUNS_ENV = "MEDROBUST_MLRUNS"
ARTIFACT_PATH = "checkpoint"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>[^/@]+)|@(?P<alias>[^/@]+))/?$")
# artifact URI schemes that resolve through the local tracking store (never the network)
_LOCAL_DOWNLOAD_SCHEMES = ("runs",)
# with a configured tracking server (``$MEDROBUST_TRACKING_URI``), artifacts it proxies are fetched
# from that server, which is part of the deployment (never from anywhere else)
_SERVER_DOWNLOAD_SCHEMES = ("runs", "mlflow-artifacts")


class RegistryError(LookupError):
    """An unknown registered model, version or alias."""


@dataclass(frozen=True)
class RegisteredVersion:
    name: str
    version: int
    run_id: str
    source: str
    uri: str


def mlruns_dir() -> Path:
    """The MLflow folder: ``$MEDROBUST_MLRUNS`` (relative to the working directory), default ``mlruns``."""
    return Path(os.environ.get(MLRUNS_ENV) or "mlruns")


def seg_model_name(model_id: str, strategy: str) -> str:
    """Registered-model name of a segmentation model fine-tuned with ``strategy``."""
    return f"medrobust-seg-{model_id}-{strategy}"


def _root(d: str | Path | None) -> Path:
    return Path(d) if d is not None else mlruns_dir()


def _client(d: str | Path | None) -> Any:
    from mlflow import MlflowClient

    uri = init_store(_root(d))
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _is_missing(exc: Exception) -> bool:
    return getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE")


def _registered_model(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if not _is_missing(exc):
            raise
        known = sorted(rm.name for rm in client.search_registered_models(max_results=50))
        raise RegistryError(f"unknown registered model {name!r}; registered: {known or 'none'}") from None


def _all_versions(client: Any, name: str) -> list[Any]:
    out: list[Any] = []
    token: str | None = None
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return sorted(out, key=lambda mv: int(mv.version))


def _model_version(client: Any, name: str, version: int) -> Any:
    from mlflow.exceptions import MlflowException

    _registered_model(client, name)
    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if not _is_missing(exc):
            raise
        have = [int(mv.version) for mv in _all_versions(client, name)]
        raise RegistryError(f"registered model {name!r} has no version {version}; versions: {have}") from None


# ---- write -----------------------------------------------------------------------------------

def register_checkpoint(folder: str | Path, name: str, *, tags: Mapping[str, str], experiment: str = "registry",
                        mlruns_dir: str | Path | None = None, run: Any = None,
                        alias: str | None = "candidate") -> RegisteredVersion:
    """Log ``folder``'s ``model.safetensors`` (+ ``config.json``) under the ``checkpoint`` artifact
    path of ``run`` (a new, finished run in ``experiment`` when None), register it as a new version
    of ``name`` (created when missing) with ``tags`` (secret-looking keys dropped) and move
    ``alias`` to it."""

    src = Path(folder)
    weights = src / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {src} to register as {name!r}")
    client = _client(mlruns_dir)
    clean = safe_params(tags)
    files = [weights] + ([src / CONFIG_FILE] if (src / CONFIG_FILE).is_file() else [])
    if run is None:
        exp_id = ensure_experiment(experiment, _root(mlruns_dir))
        run = client.create_run(exp_id, run_name=f"register-{name}",
                                tags={**clean, "medrobust.registered_model": name})
        try:
            for f in files:
                client.log_artifact(run.info.run_id, str(f), ARTIFACT_PATH)
        except BaseException:
            client.set_terminated(run.info.run_id, "FAILED")
            raise
        client.set_terminated(run.info.run_id)
    else:
        for f in files:
            client.log_artifact(run.info.run_id, str(f), ARTIFACT_PATH)
    ensure_registered_model(client, name, "medrobust segmentation checkpoint (safetensors)")
    source = f"{run.info.artifact_uri}/{ARTIFACT_PATH}"
    mv = client.create_model_version(name, source=source, run_id=run.info.run_id, tags=clean)
    version = int(mv.version)
    if alias:
        client.set_registered_model_alias(name, alias, str(version))
    return RegisteredVersion(name, version, run.info.run_id, source, f"models:/{name}/{version}")


def set_alias(name: str, alias: str, version: int, mlruns_dir: str | Path | None = None) -> None:
    """Point ``alias`` of ``name`` at ``version`` (which must exist)."""
    client = _client(mlruns_dir)
    _model_version(client, name, version)
    client.set_registered_model_alias(name, alias, str(version))


def set_version_tag(name: str, version: int, key: str, value: str, mlruns_dir: str | Path | None = None) -> None:
    """Set one tag on a registered version (e.g. the gate verdict)."""
    client = _client(mlruns_dir)
    _model_version(client, name, version)
    client.set_model_version_tag(name, str(version), key, value)


# ---- read ------------------------------------------------------------------------------------

def get_alias_version(name: str, alias: str, mlruns_dir: str | Path | None = None) -> int | None:
    """The version ``alias`` points at; None when the alias (or the model) does not exist."""
    client = _client(mlruns_dir)
    try:
        rm = _registered_model(client, name)
    except RegistryError:
        return None
    v = dict(rm.aliases or {}).get(alias)
    return int(v) if v is not None else None


def list_versions(name: str, mlruns_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every version of ``name``, oldest first: version, aliases, tags, run_id, creation_timestamp, source."""
    client = _client(mlruns_dir)
    rm = _registered_model(client, name)
    by_version: dict[int, list[str]] = {}
    for a, v in dict(rm.aliases or {}).items():
        by_version.setdefault(int(v), []).append(a)
    return [{"version": int(mv.version), "aliases": sorted(by_version.get(int(mv.version), [])),
             "tags": dict(mv.tags or {}), "run_id": mv.run_id, "creation_timestamp": mv.creation_timestamp,
             "source": mv.source} for mv in _all_versions(client, name)]


def snapshot(prefix: str = "medrobust-seg-", mlruns_dir: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """What the registry holds for every model whose name starts with ``prefix``:
    ``{name: {"versions": [1, 2, ...], "aliases": {"candidate": 2, ...}}}`` (versions ascending).
    One ``search_registered_models`` page walk plus one version search per model; used by the
    Dagster registry sensor on every tick."""
    client = _client(mlruns_dir)
    out: dict[str, dict[str, Any]] = {}
    token: str | None = None
    while True:
        page = client.search_registered_models(filter_string=f"name LIKE '{prefix}%'", page_token=token)
        for rm in page:
            out[rm.name] = {"versions": [int(mv.version) for mv in _all_versions(client, rm.name)],
                            "aliases": {a: int(v) for a, v in dict(rm.aliases or {}).items()}}
        token = page.token
        if not token:
            return dict(sorted(out.items()))


def resolve_version(uri: str, mlruns_dir: str | Path | None = None) -> tuple[str, int]:
    """``(name, version)`` that ``models:/name/<version>|@<alias>|/latest`` points at now."""
    name, version, alias = parse_model_uri(uri)
    client = _client(mlruns_dir)
    rm = _registered_model(client, name)
    if alias is not None:
        aliases = dict(rm.aliases or {})
        if alias not in aliases:
            raise RegistryError(f"registered model {name!r} has no alias {alias!r}; aliases: "
                                f"{sorted(aliases) or 'none'}")
        return name, int(aliases[alias])
    if version is None:
        versions = _all_versions(client, name)
        if not versions:
            raise RegistryError(f"registered model {name!r} has no versions")
        return name, int(versions[-1].version)
    return name, int(_model_version(client, name, version).version)


def version_tags(name: str, version: int, mlruns_dir: str | Path | None = None) -> dict[str, str]:
    """The tags of one registered version."""
    return dict(_model_version(_client(mlruns_dir), name, version).tags or {})


def parse_model_uri(uri: str) -> tuple[str, int | None, str | None]:
    """``(name, version, alias)``; version None and alias None mean ``latest``."""
    m = _URI.match(uri.strip())
    if m is None:
        raise ValueError(f"not a registry URI: {uri!r}; expected models:/<name>/<version>, "
                         "models:/<name>@<alias> or models:/<name>/latest")
    name, version, alias = m["name"], m["version"], m["alias"]
    if alias is not None:
        return name, None, alias
    if version == "latest":
        return name, None, None
    if not version.isdigit():
        raise ValueError(f"{uri!r}: version must be a number, 'latest' or '@<alias>' (stages are not supported)")
    return name, int(version), None


def _local_path(source: str) -> Path | None:
    p = urlparse(source)
    if p.scheme == "file":
        return Path(url2pathname(unquote(p.path)))
    if p.scheme == "":
        return Path(source)
    return None


def resolve_model_uri(uri: str, mlruns_dir: str | Path | None = None) -> Path:
    """The local ``model.safetensors`` of the registry version ``uri`` names."""
    name, version = resolve_version(uri, mlruns_dir)
    mv = _model_version(_client(mlruns_dir), name, version)
    source = str(mv.source)
    folder = _local_path(source)
    if folder is None:
        scheme = urlparse(source).scheme
        allowed = _SERVER_DOWNLOAD_SCHEMES if server_uri() else _LOCAL_DOWNLOAD_SCHEMES
        if scheme not in allowed:
            raise ValueError(f"{uri}: version {mv.version} lives at {source}, outside the local store; "
                             "refusing to download it")
        folder = _root(mlruns_dir).resolve() / ".cache" / name / str(mv.version)
        if not (folder / WEIGHTS_FILE).is_file():
            tmp = folder.with_name(f"{folder.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            import mlflow.artifacts

            store = tracking_uri(_root(mlruns_dir))
            got = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(tmp),
                                                           tracking_uri=store, registry_uri=store))
            shutil.rmtree(folder, ignore_errors=True)
            got.replace(folder)
            shutil.rmtree(tmp, ignore_errors=True)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{uri} (version {mv.version}): no {WEIGHTS_FILE} at {weights}")
    return weights
