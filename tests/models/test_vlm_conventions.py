"""The per-architecture conventions table and the trainer's batch assembly."""

from __future__ import annotations

import pytest
import torch

from medrobust_lib.models.vlm_conventions import CONVENTIONS, LM_PROJ_REGEX, VLMConventions, conventions_for
from medrobust_lib.training.vlm_train import EncodedSet, _stack_padded, collate


def test_every_model_type_has_one_entry() -> None:
    types = [t for c in CONVENTIONS for t in c.model_types]
    assert len(types) == len(set(types))
    assert {"llava", "llava_next", "gemma3", "qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "paligemma",
            "mllama"} <= set(types)
    assert conventions_for("gemma3").nest_images and not conventions_for("llava").nest_images
    assert not conventions_for("paligemma").chat_template
    with pytest.raises(ValueError, match=r"model_type 'some_new_vlm'; known: .*gemma3.*llava.*qwen2_vl") as err:
        conventions_for("some_new_vlm")
    assert all(t in str(err.value) for t in types)
    with pytest.raises(ValueError, match="count must be one of"):
        VLMConventions("x", ("x",), "vision_tower", "tiles")


@pytest.mark.parametrize(("name", "hit"), [
    ("model.language_model.layers.3.self_attn.q_proj", True),
    ("model.text_model.layers.0.mlp.down_proj", True),
    ("language_model.model.layers.1.self_attn.o_proj", True),
    ("model.vision_tower.encoder.layers.0.self_attn.q_proj", False),
    ("model.visual.blocks.0.attn.qkv", False),
    ("model.vision_model.encoder.layers.0.self_attn.k_proj", False),
    ("model.language_model.layers.1.cross_attn.q_proj", False),
    ("model.multi_modal_projector.linear_1", False),
])
def test_lora_regex_selects_language_model_projections_only(name: str, hit: bool) -> None:
    import re

    assert bool(re.fullmatch(LM_PROJ_REGEX, name)) is hit


def test_stack_padded_zero_pads_tiles() -> None:
    a, b = torch.ones(1, 5, 3, 2, 2), torch.full((1, 2, 3, 2, 2), 2.0)
    out = _stack_padded([a, b])
    assert out.shape == (2, 5, 3, 2, 2)
    assert torch.equal(out[1, :2], b[0]) and (out[1, 2:] == 0).all() and torch.equal(out[0], a[0])


def _set(per_sample: bool) -> EncodedSet:
    ids = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    labels = [torch.tensor([-100, 2, 3]), torch.tensor([-100, 5])]
    images = [{"pixel_values": torch.ones(1, 3, 4, 4)}]
    extras = [{"token_type_ids": torch.tensor([1, 0, 0])}, {}]
    return EncodedSet(ids, labels, [0, -1], images, ["", ""], extras, per_sample)


def test_collate_pads_extras_and_refuses_mixed_per_sample_batches() -> None:
    batch = collate(_set(False), [0, 1], pad_id=0)
    assert batch["token_type_ids"].tolist() == [[1, 0, 0], [0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["pixel_values"].shape == (1, 3, 4, 4)
    with pytest.raises(ValueError, match="cannot mix"):
        collate(_set(True), [0, 1], pad_id=0)
    assert collate(_set(True), [0], pad_id=0)["pixel_values"].shape == (1, 3, 4, 4)


def test_every_committed_demo_vlm_resolves_its_conventions() -> None:
    """Unknown architectures are refused, so every VLM the demo ships must be in the table."""
    import json
    from pathlib import Path

    import medrobust_lib.demo

    weights = Path(medrobust_lib.demo.__file__).parent / "weights"
    vlms = [json.loads(p.read_text()) for p in sorted(weights.glob("*/config.json"))]
    vlms = [c for c in vlms if "model_type" in c and c.get("vision_config") is not None]
    assert len(vlms) >= 3  # tiny-llava and the two taxonomy demo models
    for cfg in vlms:
        assert conventions_for(cfg["model_type"]).family == cfg["model_type"]
