"""The device perturbation engine: the calibrated perturbation path (apply at a strength, SSIM
against the clean image, the band search) in PyTorch, batched over images and strengths, on CUDA
where present and on the CPU in tests.

What runs where (docs/gpu-corruptions.md):

* host, once per (image, type): the port's ``prepare`` (:mod:`medrobust_lib.perturb.torch_ports`):
  the random draws, from the generator the CPU engine uses (:func:`medrobust_lib.seeding.rng_for`
  of the same key: seed, dataset, sample id, type; never the level), and the fields that depend on
  the clean image and the draws only; then one copy to the device (:class:`Prepared`);
* device, per evaluation: the port's ``apply`` for a batch of (image, strength) items, the final
  clipping, spatial resampling (:func:`medrobust_lib.perturb.torch_ops.remap`) and SSIM
  (:func:`medrobust_lib.perturb.ssim.ssim_nchw`, float64 by default);
* host, per evaluation: the band search's bookkeeping (:func:`medrobust_lib.perturb.calibrate.search`,
  the same generator the CPU engine drives, so both take the same steps): a few floats per search.

The searches of many (image, level) problems run in lock-step (:func:`calibrate_batch`): every
round, each unfinished search names its next strength and all of them are evaluated in batches
of ``max_batch`` items. The same (image, type, level, seed) gives the CPU engine's output to
float rounding (the tests: 1/255 max abs on the demo images, SSIM within 1e-4, the same calibrated
strength and band flag); types without a port (:data:`HOST_ONLY`) stay on the host engine.

Feed (:func:`perturbed_batch`, :func:`regenerate_batches`): perturbed outputs as a device tensor
batch (B, C, H, W) (and the moved masks of spatial types), for a model without a host round trip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb import torch_ops as T
from medrobust_lib.perturb.calibrate import (
    DEFAULT_BANDS,
    DEFAULT_SLOPE,
    MAX_EVALS,
    Band,
    WarmStart,
    first_strength,
    fit_warm_start,
    search,
)
from medrobust_lib.perturb.engine import calibration_subset, perturbation_key
from medrobust_lib.perturb.spec import PerturbationSpec, get_perturbation
from medrobust_lib.perturb.ssim import ssim_nchw
from medrobust_lib.perturb.torch_ports import HOST_ONLY, PORTS, Fields, Prepared
from medrobust_lib.seeding import rng_for

__all__ = ["HOST_ONLY", "DEVICE_TYPES", "Prepared", "supports", "default_device", "prepare", "prepare_many", "apply",
           "calibrate_batch", "warm_start_batch", "warm_start_runs_batch", "calibrate_levels", "perturbed_batch", "regenerate_batches"]

DEVICE_TYPES: tuple[str, ...] = tuple(sorted(PORTS))
"""The types the device engine runs (every registered type but :data:`HOST_ONLY`)."""
MAX_BATCH = 32
"""Items per device evaluation by default (images of 1024 px: 32 x 12 MB per RGB tensor)."""


def supports(name: str) -> bool:
    """Whether type ``name`` has a device port."""
    return name in PORTS


def default_device() -> torch.device:
    """CUDA when available, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _port(name: str) -> Any:
    if name not in PORTS:
        why = HOST_ONLY.get(name)
        if why is not None:
            raise KeyError(f"{name!r} has no device port ({why}); run it on the host engine")
        raise KeyError(f"unknown perturbation {name!r}; device types: {', '.join(DEVICE_TYPES)}")
    return PORTS[name]


def prepare(spec: PerturbationSpec, image: np.ndarray, key: Sequence[object],
            device: torch.device | str | None = None) -> Prepared:
    """The host part of ``spec`` for one clean image (float32 (H, W) or (H, W, 3) in [0, 1]) and
    its random key (as :func:`medrobust_lib.perturb.calibrate.calibrate` takes it, e.g.
    ``(perturbation_key(seed, dataset, sample_id, type),)``): the draws from ``rng_for(*key)`` and
    the strength-independent fields, copied to ``device`` on first use."""
    if image.dtype != np.float32 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"images must be float32 (H, W) or (H, W, 3), got {image.dtype} {image.shape}")
    if spec.channels == "rgb" and image.ndim != 3:
        raise ValueError(f"perturbation {spec.name!r} needs an RGB image, got shape {image.shape}")
    values = _port(spec.name).prepare(image, rng_for(*key))
    return Prepared(spec.name, image, values, device or default_device())


PREPARE_THREADS = min(8, os.cpu_count() or 1)
"""Host threads that prepare items (the draws and fields are numpy and OpenCV work that releases
the GIL; measured at 1024 px: about 0.5 s per image for the 46 device types before window_level, on
one core)."""


def prepare_many(spec: PerturbationSpec, jobs: Sequence[tuple[np.ndarray, Sequence[object]]],
                 device: torch.device | str | None = None, threads: int = PREPARE_THREADS) -> list[Prepared]:
    """:func:`prepare` for many (image, key) jobs, on ``threads`` host threads; results in order."""
    dev = device or default_device()
    if threads <= 1 or len(jobs) <= 1:
        return [prepare(spec, image, key, dev) for image, key in jobs]
    with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
        return list(pool.map(lambda job: prepare(spec, job[0], job[1], dev), jobs))


@dataclass(frozen=True)
class DeviceOutput:
    """A perturbed batch on the device: ``images`` (B, C, H, W) float32 in [0, 1], ``masks``
    (B, H, W) bool (moved by a spatial type; the inputs unchanged otherwise) or None, and the
    strengths applied (clamped)."""

    images: torch.Tensor
    masks: torch.Tensor | None
    strengths: tuple[float, ...]


def apply(spec: PerturbationSpec, items: Sequence[Prepared], strengths: Sequence[float],
          masks: torch.Tensor | None = None) -> DeviceOutput:
    """``spec`` at ``strengths[i]`` on ``items[i]`` (prepared for ``spec``, all of one shape), on the
    items' device: the CPU's ``spec.apply(image, s, rng).image`` to float rounding, batched.
    ``masks`` (B, H, W) bool on the device: moved with a spatial type's draw (nearest neighbour,
    as the CPU engine moves masks)."""
    if not items:
        raise ValueError("apply needs at least one item")
    shape = items[0].shape
    if any(it.shape != shape for it in items) or any(it.name != spec.name for it in items):
        raise ValueError("one apply batch takes items of one type and one image shape")
    p = _port(spec.name)
    s = [spec.clamp(float(v), shape) for v in strengths]
    x = torch.stack([it.clean for it in items])
    f = Fields(items)
    moved = masks
    with T.full_float32():
        if p.spatial:
            map_x, map_y = p.apply(x, s, f)
            out = T.remap(x, map_x, map_y, "constant")
            if masks is not None:
                moved = T.remap(masks[:, None].to(torch.float32), map_x, map_y, "constant", "nearest")[:, 0] > 0.5
        else:
            out = p.apply(x, s, f)
    out = torch.nan_to_num(out.to(torch.float32), nan=0.0, posinf=1.0, neginf=0.0).clamp_(0.0, 1.0)
    return DeviceOutput(out, moved, tuple(s))


# ---- calibration --------------------------------------------------------------------------------


@dataclass
class DeviceCalibrated:
    """The outcome of one device search, as :class:`medrobust_lib.perturb.calibrate.Calibrated`
    without the output (regenerate it with :func:`apply` at ``strength``)."""

    strength: float
    ssim: float
    band_reached: bool
    n_ssim_evals: int
    points: tuple[tuple[float, float], ...] = field(default_factory=tuple)


def calibrate_batch(spec: PerturbationSpec, items: Sequence[Prepared], bands: Sequence[Band], *,
                    starts: Sequence[float | None] | None = None, warm: Sequence[WarmStart | None] | None = None,
                    search_spec: PerturbationSpec | None = None, max_batch: int = MAX_BATCH,
                    max_evals: int = MAX_EVALS, ssim_dtype: torch.dtype = torch.float64,
                    known: Sequence[Sequence[tuple[float, float]]] | None = None) -> list[DeviceCalibrated]:
    """Calibrate ``items[i]`` into ``bands[i]`` (as :func:`medrobust_lib.perturb.calibrate.calibrate`
    with ``start=starts[i]`` / ``warm=warm[i]``), all searches in lock-step: one round evaluates
    every unfinished search's next strength, ``max_batch`` items (of one shape) per device call.
    ``search_spec``: the type as the searches see it (default ``spec.for_shape`` of each image; the
    warm start passes the subset's largest image's). ``known[i]``: the known points of item i
    (``calibrate``'s ``known``)."""
    n = len(items)
    starts = list(starts) if starts is not None else [None] * n
    warms = list(warm) if warm is not None else [None] * n
    knowns = [tuple(k) for k in known] if known is not None else [()] * n
    gens, pending = [], {}
    points: list[dict[float, float]] = [{} for _ in range(n)]
    results: list[DeviceCalibrated | None] = [None] * n
    for i, (it, band) in enumerate(zip(items, bands, strict=True)):
        sp = search_spec or spec.for_shape(it.shape)
        w = warms[i]
        g = search(sp, band, first_strength(sp, band, starts[i], w, knowns[i], it.shape),
                   w.slope if w is not None else DEFAULT_SLOPE, max_evals, it.shape, knowns[i])
        gens.append(g)
        pending[i] = next(g)
    while pending:
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i in pending:
            by_shape.setdefault(items[i].shape, []).append(i)
        values: dict[int, float] = {}
        for ids in by_shape.values():
            for k in range(0, len(ids), max_batch):
                chunk = ids[k : k + max_batch]
                out = apply(spec, [items[i] for i in chunk], [pending[i] for i in chunk])
                clean = torch.stack([items[i].clean for i in chunk])
                for i, v in zip(chunk, ssim_nchw(clean, out.images, dtype=ssim_dtype).tolist(), strict=True):
                    values[i] = float(v)
        for i, v in values.items():
            s = pending.pop(i)
            points[i][s] = v
            try:
                pending[i] = gens[i].send(v)
            except StopIteration as stop:
                strength, reached = stop.value
                results[i] = DeviceCalibrated(strength, points[i][strength], reached, len(points[i]),
                                              tuple(points[i].items()))
    return [r for r in results if r is not None]


def warm_start_batch(spec: PerturbationSpec, subsets: Sequence[Sequence[Prepared]], bands: Sequence[Band],
                     starts: Sequence[float | None], *, max_batch: int = MAX_BATCH,
                     ssim_dtype: torch.dtype = torch.float64,
                     anchors: Sequence[Sequence[tuple[float, float] | None]] | None = None) -> list[WarmStart]:
    """:func:`medrobust_lib.perturb.calibrate.warm_start` for several (subset, band, start)
    problems at once (e.g. the five levels of one type), their searches in lock-step."""
    return warm_start_runs_batch(spec, subsets, bands, starts, max_batch=max_batch, ssim_dtype=ssim_dtype,
                                 anchors=anchors)[0]


def warm_start_runs_batch(spec: PerturbationSpec, subsets: Sequence[Sequence[Prepared]], bands: Sequence[Band],
                          starts: Sequence[float | None], *, max_batch: int = MAX_BATCH,
                          ssim_dtype: torch.dtype = torch.float64,
                          anchors: Sequence[Sequence[tuple[float, float] | None]] | None = None
                          ) -> tuple[list[WarmStart], list[list[DeviceCalibrated]]]:
    """:func:`medrobust_lib.perturb.calibrate.warm_start_runs` for several problems at once:
    the warm starts and, per problem, its subset's searches. ``anchors[j][i]``: subset image i of
    problem j's point at the anchor level (None: none)."""
    anchors = [list(a) for a in anchors] if anchors is not None else [[None] * len(sub) for sub in subsets]
    specs = [spec.for_shape(max((it.shape for it in subset), key=lambda sh: max(sh[:2]))) if subset else spec
             for subset in subsets]
    # the searches of problems whose search specs agree (the subsets' largest shapes) run together
    groups: dict[PerturbationSpec, list[tuple[int, int, Prepared]]] = {}
    for j, subset in enumerate(subsets):
        groups.setdefault(specs[j], []).extend((j, i, it) for i, it in enumerate(subset))
    calibrated: list[list[DeviceCalibrated]] = [[] for _ in subsets]
    for sp, members in groups.items():
        res = calibrate_batch(spec, [it for _, _, it in members], [bands[j] for j, _, _ in members],
                              starts=[starts[j] for j, _, _ in members], search_spec=sp,
                              max_batch=max_batch, ssim_dtype=ssim_dtype,
                              known=[[a] if (a := anchors[j][i]) is not None else [] for j, i, _ in members])
        for (j, _, _), c in zip(members, res, strict=True):
            calibrated[j].append(c)
    out = []
    for j, (subset, start) in enumerate(zip(subsets, starts, strict=True)):
        if not subset:
            out.append(WarmStart(spec.clamp(start) if start is not None else spec.levels[0], DEFAULT_SLOPE, 0))
        else:
            out.append(fit_warm_start(specs[j], [(c.strength, c.points, c.n_ssim_evals) for c in calibrated[j]],
                                      bands[j], anchors[j]))
    return out, calibrated


@dataclass
class LevelResult:
    """One type's calibration of a set of samples at several levels on the device (the per-image
    protocol of :func:`medrobust_lib.perturb.engine.run_chunk`): per level, its warm start and one
    :class:`DeviceCalibrated` per applicable sample (sample ids in ``sample_ids``)."""

    name: str
    sample_ids: list[str]
    warm: dict[int, WarmStart]
    results: dict[int, list[DeviceCalibrated]]


def calibrate_levels(spec: PerturbationSpec, samples: Sequence[Sample], levels: Sequence[int], seed: int,
                     calibration_subset_size: int, *, bands: dict[int, Band] | None = None,
                     device: torch.device | str | None = None, max_batch: int = MAX_BATCH,
                     prepared: dict[str, Prepared] | None = None, chain: bool = False) -> LevelResult:
    """Calibrate ``spec`` on every applicable sample at every level, as the CPU engine's chunks of
    one (dataset, type, level) do (``mode: per_image``): a warm start fitted on the seeded
    calibration subset (from the level's default strength), then every sample searched from it.
    ``chain``: ``levels`` are the suite's levels, each anchored on the one below it, as a suite's
    CPU chunks are (their :attr:`~medrobust_lib.perturb.engine.ChunkSpec.previous`, from
    :func:`~medrobust_lib.perturb.engine.chunk_previous`), so the levels run in ascending order,
    each level's subset searches and then its samples' searches in lock-step; without it (as
    chunks built without ``previous``) all levels run in lock-step, none anchored. A subset image starts from its own
    subset search's points, as on the CPU. Each sample is prepared once for all levels (its key
    has no level)."""
    bands = bands or DEFAULT_BANDS
    dev = device or default_device()
    ordered = sorted(samples, key=lambda s: s.sample_id)
    applicable = [s for s in ordered if spec.applies_to(s.modality, s.n_channels)]
    prep = prepared if prepared is not None else {}
    todo = [s for s in applicable if s.sample_id not in prep]
    jobs = [(s.image, (perturbation_key(seed, s.dataset, s.sample_id, spec.name),)) for s in todo]
    prep.update(zip([s.sample_id for s in todo], prepare_many(spec, jobs, dev), strict=True))
    subset = calibration_subset(applicable, seed, calibration_subset_size)
    steps = [[lv] for lv in sorted(levels)] if chain else [list(levels)]
    warm: dict[int, WarmStart] = {}
    results: dict[int, list[DeviceCalibrated]] = {}
    anchors: dict[str, tuple[float, float]] = {}
    for group in steps:
        warm_list, runs = warm_start_runs_batch(
            spec, [[prep[s.sample_id] for s in subset] for _ in group], [bands[lv] for lv in group],
            [spec.level_start(lv, subset[0].image.shape) if subset else None for lv in group], max_batch=max_batch,
            anchors=[[anchors.get(s.sample_id) for s in subset] for _ in group])
        known: list[list[tuple[float, float]]] = []
        for k, lv in enumerate(group):
            warm[lv] = warm_list[k]
            own = {s.sample_id: list(c.points) for s, c in zip(subset, runs[k], strict=True)}
            known.extend([*([anchors[s.sample_id]] if s.sample_id in anchors else []), *own.get(s.sample_id, [])]
                         for s in applicable)
        items = [prep[s.sample_id] for _ in group for s in applicable]
        res = calibrate_batch(spec, items, [bands[lv] for lv in group for _ in applicable],
                              warm=[warm[lv] for lv in group for _ in applicable], max_batch=max_batch, known=known)
        n = len(applicable)
        for k, lv in enumerate(group):
            results[lv] = res[k * n : (k + 1) * n]
        if chain:
            anchors = {s.sample_id: (c.strength, c.ssim) for s, c in zip(applicable, results[group[-1]], strict=True)}
    return LevelResult(spec.name, [s.sample_id for s in applicable], warm, {lv: results[lv] for lv in levels})


# ---- the feed: perturbed batches as device tensors ---------------------------------------------------


def _mask_tensor(samples: Sequence[Sample], device: torch.device) -> torch.Tensor | None:
    if any(s.mask is None for s in samples):
        return None
    return torch.from_numpy(np.stack([np.asarray(s.mask, bool) for s in samples])).to(device)


def perturbed_batch(name: str, samples: Sequence[Sample], strengths: Sequence[float], seed: int, *,
                    device: torch.device | str | None = None, prepared: dict[str, Prepared] | None = None
                    ) -> DeviceOutput:
    """Type ``name`` at ``strengths[i]`` on ``samples[i]`` (one image shape), with the random key the
    CPU engine uses for (seed, dataset, sample id, type): the images (B, C, H, W) float32 on the
    device and the ground-truth masks (B, H, W) bool on the device (moved by a spatial type; None
    when a sample has none). ``prepared``: a per-sample-id cache of prepared items to reuse."""
    spec = get_perturbation(name)
    dev = torch.device(device) if device is not None else default_device()
    cache = prepared if prepared is not None else {}
    items = []
    for s in samples:
        it = cache.get(s.sample_id)
        if it is None or it.name != name:
            it = prepare(spec, s.image, (perturbation_key(seed, s.dataset, s.sample_id, name),), dev)
            cache[s.sample_id] = it
        items.append(it)
    return apply(spec, items, strengths, _mask_tensor(samples, dev))


def regenerate_batches(rows: Sequence[dict[str, Any]], samples: dict[tuple[str, str], Sample], *,
                       device: torch.device | str | None = None, batch_size: int = MAX_BATCH
                       ) -> Iterator[tuple[list[dict[str, Any]], DeviceOutput]]:
    """The perturbed outputs of manifest rows (``perturbation``, ``strength``, ``seed_key``,
    ``dataset``, ``sample_id``) on the device, in batches of one (type, image shape): yields (the
    batch's rows, its :class:`DeviceOutput`). ``samples`` maps (dataset, sample id) to the clean
    sample. Each sample is prepared once per type."""
    dev = torch.device(device) if device is not None else default_device()
    groups: dict[tuple[str, tuple[int, ...]], list[dict[str, Any]]] = {}
    for r in rows:
        s = samples[(str(r["dataset"]), str(r["sample_id"]))]
        groups.setdefault((str(r["perturbation"]), tuple(s.image.shape)), []).append(r)
    for (name, _), group in groups.items():
        spec = get_perturbation(name)
        cache: dict[tuple[str, str], Prepared] = {}
        for k in range(0, len(group), batch_size):
            chunk = group[k : k + batch_size]
            keys = [(str(r["dataset"]), str(r["sample_id"])) for r in chunk]
            todo = {key: r for key, r in zip(keys, chunk, strict=True) if key not in cache}
            jobs = [(samples[key].image, (str(r["seed_key"]),)) for key, r in todo.items()]
            cache.update(zip(todo, prepare_many(spec, jobs, dev), strict=True))
            items = [cache[key] for key in keys]
            chunk_samples = [samples[key] for key in keys]
            yield chunk, apply(spec, items, [float(r["strength"]) for r in chunk], _mask_tensor(chunk_samples, dev))
