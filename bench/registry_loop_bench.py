"""Sensor-to-results latency with the real Dagster daemon: register a new segmentation version in
MLflow and time until its evaluation rows are queryable in the DuckDB mart, with no other action.

Needs the state of ``make demo`` (base model, perturbed datasets, registered strategies). The
daemon (``dagster-daemon run -w workspace.yaml``, the project's ``dagster.yaml`` instance) runs
``registry_sensor`` (30 s interval) -> ``registry_evaluation_job`` (a subprocess run) ->
``mart_after_evaluation`` (30 s interval) -> ``marts_job``. The script first lets the daemon
clear the backlog it finds (versions its cursor has not seen), then registers the LoRA recipe
retrained with a new seed and polls the mart. Prints the timeline and a table of the phases.

Run after ``make demo``: ``python -m bench.registry_loop_bench [--seed-offset 2] [--timeout 900]``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mart_rows(mart: Path, model_id: str) -> int:
    from medrobust_lib.store.marts import connect_readonly

    if not mart.is_file():
        return 0
    try:
        con = connect_readonly(mart)
    except Exception:  # the file is being replaced right now
        return 0
    try:
        return int(con.execute("select count(*) from segmentation_results where model = ?", [model_id])
                   .fetchall()[0][0])
    finally:
        con.close()


def _runs(instance: object, tag: str | None = None) -> list[object]:
    import dagster as dg

    filters = dg.RunsFilter(tags={"medrobust/registered_model": tag} if tag else {})
    return list(instance.get_runs(filters=filters))  # type: ignore[attr-defined]


def _busy(instance: object, since: datetime) -> int:
    """Active runs created after ``since`` (the daemon's start): only the runs this bench causes.
    A zombie run left by a killed earlier process (NOT_STARTED forever) is never waited for."""
    import dagster as dg

    active = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED]
    flt = dg.RunsFilter(statuses=active, created_after=since)
    return len(list(instance.get_runs(filters=flt)))  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="configs/demo.yaml")
    ap.add_argument("--seed-offset", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    os.chdir(ROOT)
    os.environ["DAGSTER_HOME"] = str(ROOT)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import dagster as dg

    from medrobust_lib.config import load_suite
    from medrobust_lib.paths import experiment_name
    from medrobust_lib.store import model_registry
    from medrobust_lib.tracks.finetune.strategy_runs import (
        finetune_strategy,
        register_version,
        require_finetune,
        strategy_dir,
    )

    suite = load_suite(args.suite)
    ft = require_finetune(suite)
    strategy = "lora" if "lora" in ft.strategies else ft.strategies[0]
    name = model_registry.seg_model_name(ft.base, strategy)
    instance = dg.DagsterInstance.get()
    log = ROOT / "var" / "dagster" / "registry_loop_bench.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # the candidate is trained before the clock starts: the figure is the loop, not the training
    root = strategy_dir(suite, ft.base, strategy)
    out = root.with_name(f"{root.name}-seed{args.seed_offset}")
    cand = finetune_strategy(suite, strategy, seed=suite.seed + args.seed_offset, out_dir=out)
    started = datetime.now(UTC)
    daemon = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"],
                              cwd=ROOT, env=dict(os.environ), stdout=log.open("wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        t0 = time.perf_counter()
        quiet_since = time.perf_counter()
        # the backlog (versions the daemon's fresh cursor has not seen, and the mart runs after them)
        # is done when no run has been active for 70 s (two sensor intervals)
        while time.perf_counter() - quiet_since < 70:
            if time.perf_counter() - t0 > args.timeout:
                raise SystemExit("the daemon's backlog did not clear in time")
            if _busy(instance, started):
                quiet_since = time.perf_counter()
            time.sleep(2)
        print(f"backlog cleared after {time.perf_counter() - t0:.0f} s; registering the candidate", flush=True)
        before = {r.run_id for r in _runs(instance, name)}  # type: ignore[attr-defined]
        t_reg = time.perf_counter()
        version, created = register_version(out, name, {"strategy": strategy, "role": "bench: retrained"},
                                            mlruns_dir="mlruns", experiment=experiment_name(suite, "registry"))
        if not created:
            raise SystemExit(f"{name} already has these weights (version {version}); use another --seed-offset")
        model_id = f"{name}-v{version}"
        marks: dict[str, float] = {}
        expected: int | None = None
        while "mart" not in marks:
            now = time.perf_counter() - t_reg
            if now > args.timeout:
                raise SystemExit(f"no mart rows for {model_id} after {now:.0f} s; see {log}")
            for r in _runs(instance, name):
                if r.run_id in before or r.tags.get("medrobust/version") != str(version):  # type: ignore[attr-defined]
                    continue
                marks.setdefault("run created", now)
                if r.status == dg.DagsterRunStatus.SUCCESS:  # type: ignore[attr-defined]
                    marks.setdefault("evaluation done", now)
            if "evaluation done" in marks:
                if expected is None:
                    from medrobust_lib.store.results import read_table

                    rows = read_table(suite.results_dir, "segmentation_results")
                    expected = int((rows["model"] == model_id).sum())
                if expected and _mart_rows(Path(suite.mart_path), model_id) == expected:  # all of them
                    marks["mart"] = now
            time.sleep(1)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
    print(f"{name} v{version} ({model_id}, {expected} rows), candidate val Dice {cand.val_dice:.3f}")
    print("| phase | seconds after registration |")
    print("|---|---:|")
    for k in ("run created", "evaluation done", "mart"):
        print(f"| {k} | {marks[k]:.1f} |")
    print(f"\nsensor-to-results latency: {marks['mart']:.1f} s (the sensors poll every 30 s; the evaluation "
          f"itself is the rest)")


if __name__ == "__main__":
    main()
