"""MLflow helpers: a SQLite-backed store under ``mlruns/`` with an explicit artifact location.

Secrets never reach MLflow: :func:`safe_params` drops keys that look like credentials.
``mlflow`` is imported lazily (it costs seconds) so the CLI and Dagster definitions load fast.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SECRET = re.compile(r"(key|token|secret|password|passwd|credential|auth)", re.IGNORECASE)


def tracking_uri(mlruns_dir: str | Path = "mlruns") -> str:
    """``sqlite:///<abs path>/mlflow.db`` for the given folder (created if needed)."""
    root = Path(mlruns_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


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


def ensure_experiment(name: str, mlruns_dir: str | Path = "mlruns") -> str:
    """Experiment id for ``name``, created with an explicit artifact location when missing."""
    import mlflow

    configure(mlruns_dir)
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
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


def register_artifact(run: Any, artifact_path: str, name: str, tags: Mapping[str, str] | None = None) -> str:
    """Register the run's logged artifact folder ``artifact_path`` as a new version of the
    registered model ``name`` (created when missing); returns the version number. The version's
    source is the artifact location, so ``models:/<name>/<version>`` resolves to those files."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run.info.run_id,
                                     tags=safe_params(tags or {}))
    return str(mv.version)
