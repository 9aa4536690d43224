"""The perturbed-dataset step: one (modality, level) partition of the perturbation manifest."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.data.sample import Sample, SampleRef
from medrobust_lib.perturb.engine import (
    NOT_APPLICABLE,
    Anchors,
    ChunkSpec,
    anchor_chunk,
    anchors_from_rows,
    chunk_previous,
    run_chunks,
)
from medrobust_lib.perturb.spec import (
    CAP_RULE,
    REFERENCE_SIZE,
    get_perturbation,
    list_perturbations,
    size_factor,
)
from medrobust_lib.progress import Progress, finish
from medrobust_lib.store import results
from medrobust_lib.store.schema import column_names
from medrobust_lib.tracks.datasets import load_clean_samples
from medrobust_lib.tracks.partition import PartitionInputs, added, sample_hashes

MANIFEST_TABLE = "perturbation_manifest"
MANIFEST_COLUMNS: tuple[str, ...] = column_names(MANIFEST_TABLE)
"""The columns of a manifest chunk, in the declared order (:mod:`medrobust_lib.store.schema`)."""

CALIBRATION_VERSION = 5
"""Bumped when the calibration algorithm changes (3: issue 47, the warm start aims at the stretch most
subset images have in band; 4: issue 47, each image starts from its own point at the suite's
previous level, a subset image from its own subset search; 5: a miss reports the closer side among
known points too, evaluated), so manifest chunks of an older
algorithm are recomputed, not reused."""


def selected_types(suite: Suite, modality: str, n_channels: int, dataset: str | None = None) -> list[str]:
    """Registered types for this modality and channel count, filtered by the suite's
    include/exclude globs and then by ``types_by_dataset[dataset]`` when ``dataset`` is listed
    there, else by ``types_by_modality`` when the modality is listed there."""
    cfg = suite.perturbations
    names = list_perturbations(modality=modality, n_channels=n_channels)
    keep = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in cfg.include)]
    keep = [n for n in keep if not any(fnmatch.fnmatchcase(n, p) for p in cfg.exclude)]
    if dataset is not None and dataset in cfg.types_by_dataset:
        only: list[str] | None = cfg.types_by_dataset[dataset]
    else:
        only = (cfg.types_by_modality or {}).get(modality)
    return keep if only is None else [n for n in keep if any(fnmatch.fnmatchcase(n, p) for p in only)]


@dataclass
class PerturbSummary:
    modality: str
    level: int
    n_rows: int = 0
    n_error: int = 0
    n_not_applicable: int = 0
    n_reached: int = 0
    n_reachable_rows: int = 0
    n_reachable_reached: int = 0
    n_warning: int = 0
    chunks_computed: int = 0
    chunks_reused: int = 0
    calibration_evals: int = 0
    mean_ssim: float = float("nan")
    types: list[str] = field(default_factory=list)
    unreachable_types: list[str] = field(default_factory=list)
    warning_types: list[str] = field(default_factory=list)
    """Types with a manifest ``warning`` (strength above the image's value range) on some row."""

    @property
    def reachable_hit_rate(self) -> float:
        return self.n_reachable_reached / self.n_reachable_rows if self.n_reachable_rows else float("nan")


@dataclass(frozen=True, kw_only=True)
class ChunkInputs(PartitionInputs):
    """What one manifest chunk (a dataset under one type at one level) depends on, by name
    (:mod:`medrobust_lib.tracks.partition`). Build with :func:`chunk_inputs` (the chunk of loaded
    samples) or :func:`error_chunk_inputs` (every sample of the dataset failed to load)."""

    PAYLOAD = "mapping"
    version: int = CALIBRATION_VERSION
    chunk: dict[str, Any]
    """:func:`_chunk_fields`: dataset, modality, type, level, band, seed, calibration subset, mode and
    (an anchored chunk) the suite's lower levels with their bands."""
    spec: list[Any] | None = added(None)
    """The type's calibration-relevant settings (:func:`_spec_key`)."""
    samples: list[tuple[str, str]] | None = added(None)
    """(sample id, content hash) of the chunk's samples."""
    errors: list[dict[str, Any]] | None = added(None)
    """The rows of a chunk whose samples all failed to load (then no spec, no samples)."""


def _spec_key(ch: ChunkSpec, samples: list[Sample]) -> list[Any]:
    spec = get_perturbation(ch.perturbation)
    key: list[object] = [spec.strength_range, spec.levels, spec.inverse, spec.integer, spec.geometry]
    if spec.strength_is_intensity:
        key.append("strength_warning")  # issue 42: rows gained a warning column; recompute such chunks
    if spec.scales_with_size and any(size_factor(s.image.shape) > 1.0 for s in samples):
        key.append(["scales_with_size", REFERENCE_SIZE])  # the range of these samples depends on their size
        if spec.smoothing:
            key.append(CAP_RULE)  # issue 30: a smoothing type's cap grows faster than linearly
    return key


def chunk_inputs(ch: ChunkSpec, samples: list[Sample]) -> ChunkInputs:
    """The inputs of the chunk ``ch`` over ``samples`` (the dataset's loaded samples)."""
    return ChunkInputs(chunk=_chunk_fields(ch), spec=_spec_key(ch, samples), samples=sample_hashes(samples),
                       errors=None)


def error_chunk_inputs(ch: ChunkSpec, rows: list[dict[str, Any]]) -> ChunkInputs:
    """The inputs of the chunk ``ch`` of a dataset whose every sample failed to load (``rows``: their
    ``error`` rows)."""
    return ChunkInputs(chunk=_chunk_fields(ch), spec=None, samples=None, errors=rows)


def chunk_spec(suite: Suite, dataset: str, modality: str, perturbation: str, level: int) -> ChunkSpec:
    """The chunk of ``dataset`` under ``perturbation`` at ``level``: the level's SSIM band, the suite
    seed, the calibration subset, the dataset's calibration mode and (per-image calibration) the
    suite's lower levels, the nearest of which anchors this one (:func:`~medrobust_lib.perturb.engine.anchor_chunk`)."""
    cfg = suite.perturbations
    mode = cfg.mode_for(dataset)
    previous = chunk_previous(cfg.levels, cfg.bands, level) if mode == "per_image" else ()
    return ChunkSpec(dataset, modality, perturbation, level, cfg.bands[level], suite.seed, cfg.calibration_subset,
                     mode, previous)


def chunk_fingerprint(ch: ChunkSpec, samples: list[Sample]) -> str:
    """The fingerprint stored in the chunk ``ch`` over ``samples`` (:func:`chunk_inputs`)."""
    return chunk_inputs(ch, samples).fingerprint


def _chunk_fields(ch: ChunkSpec) -> dict[str, Any]:
    """The chunk's fields for its fingerprint; the default mode and an empty ``previous`` (no
    anchor level) are left out, so chunks written before they existed keep their fields (the
    calibration version still moves them)."""
    d = dict(ch.__dict__)
    if d.get("mode") == "per_image":
        d.pop("mode")
    if not d.get("previous"):
        d.pop("previous", None)
    return d


def build_perturbed(
    suite: Suite, modality: str, level: int, *, workers: int | None = None,
    progress: Callable[[str], None] | None = None, report: Progress | None = None,
) -> PerturbSummary:
    """Calibrate every applicable type on every selected sample of ``modality`` at ``level`` and
    write the manifest partition. Chunks already on disk with a matching fingerprint are reused
    (resume); stale chunks are removed; the partition ends with exactly one row per
    (sample, type).

    A dataset's types are every type the suite selects for the modality (:func:`modality_types`):
    a type that applies to none or only some of its samples (an RGB-only type on grayscale images)
    still gets its chunk, whose rows for those samples are ``not_applicable`` (with the reason), so
    a type is counted, never silently absent.
    No row vanishes: a sample that fails to load becomes an ``error`` row in every chunk of its
    dataset, also when every sample of the dataset fails (then the chunks hold only error rows,
    for the types of the channel counts recorded in the clean index). ``progress``: a line per
    chunk written; ``report``: (chunks done, chunks of the partition) per chunk written
    (:mod:`medrobust_lib.progress`)."""
    cfg = suite.perturbations
    part = {"modality": modality, "level": level}
    load_errors: list[tuple[str, SampleRef, Exception]] = []
    samples_by_ds = load_clean_samples(
        suite, modality, split=cfg.split, max_samples=cfg.max_samples,
        on_error=lambda ref, exc: load_errors.append((ref.dataset, ref, exc)),
    )
    summary = PerturbSummary(modality=modality, level=level)
    todo: list[ChunkSpec] = []
    todo_lower: list[dict[int, Anchors]] = []
    expected: list[str] = []
    types_seen: set[str] = set()
    failed_only: dict[str, list[str]] = {}
    for ds, samples in sorted(samples_by_ds.items()):
        if not samples:
            if any(d == ds for d, _, _ in load_errors):
                failed_only[ds] = dataset_types(suite, modality, _index_channels(suite, modality, ds), ds)
                types_seen.update(failed_only[ds])
                expected.extend(f"{ds}__{t}" for t in failed_only[ds])
            continue
        types = modality_types(suite, modality, ds)  # an RGB-only type on grayscale data: not_applicable rows
        types_seen.update(types)
        for t in types:
            ch = chunk_spec(suite, ds, modality, t, level)
            name = f"{ds}__{t}"
            expected.append(name)
            path = results.chunk_path(suite.results_dir, MANIFEST_TABLE, part, name)
            if results.chunk_is_current(path, chunk_fingerprint(ch, samples)):
                summary.chunks_reused += 1
            else:
                todo.append(ch)
                todo_lower.append(current_lower_rows(suite, ch, samples))

    def write(ch: ChunkSpec, rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
        extra = [_error_row(ch, ref, exc) for ds, ref, exc in load_errors if ds == ch.dataset]
        path = results.chunk_path(suite.results_dir, MANIFEST_TABLE, part, f"{ch.dataset}__{ch.perturbation}")
        results.write_chunk(path, rows + extra, chunk_fingerprint(ch, samples_by_ds[ch.dataset]),
                            columns=MANIFEST_COLUMNS)
        summary.chunks_computed += 1
        summary.calibration_evals += int(stats["calibration_evals"])
        done = summary.chunks_computed + summary.chunks_reused
        if progress:
            progress(f"[{modality} L{level}] {done}/{len(expected)} {ch.dataset}/{ch.perturbation}")
        if report is not None:
            report(min(done, len(expected) - 1), len(expected), "perturbation chunks")

    if report is not None:
        report(summary.chunks_reused, len(expected), "perturbation chunks")
    for _ in run_chunks(todo, samples_by_ds, workers=workers or suite.workers, on_done=write, lower=todo_lower):
        pass
    finish(report, len(expected), "perturbation chunks")
    for ds, types in failed_only.items():  # every sample failed: the error rows still reach the mart
        errs = [(ref, exc) for d, ref, exc in load_errors if d == ds]
        for t in types:
            ch = chunk_spec(suite, ds, modality, t, level)
            rows = [_error_row(ch, ref, exc) for ref, exc in errs]
            fp = error_chunk_inputs(ch, rows).fingerprint
            path = results.chunk_path(suite.results_dir, MANIFEST_TABLE, part, f"{ds}__{t}")
            results.write_chunk(path, rows, fp, columns=MANIFEST_COLUMNS)
            summary.chunks_computed += 1
    results.finalize_partition(suite.results_dir, MANIFEST_TABLE, part, expected)
    df = results.read_partition(suite.results_dir, MANIFEST_TABLE, part)
    _summarize(df, summary)
    summary.types = sorted(types_seen)
    return summary


def current_lower_rows(suite: Suite, ch: ChunkSpec, samples: list[Sample]) -> dict[int, Anchors]:
    """Level -> the anchor rows of every lower level of ``ch`` (its anchor chunk, that chunk's anchor
    chunk, ...) whose manifest chunk is current (same inputs, so the same rows the engine would
    compute). The engine computes an anchor chunk only below the highest of them; the result is the
    same either way, whatever order the levels are built in (:func:`medrobust_lib.perturb.engine.run_chunk`)."""
    held: dict[int, Anchors] = {}
    prev = anchor_chunk(ch)
    while prev is not None:
        path = results.chunk_path(suite.results_dir, MANIFEST_TABLE, {"modality": ch.modality, "level": prev.level},
                                  f"{ch.dataset}__{ch.perturbation}")
        if results.chunk_is_current(path, chunk_fingerprint(prev, samples)):
            held[prev.level] = anchors_from_rows(results.verify_chunk(path).to_pylist())
            break  # the levels below it are not needed: this one anchors the chain
        prev = anchor_chunk(prev)
    return held


def modality_types(suite: Suite, modality: str, dataset: str | None = None) -> list[str]:
    """Every type the suite selects for ``modality`` (for ``dataset``, when given:
    ``perturbations.types_by_dataset``), whatever the channel count, sorted."""
    return dataset_types(suite, modality, {1, 3}, dataset)


def dataset_types(suite: Suite, modality: str, channel_counts: set[int], dataset: str | None = None) -> list[str]:
    """The selected types applying to any of the channel counts present in a dataset, sorted."""
    out: set[str] = set()
    for n in channel_counts or {1}:
        out.update(selected_types(suite, modality, n, dataset))
    return sorted(out)


def _index_channels(suite: Suite, modality: str, dataset: str) -> set[int]:
    """Channel counts the clean index recorded for the dataset's usable samples."""
    from medrobust_lib.tracks.datasets import CLEAN_TABLE

    idx = results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": modality})
    if idx.empty:
        return set()
    ch = idx.loc[(idx["dataset"] == dataset) & (idx["status"] == "ok"), "channels"].dropna()
    return {int(c) for c in ch}


def _error_row(ch: ChunkSpec, ref: SampleRef, exc: Exception) -> dict[str, Any]:
    return {
        "sample_id": ref.sample_id, "dataset": ch.dataset, "modality": ch.modality,
        "perturbation": ch.perturbation, "family": None, "geometry": None, "level": ch.level,
        "band_low": ch.band[0], "band_high": ch.band[1], "strength": float("nan"),
        "dataset_strength": float("nan"), "ssim": float("nan"), "band_reached": False,
        "miss_reason": "error", "n_ssim_evals": 0, "seed_key": None, "sha256": None,
        "status": "error", "error": f"{type(exc).__name__}: {exc}"[:500], "warning": None,
    }


def _summarize(df: pd.DataFrame, s: PerturbSummary) -> None:
    if df.empty:
        return
    ok = df[df["status"] == "ok"]
    s.n_rows = len(df)
    s.n_not_applicable = int((df["status"] == NOT_APPLICABLE).sum())
    s.n_error = int((~df["status"].isin(["ok", NOT_APPLICABLE])).sum())
    s.n_reached = int(ok["band_reached"].sum())
    # A band is out of reach for one output when even the strongest strength stays above it;
    # the hit rate is taken over the other outputs (the "reachable" ones).
    unreachable = ok["miss_reason"] == "unreachable"
    s.unreachable_types = sorted(ok.loc[unreachable, "perturbation"].unique())
    reachable = ok[~unreachable]
    s.n_reachable_rows = len(reachable)
    s.n_reachable_reached = int(reachable["band_reached"].sum())
    s.mean_ssim = float(ok["ssim"].mean()) if len(ok) else float("nan")
    if "warning" in df.columns:  # chunks written before the column existed have none
        warned = ok["warning"].notna()
        s.n_warning = int(warned.sum())
        s.warning_types = sorted(ok.loc[warned, "perturbation"].unique())


def read_manifest(suite: Suite, modality: str | None = None, level: int | None = None) -> pd.DataFrame:
    """The manifest rows of one partition, or of all partitions."""
    if modality is not None and level is not None:
        return results.read_partition(suite.results_dir, MANIFEST_TABLE, {"modality": modality, "level": level})
    df = results.read_table(suite.results_dir, MANIFEST_TABLE)
    if modality is not None and not df.empty:
        df = df[df["modality"] == modality]
    return df


def manifest_keys(manifest: pd.DataFrame) -> list[tuple[str, str]]:
    """The distinct (dataset, sample_id) keys named by manifest rows, sorted (none for an empty
    frame)."""
    if manifest.empty:
        return []
    return sorted({(str(d), str(i)) for d, i in zip(manifest["dataset"], manifest["sample_id"], strict=True)})
