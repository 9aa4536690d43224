"""The VLM architecture matrix: every released architecture family, as a tiny random twin saved
with ``save_pretrained``, goes through the public model path (``HFVisionLanguageModel(folder)``).

Checks per architecture: batched greedy generation equals one-at-a-time generation (images of
different sizes, so pixel budgets and tiling differ within a batch); option scoring equals the
log-softmax of the model's own logits on inputs built by the stock processor; text-only prompts
work and do not run the vision encoder; the vision-encoder counter counts images; the released
chat template is applied (rendered prompt and the tokens the model receives); a LoRA adapter
trains on the language model only and reloads through the adapter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.models.hf_vlm import HFVisionLanguageModel
from medrobust_lib.models.shared_image import shared_image
from medrobust_lib.models.vlm_conventions import conventions_for, encode_prompts
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.vlm_lora import finetune_lora
from medrobust_lib.training.vlm_train import VLMExample, VLMTrainConfig
from tests.models.vlm_twins import ARCHS, build_twin

Q = "is there a lesion in the left half of the image ?"
QUESTIONS = [Q, "which modality is this ?", "is the lesion small ?"]
# (H, W): different sizes, so Qwen's pixel budget, LLaVA-NeXT's anyres grid, Idefics3's and
# Mllama's tiles give different token counts / tile counts within one batch.
SIZES = [(48, 64), (64, 64), (64, 32)]

# The rendered generation prompt for one image and Q, as the releases document it: llava-hf
# model cards ("USER: <image>\n... ASSISTANT:", "[INST] <image>\n... [/INST]"), the Gemma 3 and
# Qwen2-VL prompt formats, SmolVLM's "<|im_start|>User:<image>...<end_of_utterance>\nAssistant:",
# Llama 3.2 Vision's header format (no system block when an image is present).
RENDERED = {
    "llava": f"USER: <image>\n{Q} ASSISTANT:",
    "llava_next": f"[INST] <image>\n{Q} [/INST]",
    "gemma3": f"<bos><start_of_turn>user\n<start_of_image>{Q}<end_of_turn>\n<start_of_turn>model\n",
    "qwen2_vl": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                 f"<|vision_start|><|image_pad|><|vision_end|>{Q}<|im_end|>\n<|im_start|>assistant\n"),
    "idefics3": f"<|im_start|>User:<image>{Q}<end_of_utterance>\nAssistant:",
    "paligemma": f"<image>{Q}",
    "mllama": ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|image|>"
               f"{Q}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
}
RENDERED["qwen2_5_vl"] = RENDERED["qwen2_vl"]
# The last tokens the model receives: the generation prompt's tail (the twins' word-level tokenizer
# lower-cases words and drops whitespace).
PROMPT_END = {"llava": ["assistant", ":"], "llava_next": ["[/INST]"], "gemma3": ["<start_of_turn>", "model"],
              "qwen2_vl": ["<|im_start|>", "assistant"], "qwen2_5_vl": ["<|im_start|>", "assistant"],
              "idefics3": ["assistant", ":"], "paligemma": ["?"],
              "mllama": ["<|start_header_id|>", "assistant", "<|end_header_id|>"]}


@pytest.fixture(scope="module", autouse=True)
def _threads() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threading costs more than it gives on 2 shared cores
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def twin_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm_twins")
    return {arch: build_twin(arch, root / arch, seed=3) for arch in ARCHS}


_LOADED: dict[str, HFVisionLanguageModel] = {}


def _vlm(twin_folders: dict[str, Path], arch: str) -> HFVisionLanguageModel:
    if arch not in _LOADED:
        _LOADED[arch] = HFVisionLanguageModel(twin_folders[arch])
    vlm = _LOADED[arch]
    vlm.n_vision_calls = 0
    return vlm


def _images() -> list[np.ndarray]:
    out = []
    for i, (h, w) in enumerate(SIZES):
        shape = (h, w) if i == 1 else (h, w, 3)  # one grayscale image: replicated to RGB
        out.append(rng_for("vlm-arch", i).random(shape, dtype=np.float32))
    return out


def _u8(image: np.ndarray) -> np.ndarray:
    u8 = np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
    return np.repeat(u8[..., None], 3, axis=2) if u8.ndim == 2 else u8


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_through_the_public_path(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    assert vlm.model.config.model_type == arch
    assert vlm.conventions.family == conventions_for(arch).family
    assert not vlm.model.training
    assert vlm.processor.tokenizer.padding_side == "left"


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_generation_equals_one_at_a_time(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    imgs = _images()
    batched = vlm.generate(imgs, QUESTIONS, max_new_tokens=4)
    assert vlm.n_vision_calls == 3  # the vision encoder counted three images, whatever the tiles
    single = [vlm.generate([im], [q], max_new_tokens=4)[0] for im, q in zip(imgs, QUESTIONS, strict=True)]
    assert batched == single
    assert vlm.n_vision_calls == 6
    assert any(s for s in single)  # random weights still emit words (not all special tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_text_only_prompts(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    batched = vlm.generate([None, None], QUESTIONS[:2], max_new_tokens=4)
    single = [vlm.generate([None], [q], max_new_tokens=4)[0] for q in QUESTIONS[:2]]
    assert batched == single and vlm.n_vision_calls == 0
    s = vlm.score([None, None], QUESTIONS[:2], ["yes", "no"])
    assert all(d["yes"] < 0 and d["no"] < 0 for d in s)
    text = vlm.chat_prompt(Q, with_image=False)
    image_markers = ("<image>", "<|image|>", "<start_of_image>", "<|vision_start|>")
    assert Q in text and not any(m in text for m in image_markers)


def _reference_inputs(vlm: HFVisionLanguageModel, arch: str, image: np.ndarray, question: str) -> Any:
    """Inputs built the stock way, independently of the adapter: the processor's own chat template
    (or PaliGemma's documented '<image>' + prompt) and images nested per prompt."""
    proc = vlm.processor
    if arch == "paligemma":
        text = "<image>" + question
    else:
        conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        text = proc.apply_chat_template(conv, add_generation_prompt=True)
    batch = proc(images=[[_u8(image)]], text=[text], return_tensors="pt")
    batch.pop("labels", None)
    return batch


@pytest.mark.parametrize("arch", ARCHS)
def test_score_equals_the_models_own_logits(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    imgs = _images()
    scores = vlm.score(imgs, QUESTIONS, ["yes", "no"])
    yes, no = vlm.option_token_ids(["yes", "no"])
    for im, q, got in zip(imgs, QUESTIONS, scores, strict=True):
        with torch.no_grad():
            logits = vlm.model(**_reference_inputs(vlm, arch, im, q)).logits[0, -1].float()
        ref = torch.log_softmax(logits, -1)
        assert got["yes"] == pytest.approx(ref[yes].item(), abs=1e-4)
        assert got["no"] == pytest.approx(ref[no].item(), abs=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_chat_template_is_applied(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    assert vlm.chat_prompt(Q, with_image=True) == RENDERED[arch]
    batch = vlm._inputs([_images()[0]], [Q])
    tok = vlm.processor.tokenizer
    ids = batch["input_ids"][0].tolist()
    toks = tok.convert_ids_to_tokens(ids)
    assert toks[-len(PROMPT_END[arch]):] == PROMPT_END[arch]
    if arch == "paligemma":  # the processor's layout: image tokens, <bos>, prompt, newline (dropped by the split)
        first_text = toks.index("<bos>")
        assert set(toks[:first_text]) == {"<image>"} and first_text == 16
    assert tok.unk_token_id not in ids[-8:]


@pytest.mark.parametrize("arch", ARCHS)
def test_score_variants_matches_score(twin_folders: dict[str, Path], arch: str) -> None:
    vlm = _vlm(twin_folders, arch)
    img = _images()[0]
    per = vlm.score([img] * 3, QUESTIONS, ["yes", "no"])
    vlm.n_vision_calls = 0
    once = vlm.score_variants(img, QUESTIONS, ["yes", "no"])
    assert vlm.n_vision_calls == (1 if vlm.conventions.reuse_encoder else 3)
    for a, b in zip(per, once, strict=True):
        assert a["yes"] == pytest.approx(b["yes"], abs=1e-4) and a["no"] == pytest.approx(b["no"], abs=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_image_processing_returns_what_the_processor_returns(twin_folders: dict[str, Path], arch: str) -> None:
    """One image repeated over several prompts (flat, or nested per prompt where the family wants
    that): processed once where every output is per image, and the processor's outputs are
    identical, tokens and pixels, to processing every copy."""
    vlm = _vlm(twin_folders, arch)
    conv = vlm.conventions
    pic = _u8(_images()[0])
    texts = [vlm.chat_prompt(q, True) for q in QUESTIONS]
    want = encode_prompts(vlm.processor, conv, texts, [pic] * len(texts))
    inner = vlm.processor.image_processor
    with shared_image(vlm.processor) as wrapper:
        got = encode_prompts(vlm.processor, conv, texts, [pic] * len(texts))
    assert vlm.processor.image_processor is inner  # restored
    assert wrapper is not None
    assert sorted(got.keys()) == sorted(want.keys())
    for key in want:
        a, b = want[key], got[key]
        if isinstance(a, torch.Tensor):
            assert a.shape == b.shape and torch.equal(a, b), key
        else:
            assert a == b, key
    # the families whose image outputs are one entry per image take the shortcut; Qwen2-VL's
    # flattened patches do not (every copy is processed, as the processor would)
    per_image = arch not in ("qwen2_vl", "qwen2_5_vl")
    assert wrapper.n_shared == (1 if per_image else 0)


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_trains_the_language_model_and_reloads(twin_folders: dict[str, Path], arch: str,
                                                    tmp_path: Path) -> None:
    base = HFVisionLanguageModel(twin_folders[arch])
    imgs = _images()
    ex = [VLMExample(f"img{i}", imgs[i % 3], QUESTIONS[i % 3], "yes" if i % 2 == 0 else "no") for i in range(4)]
    cfg = VLMTrainConfig(max_steps=12, batch_size=4, lr=2e-2, warmup_steps=1, eval_every=4, patience=5, seed=1)
    res = finetune_lora(base.model, base.processor, ex, ex, LoraSettings(r=4, alpha=8, dropout=0.0), cfg,
                        tmp_path / "lora")
    assert res.target_modules and all(("language_model" in n or "text_model" in n) for n in res.target_modules)
    assert not any(v in n for n in res.target_modules for v in ("vision", "visual", "projector", "connector"))
    assert res.train.best_val_loss < res.initial_val_loss  # it learned the four examples
    tuned = HFVisionLanguageModel(twin_folders[arch], adapter=res.adapter_dir)
    plain = _vlm(twin_folders, arch)  # the untouched base (the cached instance; LoRA went into `base`)
    qs = [e.question for e in ex]
    pics = [e.image for e in ex]
    ref = base.score(pics, qs, ["yes", "no"])  # the trained (unmerged) peft model inside `base`
    got = tuned.score(pics, qs, ["yes", "no"])
    orig = plain.score(pics, qs, ["yes", "no"])
    for r, g in zip(ref, got, strict=True):
        assert g["yes"] == pytest.approx(r["yes"], abs=1e-4) and g["no"] == pytest.approx(r["no"], abs=1e-4)
    assert max(abs(g["yes"] - o["yes"]) for g, o in zip(got, orig, strict=True)) > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_training_prompt_is_the_evaluation_prompt(twin_folders: dict[str, Path], arch: str) -> None:
    """The trainer's prompt tokens (image placeholder expanded for that image's size) equal what the
    evaluation adapter feeds the model, and the sequence-aligned extras cover prompt + answer."""
    from medrobust_lib.training.vlm_train import IGNORE, encode_examples

    vlm = _vlm(twin_folders, arch)
    imgs = _images()
    ex = [VLMExample(f"img{i}", imgs[i], Q, "yes") for i in range(3)] + [VLMExample("none", None, Q, "no")]
    enc = encode_examples(vlm.processor, ex, vlm.model.config.model_type)
    for i, e in enumerate(ex):
        ref = vlm._inputs([e.image], [Q])
        n = int(ref["attention_mask"][0].sum())
        prompt = ref["input_ids"][0, -n:].tolist()
        assert enc.ids[i][: len(prompt)].tolist() == prompt
        assert (enc.labels[i][: len(prompt)] == IGNORE).all() and (enc.labels[i][len(prompt):] != IGNORE).all()
        for key, v in enc.seq_extras[i].items():
            assert v.shape[0] == len(enc.ids[i]), key
    assert enc.image_row == [0, 1, 2, -1]


def test_system_prompt_and_seeded_sampling(twin_folders: dict[str, Path]) -> None:
    """``system_prompt`` goes through the chat template's system role (Gemma 3 folds it into the
    user turn); temperature > 0 samples, the same batch twice the same answers (seeded from the
    seed and the prompts); the default stays greedy."""
    sys_text = "You are an expert medical imaging specialist."
    vlm = HFVisionLanguageModel(twin_folders["gemma3"], system_prompt=sys_text, temperature=5.0, top_p=0.95, seed=1)
    assert sys_text in vlm.chat_prompt(Q, with_image=True) and sys_text not in _vlm(twin_folders, "gemma3").chat_prompt(
        Q, with_image=True)
    img = _images()[0]
    first = vlm.generate_capped([img, img], [Q, Q], max_new_tokens=6)
    assert vlm.generate_capped([img, img], [Q, Q], max_new_tokens=6) == first
    assert vlm._sampling() == {"do_sample": True, "temperature": 5.0, "top_p": 0.95}
    assert _vlm(twin_folders, "gemma3")._sampling() == {"do_sample": False}
