"""Per-process runtime state, owned in one place: the bounded caches, the worker process pools,
the parsed suites and the torch thread setting.

Library modules do not keep such state in globals of their own: a cache is a named
:class:`~medrobust_lib.lru.LRU` (``LRU(..., name="<package>.<what>")`` registers it; :func:`caches`
lists them), a process pool is asked for with
:func:`process_pool`, a suite file is read through :func:`load_suite` (parsed once per process
while the file is unchanged). :func:`configure` applies the process settings (torch threads);
:func:`reset` empties every cache, shuts the pools down and forgets the parsed suites (tests, or
a long-lived process that must drop what it holds). None of this changes a result: caches are
keyed by what they depend on, pools only move work between processes.

Plain Python: importing this module imports neither torch nor dagster.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from medrobust_lib.config import Suite
from medrobust_lib.config import load_suite as parse
from medrobust_lib.lru import LRU, FileStamp, file_stamp
from medrobust_lib.lru import REGISTRY as lru_registry

_LOCK = threading.Lock()
_POOLS: dict[str, tuple[int, ProcessPoolExecutor]] = {}
_SUITES: dict[str, tuple[FileStamp, Suite]] = {}
_SOURCES: dict[int, str] = {}  # id(parsed suite) -> its resolved path (the suite is kept in _SUITES)
_SUITE_PARSES = 0


def caches() -> dict[str, LRU[Any, Any]]:
    """Every library cache by name (``LRU(..., name=...)`` registers it in
    :data:`medrobust_lib.lru.REGISTRY`); a copy of the registry, the caches themselves are live."""
    with _LOCK:
        return dict(lru_registry)


def process_pool(name: str, workers: int) -> ProcessPoolExecutor:
    """The process pool ``name`` with ``workers`` processes, kept for the life of the process
    (spawning one per partition would cost seconds each time); asked again with another size, the
    old pool is shut down and a new one started. Spawn, not fork: forking after OpenCV, torch or
    Dagster threads have started can deadlock. Each worker's OpenCV, torch and OpenMP/BLAS thread
    pools are limited to :func:`worker_threads` (the cores divided among the workers), so
    ``workers`` processes do not each start one thread per core."""
    if workers < 1:
        raise ValueError(f"a process pool needs at least one worker, got {workers}")
    with _LOCK:
        held = _POOLS.get(name)
        if held is not None and held[0] == workers:
            return held[1]
        if held is not None:
            held[1].shutdown(cancel_futures=True)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                   initializer=limit_worker_threads, initargs=(worker_threads(workers),))
        _POOLS[name] = (workers, pool)
        atexit.register(pool.shutdown, cancel_futures=True)
        return pool


def terminate_pools() -> int:
    """Stop every pool now, killing its workers mid-task (after Ctrl-C: an orderly shutdown, and
    the interpreter's exit, wait for each running task to finish, seconds to minutes). Queued
    tasks are cancelled; nothing a worker was computing is kept (results are written by the
    parent, idempotently, so a rerun recomputes it). Returns how many worker processes were
    stopped; pools start again on demand."""
    with _LOCK:
        pools = [p for _, p in _POOLS.values()]
        _POOLS.clear()
    stopped = 0
    for pool in pools:
        procs = list((getattr(pool, "_processes", None) or {}).values())  # CPython's worker table
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                stopped += 1
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.join(timeout=5)
    return stopped


def worker_threads(workers: int, cores: int | None = None) -> int:
    """Threads each of ``workers`` pool processes may use: ``cores // workers``, at least 1
    (``cores``: this machine's, :func:`os.cpu_count`)."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, workers))


def limit_worker_threads(threads: int) -> None:
    """A pool worker's initializer: OpenMP / BLAS thread counts for libraries loaded later (the
    environment variables, unless already set), OpenCV's and (if loaded) torch's thread pools set
    to ``threads``. Results do not change: only how many threads one worker runs."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    import cv2

    cv2.setNumThreads(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def load_suite(path: str | Path) -> Suite:
    """The suite of the YAML at ``path``, parsed once per process while the file is unchanged (its
    :func:`~medrobust_lib.lru.file_stamp`; an edited file is parsed again). Every caller gets the
    same object: treat it as read-only (``model_copy(update=...)`` for a changed copy). Errors as
    :func:`medrobust_lib.config.load_suite` (FileNotFoundError, ValueError)."""
    global _SUITE_PARSES
    p = Path(path)
    if not p.is_file():
        return parse(p)  # raises FileNotFoundError with the config's message
    key = str(p.resolve())
    stamp = file_stamp(p)
    with _LOCK:
        held = _SUITES.get(key)
        if held is not None and held[0] == stamp:
            return held[1]
    suite = parse(p)
    with _LOCK:
        old = _SUITES.get(key)
        if old is not None:
            _SOURCES.pop(id(old[1]), None)
        _SUITES[key] = (stamp, suite)
        _SOURCES[id(suite)] = key
        _SUITE_PARSES += 1
    return suite


def suite_source(suite: object) -> str | None:
    """The resolved path :func:`load_suite` read ``suite`` from (None: not parsed through it)."""
    with _LOCK:
        return _SOURCES.get(id(suite))


def suite_parses() -> int:
    """How many times :func:`load_suite` has parsed a file in this process (a count for tests)."""
    return _SUITE_PARSES


def configure(*, torch_threads: int = 0) -> None:
    """Apply the process settings: ``torch_threads`` > 0 sets torch's intra-op threads (only
    when torch is already imported or the value asks for it; 0 leaves torch's default)."""
    if torch_threads < 0:
        raise ValueError(f"torch_threads must be >= 0, got {torch_threads}")
    if torch_threads:
        import torch

        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def reset() -> None:
    """Empty every registered cache, shut every pool down and forget the parsed suites. The
    caches stay registered (their modules keep using them); pools are started again on demand."""
    global _SUITE_PARSES
    with _LOCK:
        lrus = list(lru_registry.values())
        pools = [p for _, p in _POOLS.values()]
        _POOLS.clear()
        _SUITES.clear()
        _SOURCES.clear()
        _SUITE_PARSES = 0
    for lru in lrus:
        lru.clear()
    for pool in pools:
        pool.shutdown(cancel_futures=True)

