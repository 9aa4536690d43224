"""Operating-system processes: the worker pools kept for the life of the process, one per owner
(the perturbation engine, the regeneration feed), so that a partition does not pay for spawning
workers (seconds each time); and whether a process id still names a running process (orphaned
temporary marts, orphaned runs).

Pools spawn, never fork: forking after OpenCV, torch or Dagster threads have started can deadlock.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

_POOLS: dict[str, tuple[ProcessPoolExecutor, int]] = {}


def process_pool(owner: str, workers: int) -> ProcessPoolExecutor:
    """The pool of ``owner`` with ``workers`` processes (>= 1). The same pool is returned while the
    size stays the same; a new size shuts the owner's old pool down (cancelling queued work) and
    starts another. Every pool is shut down at interpreter exit."""
    if workers < 1:
        raise ValueError(f"a process pool needs at least 1 worker, got {workers}")
    held = _POOLS.get(owner)
    if held is not None and held[1] == workers:
        return held[0]
    if held is not None:
        held[0].shutdown(cancel_futures=True)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    _POOLS[owner] = (pool, workers)
    atexit.register(pool.shutdown, cancel_futures=True)
    return pool


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 is sent, nothing is delivered). A
    process of another user (``PermissionError``) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
