"""A materialization of ``perturbed_samples`` SIGKILLed mid-partition, then re-run, leaves exactly the
rows of an uninterrupted run: no duplicates, no losses, the finished chunks reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from medrobust_assets.definitions import definitions_for_file
from medrobust_lib.config import Suite, load_suite
from medrobust_lib.demo import build_demo
from medrobust_lib.store.results import partition_dir
from medrobust_lib.tracks.perturbed import MANIFEST_TABLE, modality_types, read_manifest
from tests.suite_helpers import write_suite

ROOT = Path(__file__).resolve().parents[2]
MODALITY = "ct"  # one demo dataset, 18 applicable types: 18 chunks per partition
LEVEL = 3
PARTITION = dg.MultiPartitionKey({"modality": MODALITY, "severity": str(LEVEL)})
KEY = ["dataset", "sample_id", "perturbation", "level"]
START_TIMEOUT_S = 180.0

MATERIALIZE_SCRIPT = """
import sys
import dagster as dg
from medrobust_assets.definitions import definitions_for_file

suite, mlruns, modality, level = sys.argv[1:5]
key = dg.MultiPartitionKey({"modality": modality, "severity": level})
graph = definitions_for_file(suite, mlruns_dir=mlruns)
res = dg.materialize(list(graph.assets or []), selection=["perturbed_samples"], partition_key=key,
                     resources=graph.resources)
sys.exit(0 if res.success else 1)
"""


@dataclass(frozen=True)
class Interrupted:
    """What a killed materialization left behind."""

    chunks_at_kill: int
    expected_chunks: int
    returncode: int


def _materialize(asset: str, partition: str | dg.MultiPartitionKey | None, root: Path) -> dg.ExecuteInProcessResult:
    """Materialize one asset (partition) in-process with the suite and MLflow store under ``root``."""
    graph = definitions_for_file(root / "suite.yaml", mlruns_dir=str(root / "mlruns"))
    res = dg.materialize(list(graph.assets or []), selection=[asset], partition_key=partition,
                         resources=graph.resources)
    assert res.success
    return res


def _prepare(root: Path, demo_root: Path, n_per_modality: int) -> Suite:
    """A suite under ``root`` (every type on the modality's demo data) with its clean index written
    (the upstream of the partition)."""
    path = write_suite(root, demo_root, modalities=[MODALITY],
                       demo={"enabled": True, "root": str(demo_root), "n_per_modality": n_per_modality, "seed": 0},
                       perturbations={"include": ["*"], "split": "all", "calibration_subset": 2})
    _materialize("demo_data", None, root)
    _materialize("clean_samples", MODALITY, root)
    return load_suite(path)


def _chunks(folder: Path) -> list[Path]:
    """Complete chunks only: a chunk is written to a hidden ``.tmp`` name and renamed into place."""
    return sorted(folder.glob("*.parquet")) if folder.is_dir() else []


def _kill_after_first_chunk(suite: Suite, root: Path, tmp: Path) -> Interrupted:
    """Start the materialization (suite and MLflow store under ``root``) in its own process group
    and SIGKILL the group as soon as the first chunk of the partition is on disk."""
    folder = partition_dir(suite.results_dir, MANIFEST_TABLE, {"modality": MODALITY, "level": LEVEL})
    # every type selected for the modality has its chunk, one that applies to no image too (issue 43)
    expected = len(modality_types(suite, MODALITY))
    script = tmp / "materialize.py"
    script.write_text(MATERIALIZE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = (tmp / "materialize.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(script), str(root / "suite.yaml"), str(root / "mlruns"),
                             MODALITY, str(LEVEL)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _chunks(folder) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
    return Interrupted(len(_chunks(folder)), expected, proc.returncode)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["level"] = df["level"].astype(int)
    return df.sort_values(KEY).reset_index(drop=True)[sorted(df.columns)]


def test_sigkill_mid_partition_then_rerun_gives_the_uninterrupted_rows(tmp_path: Path, demo_root: Path) -> None:
    # If the kill lands after the last chunk, the run was not interrupted: retry on a larger demo
    # (slower chunks) instead of passing without having tested anything.
    attempts: list[Interrupted] = []
    for n in (4, 12):
        root = tmp_path / f"n{n}"
        demo = demo_root if n == 4 else root / "demo"
        if n != 4:
            build_demo(demo, seed=0, n_per_modality=n)
        killed = _prepare(root / "killed", demo, n)
        cut = _kill_after_first_chunk(killed, root / "killed", root)
        attempts.append(cut)
        if cut.returncode == -signal.SIGKILL and 0 < cut.chunks_at_kill < cut.expected_chunks:
            break
    else:
        log = (root / "materialize.log").read_text(errors="replace")
        pytest.fail(f"could not interrupt a materialization mid-partition: {attempts}\n{log[-3000:]}")
    log = (root / "materialize.log").read_text(errors="replace")
    assert "RUN_SUCCESS" not in log, log[-2000:]

    # the re-run reuses every chunk that was on disk and computes only the rest
    res = _materialize("perturbed_samples", PARTITION, root / "killed")
    meta = res.asset_materializations_for_node("perturbed_samples")[0].metadata
    assert meta["chunks_reused"].value == cut.chunks_at_kill
    folder = partition_dir(killed.results_dir, MANIFEST_TABLE, {"modality": MODALITY, "level": LEVEL})
    assert len(_chunks(folder)) == cut.expected_chunks
    assert not [f.name for f in folder.iterdir() if f.name.endswith(".tmp")]  # no temp file left behind

    reference = _prepare(root / "reference", demo, n)
    _materialize("perturbed_samples", PARTITION, root / "reference")

    got, want = read_manifest(killed, MODALITY, LEVEL), read_manifest(reference, MODALITY, LEVEL)
    assert not got.duplicated(KEY).any()
    assert len(got) == n * cut.expected_chunks and got["status"].isin(["ok", "not_applicable"]).all()
    pd.testing.assert_frame_equal(_sorted(got), _sorted(want))
    assert meta["n_rows"].value == len(want)
