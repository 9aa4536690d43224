"""Fine-tuning strategies end to end on a small demo: every strategy trains only its parameters,
saves a checkpoint the ordinary loader reads, and reports val (selection) and test numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.models.sam import load_segmenter
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.finetune.strategy_runs import finetune_strategy
from medrobust_lib.tracks.segmentation.model import seg_splits, train_base_checkpoint
from medrobust_lib.training.strategies import STRATEGIES
from tests.suite_helpers import write_suite

SEG = {"models": [{"id": "tiny-sam", "family": "sam", "arch": "tiny", "checkpoint": "trained"}],
       "train": {"max_steps": 20, "eval_every": 10, "time_budget_s": 60}, "split": "all",
       "finetune": {"base": "tiny-sam", "encoder_blocks": 1, "strategies": list(STRATEGIES),
                    "train": {"max_steps": 4, "eval_every": 2, "batch_size": 4, "time_budget_s": 30}}}


@pytest.fixture(scope="module")
def ft_suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("ft")
    suite = load_suite(write_suite(root, demo_root, modalities=["ct", "dermoscopy"], segmentation=SEG))
    for m in suite.modalities:
        build_clean_index(suite, m)
    train_base_checkpoint(suite, "tiny-sam")
    return suite


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_checkpoint_loads_and_reports(ft_suite: Suite, strategy: str) -> None:
    out = finetune_strategy(ft_suite, strategy)
    assert 0 < out.n_trainable <= out.n_total and (out.n_trainable == out.n_total) == (strategy == "full")
    assert 0.0 <= out.val_dice <= 1.0 and 0.0 <= out.test_dice <= 1.0 and out.steps <= 4
    cfg = json.loads((Path(out.checkpoint).parent / "config.json").read_text())
    assert cfg["strategy"] == strategy and cfg["n_trainable"] == out.n_trainable
    model = load_segmenter("sam", "tiny", out.checkpoint)  # LoRA merged, adapters detected
    sample = seg_splits(ft_suite)["test"][0]
    prob = model.predict([sample.image], [prompt_boxes(sample, PromptConfig())])[0]
    assert prob.shape[1:] == sample.image.shape[:2] and np.isfinite(prob).all()


def test_unknown_strategy_is_refused(ft_suite: Suite) -> None:
    with pytest.raises(ValueError, match="not configured"):
        finetune_strategy(ft_suite, "prompt_tuning")


def _with_lr(suite: Suite, lr: float) -> Suite:
    ft = suite.segmentation.finetune
    assert ft is not None
    ft = ft.model_copy(update={"train": ft.train.model_copy(update={"lr": lr})})
    return suite.model_copy(update={"segmentation": suite.segmentation.model_copy(update={"finetune": ft})})


def test_a_checkpoint_of_the_same_recipe_is_kept(ft_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run keeps a checkpoint trained from the same recipe instead of training it again;
    another recipe (here the learning rate) or weights that are not the recorded ones train again."""
    from medrobust_lib.training import train

    first = finetune_strategy(ft_suite, "decoder_only")  # trained here, or by the test above
    path = Path(first.checkpoint)
    stamp = path.stat().st_mtime_ns

    def no_training(*_: object, **__: object) -> None:
        raise RuntimeError("trained again")

    monkeypatch.setattr(train, "train_segmenter", no_training)
    kept = finetune_strategy(ft_suite, "decoder_only")
    assert kept.reused and kept.checkpoint == first.checkpoint and path.stat().st_mtime_ns == stamp
    assert (kept.val_dice, kept.test_dice, kept.n_trainable, kept.steps) == (
        first.val_dice, first.test_dice, first.n_trainable, first.steps)
    # the base model's evaluation-only settings are not part of the recipe
    models = [m.model_copy(update={"batch_size": 3, "levels": [2]}) for m in ft_suite.segmentation.models]
    eval_changed = ft_suite.model_copy(update={"segmentation": ft_suite.segmentation.model_copy(
        update={"models": models})})
    assert finetune_strategy(eval_changed, "decoder_only").reused
    with pytest.raises(RuntimeError, match="trained again"):
        finetune_strategy(_with_lr(ft_suite, 0.123), "decoder_only")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the weights are not the ones config.json records
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="trained again"):
        finetune_strategy(ft_suite, "decoder_only")
