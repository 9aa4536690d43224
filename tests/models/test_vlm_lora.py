"""LoRA fine-tuning of the tiny LLaVA and loading the adapter through HFVisionLanguageModel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.models.hf_vlm import HFVisionLanguageModel, ModelNotAvailable
from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.vlm_lora import (
    LM_PROJ_REGEX,
    LoraResult,
    adapter_hash,
    apply_lora,
    finetune_lora,
    lora_regex,
    lora_target_modules,
    trainable_summary,
)
from medrobust_lib.training.vlm_train import VLMExample, VLMTrainConfig

TEXTS = ["is there a lesion ?", "is the lesion bright ?", "yes", "no"]
QUESTION = "is there a lesion ?"
CFG = VLMTrainConfig(max_steps=60, batch_size=4, lr=1e-2, warmup_steps=2, eval_every=10, patience=3, seed=3)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _images(n: int) -> list[np.ndarray]:
    return [rng_for("vlm-lora", i).random((64, 64), dtype=np.float32) for i in range(n)]


def _examples() -> list[VLMExample]:
    return [VLMExample(f"img{i}", im, QUESTION, "yes" if i % 2 == 0 else "no")
            for i, im in enumerate(_images(4))]


@dataclass
class Trained:
    folder: Path
    base_state: dict[str, torch.Tensor]
    vlm: HFVisionLanguageModel  # its .model is the base model with the trained LoRA layers injected
    result: LoraResult


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, proc = build_tiny_llava(build_tokenizer(TEXTS), seed=1)
    return save_tiny(model, proc, tmp_path_factory.mktemp("tiny_llava_base"))


@pytest.fixture(scope="module")
def trained(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    vlm = HFVisionLanguageModel(folder)
    base_state = {k: v.detach().clone() for k, v in vlm.model.state_dict().items()}
    ex = _examples()
    result = finetune_lora(vlm.model, vlm.processor, ex, ex, LoraSettings(), CFG,
                           tmp_path_factory.mktemp("adapter") / "lora", base_model_hash="base123")
    return Trained(folder, base_state, vlm, result)


def test_regex_matches_only_language_model_projections(folder: Path) -> None:
    vlm = HFVisionLanguageModel(folder)
    names = lora_target_modules(vlm.model, lora_regex(LoraSettings()))
    assert lora_regex(LoraSettings()) == LM_PROJ_REGEX  # the default targets
    assert not any("vision_tower" in n or "multi_modal_projector" in n or "lm_head" in n for n in names)
    n_layers = vlm.model.config.text_config.num_hidden_layers
    assert len(names) == 7 * n_layers
    lm_q = [n for n, _ in vlm.model.named_modules() if n.endswith("q_proj") and "language_model" in n]
    assert lm_q and set(lm_q) <= set(names)
    vision_q = [n for n, _ in vlm.model.named_modules() if n.endswith("q_proj") and "vision_tower" in n]
    assert vision_q and not set(vision_q) & set(names)  # CLIP has q_proj too, and it is left alone
    assert all(n.startswith("model.language_model.layers.") for n in names)
    with pytest.raises(ValueError, match="matches no Linear module"):
        lora_target_modules(vlm.model, r"nothing\.here")


def test_apply_lora_is_seeded_and_leaves_the_global_rng_alone(folder: Path) -> None:
    state = torch.random.get_rng_state()
    a = apply_lora(HFVisionLanguageModel(folder).model, LoraSettings(), seed=5)
    b = apply_lora(HFVisionLanguageModel(folder).model, LoraSettings(), seed=5)
    c = apply_lora(HFVisionLanguageModel(folder).model, LoraSettings(), seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    key = next(k for k in a.state_dict() if "lora_A" in k)
    assert torch.equal(a.state_dict()[key], b.state_dict()[key])
    assert not torch.equal(a.state_dict()[key], c.state_dict()[key])
    assert all(p.requires_grad == ("lora_A" in n or "lora_B" in n) for n, p in a.named_parameters())
    s = trainable_summary(a)
    assert 0 < s["n_trainable"] < s["n_total"]
    assert s["modules"] == lora_target_modules(a)


def test_training_touches_only_lora_and_learns(trained: Trained) -> None:
    peft_model = trained.result.model
    assert all(p.requires_grad == ("lora_A" in n or "lora_B" in n) for n, p in peft_model.named_parameters())
    for name, p in peft_model.get_base_model().named_parameters():
        if "lora_" in name:
            continue
        assert torch.equal(p, trained.base_state[name.replace(".base_layer", "")]), name
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert any(float(p.abs().max()) > 0 for p in lora_b)  # B starts at zero: training moved it
    r = trained.result
    # memorises 4 examples (the frozen random tiny LM head caps how confident the model can get)
    assert r.train.best_val_loss < 0.7 * r.initial_val_loss
    assert r.n_trainable == sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    assert len(r.target_modules) == 14


def test_saved_adapter_is_safetensors_with_a_training_record(trained: Trained) -> None:
    from safetensors.torch import load_file

    out = trained.result.adapter_dir
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert tensors and all("lora_A" in k or "lora_B" in k for k in tensors)
    assert not any("vision_tower" in k or "embed_tokens" in k or "lm_head" in k for k in tensors)
    rec = json.loads((out / "training.json").read_text())
    assert rec["lora"] == {"r": 8, "alpha": 16, "dropout": 0.05, "target_regex": LM_PROJ_REGEX}
    assert rec["train_config"]["seed"] == 3 and rec["base_model_hash"] == "base123"
    assert rec["adapter_hash"] == adapter_hash(out) == trained.result.adapter_hash
    assert rec["n_trainable"] == trained.result.n_trainable and len(rec["target_modules"]) == 14
    assert rec["best_val_loss"] == pytest.approx(trained.result.train.best_val_loss)
    assert rec["steps"] == trained.result.train.steps
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["target_modules"] == LM_PROJ_REGEX and cfg["r"] == 8


def test_adapter_reloads_through_the_evaluation_adapter(trained: Trained, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pickle(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.load (pickle) was called")

    with monkeypatch.context() as m:
        m.setattr(torch, "load", no_pickle)
        tuned = HFVisionLanguageModel(trained.folder, adapter=trained.result.adapter_dir)
    base = HFVisionLanguageModel(trained.folder)
    assert tuned.adapter_hash == trained.result.adapter_hash and len(tuned.adapter_hash) == 16
    assert base.adapter_hash is None
    assert not tuned.model.training
    imgs = _images(4)
    qs = [QUESTION] * 4
    ref = trained.vlm.score(imgs, qs, ["yes", "no"])  # the fine-tuned (unmerged) model
    got = tuned.score(imgs, qs, ["yes", "no"])
    plain = base.score(imgs, qs, ["yes", "no"])
    for r, g, p in zip(ref, got, plain, strict=True):
        for o in ("yes", "no"):
            assert g[o] == pytest.approx(r[o], abs=1e-5)
        assert max(abs(g[o] - p[o]) for o in ("yes", "no")) > 1e-2
    assert [max(s, key=lambda o: s[o]) for s in got] == ["yes", "no", "yes", "no"]


def test_missing_adapter_is_a_clear_error(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailable, match="adapter folder not found") as err:
        HFVisionLanguageModel(folder, adapter=tmp_path / "nope")
    assert isinstance(err.value, FileNotFoundError)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        HFVisionLanguageModel(folder, adapter=tmp_path / "half")


def test_finetune_is_reproducible_given_the_seed(folder: Path, tmp_path: Path) -> None:
    cfg = VLMTrainConfig(max_steps=4, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=2, patience=3, seed=7)
    ex = _examples()
    state = torch.random.get_rng_state()
    runs = [finetune_lora(HFVisionLanguageModel(folder).model, HFVisionLanguageModel(folder).processor, ex, ex[:2],
                          LoraSettings(), cfg, tmp_path / name) for name in ("a", "b")]
    assert torch.equal(torch.random.get_rng_state(), state)
    assert runs[0].adapter_hash == runs[1].adapter_hash
    assert [h["val_loss"] for h in runs[0].train.history] == [h["val_loss"] for h in runs[1].train.history]
