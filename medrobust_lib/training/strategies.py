"""Fine-tuning strategies for the SAM family (SAM, MedSAM, SAM-Med2D) and LiteMedSAM.

LiteMedSAM's TinyViT encoder (:mod:`medrobust_lib.models.tinyvit_adapters`): ``encoder_partial``
counts its 12 blocks over the four stages in forward order; the default LoRA targets cover its
attention ``qkv``/``proj`` (``image_encoder.layers.{s}.blocks.{j}.attn``) like ViT's; ``adapter``
adds zero-initialised bottleneck adapters in parallel with every TinyViT block's MLP.

:func:`apply_strategy` prepares a :class:`~medrobust_lib.models.sam.SamSegmenter` in place: it adds
the strategy's new modules (LoRA layers, adapters) when needed and sets ``requires_grad`` so that
exactly the strategy's parameters train. Strategies:

* ``full``: every parameter.
* ``decoder_only``: the mask decoder.
* ``decoder_prompt``: the mask decoder and the prompt encoder.
* ``encoder_partial``: the last ``encoder_blocks`` image-encoder blocks (default 4, the reference
  code's example on ViT-B; the tiny demo encoder has 2 blocks and uses 1) plus the mask decoder and
  the prompt encoder. The encoder's patch embedding, position embedding and neck stay
  frozen. ``encoder_partial_adapters``: also every image-encoder parameter whose name contains
  ``adapter`` (any case), as the reference trains SAM-Med2D's ``encoder_partial`` (its adapters in
  every block, not only in the last N); a model without adapters is unaffected.
* ``lora``: LoRA (peft ``inject_adapter_in_model``, so the model stays a plain ``Sam`` module whose
  parameter names keep their prefixes) on the ``nn.Linear`` modules whose full name matches
  ``lora.target_regex`` (full match, peft's semantics for a string target; ``nn.Conv2d`` modules
  are wrapped too when the regex names them, as peft's suffix match does for the reference's
  SAM-Med2D ``["qkv", "proj"]``, which also reaches ``image_encoder.patch_embed.proj``). The default,
  :data:`DEFAULT_LORA_TARGETS`, covers the image encoder's attention (``blocks.{i}.attn.qkv`` and
  ``blocks.{i}.attn.proj``, the real names in segment-anything's ``ImageEncoderViT``) and every
  attention projection of the mask decoder's two-way transformer (``q_proj``, ``k_proj``,
  ``v_proj``, ``out_proj`` of ``self_attn``, ``cross_attn_token_to_image``,
  ``cross_attn_image_to_token`` and ``final_attn_token_to_image``). Only the LoRA matrices train.
  This deliberately avoids the published MedSAM "LoRA" defect: targeting ``q_proj``/``v_proj`` only
  adapts the decoder, because the vision encoder has no such modules.
* ``lora_plus_encoder`` / ``lora_plus_decoder``: LoRA+ (Hayou et al. 2024, as the reference
  benchmark's ``finetune_utils.py`` runs it): LoRA layers on the ``nn.Linear`` modules of one
  component (default targets: :data:`DEFAULT_LORA_PLUS_TARGETS`, the encoder or the decoder half of
  :data:`DEFAULT_LORA_TARGETS`), trained with the ``B`` matrices at ``lora_plus_lr_ratio`` (16) times
  the learning rate (:func:`medrobust_lib.training.train.param_groups`). Besides the LoRA matrices,
  ``lora_plus_encoder`` trains the mask decoder and the prompt encoder in full and
  ``lora_plus_decoder`` the prompt encoder in full, as the reference does. ``lora_modules=False``:
  no LoRA layer at all (the reference's MedSAM ``lora_plus_encoder``, whose ``q_proj``/``v_proj``
  search finds nothing in a vision encoder that names its attention ``qkv``/``proj``).
* ``adapter``: SAM-Med2D's bottleneck adapters in every encoder block
  (:func:`medrobust_lib.models.sam_med2d.insert_adapters`, ratio ``adapter_ratio``), inserted
  when the encoder has none (vanilla SAM, MedSAM); a SAM-Med2D model keeps its own. The adapter
  parameters, the mask decoder and the prompt encoder train (what SAM-Med2D's training trains:
  the encoder frozen except its ``Adapter`` modules). The inserted adapters are not zero-initialised (SAM-Med2D's Kaiming
  init; the adapter output is added unscaled), so they change the model's output before training.

All random initialisation (LoRA ``A`` matrices, adapters) runs inside ``torch.random.fork_rng``
seeded from ``(seed, "strategy-init", name)``: the same seed gives the same initial weights and the
caller's global RNG state is left untouched.

Evaluation: call :func:`prepare_for_eval` before evaluating; it puts every module in eval mode,
so LoRA dropout (and any other dropout) is inactive. (The published code evaluated LoRA models
with dropout active.)

Saving: :func:`state_dict_for_save` gives weights loadable without peft: for a LoRA model the
LoRA update ``B @ A * alpha / r`` is merged into each base weight under the plain SAM key (so
``medrobust_lib.models.sam.load_into`` loads it strictly into a freshly built model of the same
architecture); otherwise the full state dict (with ``...blocks.{i}.Adapter.*`` keys when adapters
are present; those load into ``build_sam(replace(arch, adapter=True, adapter_mlp_ratio=ratio))``).
:func:`merge_lora` does the same merge in place and removes the LoRA layers.
:func:`trainable_state_dict` gives only the trained tensors, for small checkpoints.

Training with :func:`medrobust_lib.training.train.train_segmenter`: pass
``trainable=report.is_trainable`` (its default, ``None``, makes every parameter trainable). Note
that ``train_segmenter`` sets ``requires_grad=True`` on every parameter when it returns, so pass
the report to :func:`trainable_state_dict` after training.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.config.segmentation import FINETUNE_STRATEGIES, LORA_FINETUNE_STRATEGIES
from medrobust_lib.models import tinyvit_adapters
from medrobust_lib.models.sam import SamSegmenter
from medrobust_lib.seeding import scoped_torch_seed

STRATEGIES = FINETUNE_STRATEGIES
LORA_STRATEGIES = LORA_FINETUNE_STRATEGIES
"""The strategies that add LoRA layers (merged into the base weights when a checkpoint is saved)."""
LORA_PLUS_LR_RATIO = 16.0
"""LoRA+'s learning-rate ratio of the ``B`` matrices to the ``A`` matrices (the LoRA+ paper's
recommendation and the reference benchmark's ``LORA_PLUS_LR_RATIO``)."""

_DECODER_ATTN = r"(?:layers\.\d+\.(?:self_attn|cross_attn_token_to_image|cross_attn_image_to_token)|final_attn_token_to_image)"
#: Default LoRA targets (full match over module names of ``Sam``): image-encoder attention
#: ``qkv``/``proj`` in every block, and all mask-decoder transformer attention projections.
_ENCODER_TARGETS = r"image_encoder\.(?:layers\.\d+\.)?blocks\.\d+\.attn\.(?:qkv|proj)"
_DECODER_TARGETS = rf"mask_decoder\.transformer\.{_DECODER_ATTN}\.(?:q_proj|k_proj|v_proj|out_proj)"
DEFAULT_LORA_TARGETS = f"{_ENCODER_TARGETS}|{_DECODER_TARGETS}"
#: Default LoRA+ targets per strategy: the encoder half and the decoder half of the LoRA default.
DEFAULT_LORA_PLUS_TARGETS = {"lora_plus_encoder": _ENCODER_TARGETS, "lora_plus_decoder": _DECODER_TARGETS}
#: What each LoRA+ strategy trains in full besides its LoRA matrices (the reference's ``setup_*_finetune``).
LORA_PLUS_FULL = {"lora_plus_encoder": ("mask_decoder.", "prompt_encoder."), "lora_plus_decoder": ("prompt_encoder.",)}
_LORA_PARAM = re.compile(r"\.lora_[A-Za-z_]+(?:\..*)?$")


@dataclass(frozen=True)
class StrategyConfig:
    """Which strategy and its settings. ``encoder_blocks`` and ``encoder_partial_adapters`` are
    used by ``encoder_partial``; the ``lora`` settings by ``lora`` (``lora.target_regex=None``:
    :data:`DEFAULT_LORA_TARGETS`) and by the LoRA+ strategies (``lora.target_regex=None``: their
    :data:`DEFAULT_LORA_PLUS_TARGETS`; ``lora_modules=False``: no LoRA layer);
    ``lora_plus_lr_ratio`` is the LoRA+ ``B``-matrix learning-rate ratio (applied by the trainer,
    recorded here); ``adapter_ratio`` (hidden width / embed dim) by ``adapter`` when adapters are
    inserted."""

    name: str
    encoder_blocks: int = 4
    lora: LoraSettings = field(default_factory=LoraSettings)
    adapter_ratio: float = 0.25
    encoder_partial_adapters: bool = False
    lora_plus_lr_ratio: float = LORA_PLUS_LR_RATIO
    lora_modules: bool = True


@dataclass(frozen=True)
class StrategyReport:
    """What :func:`apply_strategy` did.

    ``trainable_modules``: a readable summary of what trains, in natural sort order. Rule: each
    trainable parameter is reported by its highest enclosing module whose parameters are *all*
    trainable, never above the top-level components (``image_encoder``, ``prompt_encoder``,
    ``mask_decoder``) and never a bare ``ModuleList``/``ModuleDict`` (so trained encoder blocks
    are listed one by one); a trainable parameter with no such module is reported by its own
    name.
    LoRA matrices (``X.lora_A.default.weight``, ``X.lora_B...``) are reported once as ``X.lora``.
    Examples: ``decoder_prompt`` -> ``["mask_decoder", "prompt_encoder"]``; ``encoder_partial``
    with N=1 on a 2-block encoder adds ``"image_encoder.blocks.1"``; ``lora`` lists
    ``"image_encoder.blocks.0.attn.qkv.lora"`` etc.; ``adapter`` lists
    ``"image_encoder.blocks.{i}.Adapter"``, ``"mask_decoder"`` and ``"prompt_encoder"``.

    ``targets``: for ``lora`` and the LoRA+ strategies, the names of the wrapped modules (in
    module order); else empty.
    ``param_names``: every trainable parameter name (``named_parameters`` of ``segmenter.sam``).
    ``adapters_inserted``: ``adapter`` added adapters (False when the encoder already had them).
    """

    name: str
    n_trainable: int
    n_total: int
    trainable_modules: tuple[str, ...]
    targets: tuple[str, ...] = ()
    param_names: tuple[str, ...] = ()
    adapters_inserted: bool = False

    def is_trainable(self, param_name: str) -> bool:
        """Predicate for ``train_segmenter(..., trainable=report.is_trainable)``."""
        return param_name in self.param_names

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (without the full parameter-name list)."""
        d = asdict(self)
        d.pop("param_names")
        d["trainable_modules"] = list(self.trainable_modules)
        d["targets"] = list(self.targets)
        d["n_targets"] = len(self.targets)
        return d


def _natural_key(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _lora_layers(model: nn.Module) -> dict[str, Any]:
    """Name -> peft LoRA layer, in module order (empty when peft is absent or unused)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def lora_target_names(model: nn.Module, regex: str = DEFAULT_LORA_TARGETS, *, conv: bool = True) -> list[str]:
    """Names of the ``nn.Linear`` (and, with ``conv``, ``nn.Conv2d``) modules of ``model`` whose
    full name matches ``regex`` (full match, as peft applies a string ``target_modules``), in
    module order. ``conv=False``: linear modules only (the reference's ``LoRAPlusLinear``).

    Raises:
        ValueError: the regex is invalid or matches no such module.
    """
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise ValueError(f"invalid LoRA target regex {regex!r}: {exc}") from None
    kinds: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d) if conv else (nn.Linear,)
    names = [n for n, m in model.named_modules() if isinstance(m, kinds) and pattern.fullmatch(n)]
    linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(
            f"LoRA target regex {regex!r} matches no nn.Linear module of {type(model).__name__} "
            f"(full match over module names; it has {len(linear)} Linear modules, e.g. "
            f"{', '.join(linear[:3])}; default targets: {DEFAULT_LORA_TARGETS!r})"
        )
    return names


def _trainable_modules(model: nn.Module) -> tuple[str, ...]:
    """The collapsed module list described in :class:`StrategyReport`."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    fully: set[str] = set()
    for name, module in model.named_modules():
        if not name or isinstance(module, nn.ModuleList | nn.ModuleDict):
            continue  # containers are never reported: list their members instead
        own = [f"{name}.{n}" for n, _ in module.named_parameters()]
        if own and all(n in trainable for n in own):
            fully.add(name)
    out: set[str] = set()
    for pname in trainable:
        parts = pname.split(".")
        label = pname
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            if prefix in fully:
                label = prefix
                break
        out.add(_LORA_PARAM.sub(".lora", label))
    return tuple(sorted(out, key=_natural_key))


def _set_trainable(model: nn.Module, keep: Any) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(bool(keep(n)))


def apply_strategy(segmenter: SamSegmenter, cfg: StrategyConfig, seed: int = 0) -> StrategyReport:
    """Apply ``cfg`` to ``segmenter.sam`` in place and report what trains.

    Everything is frozen except the strategy's parameters. New modules (LoRA, adapters) are
    initialised inside a ``fork_rng`` scope seeded from ``seed`` and take the model's device and
    dtype. The model's train/eval mode is not changed.

    Raises:
        ValueError: unknown strategy; ``encoder_blocks`` outside 1..depth; LoRA targets that
            match nothing (or an already LoRA-wrapped model); invalid LoRA/adapter settings;
            ``lora_modules=False`` for ``lora``.
    """
    if cfg.name not in STRATEGIES:
        raise ValueError(f"unknown fine-tuning strategy {cfg.name!r}; valid: {', '.join(STRATEGIES)}")
    sam: nn.Module = segmenter.sam
    encoder: Any = sam.image_encoder
    targets: tuple[str, ...] = ()
    inserted = False

    if cfg.name == "full":
        _set_trainable(sam, lambda n: True)
    elif cfg.name == "decoder_only":
        _set_trainable(sam, lambda n: n.startswith("mask_decoder."))
    elif cfg.name == "decoder_prompt":
        _set_trainable(sam, lambda n: n.startswith(("mask_decoder.", "prompt_encoder.")))
    elif cfg.name == "encoder_partial":
        prefixes = _last_block_prefixes(encoder, cfg.encoder_blocks)
        adapters = cfg.encoder_partial_adapters
        _set_trainable(sam, lambda n: n.startswith(("mask_decoder.", "prompt_encoder.", *prefixes))
                       or (adapters and n.startswith("image_encoder.") and "adapter" in n.lower()))
    elif cfg.name == "lora":
        if not cfg.lora_modules:
            raise ValueError("the lora strategy needs LoRA modules (lora_modules=False leaves nothing to train)")
        targets = tuple(_apply_lora(sam, cfg, seed))
    elif cfg.name in LORA_PLUS_FULL:
        targets = tuple(_apply_lora(sam, cfg, seed)) if cfg.lora_modules else ()
        full = LORA_PLUS_FULL[cfg.name]
        _set_trainable(sam, lambda n: _LORA_PARAM.search(n) is not None or n.startswith(full))
    elif tinyvit_adapters.is_tinyvit(encoder):  # adapter on LiteMedSAM's TinyViT
        if not tinyvit_adapters.has_adapters(encoder):
            if cfg.adapter_ratio <= 0:
                raise ValueError(f"adapter_ratio must be > 0, got {cfg.adapter_ratio}")
            with scoped_torch_seed(seed, "strategy-init", "adapter", module=sam):
                gen = torch.Generator().manual_seed(torch.initial_seed())
                tinyvit_adapters.insert_adapters(encoder, cfg.adapter_ratio, generator=gen)
            inserted = True
        _set_trainable(sam, lambda n: n.startswith(("mask_decoder.", "prompt_encoder."))
                       or (n.startswith("image_encoder.") and ".Adapter." in n))
    else:  # adapter
        from medrobust_lib.models.sam_med2d import SamMed2dBlock, insert_adapters

        if not any(isinstance(b, SamMed2dBlock) for b in encoder.blocks):
            if cfg.adapter_ratio <= 0:
                raise ValueError(f"adapter_ratio must be > 0, got {cfg.adapter_ratio}")
            with scoped_torch_seed(seed, "strategy-init", "adapter", module=sam):
                # the layers' default init draws from the (scoped) global RNG, then
                # insert_adapters re-initialises the weights from this generator
                gen = torch.Generator().manual_seed(torch.initial_seed())
                insert_adapters(encoder, cfg.adapter_ratio, generator=gen)
            inserted = True
        _set_trainable(sam, lambda n: n.startswith(("mask_decoder.", "prompt_encoder."))
                       or (n.startswith("image_encoder.blocks.") and ".Adapter." in n))

    params = list(sam.named_parameters())
    names = tuple(n for n, p in params if p.requires_grad)
    return StrategyReport(
        name=cfg.name,
        n_trainable=sum(p.numel() for _, p in params if p.requires_grad),
        n_total=sum(p.numel() for _, p in params),
        trainable_modules=_trainable_modules(sam),
        targets=targets,
        param_names=names,
        adapters_inserted=inserted,
    )


def _last_block_prefixes(encoder: Any, n_blocks: int) -> tuple[str, ...]:
    """Parameter prefixes of the last ``n_blocks`` image-encoder blocks: ViT ``blocks.{i}``, or
    TinyViT's blocks over its stages in forward order (:mod:`medrobust_lib.models.tinyvit_adapters`)."""
    if tinyvit_adapters.is_tinyvit(encoder):
        return tinyvit_adapters.encoder_block_prefixes(encoder, n_blocks)
    depth = len(encoder.blocks)
    if not 1 <= n_blocks <= depth:
        raise ValueError(f"encoder_partial: encoder_blocks must be in 1..{depth} (the encoder has "
                         f"{depth} blocks), got {n_blocks}")
    return tuple(f"image_encoder.blocks.{i}." for i in range(depth - n_blocks, depth))


def _apply_lora(sam: nn.Module, cfg: StrategyConfig, seed: int) -> list[str]:
    from peft import LoraConfig, inject_adapter_in_model

    if _lora_layers(sam):
        raise ValueError("this model already has LoRA layers; apply the lora strategy to a fresh model")
    lora = cfg.lora  # r >= 1 and dropout in [0, 1) are checked by LoraSettings
    default = DEFAULT_LORA_PLUS_TARGETS.get(cfg.name, DEFAULT_LORA_TARGETS)
    regex = lora.target_regex if lora.target_regex is not None else default
    # peft wraps every module the regex names; LoRA+ wraps linear modules only (LoRAPlusLinear)
    names = lora_target_names(sam, regex, conv=cfg.name == "lora")  # a clear error before peft's
    peft_cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=names if cfg.name != "lora" else regex, bias="none")
    with scoped_torch_seed(seed, "strategy-init", "lora", module=sam):
        inject_adapter_in_model(peft_cfg, sam)
    wrapped = list(_lora_layers(sam))
    if wrapped != names:  # pragma: no cover - peft and our matcher disagree
        raise RuntimeError(f"peft wrapped {len(wrapped)} modules, expected {len(names)}: {wrapped[:4]}")
    _set_trainable(sam, lambda n: _LORA_PARAM.search(n) is not None)
    return names


def prepare_for_eval(segmenter: SamSegmenter) -> SamSegmenter:
    """Put every module of ``segmenter.sam`` in eval mode (LoRA and other dropout off, no
    batch-norm updates); ``requires_grad`` is left as it is. Returns the segmenter."""
    segmenter.sam.eval()
    return segmenter


def trainable_state_dict(segmenter: SamSegmenter, report: StrategyReport | None = None) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the trainable parameters only, keyed as in ``segmenter.sam``.

    With ``report``, its ``param_names`` decide (use this after ``train_segmenter``, which leaves
    every parameter with ``requires_grad=True``); otherwise ``requires_grad`` does. Load back with
    ``segmenter.sam.load_state_dict(sd, strict=False)`` after applying the same strategy."""
    keep = report.is_trainable if report is not None else None
    return {n: p.detach().cpu().clone() for n, p in segmenter.sam.named_parameters()
            if (keep(n) if keep is not None else p.requires_grad)}


def _pending_delta(layer: Any) -> torch.Tensor | None:
    """The summed weight update of the active, not yet merged adapters of a LoRA layer."""
    delta: torch.Tensor | None = None
    for name in layer.active_adapters:
        if name in layer.merged_adapters or name not in layer.lora_A:
            continue
        if layer.use_dora.get(name, False):  # the lora strategy never enables DoRA
            raise ValueError("this layer carries a DoRA adapter; the lora strategy only merges plain LoRA updates")
        d = layer.get_delta_weight(name)
        delta = d if delta is None else delta + d
    return delta


def state_dict_for_save(segmenter: SamSegmenter) -> dict[str, torch.Tensor]:
    """A state dict loadable without peft, leaving the model untouched (detached CPU tensors).

    LoRA model: plain ``Sam`` keys, each wrapped weight replaced by ``W + B @ A * alpha / r``
    (LoRA keys dropped), so it loads strictly into ``build_sam`` of the same architecture and
    reproduces the model's outputs. Otherwise: ``segmenter.sam.state_dict()`` (including
    ``Adapter`` keys when adapters are present)."""
    sam: nn.Module = segmenter.sam
    layers = _lora_layers(sam)
    sd = {k: v.detach().cpu().clone() for k, v in sam.state_dict().items()}
    if not layers:
        return sd
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        deltas = {name: _pending_delta(layer) for name, layer in layers.items()}
    for key, value in sd.items():
        owner = next((n for n in layers if key.startswith(n + ".")), None)
        if owner is None:
            out[key] = value
            continue
        rest = key[len(owner) + 1:]
        if not rest.startswith("base_layer."):
            continue  # lora_A / lora_B / ... : merged below
        plain = f"{owner}.{rest.removeprefix('base_layer.')}"
        delta = deltas[owner]
        if rest == "base_layer.weight" and delta is not None:
            value = (value.float() + delta.detach().cpu().float()).to(value.dtype)
        out[plain] = value
    return out


def merge_lora(segmenter: SamSegmenter) -> int:
    """Merge every LoRA layer into its base weight and put the base ``nn.Linear`` back, in place,
    so ``segmenter.sam`` is a plain ``Sam`` again (its state dict has the published keys). The
    merged weights keep ``requires_grad=False``. Returns the number of merged modules (0 when the
    model has no LoRA)."""
    sam: nn.Module = segmenter.sam
    layers = _lora_layers(sam)
    for name, layer in layers.items():
        layer.merge(safe_merge=True)
        parent_name, _, child = name.rpartition(".")
        parent = sam.get_submodule(parent_name) if parent_name else sam
        setattr(parent, child, layer.get_base_layer())
    if layers and "peft_config" in vars(sam):
        delattr(sam, "peft_config")
    return len(layers)
