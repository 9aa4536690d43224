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
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from medrobust_lib.config.common import AddedKeys, TrainLoop
from medrobust_lib.models.vlm_conventions import CONVENTIONS, conventions_for, encode_prompts, prompt_text
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.schedule import linear_with_warmup

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


class VLMTrainConfig(TrainLoop, AddedKeys):
    """The VLM trainer's settings (:func:`train_vlm`): the loop of
    :class:`~medrobust_lib.config.common.TrainLoop` plus how the best step is selected, per-parameter
    learning-rate factors, gradient accumulation and the learning-rate schedule."""

    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("lr_schedule",)

    max_steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 100
    select_on: Literal["loss", "first_token_accuracy"] = "loss"
    """``loss`` (mean validation loss) or ``first_token_accuracy`` (closed-answer tasks)."""
    lr_scales: tuple[tuple[str, float], ...] = ()
    """(parameter-name prefix, factor) pairs: a trainable parameter whose name starts with the first
    matching prefix learns at factor x the scheduled learning rate (1 for the rest)."""
    grad_accumulation: int = 1
    """Micro-batches of ``batch_size`` whose mean gradient makes one optimizer step."""
    lr_schedule: Literal["cosine", "linear"] = "cosine"
    """After the warmup: ``cosine`` decay to 0, or ``linear``: transformers'
    ``get_linear_schedule_with_warmup`` (warmup from 0 included), as the reference trains its VLM LoRA."""


def adapter_train_config(ft: Any, n_train: int, seed: int) -> VLMTrainConfig:
    """The :class:`VLMTrainConfig` of a VLM adapter from the suite's ``vlm.finetune`` settings
    (:class:`medrobust_lib.config.vlm.VLMFinetuneSettings`): ``epochs`` become optimizer steps
    (``ceil(n_train / (batch_size x grad_accumulation))`` per epoch) and ``warmup_ratio`` a share of them."""
    per_step = ft.batch_size * ft.grad_accumulation
    steps = ft.max_steps if ft.epochs is None else max(1, ft.epochs * -(-n_train // per_step))
    warmup = ft.warmup_steps if ft.warmup_ratio is None else int(ft.warmup_ratio * steps)
    return VLMTrainConfig(max_steps=steps, batch_size=ft.batch_size, lr=ft.lr, weight_decay=ft.weight_decay,
                          warmup_steps=warmup, eval_every=ft.eval_every, patience=ft.patience,
                          time_budget_s=ft.time_budget_s, seed=seed, grad_accumulation=ft.grad_accumulation,
                          lr_schedule=ft.lr_schedule)


SEQ_KEYS = ("token_type_ids", "mm_token_type_ids", "cross_attention_mask")
"""Processor outputs aligned with the token sequence, shape (1, L, ...): Gemma 3 / PaliGemma
``token_type_ids``, Qwen2-VL ``mm_token_type_ids``, Mllama ``cross_attention_mask``. Every other
non-text output (``pixel_values``, ``image_grid_thw``, ``image_sizes``, ``pixel_attention_mask``,
``aspect_ratio_ids``, ...) belongs to the image."""


@dataclass
class EncodedSet:
    """Tokenised examples: ``ids[i]`` int64 (L_i,), ``labels[i]`` int64 (L_i,) with -100 on the
    prompt; ``image_row[i]`` indexes ``image_inputs`` (-1 = no image), whose entries are the
    processor's image tensors for one image (leading dimension of one image: e.g. LLaVA
    ``pixel_values`` (1, 3, S, S), Qwen2-VL (patches, D) with ``image_grid_thw`` (1, 3));
    ``seq_extras[i]`` holds the sequence-aligned tensors of example i, (L_i, ...)."""

    ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    image_row: list[int]
    image_inputs: list[dict[str, torch.Tensor]]
    tasks: list[str]
    seq_extras: list[dict[str, torch.Tensor]] = field(default_factory=list)
    per_sample_images: bool = False

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


def _conventions(processor: Any, model_type: str | None) -> Any:

    return conventions_for(model_type or _model_type_of(processor))


def _model_type_of(processor: Any) -> str:
    """The architecture family from the processor class (LlavaProcessor -> llava); the trainer has
    no model config at hand. An unknown processor gives its own name, which
    :func:`~medrobust_lib.models.vlm_conventions.conventions_for` refuses."""

    name = type(processor).__name__.lower().replace("_", "").removesuffix("processor")
    for conv in CONVENTIONS:
        for t in conv.model_types:
            if name == t.replace("_", ""):
                return t
    return name


def chat_prompt(processor: Any, question: str, with_image: bool, model_type: str | None = None) -> str:
    """The generation prompt for one user turn (the same prompt evaluation uses)."""

    return prompt_text(processor, _conventions(processor, model_type), question, with_image)


def encode_examples(processor: Any, examples: Sequence[VLMExample], model_type: str | None = None) -> EncodedSet:
    """Tokenise every example once and run the image processor once per distinct image key.

    The prompt is the one evaluation uses, encoded by the processor with the image, so the image
    placeholder expands to the architecture's token count for that image size (fixed for LLaVA,
    size-dependent for Qwen2-VL's pixel budget, LLaVA-NeXT's anyres, Idefics3's tiles, Mllama's
    tiles). Answer tokens extend the sequence-aligned outputs (``SEQ_KEYS``): token types take the
    family's ``answer_token_type`` (PaliGemma: 1, the causal suffix), Mllama's cross-attention mask
    repeats its last row (answers see the image like the prompt's end does)."""

    conv = _conventions(processor, model_type)
    tok = processor.tokenizer
    keys: dict[str, int] = {}
    image_inputs: list[dict[str, torch.Tensor]] = []
    ids: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    extras: list[dict[str, torch.Tensor]] = []
    rows: list[int] = []
    prompt_cache: dict[tuple[str, bool, tuple[int, ...]], tuple[list[int], dict[str, torch.Tensor]]] = {}
    for ex in examples:
        with_image = ex.image is not None
        pic = _rgb_u8(np.asarray(ex.image)) if ex.image is not None else None
        # the prompt's tokens depend on the image's size, never on its pixels
        ck = (ex.question, with_image, tuple(pic.shape[:2]) if pic is not None else ())
        new_image = pic is not None and ex.image_key not in keys
        if ck not in prompt_cache or new_image:
            text = prompt_text(processor, conv, ex.question, with_image)
            enc = encode_prompts(processor, conv, [text], [pic] if pic is not None else None)
            seq = {k: enc[k][0] for k in SEQ_KEYS if k in enc}
            prompt_cache.setdefault(ck, (enc["input_ids"][0].tolist(), seq))
            if new_image:
                keys[ex.image_key] = len(image_inputs)
                image_inputs.append({k: v for k, v in enc.items()
                                     if k not in SEQ_KEYS and k not in ("input_ids", "attention_mask")})
        prompt, seq = prompt_cache[ck]
        answer = tok(ex.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids.append(torch.tensor(prompt + answer, dtype=torch.long))
        labels.append(torch.tensor([IGNORE] * len(prompt) + answer, dtype=torch.long))
        extras.append({k: _extend(k, v, len(answer), conv.answer_token_type) for k, v in seq.items()})
        rows.append(keys[ex.image_key] if pic is not None else -1)
    return EncodedSet(ids, labels, rows, image_inputs, [ex.task for ex in examples], extras,
                      conv.per_sample_images)


def _extend(key: str, value: torch.Tensor, n: int, answer_token_type: int | None) -> torch.Tensor:
    """A sequence-aligned tensor (L, ...) extended by ``n`` answer positions."""
    if key == "cross_attention_mask":
        tail = value[-1:].expand(n, *value.shape[1:])
    elif key == "token_type_ids":
        tail = torch.full((n, *value.shape[1:]), answer_token_type or 0, dtype=value.dtype)
    else:
        tail = torch.zeros((n, *value.shape[1:]), dtype=value.dtype)
    return torch.cat([value, tail], dim=0)


def _stack_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0, zero-padding the other dimensions to their maximum (LLaVA-NeXT
    patches and Idefics3 tiles differ in number per image; zero tiles are padding to both)."""
    shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
    padded = []
    for p in parts:
        if list(p.shape[1:]) != shape:
            q = p.new_zeros((p.shape[0], *shape))
            q[tuple(slice(0, s) for s in p.shape)] = p
            p = q
        padded.append(p)
    return torch.cat(padded, dim=0)


def collate(data: EncodedSet, idx: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels, the sequence-aligned extras, and the
    image tensors of the examples that have an image (in batch order)."""
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
    if img and data.per_sample_images and len(img) != len(idx):
        raise ValueError("this architecture lays image tensors out per prompt (Mllama): a training batch cannot mix "
                         "examples with and without an image")
    extras = [data.seq_extras[i] if data.seq_extras else {} for i in idx]
    for key in dict.fromkeys(k for e in extras for k in e):  # union, in first-seen order; absent = zeros
        first = next(e[key] for e in extras if key in e)
        t = first.new_zeros((len(idx), n, *first.shape[1:]))
        for r, e in enumerate(extras):
            if key in e:
                t[r, : e[key].shape[0]] = e[key]
        out[key] = t
    if img:
        for key in data.image_inputs[img[0]]:
            out[key] = _stack_padded([data.image_inputs[r][key] for r in img])
    return out


def on_model_device(batch: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """``batch`` on the device of ``model``'s first parameter (a model moved to a GPU trains on
    the CPU-collated batches; on the CPU nothing is copied)."""
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in batch.items()}


def example_losses(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over each example's answer tokens: float (B,)."""
    batch = on_model_device(batch, model)
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
        batch = on_model_device(collate(data, idx, pad_id), model)
        kw = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**kw).logits[:, :-1, :].float()
        target = batch["labels"][:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE, reduction="none")
        valid = target != IGNORE
        total += float((ce.sum(dim=1) / valid.sum(dim=1).clamp(min=1)).sum())
        first = valid.float().argmax(dim=1)
        rows = torch.arange(len(idx), device=logits.device)
        hits += int((logits[rows, first].argmax(dim=-1) == target[rows, first]).sum())
    model.train(was)
    return total / len(data), hits / len(data)


def mean_loss(model: Any, data: EncodedSet, pad_id: int, batch_size: int = 64) -> float:
    return evaluate_set(model, data, pad_id, batch_size)[0]


def _lr_at(step: int, cfg: VLMTrainConfig) -> float:
    if cfg.lr_schedule == "linear":
        return cfg.lr * linear_with_warmup(step, cfg.warmup_steps, cfg.max_steps)
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def train_vlm(model: Any, processor: Any, train: EncodedSet, val: EncodedSet, cfg: VLMTrainConfig,
              log: Callable[[str], None] | None = None) -> VLMTrainResult:
    """Train the parameters of ``model`` that require grad; restores the best-on-val weights (an
    empty ``val``, a suite whose ``splits`` have no validation share: the last weights)."""
    pad_id = int(processor.tokenizer.pad_token_id)
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            scale = next((f for prefix, f in cfg.lr_scales if name.startswith(prefix)), 1.0)
            groups.setdefault(float(scale), []).append(p)
    params = [p for ps in groups.values() for p in ps]
    if not params:
        raise ValueError("the model has no trainable parameters")
    opt = torch.optim.AdamW([{"params": ps, "scale": f} for f, ps in groups.items()], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
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
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg) * g["scale"]
        opt.zero_grad(set_to_none=True)
        for _ in range(cfg.grad_accumulation):
            if len(order) < cfg.batch_size:
                order.extend(rng.permutation(len(train)).tolist())
            idx, order = order[: cfg.batch_size], order[cfg.batch_size:]
            loss = example_losses(model, collate(train, idx, pad_id)).mean()
            (loss / cfg.grad_accumulation).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        out_of_time = cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s
        if step % cfg.eval_every == 0 or step == cfg.max_steps or out_of_time:
            if not len(val):  # no validation split (e.g. 80/20): the last weights are kept
                best = (float("nan"), step)
                history.append({"step": step, "train_loss": float(loss.detach()), "seconds": time.perf_counter() - t0})
                if out_of_time:
                    stopped = True
                    break
                continue
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
