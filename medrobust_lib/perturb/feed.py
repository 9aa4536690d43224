"""The perturbation feed: perturbed images regenerated from manifest rows by a pool of worker
processes that runs ahead of the model, with bounded prefetch and results in row order.

* Workers (default ``cores - 1``, at least 1) are spawned once per process and kept (like
  :func:`medrobust_lib.perturb.engine.run_chunks`' pool); each loads and hashes the clean samples
  of a (suite, modality, split) once per process (:func:`clean_samples`) and receives only
  manifest rows, never images. The parent uses the same cache, so a process evaluating many
  partitions reads every clean sample once, not once per partition.
* At most ``prefetch`` chunks of ``chunk`` rows are in flight; results come back in the order of
  the rows whatever the completion order, so outputs do not depend on ``workers``.
* ``workers=0`` regenerates in the calling process through the same functions (tests, debugging).

Regeneration is :func:`medrobust_lib.perturb.engine.regenerate`, bit-exact with the manifest.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.spec import PerturbOutput

SampleKey = tuple[str, str]
"""(dataset, sample_id)."""

_CLEAN: dict[tuple[Any, ...], dict[SampleKey, Sample]] = {}
_MAX_CLEAN_ENTRIES = 8


def default_workers() -> int:
    """Feed worker processes by default: all cores but one (the model's), at least one."""
    return max(1, (os.cpu_count() or 1) - 1)


def _index_signature(suite: Any, modality: str) -> tuple[Any, ...]:
    """What the loaded clean samples depend on: the clean index partition's files (path, size,
    mtime) and the suite's dataset configuration. A re-materialised index reloads."""
    from medrobust_lib.pipeline.datasets import CLEAN_TABLE
    from medrobust_lib.store.results import partition_dir

    folder = Path(partition_dir(suite.results_dir, CLEAN_TABLE, {"modality": modality}))
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return (str(Path(suite.results_dir).resolve()), stats, suite.model_dump_json())


def clean_samples(suite: Any, modality: str, split: str) -> dict[SampleKey, Sample]:
    """The clean evaluation samples of a modality and split keyed by (dataset, sample_id), loaded
    and checked against their recorded hashes once per process (cached on the clean index's
    files and the suite's settings). Callers must not mutate the samples."""
    from medrobust_lib.pipeline.datasets import load_clean_samples

    key = (modality, split, _index_signature(suite, modality))
    if key not in _CLEAN:
        if len(_CLEAN) >= _MAX_CLEAN_ENTRIES:
            _CLEAN.pop(next(iter(_CLEAN)))
        loaded = load_clean_samples(suite, modality, split=split)
        _CLEAN[key] = {(s.dataset, s.sample_id): s for v in loaded.values() for s in v}
    return _CLEAN[key]


def _regenerate_rows(suite: Any, modality: str, split: str, rows: Sequence[dict[str, Any]]) -> list[PerturbOutput]:
    from medrobust_lib.perturb.engine import regenerate

    samples = clean_samples(suite, modality, split)
    out = []
    for row in rows:
        key = (str(row["dataset"]), str(row["sample_id"]))
        if key not in samples:
            raise KeyError(f"manifest row {key} has no clean sample in split {split!r} of modality {modality!r}")
        try:
            out.append(regenerate(row, samples[key]))
        except Exception as exc:
            raise RuntimeError(f"regenerating {row.get('perturbation')} level {row.get('level')} of {key} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    return out


_POOL: ProcessPoolExecutor | None = None
_POOL_SIZE = 0


def _pool(workers: int) -> ProcessPoolExecutor:
    """The feed's process pool, kept for the life of the process. Spawn, not fork: forking after
    torch/OpenCV threads have started can deadlock."""
    global _POOL, _POOL_SIZE
    if _POOL is None or _POOL_SIZE != workers:
        if _POOL is not None:
            _POOL.shutdown(cancel_futures=True)
        _POOL = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
        _POOL_SIZE = workers
        atexit.register(_POOL.shutdown, cancel_futures=True)
    return _POOL


def regenerate_stream(suite: Any, modality: str, split: str, rows: Sequence[dict[str, Any]], *,
                      workers: int | None = None, prefetch: int = 4, chunk: int = 8) -> Iterator[PerturbOutput]:
    """Regenerate every manifest row (dicts with at least dataset, sample_id, perturbation,
    strength, seed_key), yielding one :class:`PerturbOutput` per row in row order.

    ``workers``: processes (None: :func:`default_workers`; 0: in this process). ``prefetch``:
    chunks in flight ahead of the consumer (>= 1). ``chunk``: rows per task. A failing row raises
    ``RuntimeError`` naming it (the caller's partition fails, as before the feed existed)."""
    if prefetch < 1 or chunk < 1:
        raise ValueError(f"prefetch and chunk must be >= 1, got {prefetch}, {chunk}")
    n_workers = default_workers() if workers is None else workers
    if n_workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    parts = [list(rows[i : i + chunk]) for i in range(0, len(rows), chunk)]
    if n_workers == 0 or not parts:
        for part in parts:
            yield from _regenerate_rows(suite, modality, split, part)
        return
    pool = _pool(n_workers)
    inflight: deque[Future[list[PerturbOutput]]] = deque()
    nxt = 0
    try:
        while nxt < len(parts) or inflight:
            while nxt < len(parts) and len(inflight) < prefetch:
                inflight.append(pool.submit(_regenerate_rows, suite, modality, split, parts[nxt]))
                nxt += 1
            yield from inflight.popleft().result()
    finally:
        for f in inflight:
            f.cancel()
