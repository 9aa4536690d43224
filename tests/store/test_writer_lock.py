"""One writer per suite: ``run``, ``demo`` and mart builds hold an flock on the results folder; a
second writer is refused (exit 2, naming the holder's pid and command) or waits with one line; a
lock left by a killed process is taken over; two concurrent writers end with the rows of one run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from medrobust_lib.store import marts
from medrobust_lib.store.writer_lock import LOCK_NAME, SuiteBusyError, suite_writer_lock

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

HOLDER = textwrap.dedent("""
    import sys, time
    from medrobust_lib.store.writer_lock import suite_writer_lock
    with suite_writer_lock(sys.argv[1], command="holder --suite s.yaml"):
        print("ready", flush=True)
        time.sleep(float(sys.argv[2]))
""")

WRITER = textwrap.dedent("""
    import sys, time
    from medrobust_lib.store import results
    from medrobust_lib.store.marts import build_mart
    from medrobust_lib.store.writer_lock import SuiteBusyError, suite_writer_lock
    res, mart, go = sys.argv[1], sys.argv[2], sys.argv[3]
    while not __import__("os").path.exists(go):  # both writers start together
        time.sleep(0.01)
    ROW = {"model": "sam", "strategy": "pretrained", "dataset": "ds", "condition": "perturbation",
           "perturbation": "noise", "status": "ok", "dice": 0.5}
    try:
        with suite_writer_lock(res, command="writer " + sys.argv[4]):
            for level in (1, 2, 3):
                part = {"modality": "ct", "level": level}
                rows = [{**ROW, "sample_id": f"s{i}", "iou": (i + level) / 10} for i in range(5)]
                results.write_chunk(results.chunk_path(res, "segmentation_results", part, "ds"), rows, f"fp{level}")
                time.sleep(0.2)
                results.finalize_partition(res, "segmentation_results", part, ["ds"])
            build_mart(res, mart)
    except SuiteBusyError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
""")


def _holder(folder: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(seconds)], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    proc = _holder(tmp_path, 30)
    try:
        with pytest.raises(SuiteBusyError) as e, suite_writer_lock(tmp_path):
            pass
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and "holder --suite s.yaml" in msg and "\n" not in msg
        with pytest.raises(SuiteBusyError):  # a mart build is a writer too
            marts.build_mart(tmp_path, tmp_path / "m.duckdb")
        assert not (tmp_path / "m.duckdb").exists()
    finally:
        proc.kill()
        proc.wait()


SLOW_RECORD = textwrap.dedent("""
    import fcntl, json, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)  # the lock is visible, its record not yet written
    time.sleep(float(sys.argv[2]))
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": "slow holder"}).encode(), 0)
    time.sleep(30)
""")


def test_a_writer_refused_in_the_holders_first_moment_still_names_it(tmp_path: Path) -> None:
    """The holder writes its record just after taking the lock: a writer refused in between waits
    for the record instead of reporting "an unknown process" (the race of two concurrent runs)."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RECORD, str(tmp_path / LOCK_NAME), "0.3"], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(SuiteBusyError) as e, suite_writer_lock(tmp_path):
            pass
        assert f"pid {proc.pid}" in str(e.value) and "slow holder" in str(e.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_that_never_writes_its_record_is_an_unknown_process(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RECORD, str(tmp_path / LOCK_NAME), "30"], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(SuiteBusyError, match="an unknown process"), suite_writer_lock(tmp_path):
            pass
        assert time.monotonic() - t0 < 5  # refused after the settle time, not after the holder
    finally:
        proc.kill()
        proc.wait()


def test_a_waiting_writer_says_so_once_and_goes_on(tmp_path: Path) -> None:
    import threading

    proc = _holder(tmp_path, 60)
    lines: list[str] = []
    granted: list[bool] = []

    def wait_for_the_lock() -> None:
        with suite_writer_lock(tmp_path, wait_s=120, log=lines.append, poll_s=0.05):
            granted.append(True)  # granted once the holder let go

    t = threading.Thread(target=wait_for_the_lock)
    t.start()
    try:
        for _ in range(600):  # the waiter says so before the holder goes (no race with a timed holder)
            if lines:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)  # the holder leaves its lock as a run does (KeyboardInterrupt)
        proc.wait()
        t.join(timeout=120)
    assert granted == [True]
    assert len(lines) == 1 and lines[0].startswith("waiting for the results folder") and f"pid {proc.pid}" in lines[0]


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    proc = _holder(tmp_path, 60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert str(proc.pid) in (tmp_path / LOCK_NAME).read_text()  # its record stays behind
    lines: list[str] = []
    with suite_writer_lock(tmp_path, log=lines.append):
        pass
    assert any("taking over" in ln and f"pid {proc.pid}" in ln for ln in lines)


def test_the_lock_is_reentrant_within_a_process(tmp_path: Path) -> None:
    with suite_writer_lock(tmp_path), suite_writer_lock(tmp_path):
        marts.build_mart(tmp_path, tmp_path / "m.duckdb")  # the build inside a run does not wait on the run
    assert (tmp_path / "m.duckdb").is_file()


def _mart_rows(mart: Path) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        return con.execute("select level, sample_id, iou from segmentation_results order by all").fetchall()
    finally:
        con.close()


def test_two_concurrent_writers_finish_or_are_refused_and_rows_match_one_run(tmp_path: Path) -> None:
    single = tmp_path / "single"
    go = tmp_path / "go"
    go.touch()
    one = subprocess.run([sys.executable, "-c", WRITER, str(single / "res"), str(single / "m.duckdb"), str(go), "0"],
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    expected = _mart_rows(single / "m.duckdb")
    assert len(expected) == 15
    go.unlink()
    res, mart = tmp_path / "res", tmp_path / "m.duckdb"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(res), str(mart), str(go), str(i)], env=ENV,
                              stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    go.touch()
    outs = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(c for c, _ in outs)
    assert codes in ([0, 0], [0, 2]), outs
    for code, err in outs:
        if code == 2:  # refused with one line naming the other writer
            other = next(p.pid for p, (c, _) in zip(procs, outs, strict=True) if c == 0)
            assert err.count("\n") == 1 and f"pid {other}" in err and "writer " in err
        else:
            assert "Traceback" not in err
    assert _mart_rows(mart) == expected
    assert sorted(p.name for p in res.rglob("*") if p.is_file() and p.suffix != ".lock") == ["ds.parquet"] * 3


def test_medrobust_run_exits_2_naming_the_holder(tmp_path: Path) -> None:
    from tests.suite_helpers import write_suite

    suite = write_suite(tmp_path, tmp_path / "demo")
    proc = _holder(tmp_path / "results", 120)
    try:
        out = subprocess.run([sys.executable, str(ROOT / "medrobust_cli.py"), "run", "--suite", str(suite),
                              "--select", "clean_samples"], env={**ENV, "DAGSTER_HOME": str(tmp_path)},
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"pid {proc.pid}" in lines[0]
    assert "holder --suite s.yaml" in lines[0]
