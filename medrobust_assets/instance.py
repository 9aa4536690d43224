"""The Dagster instance the runner records its runs in, and the runner's own run tags.

:func:`get_instance` opens the persistent instance the UI shows (one per suite:
:func:`medrobust_assets.location_files.suite_instance_home`); :func:`runner_tags` are the tags every run
the runner starts carries (who started it, its process and host, its suite), which
:func:`mark_orphaned_runs` reads back to mark failed the runs of a runner process that is gone.
The planner and executor (:mod:`medrobust_assets.runner`) use both; nothing here runs an asset."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from medrobust_assets.location_files import suite_instance_home
from medrobust_assets.tags import SUITE_NAME_TAG
from medrobust_lib import runtime
from medrobust_lib.config import Suite
from medrobust_lib.processes import pid_alive


def get_instance(suite: Suite | None = None) -> dg.DagsterInstance:
    """The persistent instance the UI shows. ``suite``: that suite's own instance
    (:func:`medrobust_assets.location_files.suite_instance_home`: ``$DAGSTER_HOME`` when it names a
    folder other than the project root, the current folder, else ``var/<suite name>/dagster``).
    Without: ``$DAGSTER_HOME`` when set, else the current folder
    (the project root: the CLI changes into it) when it has a dagster.yaml, else ``var/dagster``
    under it (Dagster's default SQLite storage). Never an ephemeral instance."""
    if suite is not None:
        return dg.DagsterInstance.from_config(str(suite_instance_home(suite, Path.cwd())))
    if not os.environ.get("DAGSTER_HOME"):
        here = Path.cwd().resolve()
        home = here if (here / "dagster.yaml").is_file() else here / "var" / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "dagster.yaml").is_file():  # Dagster's defaults (SQLite under home), quietly
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


SOURCE_TAG = "medrobust/source"
PID_TAG = "medrobust/pid"
HOST_TAG = "medrobust/host"
SUITE_PATH_TAG = "medrobust/suite"
"""Run tag: the suite file the run belongs to (:data:`medrobust_assets.tags.SUITE_NAME_TAG` holds its name)."""
RUNNER_SOURCES = ("medrobust demo", "medrobust run")
"""``medrobust/source`` of the runs the runner starts (``medrobust demo`` / ``medrobust run``)."""
_UNFINISHED = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
               dg.DagsterRunStatus.CANCELING)


def runner_tags(source: str, suite_path: str) -> dict[str, str]:
    """The tags of a run this process starts: ``source`` (one of :data:`RUNNER_SOURCES`), this
    process's pid and host (what :func:`mark_orphaned_runs` checks), the suite's file and name."""
    return {SOURCE_TAG: source, PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(),
            SUITE_PATH_TAG: suite_path, SUITE_NAME_TAG: runtime.load_suite(suite_path).name}


def mark_orphaned_runs(inst: dg.DagsterInstance) -> list[str]:
    """Mark failed the runs the runner started whose process is gone (a SIGKILL or a crash leaves
    them NOT_STARTED / STARTED forever; the UI would show them as pending). Only runs tagged
    ``medrobust/source`` = ``medrobust demo`` or ``medrobust run`` are touched: those with ``medrobust/pid`` on this host
    whose process no longer exists, and older ones without the tag (they predate it, so their
    process is certainly gone when this one starts). Runs of the daemon, the UI or another
    host are left to Dagster's run monitoring (dagster.yaml). Returns the run ids marked."""
    host = socket.gethostname()
    marked: list[str] = []
    runs = [r for src in RUNNER_SOURCES
            for r in inst.get_runs(filters=dg.RunsFilter(statuses=list(_UNFINISHED), tags={SOURCE_TAG: src}))]
    for run in runs:
        pid_s = run.tags.get(PID_TAG)
        if pid_s is not None:
            if run.tags.get(HOST_TAG) != host or not pid_s.isdigit():
                continue
            pid = int(pid_s)
            if pid == os.getpid() or pid_alive(pid):
                continue
            why = f"its runner process {pid} on {host} is gone (killed or crashed)"
        else:
            why = "it was started by an earlier runner that no longer runs"
        inst.report_run_failed(run, message=f"marked failed by medrobust: {why}; the run never finished. "
                                            "Re-materialize its assets (results are idempotent).")
        marked.append(run.run_id)
    return marked


def clear_orphaned_runs(inst: dg.DagsterInstance, log: Callable[[str], None]) -> None:
    """:func:`mark_orphaned_runs` before a runner starts its own runs, with one line to ``log``
    naming the runs marked (nothing when there are none)."""
    orphaned = mark_orphaned_runs(inst)
    if orphaned:
        log(f"  marked {len(orphaned)} run(s) of a killed earlier runner as failed: {', '.join(orphaned)}")
