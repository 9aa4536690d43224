"""medrobust_lib.runtime: the one owner of the per-process caches, pools, parsed suites and torch
threads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from medrobust_lib import runtime
from medrobust_lib.lru import LRU


def test_the_library_caches_are_registered_and_reset_empties_them() -> None:
    from medrobust_lib.store import results
    from medrobust_lib.tracks import feed

    runtime.reset()  # earlier tests in this process may have filled the caches
    names = set(runtime.caches())
    assert {"store.result_chunks", "feed.clean_samples", "feed.worker_samples", "perturb.regen"} <= names
    assert runtime.caches()["store.result_chunks"] is results._CHUNKS and runtime.caches()["feed.clean_samples"] is feed._CLEAN
    feed._CLEAN.put(("k",), "v", 1)  # type: ignore[arg-type]
    assert len(feed._CLEAN) == 1
    runtime.reset()
    assert len(feed._CLEAN) == 0 and runtime.caches()["feed.clean_samples"] is feed._CLEAN  # still registered


def test_a_cache_name_is_registered_once() -> None:
    lru: LRU[str, int] = LRU(max_items=1, name="test.once")
    assert runtime.caches()["test.once"] is lru
    with pytest.raises(ValueError, match="registered twice"):
        LRU(max_items=1, name="test.once")
    assert len(LRU(max_items=1)) == 0 and runtime.caches()["test.once"] is lru  # unnamed: not registered


def test_pools_are_kept_per_name_and_size() -> None:
    a = runtime.process_pool("test", 1)
    assert runtime.process_pool("test", 1) is a
    b = runtime.process_pool("test", 2)
    assert b is not a and runtime.process_pool("test", 2) is b
    with pytest.raises(RuntimeError):  # the resized pool's predecessor was shut down
        a.submit(int, 1)
    runtime.reset()
    with pytest.raises(RuntimeError):
        b.submit(int, 1)
    with pytest.raises(ValueError, match="at least one worker"):
        runtime.process_pool("test", 0)


def _worker_thread_settings() -> tuple[int, str | None]:
    import os

    import cv2

    return cv2.getNumThreads(), os.environ.get("OMP_NUM_THREADS")


def test_pool_workers_share_the_cores_instead_of_each_taking_all(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runtime.worker_threads(15, cores=16) == 1 and runtime.worker_threads(2, cores=16) == 8
    assert runtime.worker_threads(4, cores=2) == 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)  # seen by the parent, which passes the count
    runtime.reset()
    try:
        assert runtime.process_pool("threads", 2).submit(_worker_thread_settings).result() == (2, "2")
    finally:
        runtime.reset()


def _sleep(seconds: float, started: str | None = None) -> float:
    import time

    if started:
        Path(started).touch()
    time.sleep(seconds)
    return seconds


def test_terminate_pools_stops_running_tasks_at_once(tmp_path: Path) -> None:
    """After Ctrl-C the CLI stops the pools: an orderly shutdown would wait for the running task
    (here 60 s); terminating returns at once, every future ends, and a later pool works."""
    import time

    runtime.reset()
    pool = runtime.process_pool("stoppable", 2)
    marker = tmp_path / "started"
    futures = [pool.submit(_sleep, 60.0, str(marker)) for _ in range(3)]
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:  # a worker is inside its task
        time.sleep(0.05)
    t0 = time.monotonic()
    assert runtime.terminate_pools() >= 1
    while not all(f.done() for f in futures) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert all(f.done() for f in futures)  # cancelled or broken, none left waiting
    assert time.monotonic() - t0 < 10
    assert runtime.process_pool("stoppable", 1).submit(_sleep, 0.0).result(timeout=60) == 0.0
    runtime.reset()


def test_suites_are_parsed_once_while_the_file_is_unchanged(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "once", "results_dir": str(tmp_path / "r"), "mart_path": str(tmp_path / "m")}))
    runtime.reset()
    s = runtime.load_suite(p)
    assert runtime.load_suite(tmp_path / "." / "s.yaml") is s and runtime.suite_parses() == 1
    assert runtime.suite_source(s) == str(p.resolve()) and runtime.suite_source(object()) is None
    p.write_text(p.read_text().replace("once", "twice"))
    assert runtime.load_suite(p).name == "twice" and runtime.suite_parses() == 2
    with pytest.raises(FileNotFoundError):
        runtime.load_suite(tmp_path / "missing.yaml")


def test_configure_sets_torch_threads() -> None:
    import torch

    before = torch.get_num_threads()
    try:
        runtime.configure(torch_threads=1)
        assert torch.get_num_threads() == 1
        runtime.configure()  # 0: leaves the setting alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError):
        runtime.configure(torch_threads=-1)
