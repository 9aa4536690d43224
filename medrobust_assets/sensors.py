"""Sensors and jobs of the registry loop: a new registered version (or a moved ``candidate``
alias) launches its evaluation; a finished evaluation rebuilds the mart."""

import json
from collections.abc import Collection
from typing import Any

import dagster as dg

from medrobust_assets.assets.finetune import REGISTERED_VERSIONS, REGISTRY_PREFIX, version_key
from medrobust_assets.resources import TrackingResource
from medrobust_lib.store.model_registry import snapshot

registry_evaluation_job = dg.define_asset_job(
    "registry_evaluation_job", selection=dg.AssetSelection.assets("registry_evaluation"),
    partitions_def=REGISTERED_VERSIONS,
    description="Evaluate one registered segmentation version and gate it against its champion.",
)
marts_job = dg.define_asset_job("marts_job", selection=dg.AssetSelection.assets("marts"),
                                description="Rebuild the DuckDB mart from the Parquet results.")


def registry_requests(snapshot: dict[str, dict[str, Any]], cursor: str | None,
                      evaluated: Collection[str] = ()) -> tuple[list[dg.RunRequest], list[str], str]:
    """Pure core of the registry sensor: ``(run requests, new partition keys, new cursor)``.

    ``snapshot``: ``medrobust_lib.store.model_registry.snapshot()``. The cursor (JSON) holds, per
    registered model, the versions already launched and where ``candidate`` pointed. A version not
    in the cursor is launched with run key ``<name>:<version>``, unless its partition key is in
    ``evaluated`` (the partitions of ``registry_evaluation`` the instance already holds a
    materialization of, e.g. from ``medrobust demo``'s own registry loop): it is then only added to
    the cursor, so a daemon that starts after the demo (``make ui``) redoes nothing. A ``candidate``
    alias moved onto a version launched before re-launches it once with run key
    ``<name>:<version>:candidate`` (the gate then compares it with the champion of that moment); a
    model the cursor has never seen has no previous alias, so nothing moved."""
    state: dict[str, dict[str, Any]] = json.loads(cursor) if cursor else {}
    done = set(evaluated)
    requests: list[dg.RunRequest] = []
    new_keys: list[str] = []
    for name, info in snapshot.items():
        candidate = info["aliases"].get("candidate")
        seen = set(state.get(name, {}).get("versions", []))
        old_candidate = state[name].get("candidate") if name in state else candidate
        for v in info["versions"]:
            if v not in seen:
                key = version_key(name, v)
                if key in done:
                    continue  # evaluated before this cursor existed: recorded below, not launched
                new_keys.append(key)
                requests.append(dg.RunRequest(run_key=key, partition_key=key,
                                              tags={"medrobust/registered_model": name,
                                                    "medrobust/version": str(v), "medrobust/trigger": "new_version"}))
        if candidate is not None and candidate != old_candidate and candidate in seen:
            key = version_key(name, candidate)
            requests.append(dg.RunRequest(run_key=f"{key}:candidate", partition_key=key,
                                          tags={"medrobust/registered_model": name,
                                                "medrobust/version": str(candidate),
                                                "medrobust/trigger": "candidate_alias"}))
        state[name] = {"versions": sorted(seen | set(info["versions"])), "candidate": candidate}
    return requests, new_keys, json.dumps(state, sort_keys=True)


REGISTRY_EVALUATION_KEY = dg.AssetKey("registry_evaluation")


def evaluated_versions(instance: dg.DagsterInstance) -> set[str]:
    """Partition keys (``<name>:<version>``) of ``registry_evaluation`` with a materialization in
    ``instance``: the versions some run (the daemon's, ``medrobust demo``'s, the UI's) evaluated."""
    return set(instance.get_materialized_partitions(REGISTRY_EVALUATION_KEY))


@dg.sensor(job=registry_evaluation_job, minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Polls the MLflow model registry (models named medrobust-seg-*): every new version not "
                       "evaluated yet, and every move of the 'candidate' alias, launches registry_evaluation for "
                       "that version (versions the instance already holds an evaluation of are not re-run).")
def registry_sensor(context: dg.SensorEvaluationContext, tracking: TrackingResource) -> dg.SensorResult:

    requests, new_keys, cursor = registry_requests(snapshot(REGISTRY_PREFIX, tracking.mlruns_dir), context.cursor,
                                                   evaluated_versions(context.instance))
    return dg.SensorResult(
        run_requests=requests, cursor=cursor,
        dynamic_partitions_requests=[REGISTERED_VERSIONS.build_add_request(new_keys)] if new_keys else [])


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[registry_evaluation_job],
                      request_job=marts_job, default_status=dg.DefaultSensorStatus.RUNNING,
                      description="After a successful registry evaluation, rebuild the mart so its rows are queryable.")
def mart_after_evaluation(context: dg.RunStatusSensorContext) -> dg.RunRequest:
    return dg.RunRequest(run_key=f"mart-after-{context.dagster_run.run_id}")


def nightly_requests(snapshot: dict[str, dict[str, Any]], known: set[str], day: str) -> list[dg.RunRequest]:
    """Pure core of the nightly schedule: one re-evaluation per ``champion`` / ``candidate``
    version that the registry sensor has already added as a partition (run key per day)."""
    out: list[dg.RunRequest] = []
    for name, info in snapshot.items():
        for v in sorted({info["aliases"][a] for a in ("champion", "candidate") if a in info["aliases"]}):
            key = version_key(name, v)
            if key in known:
                out.append(dg.RunRequest(run_key=f"{key}:nightly:{day}", partition_key=key,
                                         tags={"medrobust/registered_model": name, "medrobust/version": str(v),
                                               "medrobust/trigger": "nightly"}))
    return out


@dg.schedule(job=registry_evaluation_job, cron_schedule="0 2 * * *", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.RUNNING,
             description="Every night at 02:00 UTC: re-evaluate the champion and candidate of every registered "
                         "segmentation model from scratch (no row reuse) on the current data and perturbations, "
                         "and re-run the robustness gate; the mart sensor then rebuilds the mart.")
def nightly_reevaluation(context: dg.ScheduleEvaluationContext, tracking: TrackingResource) -> list[dg.RunRequest]:

    known = set(context.instance.get_dynamic_partitions(REGISTERED_VERSIONS.name or ""))
    when = context.scheduled_execution_time
    day = when.strftime("%Y-%m-%d") if when is not None else "manual"
    return nightly_requests(snapshot(REGISTRY_PREFIX, tracking.mlruns_dir), known, day)
