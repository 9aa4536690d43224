"""The local Hugging Face adapter on a tiny LLaVA saved with save_pretrained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from medrobust_lib.models.hf_vlm import HFVisionLanguageModel, ModelNotAvailable
from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny, words
from medrobust_lib.seeding import rng_for

TEXTS = ["Is there a lesion in the left half of the image?", "Which modality is this? A. CT B. MRI",
         "The lesion is small and bright.", "yes", "no"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer(TEXTS)
    model, proc = build_tiny_llava(tok, seed=1)
    return save_tiny(model, proc, tmp_path_factory.mktemp("tiny_llava"))


@pytest.fixture(scope="module")
def vlm(folder: Path) -> HFVisionLanguageModel:
    return HFVisionLanguageModel(folder)


def _images(n: int) -> list[np.ndarray]:
    return [rng_for("vlm", i).random((64, 64), dtype=np.float32) for i in range(n)]


def test_tokenizer_is_local_and_deterministic() -> None:
    a, b = build_tokenizer(TEXTS), build_tokenizer(reversed(TEXTS))
    assert a.get_vocab() == b.get_vocab()
    assert words("Left-half, 3.5 mm?") == ["left-half", ",", "3.5", "mm", "?"]
    ids = a("is there a lesion ?", add_special_tokens=False)["input_ids"]
    assert a.unk_token_id not in ids


def test_loads_through_the_public_path_and_generates_greedily(vlm: HFVisionLanguageModel) -> None:
    from medrobust_lib.models.base import VisionLanguageModel

    assert isinstance(vlm, VisionLanguageModel)
    assert type(vlm.model).__name__ == "LlavaForConditionalGeneration"
    imgs = _images(3)
    qs = ["is there a lesion in the left half of the image ?", "which modality is this ?", "is the lesion small ?"]
    batched = vlm.generate(imgs, qs, max_new_tokens=4)
    single = [vlm.generate([im], [q], max_new_tokens=4)[0] for im, q in zip(imgs, qs, strict=True)]
    assert batched == single  # left padding: greedy output independent of the batch
    assert vlm.n_vision_calls == 6
    text_only = vlm.generate([None, None], qs[:2], max_new_tokens=4)
    assert len(text_only) == 2 and vlm.n_vision_calls == 6  # no vision call without an image


def test_score_is_next_token_log_probability(vlm: HFVisionLanguageModel) -> None:
    imgs = _images(2)
    qs = ["is there a lesion ?", "is the lesion bright ?"]
    scores = vlm.score(imgs, qs, ["yes", "no"])
    assert all(s["yes"] < 0 and s["no"] < 0 for s in scores)
    batch = vlm._inputs([imgs[0]], [qs[0]])
    with torch.no_grad():
        logits = vlm.model(**batch).logits[0, -1]
    ref = torch.log_softmax(logits.float(), -1)[vlm.option_token_ids(["yes"])[0]].item()
    assert scores[0]["yes"] == pytest.approx(ref, abs=1e-5)
    with pytest.raises(ValueError, match="share a first token"):
        vlm.option_token_ids(["yes", "yes please"])


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailable, match="not found"):
        HFVisionLanguageModel(tmp_path / "nope")
    with pytest.raises(ModelNotAvailable, match="Nothing is downloaded"):
        HFVisionLanguageModel("some-org/some-model-that-is-not-cached")


def test_score_variants_runs_the_vision_tower_once(vlm: HFVisionLanguageModel) -> None:
    img = np.random.default_rng(0).random((64, 64)).astype(np.float32)
    prompts = ["is there a lesion ?", "is there no lesion ?", "is the lesion small ?"]
    vlm.n_vision_calls = 0
    per = vlm.score([img] * 3, prompts, ["yes", "no"])
    assert vlm.n_vision_calls == 3
    vlm.n_vision_calls = 0
    once = vlm.score_variants(img, prompts, ["yes", "no"])
    assert vlm.n_vision_calls == 1
    for a, b in zip(per, once, strict=True):
        assert abs(a["yes"] - b["yes"]) < 1e-5 and abs(a["no"] - b["no"]) < 1e-5
    assert vlm.score_variants(None, prompts, ["yes", "no"]) == vlm.score([None] * 3, prompts, ["yes", "no"])


def test_float16_storage_halves_the_file_and_loads_back_as_float32(tmp_path: Path) -> None:
    """``save_tiny(float16=True)``: the safetensors hold float16, ``from_pretrained`` returns float32
    parameters equal to the float32 originals rounded to float16, and the model's scores move by
    no more than that rounding does."""
    from safetensors import safe_open

    tok = build_tokenizer(TEXTS)
    model, proc = build_tiny_llava(tok, seed=3, vision_layers=3, vision_heads=4)
    full = save_tiny(model, proc, tmp_path / "fp32")
    half = save_tiny(model, proc, tmp_path / "fp16", float16=True)
    with safe_open(str(half / "model.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.float16}  # noqa: SIM118
    assert (half / "model.safetensors").stat().st_size < 0.55 * (full / "model.safetensors").stat().st_size
    a, b = HFVisionLanguageModel(full), HFVisionLanguageModel(half)
    params_a = dict(a.model.named_parameters())
    for name, p in b.model.named_parameters():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, params_a[name].to(torch.float16).float(), rtol=0, atol=0)
    assert len(b.model.model.vision_tower.encoder.layers) == 3
    lp_a = a.score(_images(2), [TEXTS[0]] * 2, ["yes", "no"])
    lp_b = b.score(_images(2), [TEXTS[0]] * 2, ["yes", "no"])
    for x, y in zip(lp_a, lp_b, strict=True):
        assert x.keys() == y.keys() and all(abs(x[k] - y[k]) < 0.05 for k in x)


def test_an_answer_that_reaches_its_cap_without_ending_is_flagged_truncated(folder: Path) -> None:
    """The seed-1 tiny model answers ``:`` over and over and never its end-of-sequence token: every
    answer reaches the cap (truncated). Declaring ``:`` the end-of-sequence token ends every answer
    at once: an answer that ends within the cap (even on its last token) is not truncated."""
    vlm = HFVisionLanguageModel(folder)
    imgs, qs = _images(2), ["is there a lesion ?", "which modality is this ?"]
    capped = vlm.generate_capped(imgs, qs, max_new_tokens=5)
    assert capped == [(": : : : :", True), (": : : : :", True)]
    assert vlm.generate(imgs, qs, max_new_tokens=5) == [t for t, _ in capped]
    colon = vlm.processor.tokenizer.convert_tokens_to_ids(":")
    vlm.model.generation_config.eos_token_id = colon
    assert vlm.generate_capped(imgs, qs, max_new_tokens=5) == [(":", False), (":", False)]
    assert vlm.generate_capped(imgs, qs, max_new_tokens=1) == [(":", False), (":", False)]
