"""Parallel processes creating the same MLflow experiment / registered model on a fresh SQLite
store all succeed and agree (the flock in store.tracking.store_lock)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any


def _work(root: str, barrier: Any, queue: Any) -> None:
    import os

    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    import mlflow  # noqa: F401  (imported before the barrier so the processes really race)

    from medrobust_lib.store.model_registry import register_checkpoint
    from medrobust_lib.store.tracking import ensure_experiment

    barrier.wait()
    try:
        exp = ensure_experiment("perturbed_samples", root)
        rv = register_checkpoint(Path(root).parent / "ckpt", "medrobust-seg-x-lora", tags={}, mlruns_dir=root,
                                 alias=None)
        queue.put(("ok", exp, rv.version))
    except Exception as exc:  # reported to the parent, which fails the test
        queue.put(("err", f"{type(exc).__name__}: {exc}"[:300], None))


def test_parallel_first_use_of_a_fresh_store(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"w")
    root = str(tmp_path / "mlruns")
    ctx = mp.get_context("spawn")
    n = 3
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_work, args=(root, barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(o[0] == "ok" for o in out), out
    assert len({o[1] for o in out}) == 1  # one experiment
    assert sorted(o[2] for o in out) == [1, 2, 3]  # one registered model, three versions
