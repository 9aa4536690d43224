"""LoRA fine-tuning of a transformers image-text-to-text model (LLaVA-, Gemma3-style) with peft.

Adapters go on the language model's attention and MLP projections only (q/k/v/o, gate/up/down);
the vision tower (whose CLIP/SigLIP attention also has ``q_proj``/``k_proj``/``v_proj``), the
multimodal projector, the embeddings and the LM head stay frozen and unadapted. Training is
:func:`medrobust_lib.training.vlm_train.train_vlm` (answer-only loss, early stopping on the
validation loss); the adapter is saved with safetensors only, next to a ``training.json`` that
records the settings and the outcome. Evaluation loads it with
``HFVisionLanguageModel(base_folder, adapter=out_dir)``.

Randomness: peft draws the LoRA A initialisation, and LoRA dropout draws its masks, from torch's
global generator; both happen inside ``torch.random.fork_rng`` scopes seeded from the training
seed, so a run is reproducible and the caller's global RNG state is left untouched.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.hashing import file_sha256
from medrobust_lib.models.vlm_conventions import LM_PROJ_REGEX as _LM_PROJ_REGEX
from medrobust_lib.seeding import scoped_torch_seed
from medrobust_lib.training.vlm_train import (
    VLMExample,
    VLMTrainConfig,
    VLMTrainResult,
    encode_examples,
    mean_loss,
    train_vlm,
)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
TRAINING_JSON = "training.json"

# The language model's projections, for every architecture of the conventions table (its docstring
# lists the module names per family); vision towers and projectors never match.
LM_PROJ_REGEX = _LM_PROJ_REGEX


def lora_regex(settings: LoraSettings) -> str:
    """The modules ``settings`` puts LoRA on: its ``target_regex``, else :data:`LM_PROJ_REGEX`."""
    return settings.target_regex or LM_PROJ_REGEX


@dataclass
class LoraResult:
    """What :func:`finetune_lora` produced. ``model`` is the trained peft model (eval mode)."""

    model: Any
    adapter_dir: Path
    adapter_file: Path
    config_file: Path
    training_json: Path
    adapter_hash: str
    initial_val_loss: float
    train: VLMTrainResult
    n_trainable: int
    n_total: int
    target_modules: list[str]


def _base(model: Any) -> Any:
    """The underlying transformers model of a peft model (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def lora_target_modules(model: Any, regex: str = LM_PROJ_REGEX) -> list[str]:
    """Names of the ``nn.Linear`` modules of ``model`` (or, on a peft model, the LoRA layers wrapping
    them) whose full name matches ``regex`` (full match, as peft applies it), in module order.
    Raises ``ValueError`` when nothing matches."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    pattern = re.compile(regex)
    names = [n for n, m in _base(model).named_modules()
             if n and isinstance(m, torch.nn.Linear | BaseTunerLayer) and pattern.fullmatch(n)]
    if not names:
        linear = [n for n, m in _base(model).named_modules() if isinstance(m, torch.nn.Linear)]
        raise ValueError(
            f"LoRA target regex {regex!r} matches no Linear module of {type(_base(model)).__name__} "
            f"(full match over module names; {len(linear)} Linear modules, e.g. {linear[:4]})"
        )
    return names


def apply_lora(model: Any, settings: LoraSettings, *, seed: int = 0) -> Any:
    """Wrap ``model`` with peft LoRA on the modules matched by :func:`lora_regex`; only the
    LoRA parameters require grad afterwards. The model is modified in place (peft injects the
    layers) and the returned peft model shares its weights."""
    from peft import LoraConfig, get_peft_model

    regex = lora_regex(settings)
    lora_target_modules(model, regex)  # clear error before peft's
    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                     target_modules=regex, bias="none")
    with scoped_torch_seed(seed, "lora-init", module=model), warnings.catch_warnings():
        # peft reads a transformers property deprecated in v5 while wrapping (as in models/hf_vlm.py)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, cfg)
    return peft_model


def trainable_summary(model: Any) -> dict[str, Any]:
    """``n_trainable`` / ``n_total`` parameter counts and ``modules``: names (in the base model)
    of the modules that carry a LoRA adapter."""
    from peft.tuners.lora import LoraLayer

    params = list(model.parameters())
    return {
        "n_trainable": sum(p.numel() for p in params if p.requires_grad),
        "n_total": sum(p.numel() for p in params),
        "modules": [n for n, m in _base(model).named_modules() if isinstance(m, LoraLayer)],
    }


def adapter_hash(folder: str | Path) -> str:
    """First 16 hex digits of the SHA-256 of the adapter's safetensors file."""
    return file_sha256(Path(folder) / ADAPTER_WEIGHTS)[:16]


def finetune_lora(model: Any, processor: Any, train_examples: Sequence[VLMExample],
                  val_examples: Sequence[VLMExample], settings: LoraSettings, train_cfg: VLMTrainConfig,
                  out_dir: str | Path, *, base_model_hash: str | None = None,
                  log: Callable[[str], None] | None = None) -> LoraResult:
    """Apply LoRA to ``model`` (in place), train it on ``train_examples`` with early stopping on
    ``val_examples``, and save the adapter (safetensors) and ``training.json`` under ``out_dir``.
    No ``val_examples`` (a suite whose ``splits`` have no validation share, as the reference's
    80/20): every step is trained and the last weights are kept."""
    if not train_examples:
        raise ValueError("LoRA fine-tuning needs training examples")
    peft_model = apply_lora(model, settings, seed=train_cfg.seed)
    summary = trainable_summary(peft_model)
    model_type = getattr(getattr(_base(model), "config", None), "model_type", None)
    train_set = encode_examples(processor, train_examples, model_type)
    val_set = encode_examples(processor, val_examples, model_type)
    pad_id = int(processor.tokenizer.pad_token_id)
    # LoRA B starts at zero: the base model's loss (nan without a validation set)
    initial = mean_loss(peft_model, val_set, pad_id) if len(val_set) else float("nan")
    with scoped_torch_seed(train_cfg.seed, "lora-train", module=peft_model):
        result = train_vlm(peft_model, processor, train_set, val_set, train_cfg, log=log)
    peft_model.eval()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Embeddings are never trained here; "auto" would look the base model up (possibly on the Hub).
    peft_model.save_pretrained(str(out), safe_serialization=True, save_embedding_layers=False)
    weights, config = out / ADAPTER_WEIGHTS, out / ADAPTER_CONFIG
    if not weights.is_file() or not config.is_file():
        raise RuntimeError(f"peft did not write {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG} under {out}")
    digest = adapter_hash(out)
    record = {
        "lora": {**settings.model_dump(), "target_regex": lora_regex(settings)},
        "train_config": train_cfg.model_dump(),
        "base_model_hash": base_model_hash,
        "adapter_hash": digest,
        "n_train": len(train_examples),
        "n_val": len(val_examples),
        "initial_val_loss": initial,
        "best_val_loss": result.best_val_loss,
        "best_step": result.best_step,
        "steps": result.steps,
        "stopped_early": result.stopped_early,
        "seconds": result.seconds,
        "n_trainable": summary["n_trainable"],
        "n_total": summary["n_total"],
        "target_modules": summary["modules"],
        "history": result.history,
    }
    training_json = out / TRAINING_JSON
    training_json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return LoraResult(peft_model, out, weights, config, training_json, digest, initial, result,
                      summary["n_trainable"], summary["n_total"], summary["modules"])
