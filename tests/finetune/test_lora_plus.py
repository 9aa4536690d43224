"""LoRA+ strategies, per-family LoRA targets, encoder_partial with SAM-Med2D's adapters, LoRA on a
convolution (the reference's SAM-Med2D patch embedding), on the tiny SAM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.config.segmentation import FinetuneConfig
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam, load_into
from medrobust_lib.tracks.finetune.strategy_runs import strategy_config, train_config
from medrobust_lib.training.strategies import (
    LORA_PLUS_LR_RATIO,
    StrategyConfig,
    apply_strategy,
    merge_lora,
    prepare_for_eval,
    state_dict_for_save,
)
from medrobust_lib.training.train import TrainConfig, param_groups

ENCODER_ATTN = [f"image_encoder.blocks.{i}.attn.{m}" for i in range(2) for m in ("qkv", "proj")]


def _segmenter(family: str = "sam") -> SamSegmenter:
    return SamSegmenter(build_sam(arch_for("tiny", family), seed=0), family, "tiny", "0")  # type: ignore[arg-type]


def _trainable(seg: SamSegmenter) -> set[str]:
    return {n for n, p in seg.sam.named_parameters() if p.requires_grad}


def _lora(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def test_lora_plus_encoder_trains_encoder_lora_and_the_whole_decoder() -> None:
    seg = _segmenter()
    rep = apply_strategy(seg, StrategyConfig("lora_plus_encoder"))
    assert list(rep.targets) == ENCODER_ATTN
    names = [n for n, _ in seg.sam.named_parameters()]
    assert _trainable(seg) == {n for n in names if _lora(n) or n.startswith(("mask_decoder.", "prompt_encoder."))}
    assert all(n.startswith("image_encoder.") for n in _trainable(seg) if _lora(n))


def test_lora_plus_decoder_trains_decoder_lora_and_the_prompt_encoder() -> None:
    seg = _segmenter()
    rep = apply_strategy(seg, StrategyConfig("lora_plus_decoder"))
    assert len(rep.targets) == 28 and all(t.startswith("mask_decoder.transformer.") for t in rep.targets)
    names = [n for n, _ in seg.sam.named_parameters()]
    assert _trainable(seg) == {n for n in names if _lora(n) or n.startswith("prompt_encoder.")}


def test_no_lora_modules_leaves_the_rest_of_the_strategy() -> None:
    """The reference's MedSAM lora_plus_encoder: no LoRA layer, decoder and prompt encoder in full."""
    seg, ref = _segmenter(), _segmenter()
    rep = apply_strategy(seg, StrategyConfig("lora_plus_encoder", lora_modules=False))
    assert rep.targets == ()
    assert rep.param_names == apply_strategy(ref, StrategyConfig("decoder_prompt")).param_names
    with pytest.raises(ValueError, match="needs LoRA modules"):
        apply_strategy(_segmenter(), StrategyConfig("lora", lora_modules=False))


def test_lora_plus_wraps_linear_modules_only_lora_also_convolutions() -> None:
    patch = r"image_encoder\.patch_embed\.proj"
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        apply_strategy(_segmenter(), StrategyConfig("lora_plus_encoder", lora=LoraSettings(target_regex=patch)))
    rep = apply_strategy(_segmenter(), StrategyConfig("lora", lora=LoraSettings(target_regex=r".*\.(qkv|proj)")))
    assert rep.targets == ("image_encoder.patch_embed.proj", *ENCODER_ATTN)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(2, 3, 64, 64, generator=g), torch.tensor([[8.0, 10.0, 40.0, 44.0], [20.0, 16.0, 60.0, 50.0]])


@pytest.mark.parametrize("strategy,regex", [("lora", r".*\.(qkv|proj)"), ("lora_plus_decoder", None)])
def test_a_lora_strategy_saves_plain_weights(strategy: str, regex: str | None) -> None:
    """LoRA on the patch-embedding convolution and LoRA+ (whose checkpoints, like LoRA's, are merged)
    load strictly into a plain SAM and reproduce the model."""
    seg = _segmenter()
    apply_strategy(seg, StrategyConfig(strategy, lora=LoraSettings(target_regex=regex)), seed=3)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n, p in seg.sam.named_parameters():
            if ".lora_B." in n or n.startswith("prompt_encoder."):
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    prepare_for_eval(seg)
    x, boxes = _batch()
    with torch.no_grad():
        ref = seg.forward_logits(x, boxes)
    sd = state_dict_for_save(seg)
    fresh = build_sam(arch_for("tiny", "sam"), seed=1)
    load_into(fresh, sd, "merged")
    with torch.no_grad():
        torch.testing.assert_close(SamSegmenter(fresh, "sam", "p", "0").forward_logits(x, boxes), ref,
                                   atol=1e-5, rtol=0)
    assert merge_lora(seg) > 0 and set(seg.sam.state_dict()) == set(fresh.state_dict())


def test_lora_plus_b_matrices_learn_at_the_ratio() -> None:
    seg = _segmenter()
    rep = apply_strategy(seg, StrategyConfig("lora_plus_encoder"))
    named = [(n, p) for n, p in seg.sam.named_parameters() if rep.is_trainable(n)]
    cfg = TrainConfig(lr=1e-3, lora_b_lr_factor=LORA_PLUS_LR_RATIO)
    lr = {id(p): g["lr"] for g in param_groups(named, cfg) for p in g["params"]}
    for n, p in named:
        assert lr[id(p)] == pytest.approx(1e-3 * (16 if ".lora_B." in n else 1)), n
    # as the track builds it: the ratio for the LoRA+ strategies only, never the encoder factor with it
    ft = FinetuneConfig.model_validate({"base": "b", "lora_plus_lr_ratio": 8, "train": {"encoder_lr_factor": 0.1}})
    assert train_config(ft, "lora_plus_decoder", 0).lora_b_lr_factor == 8
    assert train_config(ft, "lora_plus_decoder", 0).encoder_lr_factor == 1.0
    assert train_config(ft, "lora", 0).lora_b_lr_factor == 1.0
    assert train_config(ft, "full", 0).encoder_lr_factor == 0.1


def test_encoder_partial_with_the_adapters_of_every_block() -> None:
    seg = _segmenter("sam_med2d")
    apply_strategy(seg, StrategyConfig("encoder_partial", encoder_blocks=1, encoder_partial_adapters=True))
    adapters = {n for n in _trainable(seg) if ".Adapter." in n}
    assert {int(n.split(".")[2]) for n in adapters} == {0, 1}  # block 0's adapter trains too
    assert not any(n.startswith("image_encoder.blocks.0.") and ".Adapter." not in n for n in _trainable(seg))
    plain = _segmenter("sam_med2d")
    apply_strategy(plain, StrategyConfig("encoder_partial", encoder_blocks=1))
    assert {n for n in _trainable(plain) if ".Adapter." in n} == {n for n in adapters if ".blocks.1." in n}
    sam = _segmenter()  # a model without adapters: unaffected
    a = apply_strategy(sam, StrategyConfig("encoder_partial", encoder_blocks=1, encoder_partial_adapters=True))
    b = apply_strategy(_segmenter(), StrategyConfig("encoder_partial", encoder_blocks=1))
    assert a.param_names == b.param_names


def test_lora_targets_per_strategy_and_family() -> None:
    ft = FinetuneConfig(base="b", lora=LoraSettings(r=4, target_regex="x"), lora_targets={
        "lora": {"*": "star", "sam_med2d": "med2d"}, "lora_plus_encoder": {"*": None}})
    assert ft.lora_for("lora", "sam_med2d")[0].target_regex == "med2d"
    assert ft.lora_for("lora", "medsam")[0].target_regex == "star"
    assert ft.lora_for("lora_plus_encoder", "medsam") == (ft.lora.model_copy(update={"target_regex": None}), False)
    settings, modules = ft.lora_for("lora_plus_decoder", "medsam")  # unlisted: the strategy's default
    assert modules and settings.target_regex is None and settings.r == 4
    assert FinetuneConfig(base="b", lora=LoraSettings(target_regex="x")).lora_for("lora", "sam")[0].target_regex == "x"
    sc = strategy_config(ft, "lora_plus_encoder", "medsam")
    assert not sc.lora_modules and sc.lora_plus_lr_ratio == 16


@pytest.mark.parametrize("bad,match", [
    ({"lora_targets": {"full": {"*": "x"}}}, "adds no LoRA layers"),
    ({"lora_targets": {"lora": {"vit": "x"}}}, "unknown family"),
    ({"lora_targets": {"lora": {"*": None}}}, "nothing to train"),
    ({"lora_targets": {"lora_plus_decoder": {"*": "("}}}, "invalid regex"),
    ({"strategies": ["lora", "lora_plus"]}, "unknown fine-tuning strategies"),
    ({"lora_plus_lr_ratio": 0}, "greater than 0"),
])
def test_bad_finetune_settings_are_refused(bad: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FinetuneConfig(base="b", **bad)  # type: ignore[arg-type]


def test_new_settings_stay_out_of_the_dumps_at_their_defaults() -> None:
    """Fingerprints of suites that do not set them (the demo's recipes, its committed weights) are
    unchanged: the dumps that enter them have exactly the keys they had before."""
    from medrobust_lib.config.vlm import VLMFinetuneSettings
    from medrobust_lib.training.train import config_dict

    assert set(FinetuneConfig(base="b").model_dump()) == {
        "base", "strategies", "encoder_blocks", "adapter_ratio", "lora", "train", "eval", "gate"}
    assert "augmentation" not in FinetuneConfig(base="b").model_dump()["train"]
    assert "split" not in FinetuneConfig(base="b").model_dump()["eval"]
    assert set(config_dict(TrainConfig())) == {
        "max_steps", "batch_size", "lr", "eval_every", "patience", "time_budget_s", "weight_decay", "warmup_steps",
        "grad_clip", "seed", "w_dice", "w_bce", "box_jitter", "augment", "epochs", "warmup_epochs",
        "encoder_lr_factor"}
    assert config_dict(TrainConfig(amp="fp16", select="last"))["amp"] == "fp16"
    assert "lr_schedule" not in VLMFinetuneSettings().model_dump()
    assert VLMFinetuneSettings(lr_schedule="linear").model_dump()["lr_schedule"] == "linear"
    assert np.isclose(TrainConfig().lora_b_lr_factor, 1.0)
