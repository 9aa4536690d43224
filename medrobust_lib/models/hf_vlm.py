"""Local Hugging Face vision-language models (LLaVA, LLaVA-NeXT, Gemma 3, Qwen2-VL, Qwen2.5-VL,
Idefics3/SmolVLM, PaliGemma, Mllama) behind one adapter.

Loaded with ``AutoModelForImageTextToText`` + ``AutoProcessor`` from a local folder, or from the
local Hugging Face cache by hub id with ``local_files_only=True``: nothing is downloaded at run
time. Prompts go through the processor's chat template. Decoding is greedy (the release's
generation config is neutralised). Batches are left-padded so greedy outputs do not depend on the
batch composition. What differs per architecture (images nested per prompt, prompt layout without
a chat template, how the vision encoder's images are counted, ...) is read from
:mod:`medrobust_lib.models.vlm_conventions`.

Images: float32 in [0, 1], (H, W) grayscale (replicated to RGB for the processor) or (H, W, 3), or
``None`` for a text-only prompt (the image-removal baseline of the safety taxonomy).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from medrobust_lib.hashing import digest, short_file_hash
from medrobust_lib.models.base import GenerateFromCapped, VisionLanguageModel
from medrobust_lib.models.remote_code import refuse_remote_code
from medrobust_lib.models.shared_image import shared_image
from medrobust_lib.models.vlm_conventions import conventions_for, encode_prompts, prompt_text
from medrobust_lib.seeding import scoped_torch_seed

if TYPE_CHECKING:
    from medrobust_lib.config.vlm import VLMModelConfig
    from medrobust_lib.models.factory import VLMInputs


_PROMPT_MEMO = 4096
"""Rendered prompts a model remembers (:meth:`HFVisionLanguageModel.chat_prompt`) before it starts over."""


def first_token_ids(tokenizer: Any, options: Sequence[str]) -> list[int]:
    """The first token id of each option, encoded without special tokens (the token a one-step
    score reads). ValueError when an option encodes to nothing or two options share a first token."""
    ids = []
    for o in options:
        enc = tokenizer(o, add_special_tokens=False)["input_ids"]
        if not enc:
            raise ValueError(f"option {o!r} encodes to no token")
        ids.append(int(enc[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"options {list(options)} share a first token; cannot score them by log-probability")
    return ids


def option_log_probs(logits: torch.Tensor, ids: Sequence[int], options: Sequence[str]) -> list[dict[str, float]]:
    """Next-token ``logits`` (B, vocab) -> per row, the natural-log probability (over the whole
    vocabulary) of each option's first token ``ids``, keyed by option."""
    logp = torch.log_softmax(logits.float(), dim=-1)[:, list(ids)].cpu().numpy()
    return [{o: float(row[k]) for k, o in enumerate(options)} for row in logp]


def batch_groups(images: Sequence[np.ndarray | None], batch_size: int) -> list[list[int]]:
    """Index batches of at most ``batch_size``, each all-image or all-text-only (a text-only prompt
    has ``None`` for its image), in input order within a kind."""
    out: list[list[int]] = []
    for kind in (True, False):
        idx = [i for i, im in enumerate(images) if (im is not None) == kind]
        out.extend(idx[j : j + batch_size] for j in range(0, len(idx), batch_size))
    return out


class ModelNotAvailable(FileNotFoundError):
    """A model folder or cached hub id that is not on this machine."""


def _to_uint8_rgb(image: np.ndarray) -> np.ndarray:
    u8 = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.repeat(u8[..., None], 3, axis=2) if u8.ndim == 2 else u8


class HFVisionLanguageModel(GenerateFromCapped):
    """``generate`` and ``score`` over a local transformers image-text-to-text model."""

    def __init__(self, source: str | Path, *, model_id: str | None = None, device: str = "cpu",
                 dtype: torch.dtype | None = None, revision: str | None = None,
                 adapter: str | Path | None = None, system_prompt: str | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0) -> None:
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Loading weights" bar per partition drowns the logs

        self.adapter_hash: str | None = None
        self.system_prompt, self.temperature, self.top_p, self.seed = system_prompt, float(temperature), float(top_p), seed
        adapter_weights = self._adapter_weights(adapter) if adapter is not None else None
        src = str(source)
        local = Path(src).is_dir()
        if not local and ("/" not in src or Path(src).suffix or src.startswith((".", "/"))):
            raise ModelNotAvailable(f"model folder not found: {src}")
        refuse_remote_code(src, revision)  # a folder naming code of its own (auto_map): one line, nothing loaded
        kwargs: dict[str, Any] = {"local_files_only": True, "revision": revision}
        try:
            # trust_remote_code=False: a model folder's own code never runs (transformers would ask on stdin)
            self.processor = AutoProcessor.from_pretrained(src, trust_remote_code=False, **kwargs)
            # dtype None: the dtype config.json declares (a checkpoint stored as float16 to save bytes
            # still loads as the float32 it declares), else the checkpoint's own ("auto")
            declared = dtype or getattr(AutoConfig.from_pretrained(src, trust_remote_code=False, **kwargs),
                                        "dtype", None) or "auto"
            loaded: Any = AutoModelForImageTextToText.from_pretrained(src, dtype=declared, trust_remote_code=False,
                                                                       **kwargs)
            self.model = loaded.to(device).eval()
        except OSError as exc:
            raise ModelNotAvailable(
                f"{src} is not available locally ({type(exc).__name__}). Nothing is downloaded at run time: put the "
                "model folder on disk (save_pretrained layout) and name the folder, or pre-fill the Hugging Face "
                "cache (HF_HOME) on a machine with access and name the hub id."
            ) from None
        if adapter_weights is not None:
            self.model = self._merge_adapter(self.model, adapter_weights)
        self.model_id = model_id or Path(src).name
        self.device = torch.device(device)
        tok = self.processor.tokenizer
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        self.conventions = conventions_for(str(getattr(self.model.config, "model_type", "")))
        self._neutralise_generation_config()
        self.n_vision_calls = 0
        self._prompts: dict[tuple[str, bool], str] = {}  # chat_prompt memo (the template is fixed per model)
        self._reuse_encoder: bool | None = None  # _accepts_encoder_outputs, once known
        self._batch_images = 0  # images of the batch now in the model (the "batch" count)
        tower = self._vision_module()
        if tower is not None:
            tower.register_forward_pre_hook(self._count_vision, with_kwargs=True)

    @classmethod
    def from_config(cls, m: VLMModelConfig, inputs: VLMInputs) -> HFVisionLanguageModel:
        """The model of a suite's ``kind: hf`` entry: weights from ``inputs.source`` (plus the LoRA
        adapter ``inputs.adapter`` when given) on ``m.device``; the constructor that
        :func:`medrobust_lib.models.factory.build_vlm` calls."""
        if inputs.source is None:
            raise ValueError(f"VLM {m.id!r} names no source (a local model folder or a cached hub id)")
        kw: dict[str, Any] = {"adapter": inputs.adapter} if inputs.adapter else {}
        return cls(inputs.source, model_id=m.id, device=m.device, system_prompt=m.system_prompt,
                   temperature=m.temperature, top_p=m.top_p, seed=inputs.seed, **kw)

    @staticmethod
    def _adapter_weights(adapter: str | Path) -> Path:
        """The safetensors file of a peft LoRA adapter folder (pickle ``.bin`` adapters are refused)."""
        folder = Path(adapter)
        weights, config = folder / "adapter_model.safetensors", folder / "adapter_config.json"
        if not folder.is_dir():
            raise ModelNotAvailable(f"LoRA adapter folder not found: {folder}")
        if not weights.is_file() or not config.is_file():
            raise ModelNotAvailable(
                f"LoRA adapter folder {folder} lacks adapter_config.json or adapter_model.safetensors "
                "(save it with save_pretrained(..., safe_serialization=True); pickle .bin adapters are not loaded)"
            )
        return weights

    def _merge_adapter(self, model: Any, weights: Path) -> Any:
        """Load the LoRA adapter beside ``weights`` onto ``model`` frozen, merge it into the base
        weights and record the first 16 hex digits of the safetensors file's SHA-256."""

        from peft import PeftModel

        adapter_hash = short_file_hash(weights)

        with warnings.catch_warnings():  # peft calls a deprecated transformers property while loading
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = PeftModel.from_pretrained(model, str(weights.parent), is_trainable=False)
        merged = peft_model.merge_and_unload()
        self.adapter_hash = adapter_hash
        return merged.eval()

    def _vision_module(self) -> Any:
        name = self.conventions.vision_module
        for owner in (self.model, getattr(self.model, "model", None)):
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, torch.nn.Module):
                return module
        return None

    def _count_vision(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook on the vision encoder: adds the number of images it encodes now
        (the family's ``count`` rule, see :mod:`medrobust_lib.models.vlm_conventions`)."""
        rule = self.conventions.count
        if rule == "grid":
            grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
            self.n_vision_calls += int(grid.shape[0]) if grid is not None else self._batch_images
        elif rule == "aspect" and kwargs.get("aspect_ratio_ids") is not None:
            self.n_vision_calls += int((kwargs["aspect_ratio_ids"] > 0).sum())
        elif rule == "pixels":
            pixels: Any = args[0] if args else kwargs.get("pixel_values")
            self.n_vision_calls += int(pixels.shape[0]) if isinstance(pixels, torch.Tensor) else self._batch_images
        else:
            self.n_vision_calls += self._batch_images

    def _neutralise_generation_config(self) -> None:
        """Greedy decoding whatever the release's ``generation_config.json`` says (sampling,
        temperature, top-k/p, repetition penalty would make answers non-greedy or warn)."""
        gc = getattr(self.model, "generation_config", None)
        if gc is None:
            return
        gc.do_sample = False
        for name, neutral in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 50), ("repetition_penalty", 1.0)):
            if getattr(gc, name, None) is not None:
                setattr(gc, name, neutral)

    # ---- prompts ---------------------------------------------------------------------------
    def chat_prompt(self, question: str, with_image: bool) -> str:
        """The prompt text for one user turn (the family's chat template, or its prompt layout).
        Rendered once per (question, with_image) and remembered: evaluations ask the same questions
        of every image, and rendering the Jinja template cost more than tokenising."""
        key = (question, with_image)
        text = self._prompts.get(key)
        if text is None:
            if len(self._prompts) >= _PROMPT_MEMO:
                self._prompts.clear()
            text = self._prompts[key] = prompt_text(self.processor, self.conventions, question, with_image,
                                                    self.system_prompt)
        return text

    def _inputs(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> Any:
        with_image = images[0] is not None
        if any((im is not None) != with_image for im in images):
            raise ValueError("a batch must be all image prompts or all text-only prompts")
        texts = [self.chat_prompt(p, with_image) for p in prompts]
        pics = [_to_uint8_rgb(np.asarray(im)) for im in images if im is not None] if with_image else None
        batch = encode_prompts(self.processor, self.conventions, texts, pics)
        self._batch_images = len(pics) if pics is not None else 0
        return batch.to(self.device)

    @torch.no_grad()
    def generate_capped(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], *,
                        max_new_tokens: int = 32, batch_size: int = 8) -> list[tuple[str, bool]]:
        """:meth:`generate` with, per answer, whether it hit the cap: ``max_new_tokens`` tokens came
        out without an end-of-sequence token (the answer was cut, not finished)."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images for {len(prompts)} prompts")
        stops = self._stop_ids()
        out: list[tuple[str, bool]] = [("", False)] * len(prompts)
        for idx in batch_groups(images, batch_size):
            asked = [prompts[i] for i in idx]
            batch = self._inputs([images[i] for i in idx], asked)
            with self._seeded(asked):
                gen = self.model.generate(**batch, max_new_tokens=max_new_tokens,
                                          pad_token_id=self.processor.tokenizer.pad_token_id, **self._sampling())
            new = gen[:, batch["input_ids"].shape[1]:]
            texts = self.processor.tokenizer.batch_decode(new, skip_special_tokens=True)
            for row, (i, text) in enumerate(zip(idx, texts, strict=True)):
                ids = new[row].tolist()
                out[i] = (text.strip(), len(ids) >= max_new_tokens and not stops.intersection(ids))
        return out

    def _sampling(self) -> dict[str, Any]:
        """``generate``'s decoding arguments: greedy at temperature 0, else sampling at the
        temperature and top-p (under :meth:`_seeded`, which seeds from the batch)."""
        if self.temperature <= 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}

    def _seeded(self, prompts: Sequence[str]) -> AbstractContextManager[None]:
        """When sampling, torch's generators seeded from (seed, the batch's prompts) for the block and
        restored after it (:func:`~medrobust_lib.seeding.scoped_torch_seed`), so a rerun of the same
        batch draws the same answers; greedy decoding draws nothing."""
        if self.temperature <= 0:
            return nullcontext()
        return scoped_torch_seed("hf_vlm.sample", self.seed, digest(list(prompts)), module=self.model)

    def _stop_ids(self) -> set[int]:
        """Token ids that end an answer: the generation config's end-of-sequence id(s), else the
        tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.processor.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list | tuple) else [eos]
        return {int(i) for i in ids if i is not None}

    def option_token_ids(self, options: Sequence[str]) -> list[int]:
        """The first token of each option (encoded without special tokens)."""
        return first_token_ids(self.processor.tokenizer, options)

    @torch.no_grad()
    def score(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], options: Sequence[str], *,
              batch_size: int = 8) -> list[dict[str, float]]:
        """Log-probability (natural log, over the whole vocabulary) of each option's first token as
        the next token after the generation prompt, one dict per (image, prompt)."""
        ids = self.option_token_ids(options)
        out: list[dict[str, float]] = [{} for _ in prompts]
        for idx in batch_groups(images, batch_size):
            batch = self._inputs([images[i] for i in idx], [prompts[i] for i in idx])
            for i, scores in zip(idx, option_log_probs(self.model(**batch).logits[:, -1, :], ids, options),
                                 strict=True):
                out[i] = scores
        return out

    @torch.no_grad()
    def score_variants(self, image: np.ndarray | None, prompts: Sequence[str], options: Sequence[str], *,
                       batch_size: int = 16) -> list[dict[str, float]]:
        """:meth:`score` for several prompts about ONE image, running the vision tower once.

        The image features are computed once and handed to the model as precomputed encoder
        outputs (``mm_encoder_outputs``) for every prompt; models whose forward does not accept
        them fall back to :meth:`score` (the tower then runs per prompt, visible in
        ``n_vision_calls``). ``image`` None scores text-only prompts. Returns one dict per prompt,
        equal to :meth:`score` up to float rounding."""
        if image is None or not self._accepts_encoder_outputs():
            return self.score([image] * len(prompts), prompts, options, batch_size=batch_size)
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        ids = self.option_token_ids(options)
        pic = _to_uint8_rgb(np.asarray(image))
        pooled: Any = None
        out: list[dict[str, float]] = []
        for s in range(0, len(prompts), batch_size):
            chunk = list(prompts[s : s + batch_size])
            texts = [self.chat_prompt(p, True) for p in chunk]
            # tokenise with the image placeholder expanded; the image processor runs on one copy
            with shared_image(self.processor):
                batch = encode_prompts(self.processor, self.conventions, texts, [pic] * len(chunk))
            pixels = batch.pop("pixel_values")
            batch = batch.to(self.device)
            if pooled is None:  # every row is the same image: encode it once, for every chunk
                self._batch_images = 1
                feats = self.model.model.get_image_features(pixel_values=pixels[:1].to(self.device), return_dict=True)
                pooled = feats.pooler_output  # LLaVA: one tensor per image; Gemma 3, PaliGemma: (1, T, D)
            rep = (pooled.repeat(len(chunk), *([1] * (pooled.dim() - 1))) if isinstance(pooled, torch.Tensor)
                   else list(pooled) * len(chunk))
            mm = {"image": BaseModelOutputWithPooling(pooler_output=rep)}  # type: ignore[arg-type]
            out.extend(option_log_probs(self.model(**batch, mm_encoder_outputs=mm).logits[:, -1, :], ids, options))
        return out

    def _accepts_encoder_outputs(self) -> bool:
        known = self._reuse_encoder
        if known is None:
            inner = getattr(self.model, "model", None)
            known = self._reuse_encoder = bool(
                self.conventions.reuse_encoder and inner is not None and hasattr(inner, "get_image_features")
                and "mm_encoder_outputs" in inspect.signature(inner.forward).parameters)
        return known


_PROTOCOL: type[VisionLanguageModel] = HFVisionLanguageModel
"""Static proof (mypy) that the adapter satisfies :class:`VisionLanguageModel`."""
