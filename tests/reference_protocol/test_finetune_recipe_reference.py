"""The reference overlay's fine-tuning recipe equals the reference's, as its scripts run it.

Fixture ``finetune_recipe_reference.json`` (``tools/reference_protocol_fixtures.py``, section
``recipe``): the arguments ``Segmentation/jobgpu_with_finetune.sh`` passes to ``finetune.py`` for
every strategy, parsed by ``finetune.py``'s own parser into the ``FinetuneConfig`` its ``main``
builds; the 80/20 split; which evaluations read the fine-tune's ``data_split.json``; its
``SegmentationDataset._augment`` run with scripted random draws; and the VLM LoRA recipe
(``VLM/eval_vlm_perturbation.py``'s ``CONFIG``, the runner's ``--epochs``, its schedule).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.sample import Sample
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.tracks.finetune.strategy_runs import strategy_config, train_config
from medrobust_lib.training.train import augment_reference

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((Path(__file__).parent / "fixtures" / "finetune_recipe_reference.json").read_text())
OURS = {"adapter_only": "adapter"}


def _suite(tmp_path: Path, family: str) -> Suite:
    shutil.copy(ROOT / "configs" / "reference_protocol.yaml", tmp_path / "reference_protocol.yaml")
    body = {"overlays": ["reference_protocol.yaml"],
            "segmentation": {"models": [{"id": "base", "family": family, "arch": "vit_b", "checkpoint": "/w/b.pth"}],
                             "finetune": {"base": "base"}}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(body))
    return load_suite(tmp_path / "suite.yaml")


def test_the_overlay_runs_the_reference_strategies(tmp_path: Path) -> None:
    ft = _suite(tmp_path, "sam_med2d").segmentation.finetune
    assert ft is not None
    assert ft.strategies == [OURS.get(s, s) for s in REF["strategies"]["sammed2d"]]
    assert set(REF["strategies"]["medsam"]) <= set(ft.strategies)  # a MedSAM base: drop adapter by hand


@pytest.mark.parametrize("family", ["medsam", "sam_med2d"])
@pytest.mark.parametrize("strategy", list(REF["configs"]))
def test_each_strategy_trains_with_the_reference_settings(strategy: str, family: str, tmp_path: Path) -> None:
    ref = REF["configs"][strategy]
    ft = _suite(tmp_path, family).segmentation.finetune
    assert ft is not None
    ours = OURS.get(strategy, strategy)
    sc, tc = strategy_config(ft, ours, family), train_config(ft, ours, seed=0)
    assert (ft.train.epochs, tc.lr, tc.batch_size, tc.weight_decay) == (
        ref["num_epochs"], ref["learning_rate"], ref["batch_size"], ref["weight_decay"])
    assert (ft.train.warmup_epochs, tc.grad_clip) == (ref["warmup_epochs"], ref["max_grad_norm"])
    assert ref["gradient_accumulation_steps"] == 1  # one optimizer step per batch, as here
    # build_optimizer: the encoder factor for encoder_partial / full only, LoRA+'s ratio for the B matrices
    assert tc.encoder_lr_factor == (ref["encoder_lr_scale"] if strategy in ("encoder_partial", "full") else 1.0)
    assert tc.lora_b_lr_factor == (ref["lora_plus_lr_ratio"] if strategy.startswith("lora_plus") else 1.0)
    assert sc.encoder_blocks == ref["unfreeze_encoder_layers"]
    if strategy.startswith("lora"):
        assert (sc.lora.r, sc.lora.alpha, sc.lora.dropout) == (ref["lora_r"], ref["lora_alpha"], ref["lora_dropout"])
    assert tc.amp == ("fp16" if ref["use_amp"] else "off")  # torch.cuda.amp: float16 autocast + GradScaler
    assert tc.lr_schedule == REF["scheduler"] == "cosine"


def test_the_split_and_what_each_model_is_scored_on(tmp_path: Path) -> None:
    s = _suite(tmp_path, "medsam")
    ft = s.segmentation.finetune
    assert ft is not None
    test = REF["split"]["test_split"]
    assert not REF["split"]["validation"]
    assert (s.splits.train, s.splits.val, s.splits.test) == pytest.approx((1 - test, 0.0, test))
    assert ft.train.select == "last"  # no validation split; the reference's pick on test is not reproduced
    # pipeline.py reads data_split.json (test files only) for the fine-tunes, not for the base models
    assert REF["evaluation_reads_data_split"] == {"finetuned": True, "pretrained": False}
    assert ft.eval.split == "test" and s.segmentation.split == "all" and s.perturbations.split == "all"


class _Draws:
    """A stand-in generator whose ``random()`` returns the scripted values in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


@pytest.mark.parametrize("case", range(len(REF["augmentation"]["cases"])))
def test_the_reference_augmentation(case: int, tmp_path: Path) -> None:
    ft = _suite(tmp_path, "medsam").segmentation.finetune
    assert ft is not None and ft.train.augmentation == "reference"
    tc = train_config(ft, "lora", 0)
    assert (tc.augment, tc.augment_set, tc.box_jitter) == (True, "reference", 0.0)  # tight boxes
    aug = REF["augmentation"]
    c = aug["cases"][case]
    img = (np.asarray(aug["image"], np.float32) / 255).astype(np.float32)
    s = Sample("s", "d", "dermoscopy", img, np.asarray(aug["mask"], bool))
    draws = _Draws(c["draws"])
    out = augment_reference(s, draws)  # type: ignore[arg-type]
    assert not draws.values  # the same number of draws, in the same order
    assert out.mask is not None
    np.testing.assert_array_equal(out.mask, np.asarray(c["mask"], bool))
    diff = out.image * 255 - np.asarray(c["image"], np.float64)
    assert diff.min() > -1e-3 and diff.max() < 1 + 1e-3  # the reference truncates to uint8; here float
    # the reference flips its stored box as x -> w - x (one pixel past the flipped mask's edge);
    # here the box is the tight box of the moved mask
    box = prompt_boxes(out, PromptConfig())[0]
    assert np.abs(np.asarray(box) - np.asarray(c["box"])).max() <= 1.0


def test_the_vlm_lora_recipe(tmp_path: Path) -> None:
    ref = REF["vlm"]
    f = _suite(tmp_path, "medsam").vlm.finetune
    assert (f.r, f.alpha, f.dropout, f.lr) == (ref["lora_r"], ref["lora_alpha"], ref["lora_dropout"], ref["learning_rate"])
    assert (f.batch_size, f.grad_accumulation, f.weight_decay, f.warmup_ratio) == (
        ref["batch_size"], ref["gradient_accumulation_steps"], ref["weight_decay"], ref["warmup_ratio"])
    assert f.epochs == ref["runner_epochs"] != ref["epochs"]  # the runner's --epochs 20 over CONFIG's 3
    assert f.lr_schedule == ref["schedule"] == "linear"
