"""Fine-tuning hyperparameters as the reference: per-parameter learning rates (encoder lr factor
0.1 for encoder_partial / full) and the warmup + cosine schedule equal the reference's
``build_optimizer`` / ``build_scheduler`` (fixtures from ``tools/reference_protocol_fixtures.py``),
and the epoch budget resolves to steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.data.sample import Sample
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.training.strategies import StrategyConfig, apply_strategy
from medrobust_lib.training.train import TrainConfig, batches_per_epoch, lr_at, param_groups, resolve_budget

DATA = json.loads((Path(__file__).parent / "fixtures" / "finetune_reference.json").read_text())


@pytest.mark.parametrize("strategy", ["encoder_partial", "full"])
def test_parameter_learning_rates_equal_the_reference(strategy: str) -> None:
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")
    report = apply_strategy(seg, StrategyConfig(name=strategy, encoder_blocks=DATA["encoder_blocks"]))
    named = [(n, p) for n, p in seg.sam.named_parameters() if report.is_trainable(n)]
    cfg = TrainConfig(lr=DATA["lr"], encoder_lr_factor=DATA["encoder_lr_scale"])
    names = {id(p): n for n, p in named}
    got = {names[id(p)]: g["lr"] for g in param_groups(named, cfg) for p in g["params"]}
    assert got == pytest.approx(DATA["param_lr"][strategy], rel=1e-12)


def test_schedule_equals_the_reference() -> None:
    sc = DATA["schedule"]
    spe = sc["steps_per_epoch"]
    cfg = TrainConfig(lr=1.0, max_steps=sc["epochs"] * spe, warmup_steps=int(sc["warmup_epochs"] * spe))
    ours = [lr_at(step, cfg) for step in range(len(sc["factors"]))]
    assert ours == pytest.approx(sc["factors"], abs=1e-5)  # the reference's pi is 3.14159


def test_epochs_resolve_to_steps() -> None:
    mask = np.zeros((16, 16), bool)
    mask[4:8, 4:8] = True
    train = [Sample(f"s{i}", "d", "ct", np.zeros((16, 16) if i < 10 else (16, 20), np.float32), mask if i < 10
                    else np.pad(mask, ((0, 0), (0, 4)))) for i in range(13)]
    assert batches_per_epoch(train, 4) == 3 + 1
    cfg = resolve_budget(TrainConfig(batch_size=4, epochs=20, warmup_epochs=0.1), train)
    assert (cfg.max_steps, cfg.warmup_steps) == (80, 0)
    assert resolve_budget(TrainConfig(max_steps=7), train).max_steps == 7


def test_vlm_adapter_budget_in_epochs() -> None:
    from medrobust_lib.config.vlm import VLMFinetuneSettings
    from medrobust_lib.training.vlm_train import adapter_train_config

    ft = VLMFinetuneSettings(r=128, alpha=256, lr=2e-4, epochs=3, batch_size=64, grad_accumulation=4,
                             weight_decay=0.0, warmup_ratio=0.03)
    cfg = adapter_train_config(ft, n_train=1000, seed=0)
    assert (cfg.max_steps, cfg.warmup_steps, cfg.grad_accumulation, cfg.batch_size) == (12, 0, 4, 64)
    assert (cfg.lr, cfg.weight_decay) == (2e-4, 0.0)
    default = adapter_train_config(VLMFinetuneSettings(), n_train=1000, seed=0)
    assert (default.max_steps, default.warmup_steps, default.grad_accumulation) == (400, 30, 1)


def test_reference_lora_targets_adapt_only_the_mask_decoder() -> None:
    """MedSAM's (and every non-SAM-Med2D model's) LoRA in the overlay: the decoder's q/v projections
    (SAM-Med2D's: tests/reference_protocol/test_finetune_strategies_reference.py)."""
    import yaml

    over = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "reference_protocol.yaml").read_text())
    ft = over["segmentation"]["finetune?"]
    lora = {**ft["lora"], "target_regex": ft["lora_targets"]["lora"]["*"]}
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")
    report = apply_strategy(seg, StrategyConfig(name="lora", lora=LoraSettings(**lora)))
    trained = [n for n, _ in seg.sam.named_parameters() if report.is_trainable(n)]
    assert trained and all(n.startswith("mask_decoder.") and "lora_" in n for n in trained)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in trained} == {"q_proj", "v_proj"}
