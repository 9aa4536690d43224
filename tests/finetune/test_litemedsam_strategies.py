"""Every fine-tuning strategy applies to LiteMedSAM (TinyViT encoder): what trains, that a step moves
only that, and that saved checkpoints load strictly and reproduce the model. The step and round-trip
tests run the strategies whose LiteMedSAM code differs from SAM's (TinyViT blocks, LoRA targets,
adapters) plus decoder_only; full / decoder_prompt select parameters by prefix exactly as for SAM
(tests/finetune/test_strategies.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from medrobust_lib.models.litemedsam import LiteMedSamSegmenter, build_litemedsam, load_litemedsam
from medrobust_lib.models.tinyvit_adapters import encoder_blocks
from medrobust_lib.training.strategies import (
    StrategyConfig,
    apply_strategy,
    merge_lora,
    prepare_for_eval,
    state_dict_for_save,
)


@pytest.fixture(autouse=True, scope="module")
def _two_threads() -> Iterator[None]:
    """LiteMedSAM (78.6 GFLOP per image) uses both cores, unlike the tiny models of this folder."""
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def _model() -> LiteMedSamSegmenter:
    return LiteMedSamSegmenter(build_litemedsam(seed=1), "litemedsam", "lite", "random", "cpu", engine="reference",
                               preprocess="default")


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand((1, 3, 96, 80), generator=g)
    boxes = torch.tensor([[10.0, 12.0, 60.0, 70.0]])
    y = torch.zeros((1, 1, 96, 80))
    y[..., 20:60, 15:50] = 1
    return x, boxes, y


def test_the_encoder_has_twelve_blocks_over_four_stages() -> None:
    names = [n for n, _ in encoder_blocks(build_litemedsam().image_encoder)]
    assert names[:2] == ["layers.0.blocks.0", "layers.0.blocks.1"] and names[-1] == "layers.3.blocks.1"
    assert len(names) == 12


def test_encoder_partial_trains_the_last_blocks_and_the_decoder() -> None:
    m = _model()
    rep = apply_strategy(m, StrategyConfig("encoder_partial", encoder_blocks=2))
    enc = {n.split(".attn")[0].split(".mlp")[0].split(".local_conv")[0] for n in rep.param_names
           if n.startswith("image_encoder.")}
    assert enc == {"image_encoder.layers.3.blocks.0", "image_encoder.layers.3.blocks.1"}
    assert any(n.startswith("mask_decoder.") for n in rep.param_names)
    assert not any(n.startswith(("image_encoder.neck", "image_encoder.patch_embed", "image_encoder.layers.2"))
                   for n in rep.param_names)
    with pytest.raises(ValueError, match="must be in 1..12"):
        apply_strategy(_model(), StrategyConfig("encoder_partial", encoder_blocks=13))


def test_lora_wraps_every_tinyvit_attention_and_the_decoder() -> None:
    rep = apply_strategy(_model(), StrategyConfig("lora"))
    enc = [t for t in rep.targets if t.startswith("image_encoder.")]
    assert len(enc) == 2 * 10  # qkv and proj of the 10 attention blocks (stages 1-3)
    assert "image_encoder.layers.3.blocks.1.attn.qkv" in enc
    assert any(t.startswith("mask_decoder.transformer.") for t in rep.targets)
    assert all(".lora_" in n for n in rep.param_names)


def test_adapters_start_as_the_identity_and_only_they_and_the_decoder_train(
        batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    x, boxes, _ = batch
    m = _model()
    with torch.no_grad():
        before = m.forward_logits(x, boxes)
    rep = apply_strategy(m, StrategyConfig("adapter"))
    assert rep.adapters_inserted
    with torch.no_grad():
        after = m.forward_logits(x, boxes)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert sum(".Adapter." in n for n in rep.param_names) == 10 * 6  # norm, down, up (weight + bias) per block
    assert all(n.startswith(("mask_decoder.", "prompt_encoder.")) or ".Adapter." in n for n in rep.param_names)


@pytest.mark.parametrize("name", ["encoder_partial", "lora", "adapter", "decoder_only"])
def test_one_step_moves_only_the_strategy_parameters(name: str,
                                                     batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    x, boxes, y = batch
    m = _model()
    rep = apply_strategy(m, StrategyConfig(name, encoder_blocks=2))
    before = {n: p.detach().clone() for n, p in m.sam.named_parameters()}
    m.sam.train()
    opt = torch.optim.SGD([p for p in m.sam.parameters() if p.requires_grad], lr=1e-1)
    loss = m.loss(m.forward_logits(x, boxes), y)
    loss.backward()
    opt.step()
    moved = {n for n, p in m.sam.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and moved <= set(rep.param_names)


@pytest.mark.parametrize("name", ["lora", "adapter"])
def test_saved_checkpoints_load_strictly_and_reproduce_the_model(
        name: str, tmp_path: Path, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    x, boxes, y = batch
    m = _model()
    apply_strategy(m, StrategyConfig(name))
    opt = torch.optim.SGD([p for p in m.sam.parameters() if p.requires_grad], lr=1e-2)
    m.sam.train()
    m.loss(m.forward_logits(x, boxes), y).backward()
    with torch.no_grad():  # make the LoRA B matrices non-zero too
        for n, p in m.sam.named_parameters():
            if ".lora_B." in n:
                p.add_(0.01)
    opt.step()
    prepare_for_eval(m)
    if name == "lora":
        merge_lora(m)
    with torch.no_grad():
        want = m.forward_logits(x, boxes)
    save_file({k: v.contiguous() for k, v in state_dict_for_save(m).items()}, str(tmp_path / "model.safetensors"))
    back = load_litemedsam(tmp_path / "model.safetensors", preprocess="default")
    with torch.no_grad():
        got = back.forward_logits(x, boxes)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    img = x[0].permute(1, 2, 0).numpy()
    assert back.predict([img], [boxes.numpy()])[0].shape == (1, 96, 80)
    assert np.isfinite(back.predict_logits([img], [boxes.numpy()])[0]).all()


def test_a_saved_strategy_checkpoint_builds_as_the_registry_builds_it(tmp_path: Path) -> None:
    """The registry loop and the gate rebuild a version from its config.json (family, arch) and
    model.safetensors (:func:`medrobust_lib.tracks.finetune.strategy_runs.registry_model_config`)."""
    import json

    from medrobust_lib.config.segmentation import SegModelConfig
    from medrobust_lib.models.factory import build_segmenter
    from medrobust_lib.training.train import save_checkpoint

    m = _model()
    apply_strategy(m, StrategyConfig("adapter"))
    path = save_checkpoint(m, tmp_path / "v1", {"family": m.family, "arch": "tinyvit", "strategy": "adapter"})
    meta = json.loads((tmp_path / "v1" / "config.json").read_text())
    cfg = SegModelConfig(id="lite-adapter-v1", family=meta["family"], arch=meta["arch"], checkpoint=str(path),
                         strategy=meta["strategy"])
    seg = build_segmenter(cfg, path)
    assert isinstance(seg, LiteMedSamSegmenter) and seg.model_id == "lite-adapter-v1"
    assert sum(".mlp.Adapter." in k for k in seg.sam.state_dict()) == 10 * 6
