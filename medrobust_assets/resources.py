"""Configurable resources: the suite config and the MLflow store."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

from medrobust_lib import runtime
from medrobust_lib.config import Suite
from medrobust_lib.paths import experiment_name
from medrobust_lib.store import tracking

_PINNED: dict[str, Path] = {}
"""The paths a code location pins (:func:`pin_location`): resource config from a launch (the UI's
launchpad, a GraphQL ``launchRun``) may not point a run at another suite or MLflow store."""


def pin_location(suite_path: str | Path, mlruns_dir: str | Path) -> None:
    """Pin this process's runs to the suite at ``suite_path`` and the MLflow store ``mlruns_dir``
    (relative paths from the working directory; both resolved, symlinks included). Called by the
    code-location modules (:mod:`medrobust_assets.location` and the generated ones), which every
    Dagster process of a location imports (code server, run workers), so a run whose resource
    config names other paths fails before it reads or writes anything (issue 44, finding 4).
    Workers, retrain and torch threads stay configurable: they change no path."""
    _PINNED["suite_path"] = Path(suite_path).resolve()
    _PINNED["mlruns_dir"] = Path(mlruns_dir).resolve()


def unpin() -> None:
    """Forget the pins (tests)."""
    _PINNED.clear()


def check_pinned(field: str, value: str) -> None:
    """Raise ValueError when ``field`` is pinned and ``value`` names another path."""
    pinned = _PINNED.get(field)
    if pinned is not None and Path(value).resolve() != pinned:
        raise ValueError(f"resource config {field}={value!r} refused: this code location pins it to {pinned} "
                         "(launch config cannot move a suite's inputs or outputs; docs/security.md)")


class SuiteResource(dg.ConfigurableResource):  # type: ignore[misc]
    """Which suite YAML to run; paths inside it are relative to the working directory. Set by
    :func:`medrobust_assets.definitions.definitions_for` to the suite the graph was built from."""

    suite_path: str = ""
    workers: int = 0  # 0: use the suite's value
    retrain: bool = False  # True: demo.retrain (train the demo models instead of copying committed weights)
    torch_threads: int = 0  # > 0: torch's intra-op threads in the process that runs the step (runtime.configure)

    def load(self) -> Suite:
        """The suite (parsed once per process while its file is unchanged:
        :func:`medrobust_lib.runtime.load_suite`), with this resource's overrides; applies the
        process settings (:func:`medrobust_lib.runtime.configure`)."""
        if not self.suite_path:
            raise ValueError("these Definitions were built from a suite without its file: build them with "
                             "definitions_for(suite, suite_path=...) or definitions_for_file(path)")
        check_pinned("suite_path", self.suite_path)
        runtime.configure(torch_threads=self.torch_threads)
        suite = runtime.load_suite(self.suite_path)
        if self.workers:
            suite = suite.model_copy(update={"workers": self.workers})
        if self.retrain:
            suite = suite.model_copy(update={"demo": suite.demo.model_copy(update={"retrain": True})})
        return suite


class TrackingResource(dg.ConfigurableResource):  # type: ignore[misc]
    """MLflow on a SQLite store under ``mlruns_dir``; one run per materialization.

    The assets' only way to MLflow: :meth:`run` opens the run, the ``log_*`` methods write into
    it (delegating to :mod:`medrobust_lib.store.tracking`). Every ``log_*`` method takes the run
    that :meth:`run` yielded and does nothing when it is None (``enabled: false``), so asset
    bodies never test for tracking themselves. Metrics follow one rule
    (:func:`medrobust_lib.store.tracking.loggable_metrics`): only finite real numbers are logged;
    None, NaN, +-inf and non-numbers are skipped.
    """

    mlruns_dir: str = "mlruns"
    enabled: bool = True

    @contextmanager
    def run(self, context: dg.AssetExecutionContext, suite: Suite, experiment: str,
            params: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """An MLflow run in the suite's experiment ``<suite name>/<experiment>``
        (:func:`medrobust_lib.paths.experiment_name`), tagged with the Dagster run id, asset key
        and partition (or None when tracking is disabled)."""
        if not self.enabled:
            yield None
            return
        check_pinned("mlruns_dir", self.mlruns_dir)

        asset = context.asset_key.to_user_string()
        partition = context.partition_key if context.has_partition_key else ""
        tags = {"dagster.run_id": context.run_id, "dagster.asset": asset, "dagster.partition": str(partition),
                "medrobust.suite": suite.name}
        name = f"{asset}[{partition}]" if partition else asset
        with tracking.tracked_run(experiment_name(suite, experiment), name, tags, self.mlruns_dir,
                                  params) as run:
            yield run

    def log_metrics(self, run: Any, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Log the finite real-valued entries of ``metrics`` (others skipped); returns them."""
        return tracking.log_metrics(run, metrics)

    def log_params(self, run: Any, params: Mapping[str, Any]) -> None:
        """Log ``params`` (secret-looking keys dropped, values capped at 500 characters)."""
        tracking.log_params(run, params)

    def log_artifact(self, run: Any, path: str | Path, artifact_path: str | None = None) -> None:
        """Log one file under ``artifact_path``."""
        tracking.log_artifact(run, path, artifact_path)

    def log_files(self, run: Any, paths: Sequence[str | Path], artifact_path: str | None = None) -> None:
        """Log each file of ``paths`` under ``artifact_path``."""
        for p in paths:
            tracking.log_artifact(run, p, artifact_path)

    def log_artifacts(self, run: Any, folder: str | Path, artifact_path: str | None = None) -> None:
        """Log every file under ``folder`` under ``artifact_path``."""
        tracking.log_artifacts(run, folder, artifact_path)

    def log_text(self, run: Any, text: str, artifact_file: str) -> None:
        """Log ``text`` as the run-relative file ``artifact_file``."""
        tracking.log_text(run, text, artifact_file)

    def log_and_register(self, run: Any, folder: str | Path, artifact_path: str, name: str,
                         tags: Mapping[str, str] | None = None) -> str | None:
        """Log a model folder and register it as a new version of ``name``; the version, or None
        when tracking is disabled."""
        return tracking.log_and_register(run, folder, artifact_path, name, tags)
