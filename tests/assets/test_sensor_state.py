"""``make ui`` after ``make demo`` redoes nothing: the registry sensor's first tick in a fresh
daemon (no cursor) launches no evaluation of a version the instance already holds an evaluation
of (the demo's own registry loop materialised it), only versions that are really new; the
candidate alias seen for the first time is not a move."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import medrobust_assets.sensors as sensors
from medrobust_assets.assets.finetune import REGISTERED_VERSIONS, version_key
from medrobust_assets.registry_demo import sensor_tick
from medrobust_assets.resources import TrackingResource
from medrobust_assets.sensors import (
    REGISTRY_EVALUATION_KEY,
    evaluated_versions,
    registry_requests,
    registry_sensor,
)

NAME = "medrobust-seg-tiny-sam-lora"


def _snap(versions: list[int], candidate: int | None) -> dict[str, dict[str, Any]]:
    return {NAME: {"versions": versions, "aliases": {"champion": 1} | ({} if candidate is None else
                                                                     {"candidate": candidate})}}


def test_evaluated_versions_are_recorded_not_launched() -> None:
    done = {version_key(NAME, v) for v in (1, 2, 3)}
    reqs, keys, cur = registry_requests(_snap([1, 2, 3], 3), None, done)
    assert reqs == [] and keys == []
    assert json.loads(cur)[NAME] == {"versions": [1, 2, 3], "candidate": 3}
    # only a version that is really new is launched; the cursor then holds it
    reqs, keys, cur = registry_requests(_snap([1, 2, 3, 4], 3), None, done)
    assert [r.run_key for r in reqs] == [f"{NAME}:4"] and keys == [f"{NAME}:4"]
    # a later move of the candidate alias is still a move
    reqs, _, _ = registry_requests(_snap([1, 2, 3, 4], 2), cur, done)
    assert [r.run_key for r in reqs] == [f"{NAME}:2:candidate"]
    # without the evaluated set the same first tick launches all three (what the daemon did before)
    assert len(registry_requests(_snap([1, 2, 3], 3), None)[0]) == 3


def _materialize(instance: dg.DagsterInstance, keys: list[str]) -> None:
    """Record the evaluation of ``keys`` as the demo's in-process runs do (a materialization of
    ``registry_evaluation`` per partition), without running the model."""
    instance.add_dynamic_partitions(REGISTERED_VERSIONS.name or "", keys)
    for k in keys:
        instance.report_runless_asset_event(dg.AssetMaterialization(REGISTRY_EVALUATION_KEY, partition=k))


def test_a_fresh_daemon_after_the_demo_launches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    instance = dg.DagsterInstance.ephemeral()
    snap = _snap([1, 2, 3], 3)
    monkeypatch.setattr(sensors, "snapshot", lambda prefix, mlruns: snap)
    # the demo's registry loop: its own tick (cursor in a file), then the evaluations it requested
    requested = sensor_tick(instance, str(tmp_path / "mlruns"), tmp_path / "cursor.json")
    assert requested == [version_key(NAME, v) for v in (1, 2, 3)]
    _materialize(instance, requested)
    assert evaluated_versions(instance) == set(requested)
    # the daemon's first tick (make ui): no cursor of its own, and nothing to do
    with dg.build_sensor_context(instance=instance, cursor=None,
                                 resources={"tracking": TrackingResource(mlruns_dir=str(tmp_path))}) as ctx:
        out = registry_sensor(ctx)
    assert isinstance(out, dg.SensorResult)
    assert out.run_requests == [] and not out.dynamic_partitions_requests
    # a version registered afterwards is evaluated by the daemon, once
    snap[NAME]["versions"] = [1, 2, 3, 4]
    with dg.build_sensor_context(instance=instance, cursor=out.cursor,
                                 resources={"tracking": TrackingResource(mlruns_dir=str(tmp_path))}) as ctx:
        nxt = registry_sensor(ctx)
    assert isinstance(nxt, dg.SensorResult)
    assert [r.partition_key for r in nxt.run_requests or []] == [version_key(NAME, 4)]


def test_the_registry_sensor_stays_on() -> None:
    assert registry_sensor.default_status == dg.DefaultSensorStatus.RUNNING
