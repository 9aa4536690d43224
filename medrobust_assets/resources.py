"""Configurable resources: the suite config and the MLflow store."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dagster as dg

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store.tracking import tracked_run


class SuiteResource(dg.ConfigurableResource):  # type: ignore[misc]
    """Which suite YAML to run; paths inside it are relative to the working directory."""

    suite_path: str = ""  # empty: $MEDROBUST_SUITE, else configs/demo.yaml
    workers: int = 0  # 0: use the suite's value
    retrain: bool = False  # True: demo.retrain (train the demo models instead of copying committed weights)

    def load(self) -> Suite:

        suite = load_suite(self.suite_path or os.environ.get("MEDROBUST_SUITE", "configs/demo.yaml"))
        if self.workers:
            suite = suite.model_copy(update={"workers": self.workers})
        if self.retrain:
            suite = suite.model_copy(update={"demo": suite.demo.model_copy(update={"retrain": True})})
        return suite


class TrackingResource(dg.ConfigurableResource):  # type: ignore[misc]
    """MLflow on a SQLite store under ``mlruns_dir``; one run per materialization."""

    mlruns_dir: str = "mlruns"
    enabled: bool = True

    @contextmanager
    def run(self, context: dg.AssetExecutionContext, experiment: str,
            params: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """An MLflow run tagged with the Dagster run id, asset key and partition (or None when
        tracking is disabled)."""
        if not self.enabled:
            yield None
            return

        asset = context.asset_key.to_user_string()
        partition = context.partition_key if context.has_partition_key else ""
        tags = {"dagster.run_id": context.run_id, "dagster.asset": asset, "dagster.partition": str(partition)}
        name = f"{asset}[{partition}]" if partition else asset
        with tracked_run(experiment, name, tags, self.mlruns_dir, params) as run:
            yield run
