"""Per-architecture processor and model conventions of local Hugging Face VLMs.

One frozen entry per architecture family, keyed by the ``model_type`` of the model's config
(transformers 5). :class:`medrobust_lib.models.hf_vlm.HFVisionLanguageModel` and the VLM trainer
read this table instead of branching on class names; each entry is proven on a tiny random twin
built from the real config class (``tests/models/test_vlm_architectures.py``).

What differs between the families:

- ``nest_images``: the processor wants one list of images per prompt (Gemma 3 refuses a flat
  list for a batch: "The number of <start_of_image> tokens in each prompt should be the same as the
  number of images passed"; Idefics3 and Mllama group images per prompt the same way).
- ``chat_template``: False for PaliGemma, which has none: the prompt is ``<image>`` + question, and
  the processor inserts the image tokens, ``<bos>`` and the closing newline.
- ``processor_needs_image``: PaliGemma's processor refuses text without images; text-only prompts
  are then tokenised directly in the processor's layout (``<bos>`` + question + newline).
- ``vision_module``: the attribute of the inner model that encodes images (counted by a hook);
  ``count``: how the hook counts images from the encoder's inputs: ``pixels`` (first dimension of
  the pixel batch), ``grid`` (rows of Qwen's ``grid_thw``: one per image, whatever its pixel
  budget), ``aspect`` (Mllama: non-padding entries of ``aspect_ratio_ids``) or ``batch`` (the
  encoder sees tiles or patches, not images: LLaVA-NeXT's anyres patches, Idefics3's split
  tiles; then each encoder run counts the images of the batch that triggered it).
- ``answer_token_type``: ``token_type_ids`` of answer tokens when training (PaliGemma: 1, its
  causal suffix; Gemma 3: 0, text); None where the model takes no ``token_type_ids``.
- ``reuse_encoder``: :meth:`score_variants` may hand precomputed image features to the model
  (``mm_encoder_outputs``); only where the features are one tensor per image in the form the
  forward expects (LLaVA, Gemma 3, PaliGemma); other families encode the image once per prompt.
- ``per_sample_images``: pixel tensors are laid out per prompt (Mllama: batch x images x tiles),
  so a training batch cannot mix prompts with and without an image.
- ``drop_keys``: processor outputs the model must not receive (PaliGemma's backward-compatible
  ``labels``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LM_PROJ_REGEX = (
    r"(?:.*\.)?(?:language_model|text_model)\.(?:model\.)?layers\.\d+\."
    r"(?:self_attn\.(?:q_proj|k_proj|v_proj|o_proj)|mlp\.(?:gate_proj|up_proj|down_proj))"
)
"""Full-match regex (peft semantics) over module names: the language model's self-attention and MLP
projections. transformers 5 names them ``model.language_model.layers.N...`` (LLaVA, LLaVA-NeXT,
Gemma 3, Qwen2-VL, Qwen2.5-VL, PaliGemma, Mllama) or ``model.text_model.layers.N...`` (Idefics3,
SmolVLM); transformers 4 ``language_model.model.layers.N...``. Vision towers (``vision_tower``,
``visual``, ``vision_model``) and projectors never match; Mllama's cross-attention layers keep their
``cross_attn`` projections frozen and adapt their MLPs."""

COUNTS = ("pixels", "grid", "aspect", "batch")


@dataclass(frozen=True)
class VLMConventions:
    family: str
    model_types: tuple[str, ...]
    vision_module: str
    count: str
    nest_images: bool = False
    chat_template: bool = True
    processor_needs_image: bool = False
    answer_token_type: int | None = None
    reuse_encoder: bool = False
    per_sample_images: bool = False
    drop_keys: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        if self.count not in COUNTS:
            raise ValueError(f"count must be one of {COUNTS}, got {self.count!r}")


CONVENTIONS: tuple[VLMConventions, ...] = (
    VLMConventions("llava", ("llava",), "vision_tower", "pixels", reuse_encoder=True,
                   notes="LLaVA 1.5 and LLaVA-Med -hf (Mistral); fixed image token count"),
    VLMConventions("llava_next", ("llava_next",), "vision_tower", "batch",
                   notes="anyres: image token count follows the image size (image_sizes)"),
    VLMConventions("gemma3", ("gemma3",), "vision_tower", "pixels", nest_images=True, answer_token_type=0,
                   reuse_encoder=True, notes="Gemma 3, MedGemma: images nested per prompt; token_type_ids mark "
                   "image tokens"),
    VLMConventions("qwen2_vl", ("qwen2_vl", "qwen2_5_vl"), "visual", "grid",
                   notes="Qwen2-VL, Qwen2.5-VL: pixel budget (min/max pixels) sets the token count; image_grid_thw; "
                   "mm_token_type_ids for M-RoPE"),
    VLMConventions("idefics3", ("idefics3", "smolvlm"), "vision_model", "batch", nest_images=True,
                   notes="Idefics3, SmolVLM: image split into tiles plus a global image"),
    VLMConventions("paligemma", ("paligemma",), "vision_tower", "pixels", chat_template=False,
                   processor_needs_image=True, answer_token_type=1, reuse_encoder=True, drop_keys=("labels",),
                   notes="no chat template: <image>*N <bos> question \\n; prefix attends bidirectionally"),
    VLMConventions("mllama", ("mllama",), "vision_model", "aspect", nest_images=True, per_sample_images=True,
                   notes="Llama 3.2 Vision: cross-attention layers, cross_attention_mask per token, image tiles"),
)
_BY_TYPE = {t: c for c in CONVENTIONS for t in c.model_types}


def known_model_types() -> list[str]:
    """Every ``model_type`` of :data:`CONVENTIONS`, sorted."""
    return sorted(_BY_TYPE)


def conventions_for(model_type: str) -> VLMConventions:
    """The conventions of a config's ``model_type``.

    Raises:
        ValueError: ``model_type`` is not in :data:`CONVENTIONS` (the message lists the known
            ones); a new architecture needs its entry, proven on a tiny twin, before it runs.
    """
    known = _BY_TYPE.get(model_type)
    if known is None:
        raise ValueError(f"no VLM conventions for model_type {model_type!r}; known: {', '.join(known_model_types())} "
                         "(add an entry to medrobust_lib/models/vlm_conventions.py, tested on a tiny twin in "
                         "tests/models/test_vlm_architectures.py)")
    return known


def prompt_text(processor: Any, conv: VLMConventions, question: str, with_image: bool,
                system: str | None = None) -> str:
    """The generation prompt for one user turn: the processor's chat template with one image slot
    (``with_image``) and the question; for a family without a chat template (PaliGemma) the
    processor's own layout (``<image>`` + question, expanded by the processor, or ``<bos>`` +
    question + newline for a text-only prompt). ``system``: a system turn before the user's (the
    chat template's ``system`` role; a family without a chat template has none: ValueError)."""
    if not conv.chat_template:
        if system is not None:
            raise ValueError("this model family has no chat template, so no system turn: leave system_prompt unset")
        tok = processor.tokenizer
        image_token = getattr(processor, "image_token", None) or getattr(tok, "image_token", "<image>")
        return f"{image_token}{question}" if with_image else f"{tok.bos_token or ''}{question}\n"
    content: list[dict[str, str]] = [{"type": "image"}] if with_image else []
    content.append({"type": "text", "text": question})
    turns: list[dict[str, Any]] = [] if system is None else [
        {"role": "system", "content": [{"type": "text", "text": system}]}]
    turns.append({"role": "user", "content": content})
    return str(processor.apply_chat_template(turns, add_generation_prompt=True))


def encode_prompts(processor: Any, conv: VLMConventions, texts: Sequence[str],
                   images: Sequence[np.ndarray] | None) -> Any:
    """Processor outputs (a ``BatchFeature`` of torch tensors, padded on the tokenizer's side) for
    prompt ``texts`` (from :func:`prompt_text`) and one uint8 RGB (H, W, 3) image per text, or
    ``images`` None for text-only prompts. Keys the model must not receive are dropped."""
    if images is not None:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images for {len(texts)} prompts")
        pics: list[Any] = [[im] for im in images] if conv.nest_images else list(images)
        batch = processor(images=pics, text=list(texts), return_tensors="pt", padding=True)
    elif conv.processor_needs_image:
        import torch

        batch = processor.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        if conv.answer_token_type is not None:
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    else:
        batch = processor(text=list(texts), return_tensors="pt", padding=True)
    for key in conv.drop_keys:
        batch.pop(key, None)
    return batch
