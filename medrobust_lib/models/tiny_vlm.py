"""Tiny vision-language models of the real LLaVA architecture, for the demo and the tests.

A transformers ``LlavaForConditionalGeneration`` with a tiny CLIP vision tower and a tiny Llama
language model, plus a word-level tokenizer built locally from the demo record texts (no
download). Saved with ``save_pretrained`` it loads through the same public path as a real model
(``AutoModelForImageTextToText`` + ``AutoProcessor``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

SPECIAL = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
IMAGE_TOKEN = "<image>"
# Roles and the separator are ordinary words of the vocabulary; generation starts after "assistant :".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }} {% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)
_WORD = re.compile(r"[a-z0-9]+(?:[.\-][a-z0-9]+)*|[^\sa-z0-9]")


def words(text: str) -> list[str]:
    """Lower-case word/punctuation split used by the tiny tokenizer (and to build its vocabulary)."""
    return _WORD.findall(text.lower())


def build_tokenizer(texts: Iterable[str], min_count: int = 1) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over the words of ``texts`` (sorted, so the same
    texts give the same ids), with the chat template and ``<image>`` as a special token."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts: dict[str, int] = {}
    for t in texts:
        for w in words(t):
            counts[w] = counts.get(w, 0) + 1
    for w in ("user", "assistant", ":", "yes", "no", "a", "b", "c", "d"):
        counts.setdefault(w, min_count)
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for w in sorted(w for w, c in counts.items() if c >= min_count):
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"[^a-z0-9.\-<>]"), behavior="isolated"),
    ])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", extra_special_tokens={"image_token": IMAGE_TOKEN})
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_tiny_llava(tokenizer: Any, *, image_size: int = 64, patch_size: int = 16, text_hidden: int = 64,
                     vision_hidden: int = 48, layers: int = 2, seed: int = 0,
                     position_std: float | None = None, vision_layers: int | None = None,
                     vision_heads: int = 2) -> tuple[Any, Any]:
    """(model, processor): a randomly initialised tiny LLaVA (weights from a seeded, scoped RNG).
    ``layers`` blocks in the language model and, unless ``vision_layers`` is given, in the CLIP
    tower (``vision_heads`` heads, MLP twice ``vision_hidden`` wide). ``position_std``: the vision
    tower's position embeddings drawn from N(0, std) instead of CLIP's own init (std 0.02)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    vis = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                           num_hidden_layers=vision_layers or layers, num_attention_heads=vision_heads,
                           image_size=image_size, patch_size=patch_size)
    txt = LlamaConfig(vocab_size=len(tokenizer), hidden_size=text_hidden, intermediate_size=2 * text_hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    n_img = (image_size // patch_size) ** 2
    cfg = LlavaConfig(vision_config=vis, text_config=txt, image_token_index=image_id, vision_feature_layer=-1,
                      vision_feature_select_strategy="default", projector_hidden_act="gelu", image_seq_length=n_img)
    with torch.random.fork_rng(devices=[]):
        torch.random.manual_seed(seed)  # scoped: the global state is restored on exit
        model = LlavaForConditionalGeneration(cfg)
        if position_std is not None:
            with torch.no_grad():
                model.model.vision_tower.embeddings.position_embedding.weight.normal_(0.0, position_std)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    ip = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
                            do_convert_rgb=True)
    proc = LlavaProcessor(image_processor=ip, tokenizer=tokenizer, patch_size=patch_size,
                          vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                          num_additional_image_tokens=1)
    model.eval()
    return model, proc


def save_tiny(model: Any, processor: Any, folder: str | Path, *, float16: bool = False) -> Path:
    """``save_pretrained`` for model (safetensors) and processor; returns the folder. With
    ``float16`` the safetensors files store every floating tensor as float16 (half the bytes)
    while ``config.json`` keeps the model's float32 ``dtype``, so ``from_pretrained`` loads the
    rounded weights back as float32."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    if float16:
        store_float16(out)
    return out


def store_float16(folder: str | Path) -> list[Path]:
    """Rewrite every ``*.safetensors`` file in ``folder`` with its floating tensors as float16 (the
    file's metadata and other tensors kept); returns the files rewritten. The weights are rounded
    once; ``config.json`` is left alone, so a model that declares float32 still loads as float32."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = sorted(Path(folder).glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            meta = fh.metadata()
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()},
                  str(f), metadata=meta)
    return files
