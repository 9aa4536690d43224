"""The project's partitioned assets on the Dask executor (a 2-worker LocalCluster) write the same
rows as an in-process materialization."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from dagster_dask import dask_executor

from medrobust_assets.definitions import definitions_for_file
from medrobust_lib.config import load_suite
from medrobust_lib.store.results import read_table
from medrobust_lib.tracks.perturbed import read_manifest
from tests.suite_helpers import write_suite

INDEX_JOB = "clean_index_on_dask"
PERTURB_JOB = "perturbed_on_dask"
MODALITIES = ["ct", "dermoscopy"]
TYPES = ["gaussian_noise", "rotation", "ring_artifact", "hair"]  # generic + one per modality
PARTITIONS = [("ct", "2"), ("dermoscopy", "2"), ("ct", "5")]
MANIFEST_KEY = ["dataset", "modality", "level", "perturbation", "sample_id"]


ROOT = Path(__file__).resolve().parents[2]
GRAPH_SUITE = ROOT / "configs" / "demo_full.yaml"
"""The suite whose graph the workers rebuild (every modality, levels 1-5: the partitions below)."""


def dask_definitions() -> dg.Definitions:
    """Two asset jobs over the project's own assets (the graph of :data:`GRAPH_SUITE`), executed
    on Dask. The suite the runs read and the MLflow folder come from run config, so the workers
    rebuild exactly this from an import."""
    graph = definitions_for_file(GRAPH_SUITE)
    return dg.Definitions(
        assets=list(graph.assets or []),
        jobs=[dg.define_asset_job(INDEX_JOB, selection=["demo_data", "clean_samples"]),
              dg.define_asset_job(PERTURB_JOB, selection=["perturbed_samples"])],
        resources=graph.resources,
        executor=dask_executor,
    )


def index_job() -> dg.JobDefinition:
    """demo_data + clean_samples (partitioned by modality)."""
    return dask_definitions().resolve_job_def(INDEX_JOB)


def perturb_job() -> dg.JobDefinition:
    """perturbed_samples (partitioned by modality x severity), with its asset checks."""
    return dask_definitions().resolve_job_def(PERTURB_JOB)


@pytest.fixture(scope="module")
def cluster_address() -> Iterator[str]:
    """A 2-worker, 1-thread-per-worker LocalCluster on loopback, without its dashboard (the
    worker processes inherit the environment set here)."""
    from dask.distributed import LocalCluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, memory_limit="3GiB") as cluster:
            yield str(cluster.scheduler_address)


def _run_config(suite: Path, mlruns: Path, address: str) -> dict[str, object]:
    return {
        "resources": {"suite": {"config": {"suite_path": str(suite)}},
                      "tracking": {"config": {"mlruns_dir": str(mlruns)}}},
        "execution": {"config": {"cluster": {"existing": {"address": address}}}},
    }


def _on_dask(recon: dg.ReconstructableJob, job: dg.JobDefinition, partition: str | dg.MultiPartitionKey,
             instance: dg.DagsterInstance, run_config: dict[str, object]) -> list[dg.DagsterEvent]:
    """Execute one partition of ``recon`` through the Dask executor; returns the run's events."""
    tags = job.get_tags_for_partition_key(str(partition), None)
    with dg.execute_job(recon, instance, run_config=run_config, tags=tags) as res:
        assert res.success, [e.message for e in res.all_events if e.is_failure]
        assert res.dagster_run.tags["dagster/partition"] == str(partition)
        events = list(res.all_events)
    steps = [e for e in events if e.is_step_success]
    assert steps and all(e.pid != os.getpid() for e in steps)  # ran in a worker process, not here
    return events


def _in_process(asset: str, partition: str | dg.MultiPartitionKey | None, suite: Path, mlruns: Path) -> None:
    graph = definitions_for_file(suite, mlruns_dir=str(mlruns))
    res = dg.materialize(list(graph.assets or []), selection=[asset], partition_key=partition,
                         resources=graph.resources)
    assert res.success


def _tracked(mlruns: Path) -> set[tuple[str, str, str, str]]:
    """(experiment, dagster.partition, status, dagster.run_id) of every MLflow run in the store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{mlruns / 'mlflow.db'}")
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    return {(names[r.info.experiment_id], r.data.tags["dagster.partition"], r.info.status, r.data.tags["dagster.run_id"])
            for r in client.search_runs(list(names))}


def _sorted(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    df = df.copy()
    if "level" in df:  # hive partition values come back as strings or ints depending on the reader
        df["level"] = df["level"].astype(int)
    return df.sort_values(key).reset_index(drop=True)[sorted(df.columns)]


@pytest.mark.slow  # heavy (a server / the whole loop): .ci/run runs it after make test
def test_dask_executor_writes_the_same_rows_as_in_process(tmp_path: Path, demo_root: Path,
                                                          cluster_address: str) -> None:
    perturbations = {"include": TYPES, "split": "all", "calibration_subset": 2}
    suites = {side: write_suite(tmp_path / side, demo_root, modalities=MODALITIES, perturbations=perturbations)
              for side in ("dask", "local")}
    mlruns = {side: tmp_path / side / "mlruns" for side in suites}

    # in-process reference
    _in_process("demo_data", None, suites["local"], mlruns["local"])
    for m in MODALITIES:
        _in_process("clean_samples", m, suites["local"], mlruns["local"])
    for m, lv in PARTITIONS:
        _in_process("perturbed_samples", dg.MultiPartitionKey({"modality": m, "severity": lv}),
                    suites["local"], mlruns["local"])

    # the same partitions, every step on a Dask worker
    config = _run_config(suites["dask"], mlruns["dask"], cluster_address)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        assert instance.is_persistent
        for m in MODALITIES:
            events = _on_dask(dg.reconstructable(index_job), index_job(), m, instance, config)
            done = {e.step_key for e in events if e.is_step_success}
            assert done == {"demo_data", "clean_samples"}
        for m, lv in PARTITIONS:
            pkey = dg.MultiPartitionKey({"modality": m, "severity": lv})
            events = _on_dask(dg.reconstructable(perturb_job), perturb_job(), pkey, instance, config)
            evals = [e.asset_check_evaluation_data for e in events
                     if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
            assert {ev.check_name for ev in evals} == {"band_hit_rate", "finite_outputs", "completeness"}
            assert all(ev.passed for ev in evals if ev.check_name != "band_hit_rate")
        # the runs were recorded as materializations of each partition in the persistent instance
        mats = instance.fetch_materializations(dg.AssetKey("perturbed_samples"), limit=10).records
        assert {str(r.partition_key) for r in mats} == {f"{m}|{lv}" for m, lv in PARTITIONS}
        dagster_runs = {r.run_id for r in instance.get_runs()}

    # the workers tracked to MLflow under the orchestrating Dagster run ids, one run per step
    remote_runs, local_runs = _tracked(mlruns["dask"]), _tracked(mlruns["local"])
    assert {r[3] for r in remote_runs} <= dagster_runs
    assert {r[:3] for r in remote_runs} == {r[:3] for r in local_runs}
    assert len(remote_runs) == len(local_runs) == len(MODALITIES) + len(PARTITIONS)

    local, remote = (load_suite(suites[s]) for s in ("local", "dask"))
    for table, key in (("clean_samples", ["dataset", "sample_id"]), ("perturbation_manifest", MANIFEST_KEY)):
        a, b = read_table(local.results_dir, table), read_table(remote.results_dir, table)
        assert len(a) > 0
        pd.testing.assert_frame_equal(_sorted(a, key), _sorted(b, key))
    manifest = read_table(remote.results_dir, "perturbation_manifest")
    assert not manifest.duplicated(MANIFEST_KEY).any()
    assert (manifest["status"] == "ok").all()
    assert {(m, int(lv)) for m, lv in PARTITIONS} == set(zip(manifest["modality"], manifest["level"].astype(int),
                                                            strict=True))
    for m, lv in PARTITIONS:  # every (sample, applicable type) once per partition
        part = read_manifest(remote, m, int(lv))
        assert len(part) == part["sample_id"].nunique() * part["perturbation"].nunique()
