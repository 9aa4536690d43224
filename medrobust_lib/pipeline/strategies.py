"""Fine-tuning strategies for the segmentation track (issue 6): fine-tune a base SAM-family model
with one strategy on the train split, select on val, report test Dice, and save a checkpoint the
existing loader reads (LoRA merged into plain SAM weights; adapter checkpoints carry their adapter
keys and load into SAM + adapters).

Suite YAML (``segmentation.finetune``)::

    segmentation:
      finetune:
        base: tiny-sam                       # a segmentation.models id
        strategies: [full, decoder_only, decoder_prompt, encoder_partial, lora, adapter]
        encoder_blocks: 2                    # encoder_partial
        lora: {r: 8, alpha: 16, dropout: 0.05, targets: null}
        train: {max_steps: 200, lr: 0.0005, batch_size: 8, eval_every: 25, patience: 3, time_budget_s: 30}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from medrobust_lib.config import Suite
from medrobust_lib.data.sample import Sample


class LoraOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    targets: str | None = None


class FinetuneTrain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: int = 200
    lr: float = 5e-4
    batch_size: int = 8
    eval_every: int = 25
    patience: int = 3
    time_budget_s: float | None = 30.0


class FinetuneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str
    strategies: list[str] = Field(default_factory=lambda: ["full", "decoder_only", "decoder_prompt",
                                                           "encoder_partial", "lora", "adapter"])
    encoder_blocks: int = 2
    adapter_ratio: float = 0.25
    lora: LoraOptions = Field(default_factory=lambda: LoraOptions())
    train: FinetuneTrain = Field(default_factory=lambda: FinetuneTrain())


def finetune_config(suite: Suite) -> FinetuneConfig | None:
    raw = getattr(suite, "segmentation", None) or {}
    ft = raw.get("finetune") if isinstance(raw, dict) else None
    return None if ft is None else FinetuneConfig.model_validate(ft)


def strategy_dir(suite: Suite, base: str, strategy: str) -> Path:
    return Path(suite.results_dir).parent / "checkpoints" / f"{base}-{strategy}"


def seg_splits(suite: Suite) -> dict[str, list[Sample]]:
    """Train / val / test samples with a non-empty mask over every modality (hash-based split)."""
    from medrobust_lib.pipeline.datasets import load_clean_samples

    splits: dict[str, list[Sample]] = {"train": [], "val": [], "test": []}
    for modality in suite.modalities:
        for name in splits:
            for items in load_clean_samples(suite, modality, split=name).values():
                splits[name].extend(s for s in items if s.mask is not None and s.mask.any())
    return splits


@dataclass
class StrategySummary:
    strategy: str
    checkpoint: str
    n_trainable: int
    n_total: int
    trainable_modules: list[str]
    val_dice: float
    test_dice: float
    base_val_dice: float
    steps: int
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)


def finetune_strategy(suite: Suite, strategy: str, log: Callable[[str], None] | None = None) -> StrategySummary:
    """Fine-tune the configured base model with one strategy and save
    ``var/checkpoints/<base>-<strategy>/model.safetensors`` + ``config.json``."""
    from medrobust_lib.finetune.strategies import (
        StrategyConfig,
        apply_strategy,
        merge_lora,
        prepare_for_eval,
    )
    from medrobust_lib.finetune.train import (
        TrainConfig,
        config_dict,
        evaluate_dice,
        save_checkpoint,
        train_segmenter,
    )
    from medrobust_lib.pipeline.segmentation import load_model, model_config, seg_config

    t0 = time.perf_counter()
    ft = finetune_config(suite)
    if ft is None:
        raise ValueError("the suite has no segmentation.finetune section")
    if strategy not in ft.strategies:
        raise ValueError(f"strategy {strategy!r} is not configured; configured: {ft.strategies}")
    base = model_config(suite, ft.base)
    model = load_model(suite, base)
    splits = seg_splits(suite)
    prompt = seg_config(suite).prompt
    base_val = evaluate_dice(model, splits["val"], prompt)
    scfg = StrategyConfig(name=strategy, encoder_blocks=ft.encoder_blocks, lora_r=ft.lora.r, lora_alpha=ft.lora.alpha,
                          lora_dropout=ft.lora.dropout, lora_targets=ft.lora.targets, adapter_ratio=ft.adapter_ratio)
    report = apply_strategy(model, scfg, seed=suite.seed)
    tc = ft.train
    cfg = TrainConfig(max_steps=tc.max_steps, batch_size=tc.batch_size, lr=tc.lr, eval_every=tc.eval_every,
                      patience=tc.patience, time_budget_s=tc.time_budget_s, seed=suite.seed, warmup_steps=10)
    res = train_segmenter(model, splits["train"], splits["val"], cfg, trainable=report.is_trainable, log=log)
    prepare_for_eval(model)  # dropout (LoRA included) off for every number below
    test_dice = evaluate_dice(model, splits["test"], prompt)
    if strategy == "lora":
        merge_lora(model)  # plain SAM weights: the ordinary loader reads them
    meta = {"family": base.family, "arch": base.arch, "model_id": f"{ft.base}-{strategy}", "strategy": strategy,
            "base_model": ft.base, "base_checkpoint_sha256": model.checkpoint_hash, "train": config_dict(cfg),
            "val_dice": res.best_val_dice, "best_step": res.best_step, "test_dice": test_dice,
            "base_val_dice": base_val, **report.summary()}
    path = save_checkpoint(model, strategy_dir(suite, ft.base, strategy), meta)
    return StrategySummary(strategy, str(path), report.n_trainable, report.n_total, list(report.trainable_modules),
                           res.best_val_dice, test_dice, base_val, res.steps, time.perf_counter() - t0, meta)
