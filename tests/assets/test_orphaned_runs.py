"""A materialization killed with SIGKILL leaves its run unfinished; the runner marks its own such
runs failed (with the reason) before it starts, and leaves other runs alone."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import dagster as dg
import pytest

from medrobust_assets.instance import HOST_TAG, PID_TAG, RUNNER_SOURCES, SOURCE_TAG, mark_orphaned_runs
from tests.process_helpers import kill_at_marker

RUNNER_SOURCE = RUNNER_SOURCES[0]

_SCRIPT = """
import os, socket, sys, time
from pathlib import Path
import dagster as dg

@dg.asset
def slow() -> None:
    Path(sys.argv[1]).write_text("running")
    time.sleep(120)

tags = {"medrobust/source": sys.argv[2], "medrobust/pid": str(os.getpid()),
        "medrobust/host": socket.gethostname()}
dg.materialize([slow], instance=dg.DagsterInstance.get(), tags=tags)
"""


def _instance_home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        f"storage:\n  sqlite:\n    base_dir: {home / 'storage'}\ntelemetry:\n  enabled: false\n")
    return home


def _kill_mid_run(home: Path, tmp_path: Path, source: str) -> None:
    marker = tmp_path / f"running-{source.replace(' ', '_')}"
    kill_at_marker([sys.executable, "-c", _SCRIPT, str(marker), source], marker,
                   env={**os.environ, "DAGSTER_HOME": str(home)}, timeout_s=180)


@pytest.mark.slow
def test_a_killed_runners_run_is_marked_failed_and_others_are_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _instance_home(tmp_path)
    _kill_mid_run(home, tmp_path, RUNNER_SOURCE)
    _kill_mid_run(home, tmp_path, "someone else")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as inst:
        runs = {r.tags[SOURCE_TAG]: r for r in inst.get_runs()}
        unfinished = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
        assert all(r.status in unfinished for r in runs.values())  # the zombie the issue describes
        ours = runs[RUNNER_SOURCE]
        assert ours.tags[HOST_TAG] == socket.gethostname() and ours.tags[PID_TAG].isdigit()
        assert mark_orphaned_runs(inst) == [ours.run_id]
        after = {r.tags[SOURCE_TAG]: r for r in inst.get_runs()}
        assert after[RUNNER_SOURCE].status == dg.DagsterRunStatus.FAILURE
        assert after["someone else"].status in unfinished  # not ours: left to run monitoring
        failure = [e for e in inst.all_logs(ours.run_id) if e.dagster_event and e.dagster_event.is_run_failure]
        assert failure and "is gone" in (failure[-1].message or "")
        assert mark_orphaned_runs(inst) == []  # idempotent


def test_the_project_instance_has_run_monitoring(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("DAGSTER_HOME", str(root))
    with dg.DagsterInstance.get() as inst:
        assert inst.run_monitoring_enabled
        assert inst.run_monitoring_settings["start_timeout_seconds"] > 0
