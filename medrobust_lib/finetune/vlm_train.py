"""Supervised training of a transformers image-text-to-text model on (image, question, answer) examples.

Used twice: to train the tiny demo LLaVA from scratch, and for LoRA fine-tuning (the caller wraps
the model with peft first; only parameters with ``requires_grad`` are optimised).

Each example becomes ``chat_prompt(question) + answer + eos``. The loss is next-token cross-entropy
on the answer tokens only: prompt tokens (including the expanded image tokens) and padding carry
label -100. Every example weighs the same, whatever its answer length, so one-token answers
(yes/no, a letter) are not drowned by captions. AdamW, linear warmup then cosine decay, gradient
clipping; model selection and early stopping on the validation loss (or the first-answer-token
accuracy, for closed answers), never on test. Shuffling
comes from a generator derived from the seed.

Images: float32 in [0, 1], (H, W) or (H, W, 3), or None for a text-only example.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from medrobust_lib.seeding import rng_for

IGNORE = -100


@dataclass(frozen=True)
class VLMExample:
    """One training example. ``image_key`` identifies the image (pixel values are computed once
    per key); ``task`` is free text used for per-task reporting."""

    image_key: str
    image: np.ndarray | None
    question: str
    answer: str
    task: str = ""


@dataclass(frozen=True)
class VLMTrainConfig:
    max_steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 30
    grad_clip: float = 1.0
    eval_every: int = 100
    patience: int = 4
    time_budget_s: float | None = None
    select_on: str = "loss"
    """``loss`` (mean validation loss) or ``first_token_accuracy`` (closed-answer tasks)."""
    seed: int = 0


@dataclass
class EncodedSet:
    """Tokenised examples: ``ids[i]`` int64 (L_i,), ``labels[i]`` int64 (L_i,) with -100 on the
    prompt; ``image_row[i]`` indexes ``pixel_values`` (n_images, 3, S, S) float32, -1 = no image."""

    ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    image_row: list[int]
    pixel_values: torch.Tensor | None
    tasks: list[str]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class VLMTrainResult:
    best_val_loss: float
    best_step: int
    steps: int
    seconds: float
    stopped_early: bool
    n_trainable: int
    history: list[dict[str, float]] = field(default_factory=list)


def _rgb_u8(image: np.ndarray) -> np.ndarray:
    u8 = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.repeat(u8[..., None], 3, axis=2) if u8.ndim == 2 else u8


def chat_prompt(processor: Any, question: str, with_image: bool) -> str:
    """The generation prompt for one user turn (the same template evaluation uses)."""
    content: list[dict[str, str]] = [{"type": "image"}] if with_image else []
    content.append({"type": "text", "text": question})
    return str(processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True))


def encode_examples(processor: Any, examples: Sequence[VLMExample]) -> EncodedSet:
    """Tokenise every example once and compute pixel values once per distinct image key."""
    tok = processor.tokenizer
    keys: dict[str, int] = {}
    pics: list[np.ndarray] = []
    ids: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    rows: list[int] = []
    prompt_cache: dict[tuple[str, bool], list[int]] = {}
    for ex in examples:
        with_image = ex.image is not None
        ck = (ex.question, with_image)
        if ck not in prompt_cache:
            text = chat_prompt(processor, ex.question, with_image)
            if with_image:  # the processor expands the image placeholder into the image tokens
                dummy = np.zeros((8, 8, 3), np.uint8)
                enc = processor(text=[text], images=[dummy], return_tensors="pt")
            else:
                enc = processor(text=[text], return_tensors="pt")
            prompt_cache[ck] = enc["input_ids"][0].tolist()
        prompt = prompt_cache[ck]
        answer = tok(ex.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids.append(torch.tensor(prompt + answer, dtype=torch.long))
        labels.append(torch.tensor([IGNORE] * len(prompt) + answer, dtype=torch.long))
        if with_image:
            if ex.image_key not in keys:
                keys[ex.image_key] = len(pics)
                assert ex.image is not None
                pics.append(_rgb_u8(np.asarray(ex.image)))
            rows.append(keys[ex.image_key])
        else:
            rows.append(-1)
    pv = processor.image_processor(pics, return_tensors="pt")["pixel_values"] if pics else None
    return EncodedSet(ids, labels, rows, pv, [ex.task for ex in examples])


def collate(data: EncodedSet, idx: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels, and pixel_values for the examples
    that have an image (in batch order)."""
    n = max(len(data.ids[i]) for i in idx)
    input_ids = torch.full((len(idx), n), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(idx), n), dtype=torch.long)
    for r, i in enumerate(idx):
        k = len(data.ids[i])
        input_ids[r, :k] = data.ids[i]
        labels[r, :k] = data.labels[i]
        mask[r, :k] = 1
    out = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    img = [data.image_row[i] for i in idx if data.image_row[i] >= 0]
    if img:
        assert data.pixel_values is not None
        out["pixel_values"] = data.pixel_values[img]
    return out


def example_losses(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over each example's answer tokens: float (B,)."""
    kw = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**kw).logits[:, :-1, :].float()
    target = batch["labels"][:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE, reduction="none")
    counts = (target != IGNORE).sum(dim=1).clamp(min=1)
    return ce.sum(dim=1) / counts


@torch.no_grad()
def evaluate_set(model: Any, data: EncodedSet, pad_id: int, batch_size: int = 64) -> tuple[float, float]:
    """(mean per-example loss, first-answer-token accuracy) over ``data``; the accuracy is the
    exact accuracy for one-token answers (yes/no, a letter) under greedy decoding."""
    if len(data) == 0:
        return float("nan"), float("nan")
    was = model.training
    model.eval()
    total = 0.0
    hits = 0
    for s in range(0, len(data), batch_size):
        idx = list(range(s, min(len(data), s + batch_size)))
        batch = collate(data, idx, pad_id)
        kw = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**kw).logits[:, :-1, :].float()
        target = batch["labels"][:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE, reduction="none")
        valid = target != IGNORE
        total += float((ce.sum(dim=1) / valid.sum(dim=1).clamp(min=1)).sum())
        first = valid.float().argmax(dim=1)
        rows = torch.arange(len(idx))
        hits += int((logits[rows, first].argmax(dim=-1) == target[rows, first]).sum())
    model.train(was)
    return total / len(data), hits / len(data)


def mean_loss(model: Any, data: EncodedSet, pad_id: int, batch_size: int = 64) -> float:
    return evaluate_set(model, data, pad_id, batch_size)[0]


def _lr_at(step: int, cfg: VLMTrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def train_vlm(model: Any, processor: Any, train: EncodedSet, val: EncodedSet, cfg: VLMTrainConfig,
              log: Callable[[str], None] | None = None) -> VLMTrainResult:
    """Train the parameters of ``model`` that require grad; restores the best-on-val weights."""
    pad_id = int(processor.tokenizer.pad_token_id)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = rng_for(cfg.seed, "vlm-train", "shuffle")
    order: list[int] = []
    best = (float("inf"), -1)
    best_score = float("inf")
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = []
    bad = 0
    t0 = time.perf_counter()
    step = 0
    stopped = False
    model.train()
    while step < cfg.max_steps:
        if len(order) < cfg.batch_size:
            order.extend(rng.permutation(len(train)).tolist())
        idx, order = order[: cfg.batch_size], order[cfg.batch_size:]
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        loss = example_losses(model, collate(train, idx, pad_id)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        out_of_time = cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s
        if step % cfg.eval_every == 0 or step == cfg.max_steps or out_of_time:
            vl, va = evaluate_set(model, val, pad_id)
            history.append({"step": step, "train_loss": float(loss.detach()), "val_loss": vl,
                            "val_first_token_acc": va, "seconds": time.perf_counter() - t0})
            if log:
                log(f"step {step}: train loss {float(loss.detach()):.4f}, val loss {vl:.4f}, val acc {va:.3f}")
            score = -va if cfg.select_on == "first_token_accuracy" else vl
            if score < best_score or (score == best_score and vl < best[0]):
                best, best_score, bad = (vl, step), score, 0
                best_state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            else:
                bad += 1
                if bad >= cfg.patience:
                    stopped = True
                    break
            if out_of_time:
                stopped = True
                break
    if best_state is not None:  # only the trained parameters were copied (frozen ones never change)
        model.load_state_dict(best_state, strict=False)
    model.eval()
    return VLMTrainResult(best[0], best[1], step, time.perf_counter() - t0, stopped,
                          sum(p.numel() for p in params), history)
