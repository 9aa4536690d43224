"""The perturbation feed: perturbed images regenerated from manifest rows by a pool of worker
processes that runs ahead of the model, with bounded prefetch and results in row order.

* Workers (default ``cores - 1``, at least 1; none, in-process, for a CPU model on <= 2 cores:
  :func:`default_workers`) are spawned once per process and kept (like
  :func:`medrobust_lib.perturb.engine.run_chunks`' pool). They receive manifest rows, never
  images: a task is the rows of one clean sample (all its types at the level), and the worker
  reads that sample itself through the dataset's reader, checks it against the clean index's hash
  and keeps the last :data:`WORKER_SAMPLE_CACHE` samples (memory stays bounded however large the
  dataset), so each worker reads a sample at most once per partition and usually once per
  process. The parent loads and hashes the whole evaluation split once per process
  (:func:`clean_samples`), so a process evaluating many partitions reads every clean sample once,
  not once per partition.
* At most ``prefetch`` tasks are in flight; results come back in the order of the rows whatever
  the completion order, so outputs do not depend on ``workers``.
* ``workers=0`` regenerates in the calling process through the same functions (tests, debugging).
* Outputs pass through the parent's cache of regenerated samples
  (:mod:`medrobust_lib.perturb.regen_cache`): a later model evaluating the same partition in the
  same process gets them without regenerating, and a task whose rows are all cached is not sent
  to a worker. Workers themselves keep no outputs.

Regeneration is :func:`medrobust_lib.perturb.engine.regenerate`, bit-exact with the manifest.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from medrobust_lib import runtime
from medrobust_lib.data.dataset import index_dataset, load_sample
from medrobust_lib.data.sample import Sample, SampleError
from medrobust_lib.lru import LRU, file_stamp
from medrobust_lib.perturb import regen_cache
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.perturb.spec import PerturbOutput

if TYPE_CHECKING:
    from medrobust_lib.tracks.datasets import EvalSamples

SampleKey = tuple[str, str]
"""(dataset, sample_id)."""
T = TypeVar("T")
R = TypeVar("R")


def _key(row: dict[str, Any]) -> SampleKey:
    return (str(row["dataset"]), str(row["sample_id"]))


_CLEAN: LRU[tuple[Any, ...], EvalSamples] = LRU(max_items=8, name="feed.clean_samples")
"""Per-process cache of :func:`eval_samples`."""


CPU_INPROCESS_MAX_CORES = 2
"""On a CPU model with at most this many cores the feed regenerates in the model's process: a
worker there takes a core from torch's threads. Measured on 2 cores (``bench/seg_bench.py``, the
demo's dermoscopy partition at level 4, 119 images): 0.60 s end to end in-process against 0.96 s
with one worker, the pure forward 0.30 s."""


def default_workers(device_type: str = "cuda") -> int:
    """Feed worker processes by default for a model on ``device_type`` (``"cuda"``, ``"cpu"``,
    ...): all cores but one (the model's), at least one; 0 (in-process) for a CPU model on a
    machine with at most :data:`CPU_INPROCESS_MAX_CORES` cores."""
    cores = os.cpu_count() or 1
    if device_type != "cuda" and cores <= CPU_INPROCESS_MAX_CORES:
        return 0
    return max(1, cores - 1)


def resolve_workers(configured: int | None, device_type: str) -> int:
    """The feed's worker count for a suite setting (``segmentation.feed_workers``; None: the
    default for the model's ``device_type``, :func:`default_workers`)."""
    return configured if configured is not None else default_workers(device_type)


def index_signature(suite: Any, modality: str) -> tuple[Any, ...]:
    """What the loaded clean samples depend on: the clean index partition's files (their
    :func:`~medrobust_lib.lru.file_stamp`) and the suite's dataset configuration. A re-materialised
    index reloads."""
    from medrobust_lib.store.results import partition_dir
    from medrobust_lib.tracks.datasets import CLEAN_TABLE

    folder = Path(partition_dir(suite.results_dir, CLEAN_TABLE, {"modality": modality}))
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    return (tuple(file_stamp(f) for f in files), suite.model_dump_json())


def eval_samples(suite: Any, modality: str, split: str) -> EvalSamples:
    """The evaluation samples of a modality and split as
    :class:`medrobust_lib.tracks.datasets.EvalSamples` (the usable samples keyed by (dataset,
    sample_id), and the reason each other sample of the split cannot be used), loaded and checked
    against their recorded hashes once per process (cached on the clean index's files and the
    suite's settings). Callers must not mutate the samples."""
    from medrobust_lib.tracks.datasets import load_eval_samples

    key = (modality, split, index_signature(suite, modality))
    ev = _CLEAN.get(key)
    if ev is None:
        _CLEAN.make_room()  # the oldest set goes before this one loads
        ev = load_eval_samples(suite, modality, split)
        _CLEAN.put(key, ev)
    return ev


def clean_samples(suite: Any, modality: str, split: str) -> dict[SampleKey, Sample]:
    """The usable clean evaluation samples of a modality and split keyed by (dataset, sample_id)
    (:func:`eval_samples`; a sample that fails to load is left out here and recorded there)."""
    return eval_samples(suite, modality, split).samples


WORKER_SAMPLE_CACHE = 64
"""Clean samples a feed worker keeps (least recently used dropped first)."""
_ONE: LRU[tuple[Any, ...], Sample] = LRU(max_items=WORKER_SAMPLE_CACHE, name="feed.worker_samples")
_REFS: dict[tuple[Any, ...], tuple[dict[SampleKey, Any], dict[SampleKey, str], dict[str, Any]]] = {}


def clean_sample(suite: Any, modality: str, split: str, key: SampleKey,
                 signature: tuple[Any, ...] | None = None) -> Sample:
    """One clean sample, read through its dataset's reader and checked against the clean index's
    hash; the last :data:`WORKER_SAMPLE_CACHE` are kept per process (the feed workers' access).
    ``signature``: the clean index's :func:`index_signature`, when the caller has it already."""
    from medrobust_lib.store import results
    from medrobust_lib.tracks.datasets import CLEAN_TABLE, datasets_for

    sig = (modality, split, signature if signature is not None else index_signature(suite, modality))
    ck = (*sig, key)
    hit = _ONE.get(ck)
    if hit is not None:
        return hit
    if sig not in _REFS:
        index = results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": modality})
        ok = index[index["status"] == "ok"] if not index.empty else index
        if split != "all" and not ok.empty:
            ok = ok[ok["split"] == split]
        wanted = {(str(d), str(i)): str(h) for d, i, h in zip(ok["dataset"], ok["sample_id"], ok["sha256"], strict=True)}
        cfgs = {c.name: c for c in datasets_for(suite, modality)}
        refs = {(r.dataset, r.sample_id): r for c in cfgs.values() for r in index_dataset(c)[0]}
        _REFS.clear()
        _REFS[sig] = (refs, wanted, cfgs)
    refs, wanted, cfgs = _REFS[sig]
    if key not in wanted or key not in refs:
        raise KeyError(f"manifest row {key} has no clean sample in split {split!r} of modality {modality!r}")
    s = load_sample(cfgs[key[0]], refs[key])
    if s.content_hash() != wanted[key]:
        raise SampleError("changed_on_disk", "content differs from the clean index; re-materialize clean_samples")
    _ONE.put(ck, s)
    return s


def _regenerate_rows(suite: Any, modality: str, split: str, rows: Sequence[dict[str, Any]],
                     local: bool = False) -> list[PerturbOutput]:
    """Regenerate rows; ``local``: in the parent, from its full per-process sample cache and
    through its cache of regenerated outputs (:mod:`medrobust_lib.perturb.regen_cache`)."""
    samples = clean_samples(suite, modality, split) if local else None
    sig = None if local else index_signature(suite, modality)  # once per task, not per row
    out = []
    for row in rows:
        key = _key(row)
        if samples is not None and key not in samples:
            raise KeyError(f"manifest row {key} has no clean sample in split {split!r} of modality {modality!r}")
        sample = samples[key] if samples is not None else clean_sample(suite, modality, split, key, sig)
        try:
            out.append(regen_cache.regenerate_cached(row, sample) if local else regenerate(row, sample))
        except Exception as exc:
            raise RuntimeError(f"regenerating {row.get('perturbation')} level {row.get('level')} of {key} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    return out


def _pool(workers: int) -> ProcessPoolExecutor:
    """The feed's process pool (:func:`medrobust_lib.runtime.process_pool`, kept for the life of
    the process)."""
    return runtime.process_pool("feed", workers)


def _tasks(rows: Sequence[dict[str, Any]], chunk: int) -> list[list[dict[str, Any]]]:
    """Consecutive rows of one sample form a task (split after ``chunk`` rows), so a worker reads
    a clean sample once for all its rows there."""
    tasks: list[list[dict[str, Any]]] = []
    last: SampleKey | None = None
    for row in rows:
        key = _key(row)
        if not tasks or key != last or len(tasks[-1]) >= chunk:
            tasks.append([])
        tasks[-1].append(row)
        last = key
    return tasks


def sample_major(rows: Sequence[dict[str, Any]]) -> list[int]:
    """A deterministic order of ``rows`` that keeps the rows of one sample together (by dataset,
    sample id, then the original position): the order the evaluation feeds rows in."""
    return sorted(range(len(rows)), key=lambda i: (str(rows[i]["dataset"]), str(rows[i]["sample_id"]), i))


def regenerate_stream(suite: Any, modality: str, split: str, rows: Sequence[dict[str, Any]], *,
                      workers: int | None = None, prefetch: int = 4, chunk: int = 32) -> Iterator[PerturbOutput]:
    """Regenerate every manifest row (dicts with at least dataset, sample_id, perturbation,
    strength, seed_key), yielding one :class:`PerturbOutput` per row in row order.

    ``workers``: processes (None: :func:`default_workers` for a CUDA model; 0: in this process). ``prefetch``:
    tasks in flight ahead of the consumer (>= 1). ``chunk``: at most this many rows per task (a
    task never mixes samples; order rows with :func:`sample_major` for full tasks). A failing row
    raises ``RuntimeError`` naming it (the caller's partition fails, as before the feed existed)."""
    if prefetch < 1 or chunk < 1:
        raise ValueError(f"prefetch and chunk must be >= 1, got {prefetch}, {chunk}")
    n_workers = resolve_workers(workers, "cuda")
    if n_workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    parts = _tasks(rows, chunk)
    if n_workers == 0 or not parts:
        for part in parts:
            yield from _regenerate_rows(suite, modality, split, part, local=True)
        return
    pool = _pool(n_workers)
    samples = clean_samples(suite, modality, split)

    def start(part: list[dict[str, Any]]) -> list[PerturbOutput] | Future[list[PerturbOutput]]:
        known = [regen_cache.lookup(row, samples[_key(row)]) if _key(row) in samples else None for row in part]
        done = [o for o in known if o is not None]
        # a task already regenerated in this process (another model, same partition) is not sent again
        return done if len(done) == len(part) else pool.submit(_regenerate_rows, suite, modality, split, part)

    for part, outs, fresh in prefetched(parts, start, prefetch):
        if not fresh:
            yield from outs
            continue
        for row, out in zip(part, outs, strict=True):
            yield regen_cache.remember(row, samples[_key(row)], out) if _key(row) in samples else out


def prefetched(tasks: Sequence[T], start: Callable[[T], R | Future[R]], prefetch: int) -> Iterator[tuple[T, R, bool]]:
    """``(task, result, fresh)`` for every task in order, with at most ``prefetch`` (>= 1) tasks
    started ahead of the consumer. ``start(task)`` returns the result itself or a
    :class:`~concurrent.futures.Future` of it (``fresh``: it came from one); futures still pending
    when the consumer stops are cancelled."""
    inflight: deque[tuple[T, R | Future[R]]] = deque()
    nxt = 0
    try:
        while nxt < len(tasks) or inflight:
            while nxt < len(tasks) and len(inflight) < prefetch:
                inflight.append((tasks[nxt], start(tasks[nxt])))
                nxt += 1
            task, pending = inflight.popleft()
            if isinstance(pending, Future):
                yield task, pending.result(), True
            else:
                yield task, pending, False
    finally:
        for _, f in inflight:
            if isinstance(f, Future):
                f.cancel()
