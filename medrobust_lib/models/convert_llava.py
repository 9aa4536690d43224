"""Convert a checkpoint of the original ``llava`` code base (LLaVA-Med, LLaVA 1.5) to transformers' LLaVA.

The original layout (haotian-liu/LLaVA, microsoft/LLaVA-Med, microsoft/LLaVA-Rad): a folder with a
``config.json`` whose ``architectures`` is ``LlavaMistralForCausalLM`` or ``LlavaLlamaForCausalLM``
(a Mistral/Llama config plus ``mm_vision_tower``, ``mm_projector_type``, ``mm_hidden_size``,
``mm_vision_select_layer``, ``mm_vision_select_feature``, ``mm_use_im_start_end``,
``image_aspect_ratio``), weights in ``*.safetensors`` or ``pytorch_model*.bin`` with the keys
``model.embed_tokens.*``, ``model.layers.*``, ``model.norm.*``, ``lm_head.*``,
``model.mm_projector.{0,2}.*`` (``mlp2x_gelu``: Linear, GELU, Linear) and, only when the tower
was saved with the model, ``model.vision_tower.vision_tower.vision_model.*``, plus the tokenizer
files. The vision tower is referenced by name (``openai/clip-vit-large-patch14-336``): its weights
come from a local copy of that CLIP folder (``vision_tower``). The key mapping is the one of
transformers' ``convert_llava_weights_to_hf.py`` (``model.mm_projector.0`` -> ``linear_1``, ``.2``
-> ``linear_2``, the LM under the language model), written for transformers 5's module names.

What is converted exactly: every weight (bit-identical), the feature layer and selection
(``patch`` drops CLS = ``default``; ``cls_patch`` = ``full``), the GELU projector, the image
preprocessing (``image_aspect_ratio: pad`` = pad to a square with the processor's mean colour,
``LlavaImageProcessor(do_pad=True)``), and the prompt format of the conversation template the
code base evaluates with (``mistral_instruct`` for Mistral, ``vicuna_v1`` with its system prompt
for Llama) as the chat template. What differs by construction: transformers marks the image with
one vocabulary token (``<image>``, added at the end of the vocabulary; its embedding and LM-head
rows are the means of the existing rows, as the code base does for its own added tokens), so
full-vocabulary log-probabilities are over one more token than the original; the original
inserts the image at a sentinel id outside the vocabulary. The text around the image is
tokenised in one piece here and in pieces (split at ``<image>``) by the original.

Refused (:class:`NotConvertible`, with the reason): vision towers that transformers' LLaVA cannot
hold faithfully (LLaVA-Rad's BiomedCLIP-CXR is an open_clip/timm ViT: patch embedding with bias,
GELU MLPs, no pre-LayerNorm; ``hf-hub:`` towers; LLaVA-Rad loads as it is with ``kind: llava_rad``,
:mod:`medrobust_lib.models.llava_rad`), a tower whose weights are neither in the folder
nor given, projectors other than ``mlp2x_gelu`` (transformers' projector is Linear-act-Linear),
``mm_use_im_start_end`` checkpoints, LLaVA-NeXT (``image_newline``), LoRA-only releases
(``adapter_config.json`` + ``non_lora_trainables.bin``: merge them onto the base first), weights
the target model does not have or lacks. Pickle checkpoints are read with
``torch.load(weights_only=True)`` only; the output is safetensors only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from medrobust_lib.models.remote_code import refuse_remote_code

ARCHITECTURES = {"LlavaMistralForCausalLM": "mistral", "LlavaLlamaForCausalLM": "llama"}
VICUNA_V1_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                    "The assistant gives helpful, detailed, and polite answers to the user's questions.")
# conv_mistral_instruct (SeparatorStyle.LLAMA_2, empty system): "[INST] <image>\n{q} [/INST]"
MISTRAL_INSTRUCT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}"
    "{% endfor %}{{ ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'][0]['text'] + eos_token }}{% endif %}{% endfor %}"
)
# conv_vicuna_v1 (SeparatorStyle.TWO): "{system} USER: <image>\n{q} ASSISTANT:"
VICUNA_V1_TEMPLATE = (
    "{{ '" + VICUNA_V1_SYSTEM.replace("'", "\\'") + " ' }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'USER: ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' + message['content'][0]['text'] + "
    "eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
IMAGE_TOKEN = "<image>"
_OPEN_CLIP_HINTS = ("biomedclip", "open_clip", "hf-hub:", "timm")
_CLIP_VISION_ROOTS = ("embeddings.", "pre_layrnorm.", "encoder.", "post_layernorm.")


class NotConvertible(ValueError):
    """The checkpoint cannot be converted faithfully; the message says why."""


@dataclass
class ConversionReport:
    """What :func:`convert_llava` wrote: the output folder, the text architecture, the number of
    tensors copied, where the vision tower came from, and the documented deviations."""

    dst: Path
    text_model_type: str
    n_tensors: int
    vision_tower_source: str
    image_token_id: int
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: ``*.safetensors`` (preferred) or ``pytorch_model*.bin`` /
    ``*.pt`` read with ``torch.load(weights_only=True)``."""
    from safetensors.torch import load_file

    st = sorted(folder.glob("*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    if st:
        for f in st:
            out.update(load_file(str(f)))
        return out
    bins = sorted([*folder.glob("pytorch_model*.bin"), *folder.glob("model*.pt")])
    for f in bins:
        obj = torch.load(str(f), map_location="cpu", weights_only=True)
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise NotConvertible(f"{f.name} is not a flat state dict of tensors")
        out.update(obj)
    if not out:
        raise NotConvertible(f"no weights in {folder} (*.safetensors or pytorch_model*.bin)")
    return out


def _check_source(src: Path, cfg: dict[str, Any]) -> str:
    """The text model type of a convertible original-layout config, or :class:`NotConvertible`."""
    if (src / "adapter_config.json").is_file() or (src / "non_lora_trainables.bin").is_file():
        raise NotConvertible(
            f"{src} is a LoRA release of the llava code base (adapter_config.json / non_lora_trainables.bin): it "
            "holds deltas over a base model, not a model. LLaVA-Rad's release (microsoft/llava-rad) loads as it is "
            "with kind: llava_rad (source: the base LLaMA folder, adapter: the release folder); other releases: "
            "merge onto the base with the code base's scripts/merge_lora_weights.py, then convert the merged folder."
        )
    archs = list(cfg.get("architectures") or [])
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise NotConvertible(f"config architectures {archs} are not an original-layout LLaVA "
                             f"({sorted(ARCHITECTURES)}); a transformers LLaVA folder needs no conversion")
    tower = str(cfg.get("mm_vision_tower") or "")
    if not tower:
        raise NotConvertible("config has no mm_vision_tower: not a multimodal LLaVA checkpoint")
    if any(h in tower.lower() for h in _OPEN_CLIP_HINTS) or cfg.get("mm_vision_tower_config") \
            or cfg.get("mm_vision_tower_checkpoint"):
        raise NotConvertible(
            f"vision tower {tower!r} is an open_clip/timm ViT (LLaVA-Rad's BiomedCLIP-CXR: patch embedding with a "
            "bias, GELU MLPs, no pre-LayerNorm), which transformers' LLaVA vision towers (CLIP, SigLIP) cannot hold "
            "faithfully; converting it would change the model's outputs. Load it as it is with kind: llava_rad "
            "(medrobust_lib/models/llava_rad.py)"
        )
    ptype = cfg.get("mm_projector_type", "linear")
    if ptype != "mlp2x_gelu":
        raise NotConvertible(f"mm_projector_type {ptype!r}: transformers' LLaVA projector is Linear-GELU-Linear "
                             "(mlp2x_gelu) only")
    if cfg.get("mm_use_im_start_end"):
        raise NotConvertible("mm_use_im_start_end checkpoints wrap the image in <im_start>/<im_end> tokens, which "
                             "transformers' LLaVA processor does not write")
    select = cfg.get("mm_vision_select_feature", "patch")
    if select not in ("patch", "cls_patch"):
        raise NotConvertible(f"mm_vision_select_feature {select!r} is neither 'patch' nor 'cls_patch'")
    return ARCHITECTURES[arch]


def _vision_from_folder(folder: Path) -> tuple[Any, dict[str, torch.Tensor], Any]:
    """(CLIPVisionConfig, {key under the CLIP vision transformer: tensor}, image processor config)
    from a local transformers CLIP folder (``CLIPModel`` or ``CLIPVisionModel`` layout)."""
    from transformers import CLIPVisionConfig

    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise NotConvertible(f"vision tower folder {folder} has no config.json")
    raw = _read_json(cfg_path)
    if raw.get("model_type") not in ("clip", "clip_vision_model"):
        raise NotConvertible(f"vision tower folder {folder} is a {raw.get('model_type')!r} model, not CLIP")
    vcfg = CLIPVisionConfig(**raw["vision_config"]) if "vision_config" in raw else CLIPVisionConfig(**raw)
    raw_w = load_weights(folder)
    if any(k.startswith("vision_model.") for k in raw_w):  # CLIPModel / transformers 4 CLIPVisionModel
        weights = {k.removeprefix("vision_model."): v for k, v in raw_w.items() if k.startswith("vision_model.")}
    else:  # transformers 5 saves CLIPVisionModel without the prefix
        weights = {k: v for k, v in raw_w.items() if k.startswith(_CLIP_VISION_ROOTS)}
    pre = folder / "preprocessor_config.json"
    return vcfg, weights, (_read_json(pre) if pre.is_file() else None)


def _map_keys(original: dict[str, torch.Tensor], vision: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """Original-layout keys -> transformers 5 ``LlavaForConditionalGeneration`` keys."""
    out: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for k, v in original.items():
        if k.endswith(".inv_freq"):
            continue  # rotary buffers of old checkpoints, recomputed
        if k == "model.image_newline":
            raise NotConvertible("model.image_newline: a LLaVA-NeXT checkpoint, not a LLaVA 1.5-style one")
        if k.startswith("model.mm_projector."):
            rest = k.removeprefix("model.mm_projector.")
            idx, _, param = rest.partition(".")
            if idx not in ("0", "2"):
                raise NotConvertible(f"unexpected projector weight {k}")
            out[f"model.multi_modal_projector.linear_{1 if idx == '0' else 2}.{param}"] = v
        elif k.startswith("model.vision_tower.vision_tower.vision_model."):
            if vision is None:
                out["model.vision_tower." + k.removeprefix("model.vision_tower.vision_tower.vision_model.")] = v
        elif k.startswith("model.vision_tower."):
            unknown.append(k)
        elif k.startswith("model."):
            out["model.language_model." + k.removeprefix("model.")] = v
        elif k == "lm_head.weight":
            out[k] = v
        else:
            unknown.append(k)
    if unknown:
        raise NotConvertible(f"{len(unknown)} weights of unknown role, e.g. {unknown[:5]}")
    if vision is not None:
        for k, v in vision.items():
            out["model.vision_tower." + k] = v
    return out


def _text_config(cfg: dict[str, Any], model_type: str) -> Any:
    from transformers import AutoConfig

    skip = {"architectures", "model_type", "transformers_version", "auto_map", "_name_or_path", "torch_dtype",
            "dtype", "use_cache", "tokenizer_model_max_length", "tokenizer_padding_side", "freeze_mm_mlp_adapter",
            "tune_mm_mlp_adapter", "image_aspect_ratio", "image_grid_pinpoints", "use_mm_proj"}
    kw = {k: v for k, v in cfg.items() if k not in skip and not k.startswith("mm_")}
    return AutoConfig.for_model(model_type, **kw)


def _grow_vocab(weights: dict[str, torch.Tensor], n_vocab: int, tie: bool) -> None:
    """Append rows up to ``n_vocab`` to the embedding and LM head, each the mean of the existing
    rows (what the llava code base does for the tokens it adds)."""
    for key in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
        if key not in weights:
            continue
        w = weights[key]
        if n_vocab > w.shape[0]:
            mean = w.float().mean(dim=0, keepdim=True).to(w.dtype)
            weights[key] = torch.cat([w, mean.expand(n_vocab - w.shape[0], -1)], dim=0)
    if "lm_head.weight" not in weights and tie:
        weights["lm_head.weight"] = weights["model.language_model.embed_tokens.weight"]


def convert_llava(src: str | Path, dst: str | Path, *, vision_tower: str | Path | None = None,
                  overwrite: bool = False) -> ConversionReport:
    """Convert the original-layout LLaVA checkpoint folder ``src`` into a transformers
    ``LlavaForConditionalGeneration`` folder ``dst`` (safetensors weights, config, tokenizer with
    ``<image>``, image processor, chat template). ``vision_tower``: a local transformers CLIP
    folder for the tower named by ``mm_vision_tower`` (needed unless the tower's weights are in
    ``src`` and ``mm_vision_tower`` is itself a local folder). Raises :class:`NotConvertible`
    (nothing written) when the conversion cannot be faithful, ``FileNotFoundError`` for a
    missing folder, ``FileExistsError`` for a non-empty ``dst`` without ``overwrite``."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaImageProcessor,
        LlavaProcessor,
    )

    src, out = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json (expected an original-layout LLaVA checkpoint folder)")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty (pass overwrite to replace its files)")
    cfg = _read_json(src / "config.json")
    model_type = _check_source(src, cfg)
    tower_name = str(cfg["mm_vision_tower"])
    tower_dir = Path(vision_tower) if vision_tower is not None else (
        Path(tower_name) if Path(tower_name).is_dir() else None)
    if tower_dir is None:
        raise NotConvertible(
            f"the vision tower is referenced by name ({tower_name!r}) and its configuration is not in {src}: pass "
            f"--vision-tower with a local copy of {tower_name} (a transformers CLIP folder: config.json, "
            "model.safetensors, preprocessor_config.json); nothing is downloaded"
        )
    if not tower_dir.is_dir():
        raise FileNotFoundError(f"vision tower folder not found: {tower_dir}")
    original = load_weights(src)
    in_src = any(k.startswith("model.vision_tower.vision_tower.") for k in original)
    vcfg, vweights, pre = _vision_from_folder(tower_dir)
    if not vweights and not in_src:
        raise NotConvertible(f"no vision tower weights: neither {src} nor {tower_dir} holds vision_model.* tensors")
    if int(cfg.get("mm_hidden_size", vcfg.hidden_size)) != vcfg.hidden_size:
        raise NotConvertible(f"mm_hidden_size {cfg.get('mm_hidden_size')} != the tower's hidden_size "
                             f"{vcfg.hidden_size}: {tower_dir} is not the tower this model was trained with")
    weights = _map_keys(original, None if in_src else vweights)

    tok_files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((src / f).is_file() for f in tok_files):
        raise NotConvertible(f"{src} has no tokenizer files ({', '.join(tok_files)})")
    refuse_remote_code(src)
    tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True, trust_remote_code=False)
    notes: list[str] = []
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token if tok.unk_token is not None else tok.eos_token
        notes.append(f"pad token = {tok.pad_token} (the llava code base pads with unk)")
    tok.add_tokens([IMAGE_TOKEN], special_tokens=True)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    if not isinstance(image_id, int):
        raise NotConvertible(f"the tokenizer maps {IMAGE_TOKEN} to {image_id!r}, not one id")
    text_cfg = _text_config(cfg, model_type)
    n_vocab = max(int(text_cfg.vocab_size), len(tok))
    if n_vocab > text_cfg.vocab_size:
        notes.append(f"vocabulary {text_cfg.vocab_size} -> {n_vocab}: <image> added (mean embedding/LM-head rows)")
        text_cfg.vocab_size = n_vocab
    _grow_vocab(weights, n_vocab, bool(getattr(text_cfg, "tie_word_embeddings", False)))

    select = cfg.get("mm_vision_select_feature", "patch")
    n_patches = (vcfg.image_size // vcfg.patch_size) ** 2
    lcfg = LlavaConfig(vision_config=vcfg, text_config=text_cfg, image_token_index=image_id,
                       projector_hidden_act="gelu", vision_feature_layer=int(cfg.get("mm_vision_select_layer", -2)),
                       vision_feature_select_strategy="default" if select == "patch" else "full",
                       image_seq_length=n_patches if select == "patch" else n_patches + 1,
                       multimodal_projector_bias="model.mm_projector.0.bias" in original,
                       tie_word_embeddings=bool(getattr(text_cfg, "tie_word_embeddings", False)))
    lcfg.pad_token_id = tok.pad_token_id
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(lcfg)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise NotConvertible(f"weights do not match transformers' LLaVA: missing {missing[:5]} ({len(missing)}), "
                             f"unexpected {unexpected[:5]} ({len(unexpected)})")
    for k, v in weights.items():
        ref = model.state_dict()[k]
        if tuple(v.shape) != tuple(ref.shape):
            raise NotConvertible(f"{k}: shape {tuple(v.shape)} in the checkpoint, {tuple(ref.shape)} expected")
    model.load_state_dict(weights, strict=True, assign=True)
    model.generation_config.pad_token_id = tok.pad_token_id

    pad = cfg.get("image_aspect_ratio", "square") == "pad"
    ip_kw: dict[str, Any] = {}
    if pre is not None:
        base = CLIPImageProcessor(**{k: v for k, v in pre.items() if k not in ("image_processor_type",
                                                                                "processor_class")})
        ip_kw = {"size": base.size, "crop_size": base.crop_size, "image_mean": base.image_mean,
                 "image_std": base.image_std, "resample": base.resample, "do_center_crop": base.do_center_crop,
                 "rescale_factor": base.rescale_factor}
    else:
        notes.append("no preprocessor_config.json in the tower folder: CLIP defaults sized to the tower")
        side = vcfg.image_size
        ip_kw = {"size": {"shortest_edge": side}, "crop_size": {"height": side, "width": side}}
    ip = LlavaImageProcessor(do_pad=pad, **ip_kw)
    template = MISTRAL_INSTRUCT_TEMPLATE if model_type == "mistral" else VICUNA_V1_TEMPLATE
    tok.chat_template = template
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=vcfg.patch_size,
                          vision_feature_select_strategy=lcfg.vision_feature_select_strategy,
                          chat_template=template, num_additional_image_tokens=1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    proc.save_pretrained(out)
    for stale in [*out.glob("*.bin"), *out.glob("*.pt")]:
        stale.unlink()
    return ConversionReport(out, model_type, len(weights), "checkpoint" if in_src else str(tower_dir), image_id,
                            notes + ["image preprocessing: pad to square" if pad else "image preprocessing: resize/crop"])


def describe(report: ConversionReport) -> Iterable[str]:
    """Human-readable lines for the CLI."""
    yield f"wrote {report.dst} (transformers LlavaForConditionalGeneration, {report.text_model_type} text model)"
    yield f"tensors: {report.n_tensors}; vision tower from {report.vision_tower_source}; " \
          f"<image> id {report.image_token_id}"
    for n in report.notes:
        yield f"note: {n}"
