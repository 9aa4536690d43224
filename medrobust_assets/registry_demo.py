"""The Dagster side of the demo's registry loop (:mod:`medrobust_lib.demo.registry_loop`): the
registry sensor evaluated in-process as the daemon would (:func:`sensor_tick`), the gate outcome of
an evaluation run (:func:`gate_outcome`), and :func:`loop_steps`, which turns the runner's step
function into the loop's :class:`~medrobust_lib.demo.registry_loop.LoopSteps`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from medrobust_assets.resources import TrackingResource
from medrobust_assets.sensors import registry_sensor
from medrobust_lib.demo.registry_loop import GateOutcome, LoopSteps

REGISTRY_SENSOR_CURSOR = "registry_sensor_cursor.json"
"""The cursor file of :func:`sensor_tick`, in the suite's Dagster state folder."""

Step = Callable[[str, str | None], dg.ExecuteInProcessResult]
"""Materialize one asset (user string) for one partition (None: unpartitioned); raises when it fails."""


def sensor_tick(inst: dg.DagsterInstance, mlruns_dir: str, cursor_file: Path) -> list[str]:
    """One evaluation of the registry sensor, as the daemon would run it; the cursor lives in
    ``cursor_file`` (the daemon keeps its own). Adds the dynamic partitions the sensor asks for.
    Returns the requested partition keys."""
    cursor = cursor_file.read_text() if cursor_file.is_file() else None
    with dg.build_sensor_context(instance=inst, cursor=cursor,
                                 resources={"tracking": TrackingResource(mlruns_dir=mlruns_dir)}) as ctx:
        out = registry_sensor(ctx)
    if not isinstance(out, dg.SensorResult):
        raise TypeError(f"the registry sensor returned {type(out).__name__}, not a SensorResult")
    for req in out.dynamic_partitions_requests or []:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            inst.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    cursor_file.parent.mkdir(parents=True, exist_ok=True)
    cursor_file.write_text(out.cursor or "")
    return [r.partition_key for r in out.run_requests or [] if r.partition_key]


def gate_outcome(res: dg.ExecuteInProcessResult) -> GateOutcome:
    """The ``robustness_gate`` check of a ``registry_evaluation`` run: passed and its verdict (or
    note); a run without the check passes with "no gate result"."""
    evs = [e for e in res.get_asset_check_evaluations() if e.check_name == "robustness_gate"]
    if not evs:
        return GateOutcome(True, "no gate result")
    md = evs[0].metadata
    text = md["verdict"].value if "verdict" in md else md.get("note", dg.MetadataValue.text("")).value
    return GateOutcome(evs[0].passed, str(text))


def loop_steps(inst: dg.DagsterInstance, mlruns_dir: str, cursor_file: Path, step: Step) -> LoopSteps:
    """The loop's steps on Dagster: :func:`sensor_tick` on ``inst``, ``registry_evaluation`` and
    ``marts`` materialized by ``step`` (the runner's, which records each run in ``inst``)."""

    def tick() -> list[str]:
        return sensor_tick(inst, mlruns_dir, cursor_file)

    def evaluate(key: str) -> GateOutcome:
        return gate_outcome(step("registry_evaluation", key))

    def rebuild_mart() -> None:
        step("marts", None)

    return LoopSteps(sensor_tick=tick, evaluate=evaluate, rebuild_mart=rebuild_mart)
