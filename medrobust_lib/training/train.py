"""Supervised training of a promptable segmentation model with box prompts.

AdamW, linear warmup then cosine (or linear) decay, gradient clipping, true batching, AMP on CUDA
(bf16, or fp16 with a gradient scaler), model selection and early stopping on the validation split
(never on test; or the last weights, when a split has no validation part). All randomness
(shuffling, augmentation, box jitter, initialisation) comes from generators derived from the seed.

Augmentation sets (``augment_set``, training batches only, when ``augment``):

* ``project``: a random dihedral transform, a gain / offset change and a zoom / shift
  (:func:`augment`), with box-prompt jitter ``box_jitter``;
* ``reference``: the reference benchmark's ``SegmentationDataset._augment`` (``finetune.py``):
  horizontal flip (p 0.5), vertical flip (p 0.5), brightness / contrast ``alpha * x + beta`` with
  alpha in [0.8, 1.2] and beta in [-20, 20] / 255 (p 0.3) (:func:`augment_reference`); the box is
  the tight box of the moved mask, unjittered (set ``box_jitter`` 0).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import cv2
import numpy as np
import torch
from pydantic import Field

from medrobust_lib.config.common import AddedKeys, TrainLoop
from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.sample import Sample
from medrobust_lib.hashing import file_sha256
from medrobust_lib.metrics.segmentation import dice
from medrobust_lib.models.losses import dice_bce_loss
from medrobust_lib.models.sam import SamSegmenter, to_tensor_batch
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.schedule import linear_with_warmup


class TrainConfig(TrainLoop, AddedKeys):
    """The segmentation trainer's settings (:func:`train_segmenter`): the loop of
    :class:`~medrobust_lib.config.common.TrainLoop` plus the loss weights ``w_dice`` / ``w_bce``,
    ``box_jitter`` (box-prompt jitter, fraction of the box size), ``augment`` (the ``augment_set``
    augmentation), the reference's epoch-based budget and its recipe switches (``amp``,
    ``lr_schedule``, ``select``, ``lora_b_lr_factor``; left out of :func:`config_dict` at their
    defaults, so recipes fingerprinted before they existed keep their fingerprints)."""

    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("augment_set", "amp", "lr_schedule", "select", "lora_b_lr_factor")

    max_steps: int = 400
    batch_size: int = 8
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 20
    eval_every: int = 50
    w_dice: float = 0.7
    w_bce: float = 0.3
    box_jitter: float = 0.05
    augment: bool = True
    epochs: int | None = None
    """When set, ``max_steps`` becomes ``epochs`` x batches per epoch (the reference's budget)."""
    warmup_epochs: float | None = None
    """When set, ``warmup_steps`` becomes ``int(warmup_epochs x batches per epoch)`` (the reference: 0.1)."""
    encoder_lr_factor: float = 1.0
    """Learning-rate factor of the trainable parameters whose name contains ``encoder`` (the
    reference's ``build_optimizer`` for ``encoder_partial`` and ``full``: 0.1; its substring test
    also catches the prompt encoder)."""
    augment_set: Literal["project", "reference"] = "project"
    """Which augmentation ``augment`` applies (module docstring)."""
    amp: Literal["bf16", "fp16", "off"] = "bf16"
    """Mixed precision on CUDA (a CPU always trains in float32): ``bf16`` autocast; ``fp16``
    autocast with a gradient scaler (the reference's ``--use_amp``: ``torch.cuda.amp``); ``off``."""
    lr_schedule: Literal["cosine", "linear"] = "cosine"
    """After the warmup: ``cosine`` decay to 0 (the reference's ``build_scheduler``) or ``linear``
    decay to 0 (transformers' ``get_linear_schedule_with_warmup``, warmup included)."""
    select: Literal["best_val", "last"] = "best_val"
    """The weights kept: the best validation Dice, or the last step's (no validation split)."""
    lora_b_lr_factor: float = Field(default=1.0, gt=0)
    """Learning-rate factor of the LoRA ``B`` matrices (``.lora_B.`` in the name): LoRA+'s ratio."""


@dataclass
class TrainResult:
    best_val_dice: float
    best_step: int
    steps: int
    seconds: float
    history: list[dict[str, float]]
    stopped_early: bool


def lr_at(step: int, cfg: TrainConfig) -> float:
    """``lr_schedule`` cosine: linear warmup to cfg.lr (from ``lr / warmup_steps`` at step 0), then
    cosine decay to 0 at max_steps; no warmup when ``warmup_steps`` is 0. The reference's
    ``build_scheduler`` has the same shape (it uses 3.14159 for pi). ``linear``: transformers'
    ``get_linear_schedule_with_warmup`` (:func:`linear_with_warmup`)."""
    if cfg.lr_schedule == "linear":
        return cfg.lr * linear_with_warmup(step, cfg.warmup_steps, cfg.max_steps)
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def evaluate_dice(model: SamSegmenter, samples: Sequence[Sample], prompt: PromptConfig) -> float:
    """Mean Dice over samples with the evaluation prompt (no jitter)."""
    if not samples:
        return float("nan")
    boxes = [prompt_boxes(s, prompt) for s in samples]
    probs = model.predict([s.image for s in samples], boxes)
    scores = []
    for s, p in zip(samples, probs, strict=True):
        assert s.mask is not None
        scores.append(dice(p.max(axis=0) > 0.5 if len(p) else np.zeros_like(s.mask), s.mask))
    return float(np.mean(scores))


def augment(sample: Sample, rng: np.random.Generator) -> Sample:
    """A random dihedral transform (flips / 90-degree rotations) of image and mask plus a mild
    gain/offset change, for training only; the prompt box is re-derived from the moved mask."""
    k = int(rng.integers(4))
    flip = bool(rng.integers(2))
    gain, offset = rng.uniform(0.85, 1.15), rng.uniform(-0.08, 0.08)
    assert sample.mask is not None
    img, mask = np.rot90(sample.image, k, axes=(0, 1)), np.rot90(sample.mask, k)
    if flip:
        img, mask = img[:, ::-1], mask[:, ::-1]
    img = np.clip(img * gain + offset, 0.0, 1.0).astype(np.float32)
    # random zoom (0.8-1.25) and shift (up to 10%) about the centre; skipped if it loses the lesion
    h, w = mask.shape
    scale = float(np.exp(rng.uniform(np.log(0.8), np.log(1.25))))
    tx, ty = rng.uniform(-0.1, 0.1, 2) * (w, h)
    mat = cv2.getRotationMatrix2D((w / 2, h / 2), 0.0, scale)
    mat[:, 2] += (tx, ty)
    moved = cv2.warpAffine(np.ascontiguousarray(mask).astype(np.uint8), mat, (w, h), flags=cv2.INTER_NEAREST) > 0
    if moved.sum() >= 0.9 * mask.sum() * scale * scale:
        img = cv2.warpAffine(np.ascontiguousarray(img), mat, (w, h), flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REFLECT).reshape(img.shape)
        mask = moved
    return replace(sample, image=np.ascontiguousarray(img), mask=np.ascontiguousarray(mask), boxes=None)


def augment_reference(sample: Sample, rng: np.random.Generator) -> Sample:
    """The reference benchmark's training augmentation (``SegmentationDataset._augment``):
    horizontal flip (p 0.5), vertical flip (p 0.5), then with p 0.3 ``alpha * x + beta`` with alpha
    uniform in [0.8, 1.2] and beta uniform in [-20, 20] on the 0-255 scale (here / 255), clipped.
    The reference applies it to uint8 images and truncates the result to uint8; here it stays
    float32 in [0, 1]. The prompt box is re-derived from the moved mask: the tight box (the reference
    flips its stored tight box as x -> w - x, one pixel beyond the flipped mask's edge)."""
    assert sample.mask is not None
    img, mask = sample.image, sample.mask
    if rng.random() < 0.5:
        img, mask = img[:, ::-1], mask[:, ::-1]
    if rng.random() < 0.5:
        img, mask = img[::-1], mask[::-1]
    if rng.random() < 0.3:
        alpha = 0.8 + rng.random() * 0.4
        beta = (-20 + rng.random() * 40) / 255.0
        img = np.clip(alpha * img + beta, 0.0, 1.0)
    return replace(sample, image=np.ascontiguousarray(img, dtype=np.float32), mask=np.ascontiguousarray(mask),
                   boxes=None)


AUGMENTATIONS: dict[str, Callable[[Sample, np.random.Generator], Sample]] = {
    "project": augment, "reference": augment_reference}
"""``augment_set`` -> the augmentation applied to a training sample."""


def _save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def batches_per_epoch(samples: Sequence[Sample], batch_size: int) -> int:
    """Batches in one epoch of :func:`train_segmenter` (one shape per batch): the usable samples
    (non-empty mask) grouped by image shape, each group split into ``ceil(n / batch_size)``."""
    shapes: dict[tuple[int, ...], int] = {}
    for s in samples:
        if s.mask is not None and s.mask.any():
            shapes[s.image.shape] = shapes.get(s.image.shape, 0) + 1
    return sum(-(-n // batch_size) for n in shapes.values())


def resolve_budget(cfg: TrainConfig, train: Sequence[Sample]) -> TrainConfig:
    """``cfg`` with ``epochs`` / ``warmup_epochs`` turned into ``max_steps`` / ``warmup_steps``."""
    spe = batches_per_epoch(train, cfg.batch_size)
    if cfg.epochs is not None:
        cfg = cfg.model_copy(update={"max_steps": max(1, cfg.epochs * spe)})
    if cfg.warmup_epochs is not None:
        cfg = cfg.model_copy(update={"warmup_steps": int(cfg.warmup_epochs * spe)})
    return cfg


def param_groups(named: Sequence[tuple[str, torch.nn.Parameter]], cfg: TrainConfig) -> list[dict[str, Any]]:
    """AdamW parameter groups: with ``encoder_lr_factor != 1`` the parameters whose name contains
    ``encoder`` (any case) train at ``lr x factor``, the others at ``lr``; with
    ``lora_b_lr_factor != 1`` the LoRA ``B`` matrices (``.lora_B.`` in the name) train at
    ``lr x lora_b_lr_factor`` (LoRA+: the reference's ``build_optimizer`` gives its ``lora_B``
    group ``lr x ratio`` and every other parameter ``lr``); otherwise one group."""
    if cfg.encoder_lr_factor == 1.0 and cfg.lora_b_lr_factor == 1.0:
        return [{"params": [p for _, p in named], "lr": cfg.lr}]
    by_lr: dict[float, list[torch.nn.Parameter]] = {}
    for n, p in named:
        if ".lora_B." in n:
            factor = cfg.lora_b_lr_factor
        else:
            factor = cfg.encoder_lr_factor if "encoder" in n.lower() else 1.0
        by_lr.setdefault(cfg.lr * factor, []).append(p)
    if cfg.lora_b_lr_factor == 1.0:  # the encoder split alone: encoder group first (as before)
        order = sorted(by_lr, key=lambda lr: lr != cfg.lr * cfg.encoder_lr_factor)
    else:
        order = list(by_lr)
    return [{"params": by_lr[lr], "lr": lr} for lr in order]


def train_segmenter(
    model: SamSegmenter, train: Sequence[Sample], val: Sequence[Sample], cfg: TrainConfig,
    *, trainable: Callable[[str], bool] | None = None, log: Callable[[str], None] | None = None,
    state_path: str | Path | None = None,
) -> TrainResult:
    """Train in place; at the end the model holds the best-on-validation weights and is in eval mode.

    ``trainable(name)`` selects parameters by name (default: all). Training images are grouped by
    shape; each batch is one shape (the demo images are all 256 x 256).

    ``state_path``: a resume file written at every evaluation (model and best weights, AdamW and
    LR-scheduler state, step, epoch, position in the epoch, early-stopping counters, history) and
    read back with ``torch.load(weights_only=True)`` when it exists, so an interrupted run continues
    where it stopped and ends with the same weights as an uninterrupted one (the data order and
    augmentation are functions of (seed, epoch, step)). The caller removes it after a finished run.
    The CPU generator state is saved too, so global-RNG dropout (LoRA) continues its stream; callers
    scope that generator (``seeding.scoped_torch_seed``) to make the run itself reproducible."""
    cfg = resolve_budget(cfg, train)
    named = [(n, p) for n, p in model.sam.named_parameters() if trainable is None or trainable(n)]
    for n, p in model.sam.named_parameters():
        p.requires_grad_(trainable is None or trainable(n))
    opt = torch.optim.AdamW(param_groups(named, cfg), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg) / cfg.lr)
    use_amp = model.device.type == "cuda" and cfg.amp != "off"
    amp_dtype = torch.float16 if cfg.amp == "fp16" else torch.bfloat16
    # fp16 needs loss scaling (the reference: torch.cuda.amp.GradScaler); bf16 has float32's range
    scaler = torch.amp.GradScaler("cuda") if use_amp and cfg.amp == "fp16" else None
    eval_prompt = PromptConfig()
    train_prompt = PromptConfig(jitter=cfg.box_jitter, seed=cfg.seed)
    usable = [s for s in train if s.mask is not None and s.mask.any()]
    if not usable:
        raise ValueError("no training samples with a non-empty mask")
    if cfg.select == "best_val" and not val:
        raise ValueError("no validation samples to select the best step on: split off a validation part, or "
                         "keep the last weights (select: last)")
    augmenter = AUGMENTATIONS[cfg.augment_set]
    best = (-1.0, 0)
    best_state = {k: v.detach().clone() for k, v in model.sam.state_dict().items()}
    history: list[dict[str, float]] = []
    bad_evals = 0
    t0 = time.perf_counter()
    step = 0
    epoch = 0
    skip = 0  # batches of the current epoch already trained (resume)
    stopped = False
    spath = Path(state_path) if state_path is not None else None
    # a resume file from another configuration (or other data / trainable set) is not resumed
    run_key = json.dumps([config_dict(cfg), sorted(n for n, p in model.sam.named_parameters() if p.requires_grad),
                          sorted((s.dataset, s.sample_id) for s in usable)], sort_keys=True, default=str)
    st = torch.load(spath, map_location=model.device, weights_only=True) if spath and spath.is_file() else None
    if st is not None and st.get("run_key") != run_key:
        if log:
            log(f"ignoring {spath}: it was written by a different training configuration")
        st = None
    if st is not None:
        model.sam.load_state_dict(st["model"])
        best_state = st["best_state"]
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        if scaler is not None and "scaler" in st:
            scaler.load_state_dict(st["scaler"])
        step, epoch, skip = int(st["step"]), int(st["epoch"]), int(st["batch_pos"])
        best, bad_evals = (float(st["best_val"]), int(st["best_step"])), int(st["bad_evals"])
        history = list(st["history"])
        torch.set_rng_state(st["torch_rng"])  # dropout (LoRA) continues its random stream
        stopped = bool(st["stopped"])
        if log:
            log(f"resumed from {spath} at step {step} (epoch {epoch}, batch {skip})")
    while step < cfg.max_steps and not stopped:
        order = rng_for(cfg.seed, "train-order", epoch).permutation(len(usable))
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i in order:
            by_shape.setdefault(usable[i].image.shape[:2], []).append(int(i))
        batches = [idx[j : j + cfg.batch_size] for idx in by_shape.values() for j in range(0, len(idx), cfg.batch_size)]
        for pos, bi in enumerate(rng_for(cfg.seed, "batch-order", epoch).permutation(len(batches))):
            if pos < skip:
                continue
            batch = [usable[i] for i in batches[bi]]
            if cfg.augment:
                batch = [augmenter(s, rng_for(cfg.seed, "augment", step, s.dataset, s.sample_id)) for s in batch]
            model.sam.train()
            x = to_tensor_batch([s.image for s in batch]).to(model.device)
            boxes = torch.as_tensor(np.stack([prompt_boxes(s, train_prompt, salt=f"e{epoch}")[0] for s in batch]))
            y = torch.from_numpy(np.stack([np.asarray(s.mask) for s in batch]).astype(np.float32))[:, None].to(model.device)
            with torch.autocast(device_type=model.device.type, dtype=amp_dtype, enabled=use_amp):
                logits = model.forward_logits(x, boxes)
            loss = dice_bce_loss(logits.float(), y, cfg.w_dice, cfg.w_bce)
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.grad_clip)
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.grad_clip)
                opt.step()
            sched.step()
            step += 1
            out_of_time = cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s
            if step % cfg.eval_every == 0 or step >= cfg.max_steps or out_of_time:
                model.sam.eval()
                vd = evaluate_dice(model, val, eval_prompt) if val else float("nan")
                history.append({"step": step, "loss": float(loss.detach()), "val_dice": vd})
                if log:
                    log(f"step {step} loss {float(loss.detach()):.4f} val_dice {vd:.4f}")
                if cfg.select == "last" or vd > best[0]:  # "last": every evaluation keeps the current weights
                    best = (vd, step)
                    best_state = {k: v.detach().clone() for k, v in model.sam.state_dict().items()}
                    bad_evals = 0
                else:
                    bad_evals += 1
                    if bad_evals >= cfg.patience:
                        stopped = True
                if out_of_time:
                    stopped = True
                if spath is not None:
                    last = pos + 1 >= len(batches)
                    _save_state(spath, {
                        "model": model.sam.state_dict(), "best_state": best_state, "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "step": step, "epoch": epoch + 1 if last else epoch,
                        "batch_pos": 0 if last else pos + 1, "best_val": best[0], "best_step": best[1],
                        "bad_evals": bad_evals, "history": history, "stopped": stopped, "run_key": run_key,
                        "torch_rng": torch.get_rng_state(),
                        **({"scaler": scaler.state_dict()} if scaler is not None else {})})
            if step >= cfg.max_steps or stopped:
                break
        epoch += 1
        skip = 0
    model.sam.load_state_dict(best_state)
    model.sam.eval()
    for p in model.sam.parameters():
        p.requires_grad_(True)
    return TrainResult(best[0], best[1], step, time.perf_counter() - t0, history, stopped)


def save_checkpoint(model: SamSegmenter, folder: str | Path, meta: dict[str, Any]) -> Path:
    """``model.safetensors`` plus ``config.json`` (family, arch, provenance and ``weights_sha256``,
    the SHA-256 of the safetensors file)."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.sam.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp))
    meta = {**meta, "weights_sha256": file_sha256(tmp)}  # what a reuse of this checkpoint checks
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    return out / "model.safetensors"


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The settings as recorded and fingerprinted (``ADDED_KEYS`` left out at their defaults)."""
    return cfg.model_dump()
