"""MLflow helpers: a SQLite-backed store under ``mlruns/`` with an explicit artifact location, or,
when ``$MEDROBUST_TRACKING_URI`` is set (``http://mlflow:5000`` in ``deploy/``), that MLflow
tracking server for runs, artifacts (proxied by the server) and the model registry.

Secrets never reach MLflow: :func:`safe_params` drops keys that look like credentials.
``mlflow`` is imported lazily (it costs seconds) so the CLI and Dagster definitions load fast.

Every MLflow write of the project goes through this module (the Dagster assets reach it through
``medrobust_assets.resources.TrackingResource``): :func:`log_metrics` (one rule for missing
values, :func:`loggable_metrics`), :func:`log_params`, :func:`log_artifact`,
:func:`log_artifacts`, :func:`log_text` and :func:`log_and_register` take the run explicitly and
do nothing when it is None (tracking disabled).
"""

from __future__ import annotations

import fcntl
import math
import numbers
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SECRET = re.compile(r"(key|token|secret|password|passwd|credential|auth)", re.IGNORECASE)


SERVER_ENV = "MEDROBUST_TRACKING_URI"
"""Opt-in MLflow tracking server (``http(s)://...``); unset: the SQLite store under ``mlruns/``."""


def server_uri() -> str | None:
    """The tracking server from ``$MEDROBUST_TRACKING_URI`` (None when unset or blank)."""
    uri = os.environ.get(SERVER_ENV, "").strip()
    if uri and not uri.startswith(("http://", "https://")):
        raise ValueError(f"{SERVER_ENV} must be an http(s) MLflow tracking server URI, got {uri!r}")
    return uri or None


def tracking_uri(mlruns_dir: str | Path = "mlruns") -> str:
    """The tracking server when configured, else ``sqlite:///<abs path>/mlflow.db`` for the given
    folder (created if needed; it also holds the lock file and the download cache)."""
    root = Path(mlruns_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return server_uri() or f"sqlite:///{root / 'mlflow.db'}"


def artifact_root(mlruns_dir: str | Path = "mlruns") -> str:
    return (Path(mlruns_dir).resolve() / "artifacts").as_uri()


def configure(mlruns_dir: str | Path = "mlruns") -> str:
    """Point MLflow at the local SQLite store (telemetry off); returns the tracking URI."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri(mlruns_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


@contextmanager
def store_lock(mlruns_dir: str | Path = "mlruns") -> Iterator[None]:
    """An exclusive lock (``flock`` on ``<mlruns>/.lock``) held while a process creates the SQLite
    schema, an experiment or a registered model: parallel partitions (multiprocess / Dask
    executors, two queued runs) otherwise race on "already exists" errors."""

    root = Path(mlruns_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_READY: set[str] = set()


def init_store(mlruns_dir: str | Path = "mlruns") -> str:
    """Configure MLflow for ``mlruns_dir`` and make sure its database schema exists, under
    :func:`store_lock` (once per process and folder). Returns the tracking URI."""
    uri = configure(mlruns_dir)
    if uri not in _READY:
        import mlflow

        with store_lock(mlruns_dir):
            mlflow.search_experiments(max_results=1)  # creates / migrates the schema
        _READY.add(uri)
    return uri


def ensure_experiment(name: str, mlruns_dir: str | Path = "mlruns") -> str:
    """Experiment id for ``name``, created with an explicit artifact location when missing
    (safe when several processes ask for the same new experiment at once)."""
    import mlflow

    init_store(mlruns_dir)
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    with store_lock(mlruns_dir):
        exp = mlflow.get_experiment_by_name(name)  # another process may have created it meanwhile
        if exp is not None:
            return str(exp.experiment_id)
        if server_uri():  # the server stores (and proxies) artifacts where it was configured to
            return str(mlflow.create_experiment(name))
        loc = f"{artifact_root(mlruns_dir)}/{name}"
        return str(mlflow.create_experiment(name, artifact_location=loc))


def safe_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Stringified params without anything that looks like a secret; values capped at 500 chars."""
    return {k: str(v)[:500] for k, v in params.items() if not _SECRET.search(k)}


@contextmanager
def tracked_run(experiment: str, run_name: str, tags: Mapping[str, str], mlruns_dir: str | Path = "mlruns",
                params: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """Start an MLflow run in ``experiment`` with tags (and params); yields the active run."""
    import mlflow

    exp_id = ensure_experiment(experiment, mlruns_dir)
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=dict(tags)) as run:
        if params:
            mlflow.log_params(safe_params(params))
        yield run


def ensure_registered_model(client: Any, name: str, description: str | None = None) -> None:
    """Create the registered model ``name`` unless it exists; safe when parallel runs register
    their first version at the same time (the loser's "already exists" is the desired state)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return
    except MlflowException as exc:
        if getattr(exc, "error_code", "") not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
            raise
    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
            raise


def register_artifact(run: Any, artifact_path: str, name: str, tags: Mapping[str, str] | None = None) -> str:
    """Register the run's logged artifact folder ``artifact_path`` as a new version of the
    registered model ``name`` (created when missing); returns the version number. The version's
    source is the artifact location, so ``models:/<name>/<version>`` resolves to those files."""
    from mlflow import MlflowClient

    client = MlflowClient()
    ensure_registered_model(client, name)
    mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run.info.run_id,
                                     tags=safe_params(tags or {}))
    return str(mv.version)


# ---- logging into a run (each a no-op when ``run`` is None: tracking disabled) -----------------

def loggable_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics MLflow receives, as floats: real numbers (int, float, bool, numpy scalars) that
    are finite. None, NaN, +-inf and anything that is not a number (strings, paths, lists) are
    skipped, never logged as 0 or as NaN: a metric that could not be computed (no clean rows, no
    timing) is absent from the run rather than a value that plots as a point."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and math.isfinite(float(v))}


def _run_id(run: Any) -> str:
    return str(run.info.run_id)


def log_metrics(run: Any, metrics: Mapping[str, Any]) -> dict[str, float]:
    """Log the :func:`loggable_metrics` of ``metrics`` to ``run``; returns what was logged
    (empty when ``run`` is None)."""
    if run is None:
        return {}
    values = loggable_metrics(metrics)
    if values:
        import mlflow

        mlflow.log_metrics(values, run_id=_run_id(run))
    return values


def log_params(run: Any, params: Mapping[str, Any]) -> None:
    """Log ``params`` to ``run`` through :func:`safe_params` (no secrets, values capped)."""
    if run is None or not params:
        return
    import mlflow

    mlflow.log_params(safe_params(params), run_id=_run_id(run))


def log_artifact(run: Any, path: str | Path, artifact_path: str | None = None) -> None:
    """Copy the file ``path`` into ``run``'s artifacts under ``artifact_path`` (None: the root)."""
    if run is None:
        return
    import mlflow

    mlflow.log_artifact(str(path), artifact_path=artifact_path, run_id=_run_id(run))


def log_artifacts(run: Any, folder: str | Path, artifact_path: str | None = None) -> None:
    """Copy every file under ``folder`` into ``run``'s artifacts under ``artifact_path``."""
    if run is None:
        return
    import mlflow

    mlflow.log_artifacts(str(folder), artifact_path=artifact_path, run_id=_run_id(run))


def log_text(run: Any, text: str, artifact_file: str) -> None:
    """Write ``text`` as the artifact file ``artifact_file`` (a run-relative path) of ``run``."""
    if run is None:
        return
    import mlflow

    mlflow.log_text(text, artifact_file, run_id=_run_id(run))


def log_and_register(run: Any, folder: str | Path, artifact_path: str, name: str,
                     tags: Mapping[str, str] | None = None) -> str | None:
    """Log a model folder as the ``artifact_path`` artifacts of ``run`` and register them as a new
    version of the registered model ``name``; returns the version (None when ``run`` is None)."""
    if run is None:
        return None
    log_artifacts(run, folder, artifact_path)
    return register_artifact(run, artifact_path, name, tags)
