"""Perturbed datasets: calibrate every (sample, type) at one level and describe the outputs.

A perturbed dataset is stored as its manifest, one row per (sample, type, level) with the
calibrated strength, SSIM, band flag, seed key and a content hash. Images are regenerated on
demand from a row with :func:`regenerate`, bit-exactly.

Work is split into chunks of one (dataset, type, level); each chunk is a pure function of the
samples, the suite seed and the calibration settings, so the result does not depend on the
processing order or on the number of worker processes. A chunk anchored on the suite's previous
level (:attr:`ChunkSpec.previous`) reads that level's rows when given them and computes them
otherwise, so it stays a pure function of the same inputs, whatever order the levels run in.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

from medrobust_lib import runtime
from medrobust_lib.data.sample import Sample, array_hash
from medrobust_lib.perturb.calibrate import (
    Band,
    Calibrated,
    WarmStart,
    calibrate,
    miss_reason,
    warm_start_runs,
)
from medrobust_lib.perturb.calibrate_reference import find_strength
from medrobust_lib.perturb.spec import PerturbationSpec, PerturbOutput, get_perturbation, strength_warning
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for, seed_key, stable_fraction

CalibrationMode = Literal["per_image", "reference", "fixed"]
CALIBRATION_MODES: tuple[str, ...] = ("per_image", "reference", "fixed")


@dataclass(frozen=True)
class ChunkSpec:
    """One unit of work: every sample of one dataset under one type at one level."""

    dataset: str
    modality: str
    perturbation: str
    level: int
    band: Band
    seed: int
    calibration_subset: int
    mode: CalibrationMode = "per_image"
    """``per_image`` (the corrected protocol), ``reference`` (the published code's first-image
    bisection, :mod:`medrobust_lib.perturb.calibrate_reference`) or ``fixed`` (each type's default
    strength for the level, no search: the reference's uncalibrated VLM images)."""
    previous: tuple[tuple[int, Band], ...] = ()
    """The suite's lower levels with their bands, in order (``per_image`` only). The nearest one is
    this chunk's anchor level: each image's calibrated (strength, SSIM) there predicts its first
    strength here (:func:`anchor_chunk`). Empty: no anchor (the suite's lowest level)."""


Anchors = dict[str, tuple[float, float]]
"""Sample id -> its calibrated (strength, SSIM) at the anchor level (ok rows only)."""


def chunk_previous(levels: Sequence[int], bands: dict[int, Band], level: int) -> tuple[tuple[int, Band], ...]:
    """:attr:`ChunkSpec.previous` of ``level`` in a suite of ``levels`` with ``bands``."""
    return tuple((lv, tuple(bands[lv])) for lv in sorted(levels) if lv < level)  # type: ignore[misc]


def anchor_chunk(chunk: ChunkSpec) -> ChunkSpec | None:
    """The chunk whose rows anchor ``chunk`` (same dataset and type, the nearest lower level of the
    suite), None without one."""
    if not chunk.previous or chunk.mode != "per_image":
        return None
    (level, band), rest = chunk.previous[-1], chunk.previous[:-1]
    return replace(chunk, level=level, band=band, previous=rest)


def anchors_from_rows(rows: Sequence[dict[str, Any]]) -> Anchors:
    """The anchors a chunk's manifest rows give: (strength, SSIM) of every ``ok`` row."""
    return {str(r["sample_id"]): (float(r["strength"]), float(r["ssim"])) for r in rows if r["status"] == "ok"}


def perturbation_key(seed: int, dataset: str, sample_id: str, perturbation: str) -> str:
    """The random key of a (sample, type); deliberately without the level."""
    return seed_key(seed, dataset, sample_id, perturbation)


def calibration_subset(samples: Sequence[Sample], seed: int, k: int) -> list[Sample]:
    """The ``k`` samples used for the dataset-level warm start: the first by a seeded hash of
    their ids, so the choice does not depend on the input order."""
    ranked = sorted(samples, key=lambda s: (stable_fraction(seed, s.dataset, s.sample_id, "calibration"), s.sample_id))
    return ranked[:k]


def run_chunk(chunk: ChunkSpec, samples: Sequence[Sample], anchors: Anchors | None = None,
              lower: Mapping[int, Anchors] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Calibrate ``chunk.perturbation`` on every sample. Returns (manifest rows sorted by
    sample id, chunk statistics). A failing sample becomes a row with status 'error'; a sample the
    type does not apply to (an RGB-only type on a grayscale image of a mixed-channel dataset, a
    modality outside the type's) becomes a row with status ``not_applicable`` (reason in
    ``error``), never an exception. ``warning`` is None unless a ``strength_is_intensity`` type's
    strength exceeds the clean image's own value range (:func:`~medrobust_lib.perturb.spec.strength_warning`). The dataset-level warm start is calibrated on applicable
    samples only (NaN when there are none): the strength and the strength-to-SSIM slope fitted on
    the calibration subset (:func:`medrobust_lib.perturb.calibrate.warm_start`).

    Cross-level warm start: a chunk with an anchor level (:func:`anchor_chunk`) starts each image
    from the strength its own anchor (its calibrated point there; SSIM is one function of strength
    at every level, the key has no level) predicts, with the slope fitted on the subset's anchors.
    ``anchors``: the anchor chunk's rows (:func:`anchors_from_rows`), read from its manifest chunk
    when that is current; None: the anchor chunk is computed here, so the result never depends
    on whether or in which order other levels were built (the anchor chunk is a pure function of
    the same inputs). ``lower``: level -> the rows of this chunk's lower levels that are current
    on disk (:func:`medrobust_lib.tracks.perturbed.current_lower_rows`); computing an anchor chunk
    stops at the highest of them instead of going down to the suite's first level. A subset image
    starts from its own subset search's points."""
    spec = get_perturbation(chunk.perturbation)
    ordered = sorted(samples, key=lambda s: s.sample_id)
    applicable = [s for s in ordered if spec.applies_to(s.modality, s.n_channels)]
    precomputed: dict[str, Calibrated | Exception] = {}
    known: dict[str, list[tuple[float, float]]] = {}
    calib_evals = 0
    warm = float("nan")
    ws: WarmStart | None = None
    if chunk.mode == "reference" and applicable:  # first image (by sample id) calibrates, the rest reuse
        first = applicable[0]
        try:
            warm, _, out, calib_evals = find_strength(
                spec, first.image, chunk.band, (perturbation_key(chunk.seed, first.dataset, first.sample_id, spec.name),),
                mask=first.mask, boxes=first.boxes)
            value = ssim(first.image, out.image)
            precomputed[first.sample_id] = Calibrated(warm, value, chunk.band[0] <= value <= chunk.band[1],
                                                      calib_evals, out)
        except Exception as exc:  # every image depends on the first: each row records the failure
            precomputed[first.sample_id] = exc
    elif chunk.mode == "fixed":
        warm = spec.clamp(spec.levels[chunk.level - 1])
    else:  # calibrated: a warm start fitted on the calibration subset, then every image checked in its band
        ws, known = _warm_start(chunk, spec, samples, applicable, anchors, lower)
        if ws is not None:
            warm, calib_evals = ws.strength, ws.n_evals
    rows = []
    for s in ordered:
        key = perturbation_key(chunk.seed, s.dataset, s.sample_id, spec.name)
        base = {
            "sample_id": s.sample_id, "dataset": s.dataset, "modality": s.modality,
            "perturbation": spec.name, "family": spec.family, "geometry": spec.geometry,
            "level": chunk.level, "band_low": chunk.band[0], "band_high": chunk.band[1],
            "dataset_strength": warm, "seed_key": key,
        }
        if not spec.applies_to(s.modality, s.n_channels):
            rows.append({**base, "strength": float("nan"), "ssim": float("nan"), "band_reached": False,
                         "miss_reason": "not_applicable", "n_ssim_evals": 0, "sha256": None,
                         "status": NOT_APPLICABLE, "error": not_applicable_reason(spec, s), "warning": None})
            continue
        try:
            c = _calibrated(chunk, spec, s, key, warm, precomputed, ws, known.get(s.sample_id, ()))
            miss = miss_reason(spec, s.image.shape, c, chunk.band)
            rows.append({**base, "strength": c.strength, "ssim": c.ssim, "band_reached": c.band_reached,
                         "miss_reason": miss, "n_ssim_evals": c.n_ssim_evals,
                         "sha256": output_hash(c.output), "status": "ok", "error": None,
                         "warning": strength_warning(spec, c.strength, s.image)})
        except Exception as exc:  # a bad sample is a counted outcome, never a crash
            rows.append({**base, "strength": float("nan"), "ssim": float("nan"), "band_reached": False,
                         "miss_reason": "error", "n_ssim_evals": 0, "sha256": None, "status": "error",
                         "error": f"{type(exc).__name__}: {exc}"[:500], "warning": None})
    stats = {"calibration_evals": calib_evals, "dataset_strength": warm,
             "slope": ws.slope if ws is not None else float("nan")}
    return rows, stats


def _warm_start(chunk: ChunkSpec, spec: PerturbationSpec, samples: Sequence[Sample], applicable: Sequence[Sample],
                anchors: Anchors | None, lower: Mapping[int, Anchors] | None
                ) -> tuple[WarmStart | None, dict[str, list[tuple[float, float]]]]:
    """The calibrated mode's start of :func:`run_chunk`: the warm start fitted on the calibration
    subset (None without applicable samples) and each image's known (strength, SSIM) points (its
    anchor at the previous level, computed here unless given or held in ``lower``; a subset
    image's own subset search)."""
    prev = anchor_chunk(chunk)
    if prev is None:
        anchors = {}
    elif anchors is None:
        held = (lower or {}).get(prev.level)
        anchors = held if held is not None else anchors_from_rows(run_chunk(prev, samples, lower=lower)[0])
    known = {sid: [a] for sid, a in anchors.items()}
    subset = calibration_subset(applicable, chunk.seed, chunk.calibration_subset)
    if not subset:
        return None, known
    ws, runs = warm_start_runs(
        spec,
        [(s.image, (perturbation_key(chunk.seed, s.dataset, s.sample_id, spec.name),)) for s in subset],
        chunk.band,
        start=spec.level_start(chunk.level, subset[0].image.shape),
        anchors=[anchors.get(s.sample_id) for s in subset],
    )
    for s, c in zip(subset, runs, strict=True):
        known[s.sample_id] = [*known.get(s.sample_id, []), *c.points]
    return ws, known


def _calibrated(chunk: ChunkSpec, spec: PerturbationSpec, s: Sample, key: str, warm: float,
                precomputed: dict[str, Calibrated | Exception], ws: WarmStart | None = None,
                known: Sequence[tuple[float, float]] = ()) -> Calibrated:
    """One sample's outcome under the chunk's calibration mode (``reference``: the first image's
    own result, or ``warm`` applied; raises when the first image's calibration failed)."""
    if chunk.mode == "reference":
        first = next(iter(precomputed.values()))
        if isinstance(first, Exception):
            raise RuntimeError(f"reference calibration failed on the first image: {type(first).__name__}: {first}")
        if s.sample_id in precomputed:
            return first
    if chunk.mode in ("fixed", "reference"):
        out = spec.apply(s.image, warm, rng_for(key), mask=s.mask, boxes=s.boxes)
        value = ssim(s.image, out.image)
        return Calibrated(warm, value, chunk.band[0] <= value <= chunk.band[1], 1, out)
    return calibrate(spec, s.image, chunk.band, (key,), warm=ws, mask=s.mask, boxes=s.boxes, known=known)


NOT_APPLICABLE = "not_applicable"
"""Manifest status of a (sample, type) the type does not apply to; counted, outside every mean."""


def not_applicable_reason(spec: PerturbationSpec, sample: Sample) -> str:
    """Why ``spec`` does not apply to ``sample`` (channels or modality), for the ``error`` column."""
    if spec.channels == "rgb" and sample.n_channels != 3:
        return f"{spec.name} needs an RGB image; {sample.sample_id} is grayscale"
    return f"{spec.name} does not apply to modality {sample.modality!r}"


def output_hash(out: PerturbOutput) -> str:
    return array_hash(out.image, out.mask, out.boxes)


def regenerate(row: dict[str, Any], sample: Sample) -> PerturbOutput:
    """The perturbed sample described by a manifest row, bit-identical to the calibrated output."""
    spec = get_perturbation(str(row["perturbation"]))
    return spec.apply(sample.image, float(row["strength"]), rng_for(str(row["seed_key"])),
                      mask=sample.mask, boxes=sample.boxes, instances=sample.instances)


def verify_row(row: dict[str, Any], sample: Sample) -> bool:
    """Whether regenerating the row reproduces its hash and SSIM exactly."""
    out = regenerate(row, sample)
    return output_hash(out) == row["sha256"] and ssim(sample.image, out.image) == row["ssim"]


# ---- running many chunks, optionally in worker processes ----------------------------------

def _pool(workers: int) -> ProcessPoolExecutor:
    """The perturbation engine's process pool (:func:`medrobust_lib.runtime.process_pool`, kept
    for the life of the process)."""
    return runtime.process_pool("perturb", workers)


def _run_in_worker(chunk: ChunkSpec, samples: list[Sample], lower: Mapping[int, Anchors] | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    try:
        return run_chunk(chunk, samples, lower=lower)
    except Exception:  # pragma: no cover - surfaced to the parent with the traceback
        raise RuntimeError(f"chunk {chunk} failed:\n{traceback.format_exc()}") from None


def run_chunks(
    chunks: Sequence[ChunkSpec],
    samples_by_dataset: dict[str, list[Sample]],
    *,
    workers: int = 1,
    on_done: Callable[[ChunkSpec, list[dict[str, Any]], dict[str, Any]], None] | None = None,
    lower: Sequence[Mapping[int, Anchors] | None] | None = None,
) -> Iterator[tuple[ChunkSpec, list[dict[str, Any]], dict[str, Any]]]:
    """Run chunks in-process (``workers == 1``) or in a process pool, yielding results in the
    order of ``chunks`` whatever the completion order (so outputs do not depend on ``workers``).
    ``lower[i]``: the rows of chunk i's lower levels already at hand, by level (:func:`run_chunk`)."""
    held = list(lower) if lower is not None else [None] * len(chunks)
    if workers <= 1 or len(chunks) <= 1:
        results = ((ch, *run_chunk(ch, samples_by_dataset[ch.dataset], lower=a))
                   for ch, a in zip(chunks, held, strict=True))
    else:
        pool = _pool(workers)
        futures = [pool.submit(_run_in_worker, ch, samples_by_dataset[ch.dataset], a)
                   for ch, a in zip(chunks, held, strict=True)]
        results = ((ch, *f.result()) for ch, f in zip(chunks, futures, strict=True))
    for ch, rows, stats in results:
        if on_done:
            on_done(ch, rows, stats)
        yield ch, rows, stats
