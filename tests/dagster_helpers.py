"""Materializing assets of a test's Definitions in-process (the asset tests' shared runner)."""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

Run = Callable[..., dg.ExecuteInProcessResult]


def asset_runner(graph: dg.Definitions, instance: dg.DagsterInstance) -> Run:
    """``run(asset, partition=None)``: materialize one asset (one partition of it) of ``graph`` with
    its resources on ``instance`` and return the result, failing the test when the run fails."""

    def run(asset: str, partition: str | dg.MultiPartitionKey | None = None) -> dg.ExecuteInProcessResult:
        res = dg.materialize(list(graph.assets or []), selection=[asset], partition_key=partition, instance=instance,
                             resources=graph.resources)
        assert res.success
        return res

    return run
