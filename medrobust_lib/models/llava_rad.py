"""LLaVA-Rad (microsoft/LLaVA-Rad) loaded directly: its BiomedCLIP-CXR vision tower (an open_clip
CLIP whose image tower is a timm ViT), its projector and its LLaMA (Vicuna) language model.

Why a direct loader and not ``medrobust convert llava``: transformers' LLaVA holds CLIP/SigLIP
towers only, and LLaVA-Rad's tower is a timm ``VisionTransformer`` (patch embedding with a bias,
no pre-LayerNorm, LayerScale where the timm model has it); converting it would change the
model's outputs, so the conversion refuses it and this adapter runs the original pieces.

What the original code does (github.com/microsoft/LLaVA-Rad; paths in that repository):

- ``llava/model/multimodal_encoder/builder.py``: a config with ``mm_vision_tower_config`` and
  ``mm_vision_tower_checkpoint`` (the training scripts set ``biomedclip_cxr_518``,
  ``.../model_configs/biomedclip_cxr_518.json`` and ``biomedclipcxr_518_checkpoint.pt``) gets an
  ``OpenCLIPVisionTower``.
- ``open_clip_encoder/open_clip_encoder.py`` + ``utils.py``: the open_clip model config (JSON:
  ``embed_dim``, ``vision_cfg`` with ``timm_model_name``, ``text_cfg``) is registered under the
  tower name and ``open_clip.create_model_from_pretrained(name, pretrained=<checkpoint>)`` builds
  the CLIP and its eval transform (resize the shortest side to ``image_size``, bicubic, centre
  crop, RGB, OpenAI mean/std); when the configured JSON path does not exist it is fetched from the
  hub as ``biomedclipcxr_518.json``. Only ``model.visual.trunk`` is kept (``VisionTower``), and
  its forward is ``patch_embed -> _pos_embed -> norm_pre -> blocks`` collecting every block's
  output: hidden state 0 is the embedded input, ``i`` the output of block ``i``, the trunk's final
  ``norm`` is never applied. ``feature_select`` takes ``hidden_states[mm_vision_select_layer]``
  (-2 in the scripts) and drops index 0 (the CLS token) for ``mm_vision_select_feature: patch``.
- ``multimodal_projector/builder.py``: ``linear``, ``mlp<N>x_gelu`` (Linear, then N-1 times GELU
  + Linear: ``model.mm_projector.0``, ``.2``, ...; ``mlp2x_gelu`` in the scripts) or ``identity``.
- ``llava_arch.py`` ``prepare_inputs_labels_for_multimodal`` + ``language_model/llava_llama.py``:
  the image features replace the sentinel id ``IMAGE_TOKEN_INDEX = -200`` (``constants.py``)
  between the embedded text pieces; the result goes to the LLaMA as ``inputs_embeds``.
- ``mm_utils.py`` ``tokenizer_image_token``: the prompt is split at ``<image>``, each piece
  tokenised with BOS, the BOS kept once, the sentinel between the pieces.
- ``eval/model_mimic_cxr.py`` with ``scripts/eval.sh`` (``conv_mode v1``,
  ``conversation.py`` ``conv_vicuna_v1``): ``{system} USER: <image>\\n{question} ASSISTANT:``;
  the image goes through the tower's transform directly (``image_aspect_ratio`` is not read).
- ``model/builder.py``: the release (``microsoft/llava-rad``) is a LoRA over
  ``lmsys/vicuna-7b-v1.5``: the base LM, then ``non_lora_trainables.bin`` (the projector, keys
  ``base_model.model.model.mm_projector.*``), then the peft LoRA (``adapter_config.json`` +
  ``adapter_model.bin``) merged; the tokenizer is the base's.

Folders this adapter loads (nothing is downloaded; a missing file is a one-line error naming it):

- a LoRA release: ``adapter`` = the release folder (``config.json`` with the ``mm_*`` keys,
  ``adapter_config.json``, ``adapter_model.{safetensors,bin}``, ``non_lora_trainables.bin``, the
  tower config JSON and checkpoint), ``source`` = the base LLaMA folder (weights + tokenizer);
- a merged checkpoint (``scripts/merge_lora_weights.py``'s output, or any full
  ``LlavaLlamaForCausalLM`` folder): ``source`` = the folder (``config.json``, weights with
  ``model.*``, ``lm_head.*``, ``model.mm_projector.*``, tokenizer, tower files).

The tower files are looked up in the release folder: the configured path when it exists (an
absolute path, or one relative to the folder), else its file name, else (config only) the hub
name ``biomedclipcxr_518.json``. Tower weights always come from the tower checkpoint (the original
builds the tower from it after loading; ``model.vision_tower.*`` tensors a merged save carries are
ignored, as the original ignores them). The tower checkpoint is an open_clip training checkpoint
(``{"state_dict": {"module.visual.trunk.*": ...}}`` or a plain state dict); only
``visual.trunk.*`` is used and it must match the trunk exactly (strict, keys named).

Differences by construction: the original adds ``<im_patch>`` to the tokenizer when
``mm_use_im_patch_token`` is true or absent (``model/builder.py``); that token never occurs in a
prompt and is not added here, so full-vocabulary log-probabilities cover the base vocabulary only.
The original's LoRA merge and inference run in float16 on GPU; this adapter runs in the dtype the
config declares (float32 when none) on the configured device. Batches are left-padded (the
original groups prompts by length); padding is masked and positions follow the mask.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from medrobust_lib.hashing import short_file_hash
from medrobust_lib.models.base import GenerateFromCapped, VisionLanguageModel
from medrobust_lib.models.convert_llava import VICUNA_V1_SYSTEM, NotConvertible, _text_config, load_weights
from medrobust_lib.models.hf_vlm import ModelNotAvailable, batch_groups, first_token_ids, option_log_probs
from medrobust_lib.models.remote_code import refuse_remote_code

if TYPE_CHECKING:
    from medrobust_lib.config.vlm import VLMModelConfig
    from medrobust_lib.models.factory import VLMInputs

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_INDEX = -200
"""The sentinel id the original puts where the image features go (``llava/constants.py``)."""
HUB_TOWER_CONFIG = "biomedclipcxr_518.json"
"""The tower config's file name in the ``microsoft/llava-rad`` release (what the original fetches
when the configured path does not exist)."""
ARCHITECTURE = "LlavaLlamaForCausalLM"


@dataclass(frozen=True)
class LlavaRadFiles:
    """The files of one LLaVA-Rad model: the folder with ``config.json`` (``config``), the tower's
    open_clip config and checkpoint, and ``base``: the LLaMA folder a LoRA release applies to (None
    for a merged checkpoint, whose weights are in ``folder``)."""

    folder: Path
    config: dict[str, Any]
    tower_config: Path
    tower_checkpoint: Path
    base: Path | None


def _find(folder: Path, configured: str, what: str, key: str, extra: tuple[str, ...] = ()) -> Path:
    p = Path(configured)
    candidates = [p] if p.is_absolute() else [folder / p]
    candidates += [folder / n for n in dict.fromkeys((p.name, *extra))]
    for c in candidates:
        if c.is_file():
            return c
    names = ", ".join(dict.fromkeys(c.name for c in candidates))
    raise ModelNotAvailable(f"LLaVA-Rad {what} not found: {names} in {folder} ({key}: {configured!r}); nothing is "
                            "downloaded: copy it from the microsoft/llava-rad release into the folder")


def locate(folder: str | Path, base: str | Path | None = None) -> LlavaRadFiles:
    """Check the folder of a LLaVA-Rad release (``base``: its LLaMA folder) or merged checkpoint
    and find its files; :class:`~medrobust_lib.models.hf_vlm.ModelNotAvailable` naming the missing
    file, ValueError for a config this adapter cannot run faithfully."""
    root = Path(folder)
    if not root.is_dir():
        raise ModelNotAvailable(f"LLaVA-Rad folder not found: {root}")
    if not (root / "config.json").is_file():
        raise ModelNotAvailable(f"LLaVA-Rad folder {root} has no config.json")
    cfg = dict(json.loads((root / "config.json").read_text(encoding="utf-8")))
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise ValueError(f"{root}/config.json: architectures {cfg.get('architectures')} is not [{ARCHITECTURE!r}]")
    for key in ("mm_vision_tower_config", "mm_vision_tower_checkpoint", "mm_vision_select_layer", "mm_hidden_size"):
        if cfg.get(key) is None:
            raise ValueError(f"{root}/config.json has no {key}: not a LLaVA-Rad (open_clip tower) checkpoint; CLIP-tower "
                             "llava checkpoints are converted with `medrobust convert llava`")
    if cfg.get("mm_use_im_start_end"):
        raise ValueError(f"{root}/config.json: mm_use_im_start_end is true; LLaVA-Rad is trained without "
                         "<im_start>/<im_end> and this adapter does not write them")
    if cfg.get("mm_vision_select_feature", "patch") not in ("patch", "cls_patch"):
        raise ValueError(f"mm_vision_select_feature {cfg['mm_vision_select_feature']!r} is neither 'patch' nor "
                         "'cls_patch'")
    tower_cfg = _find(root, str(cfg["mm_vision_tower_config"]), "vision tower config", "mm_vision_tower_config",
                      (HUB_TOWER_CONFIG,))
    tower_ckpt = _find(root, str(cfg["mm_vision_tower_checkpoint"]), "vision tower checkpoint",
                       "mm_vision_tower_checkpoint")
    lora = [n for n in ("adapter_config.json", "non_lora_trainables.bin") if (root / n).is_file()]
    base_dir: Path | None = None
    if lora:
        for name in ("adapter_config.json", "non_lora_trainables.bin"):
            if name not in lora:
                raise ModelNotAvailable(f"LLaVA-Rad LoRA release {root} lacks {name}")
        if not any((root / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin")):
            raise ModelNotAvailable(f"LLaVA-Rad LoRA release {root} lacks adapter_model.safetensors / adapter_model.bin")
        if base is None:
            raise ValueError(f"{root} is a LoRA release over a base LLaMA (lmsys/vicuna-7b-v1.5 for microsoft/llava-rad): "
                             "name the base folder as `source` and this folder as `adapter`")
        base_dir = Path(base)
        if not (base_dir / "config.json").is_file():
            raise ModelNotAvailable(f"LLaVA-Rad base language model folder not found or without config.json: {base_dir}")
    return LlavaRadFiles(root, cfg, tower_cfg, tower_ckpt, base_dir)


def build_projector(cfg: dict[str, Any]) -> nn.Module:
    """``model.mm_projector`` as the original builds it from ``mm_projector_type``."""
    kind = str(cfg.get("mm_projector_type", "linear"))
    d_in, d_out = int(cfg["mm_hidden_size"]), int(cfg["hidden_size"])
    if kind == "linear":
        return nn.Linear(d_in, d_out)
    if kind == "identity":
        return nn.Identity()
    m = re.match(r"^mlp(\d+)x_gelu$", kind)
    if m is None:
        raise ValueError(f"unknown mm_projector_type {kind!r} (linear, mlp<N>x_gelu, identity)")
    layers: list[nn.Module] = [nn.Linear(d_in, d_out)]
    for _ in range(1, int(m.group(1))):
        layers += [nn.GELU(), nn.Linear(d_out, d_out)]
    return nn.Sequential(*layers)


def build_trunk(tower_config: dict[str, Any]) -> tuple[Any, int]:
    """(the timm trunk of the open_clip image tower, its input side in pixels) from an open_clip
    model config (``embed_dim``, ``vision_cfg`` with ``timm_model_name``), built by open_clip's own
    vision-tower builder with random weights (``timm_model_pretrained`` forced off: the weights come
    from the tower checkpoint)."""
    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    vcfg = dict(tower_config.get("vision_cfg") or {})
    if not vcfg.get("timm_model_name"):
        raise ValueError("the vision tower config names no vision_cfg.timm_model_name: LLaVA-Rad's VisionTower wraps a "
                         "timm VisionTransformer trunk")
    vcfg["timm_model_pretrained"] = False
    visual = _build_vision_tower(int(tower_config["embed_dim"]), CLIPVisionCfg(**vcfg))
    trunk = visual.trunk
    size = CLIPVisionCfg(**vcfg).image_size
    side = int(size if isinstance(size, int) else size[0])
    grid = getattr(trunk.patch_embed, "img_size", None)
    if grid is not None and tuple(grid) != (side, side) and not getattr(trunk.patch_embed, "dynamic_img_pad", False) \
            and not getattr(trunk, "dynamic_img_size", False):
        raise ValueError(f"vision_cfg.image_size {side} does not match {vcfg['timm_model_name']}'s input size {grid}")
    return trunk, side


def trunk_state(path: Path) -> dict[str, torch.Tensor]:
    """The ``visual.trunk.*`` tensors of an open_clip checkpoint (safetensors, or a pickle read
    with ``torch.load(weights_only=True)``: a training checkpoint's ``state_dict`` or a plain
    state dict; a DDP ``module.`` prefix is removed as open_clip does)."""
    obj: Any
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj = load_file(str(path))
    else:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path.name} is not an open_clip state dict")
    if str(next(iter(obj))).startswith("module"):
        obj = {str(k)[7:]: v for k, v in obj.items()}
    out = {k.removeprefix("visual.trunk."): v for k, v in obj.items() if k.startswith("visual.trunk.")}
    if not out:
        raise ValueError(f"{path.name} holds no visual.trunk.* tensors (an open_clip CLIP with a timm image tower)")
    return out


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """``module.load_state_dict(state)`` that names the missing and unexpected keys and the shape
    mismatches in one ValueError."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if missing or unexpected or shapes:
        raise ValueError(f"{what}: {len(missing)} missing {missing[:5]}, {len(unexpected)} unexpected "
                         f"{unexpected[:5]}, {len(shapes)} wrong shapes {shapes[:3]}")
    module.load_state_dict(state, strict=True)


def tokenize_image_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """``tokenizer_image_token``: each piece between ``<image>`` tokenised (with BOS), BOS kept
    once at the start, :data:`IMAGE_TOKEN_INDEX` between the pieces."""
    chunks = [list(tokenizer(c).input_ids) for c in prompt.split(IMAGE_TOKEN)]
    offset = 1 if chunks and chunks[0] and chunks[0][0] == tokenizer.bos_token_id else 0
    ids: list[int] = [chunks[0][0]] if offset else []
    for i, chunk in enumerate(chunks):
        if i:
            ids.append(IMAGE_TOKEN_INDEX)
        ids.extend(chunk[offset:])
    return ids


def prompt_text(question: str, with_image: bool) -> str:
    """``conv_vicuna_v1`` (``conv_mode v1``) with one user turn, as ``model_mimic_cxr.py`` writes it."""
    q = question.replace(IMAGE_TOKEN, "").strip()
    return f"{VICUNA_V1_SYSTEM} USER: {IMAGE_TOKEN}\n{q} ASSISTANT:" if with_image else \
        f"{VICUNA_V1_SYSTEM} USER: {q} ASSISTANT:"


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _declared_dtype(cfg: dict[str, Any]) -> torch.dtype:
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    value = getattr(torch, str(name), None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else torch.float32


def _lora_weights(files: LlavaRadFiles, lm: nn.Module) -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    """Apply a LoRA release to ``lm`` as ``model/builder.py`` does: the non-LoRA trainables (the
    projector, returned; any language-model tensor is loaded into ``lm``), then the peft LoRA,
    loaded strictly and merged. Returns (merged LM, projector tensors, adapter file hash)."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    raw = torch.load(str(files.folder / "non_lora_trainables.bin"), map_location="cpu", weights_only=True)
    state = {(k[11:] if k.startswith("base_model.") else k): v for k, v in raw.items()}
    if any(k.startswith("model.model.") for k in state):
        state = {(k[6:] if k.startswith("model.") else k): v for k, v in state.items()}
    proj = {k: v for k, v in state.items() if k.startswith("model.mm_projector.")}
    rest = {k: v for k, v in state.items() if k not in proj and not k.startswith("model.vision_tower.")}
    unknown = sorted(set(rest) - set(lm.state_dict()))
    if unknown:
        raise ValueError(f"non_lora_trainables.bin: {len(unknown)} tensors of unknown role, e.g. {unknown[:5]}")
    if rest:
        lm.load_state_dict(rest, strict=False)
    st, pt = files.folder / "adapter_model.safetensors", files.folder / "adapter_model.bin"
    weights_file = st if st.is_file() else pt
    if weights_file.suffix == ".safetensors":
        from safetensors.torch import load_file

        adapter = load_file(str(weights_file))
    else:
        adapter = torch.load(str(weights_file), map_location="cpu", weights_only=True)
    lcfg = LoraConfig.from_pretrained(str(files.folder))
    lcfg.inference_mode = True
    with warnings.catch_warnings():  # peft calls a deprecated transformers property while wrapping
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(lm, lcfg)
    result = set_peft_model_state_dict(peft_model, adapter)
    lora_keys = {k for k in peft_model.state_dict() if "lora_" in k}
    missing = sorted(k for k in lora_keys if k in set(getattr(result, "missing_keys", [])))
    unexpected = sorted(getattr(result, "unexpected_keys", []))
    if missing or unexpected:
        raise ValueError(f"{weights_file.name}: {len(missing)} missing LoRA tensors {missing[:3]}, "
                         f"{len(unexpected)} unexpected {unexpected[:3]}")
    return peft_model.merge_and_unload(), proj, short_file_hash(weights_file)


def _to_pil(image: np.ndarray) -> Any:
    from PIL import Image

    u8 = np.round(np.clip(np.asarray(image, np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)
    if u8.ndim == 2:
        u8 = np.repeat(u8[..., None], 3, axis=2)
    return Image.fromarray(u8, mode="RGB")


class LlavaRadVLM(GenerateFromCapped):
    """``generate`` and ``score`` over LLaVA-Rad run as its original code runs it (see the module
    docstring). Images: float32 in [0, 1], (H, W) or (H, W, 3), or None for a text-only prompt."""

    def __init__(self, source: str | Path, *, release: str | Path | None = None, model_id: str | None = None,
                 device: str = "cpu", dtype: torch.dtype | None = None) -> None:
        from open_clip.transform import PreprocessCfg, image_transform_v2
        from transformers import AutoTokenizer, LlamaForCausalLM
        from transformers.initialization import no_init_weights

        files = locate(release, base=source) if release is not None else locate(source)
        self.files = files
        cfg = files.config
        self.select_layer = int(cfg["mm_vision_select_layer"])
        self.select_feature = str(cfg.get("mm_vision_select_feature", "patch"))
        self.dtype = dtype or _declared_dtype(cfg)
        self.device = torch.device(device)

        tower_cfg = dict(json.loads(files.tower_config.read_text(encoding="utf-8")))
        trunk, side = build_trunk(tower_cfg)
        load_strict(trunk, trunk_state(files.tower_checkpoint), f"vision tower {files.tower_checkpoint.name}")
        if int(getattr(trunk, "embed_dim", cfg["mm_hidden_size"])) != int(cfg["mm_hidden_size"]):
            raise ValueError(f"mm_hidden_size {cfg['mm_hidden_size']} != the tower's width {trunk.embed_dim}: "
                             f"{files.tower_checkpoint.name} is not the tower this model was trained with")
        n_states = len(trunk.blocks) + 1
        if not -n_states <= self.select_layer < n_states:
            raise ValueError(f"mm_vision_select_layer {self.select_layer} outside the tower's {n_states} hidden states")
        self.tower: Any = trunk  # a timm VisionTransformer
        # the tower's eval transform: open_clip's defaults at the tower's image size, as
        # create_model_from_pretrained builds them for a registered model name with a checkpoint file
        self.transform = image_transform_v2(PreprocessCfg(size=side), is_train=False)
        self.image_size = side

        self.projector = build_projector(cfg)
        text_cfg = _text_config(cfg, "llama")
        with no_init_weights(), _default_dtype(self.dtype):
            lm: Any = LlamaForCausalLM(text_cfg)
        self.adapter_hash: str | None = None
        tok_dir = files.base if files.base is not None else files.folder
        if files.base is None:
            try:
                weights = load_weights(files.folder)
            except NotConvertible as exc:
                raise ModelNotAvailable(f"LLaVA-Rad weights: {exc}") from None
            proj = {k: v for k, v in weights.items() if k.startswith("model.mm_projector.")}
            lm_state = {k: v for k, v in weights.items() if not k.startswith(("model.mm_projector.",
                                                                                 "model.vision_tower."))
                        and not k.endswith(".inv_freq")}
            load_strict(lm, lm_state, f"language model of {files.folder}")
        else:
            try:
                base_weights = load_weights(files.base)
            except NotConvertible as exc:
                raise ModelNotAvailable(f"LLaVA-Rad base language model: {exc}") from None
            load_strict(lm, {k: v for k, v in base_weights.items() if not k.endswith(".inv_freq")},
                        f"base language model {files.base}")
            lm, proj, self.adapter_hash = _lora_weights(files, lm)
        load_strict(self.projector, {k.removeprefix("model.mm_projector."): v for k, v in proj.items()},
                    "projector (model.mm_projector.*)")
        self.lm = lm
        for module in (self.tower, self.projector, self.lm):
            module.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.lm.generation_config.do_sample = False
        refuse_remote_code(tok_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True, trust_remote_code=False)
        if self.tokenizer.pad_token_id is None:  # the code base pads with unk
            self.tokenizer.pad_token = self.tokenizer.unk_token or self.tokenizer.eos_token
        self.model_id = model_id or files.folder.name
        self.n_vision_calls = 0

    @classmethod
    def from_config(cls, m: VLMModelConfig, inputs: VLMInputs) -> LlavaRadVLM:
        """The model of a suite's ``kind: llava_rad`` entry: ``source`` = the merged checkpoint
        folder, or the base LLaMA folder with ``adapter`` = the LoRA release folder."""
        if inputs.source is None:
            raise ValueError(f"VLM {m.id!r} names no source (a LLaVA-Rad folder, or the base LLaMA folder of a "
                             "LoRA release named as adapter)")
        return cls(inputs.source, release=inputs.adapter, model_id=m.id, device=m.device)

    # ---- the original forward, piece by piece -------------------------------------------------
    def pixels(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """(B, 3, S, S) float tensor: each image as uint8 RGB through the tower's transform."""
        return torch.stack([self.transform(_to_pil(im)) for im in images]).to(self.device, self.dtype)

    @torch.no_grad()
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """Projected image features (B, N, hidden): ``VisionTower.forward`` up to the selected
        hidden state (the blocks after it do not change it), ``feature_select``, the projector."""
        vit: Any = self.tower
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(pixels)))
        n_states = len(vit.blocks) + 1
        for block in list(vit.blocks)[: self.select_layer % n_states]:
            h = block(h)
        self.n_vision_calls += int(pixels.shape[0])
        feats = h[:, 1:] if self.select_feature == "patch" else h
        out: torch.Tensor = self.projector(feats)
        return out

    def input_ids(self, prompts: Sequence[str], with_image: bool) -> list[list[int]]:
        return [tokenize_image_prompt(self.tokenizer, prompt_text(p, with_image)) for p in prompts]

    def embed(self, ids: Sequence[list[int]], feats: torch.Tensor | Sequence[torch.Tensor] | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs_embeds (B, L, hidden), attention_mask (B, L)): the text embeddings with row b's
        image features in place of its sentinel, left-padded with zeros (mask 0)."""
        emb = self.lm.get_input_embeddings()
        rows: list[torch.Tensor] = []
        for b, row in enumerate(ids):
            at = [i for i, t in enumerate(row) if t == IMAGE_TOKEN_INDEX]
            if len(at) != (0 if feats is None else 1):
                raise ValueError(f"prompt {b} has {len(at)} image tokens for {0 if feats is None else 1} image")
            if feats is None:
                rows.append(emb(torch.tensor(row, device=self.device)))
                continue
            p = at[0]
            rows.append(torch.cat([emb(torch.tensor(row[:p], device=self.device, dtype=torch.long)), feats[b],
                                   emb(torch.tensor(row[p + 1:], device=self.device, dtype=torch.long))]))
        width = max(r.shape[0] for r in rows)
        out = torch.zeros(len(rows), width, rows[0].shape[1], dtype=rows[0].dtype, device=self.device)
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for b, r in enumerate(rows):
            out[b, width - r.shape[0]:] = r
            mask[b, width - r.shape[0]:] = 1
        return out, mask

    def _batch(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        with_image = images[0] is not None
        if any((im is not None) != with_image for im in images):
            raise ValueError("a batch must be all image prompts or all text-only prompts")
        feats = self.image_features(self.pixels([im for im in images if im is not None])) if with_image else None
        return self.embed(self.input_ids(prompts, with_image), feats)

    @torch.no_grad()
    def last_logits(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, vocab) after each left-padded row."""
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out: torch.Tensor = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos).logits[:, -1, :]
        return out

    # ---- the VisionLanguageModel protocol --------------------------------------------------------
    @torch.no_grad()
    def generate_capped(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], *,
                        max_new_tokens: int = 32, batch_size: int = 8) -> list[tuple[str, bool]]:
        """:meth:`generate` with, per answer, whether it hit ``max_new_tokens`` without an
        end-of-sequence token."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images for {len(prompts)} prompts")
        tok = self.tokenizer
        eos = tok.eos_token_id
        out: list[tuple[str, bool]] = [("", False)] * len(prompts)
        for idx in batch_groups(images, batch_size):
            embeds, mask = self._batch([images[i] for i in idx], [prompts[i] for i in idx])
            gen = self.lm.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=max_new_tokens,
                                   do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=eos)
            texts = tok.batch_decode(gen, skip_special_tokens=True)
            for row, i in enumerate(idx):
                ids = gen[row].tolist()
                out[i] = (texts[row].strip(), len(ids) >= max_new_tokens and eos not in ids)
        return out

    def option_token_ids(self, options: Sequence[str]) -> list[int]:
        """The first token of each option (encoded without special tokens)."""
        return first_token_ids(self.tokenizer, options)

    @torch.no_grad()
    def score(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], options: Sequence[str], *,
              batch_size: int = 8) -> list[dict[str, float]]:
        """Natural-log probability (over the whole vocabulary) of each option's first token as the
        next token after the prompt, one dict per (image, prompt)."""
        ids = self.option_token_ids(options)
        out: list[dict[str, float]] = [{} for _ in prompts]
        for idx in batch_groups(images, batch_size):
            embeds, mask = self._batch([images[i] for i in idx], [prompts[i] for i in idx])
            for i, scores in zip(idx, option_log_probs(self.last_logits(embeds, mask), ids, options), strict=True):
                out[i] = scores
        return out

    @torch.no_grad()
    def score_variants(self, image: np.ndarray | None, prompts: Sequence[str], options: Sequence[str], *,
                       batch_size: int = 16) -> list[dict[str, float]]:
        """:meth:`score` for several prompts about one image, the tower run once."""
        if image is None:
            return self.score([None] * len(prompts), prompts, options, batch_size=batch_size)
        ids = self.option_token_ids(options)
        feats = self.image_features(self.pixels([image]))[0]
        out: list[dict[str, float]] = []
        for s in range(0, len(prompts), batch_size):
            chunk = list(prompts[s : s + batch_size])
            embeds, mask = self.embed(self.input_ids(chunk, True), [feats] * len(chunk))
            out.extend(option_log_probs(self.last_logits(embeds, mask), ids, options))
        return out


_PROTOCOL: type[VisionLanguageModel] = LlavaRadVLM
"""Static proof (mypy) that the adapter satisfies :class:`VisionLanguageModel`."""
