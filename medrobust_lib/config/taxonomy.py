"""The suite's ``taxonomy:`` section ("Consistent but Dangerous"): which model configurations are
classified, with which image-removal modes and paraphrase requirements."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medrobust_lib.config.common import (
    AddedKeys,
    AlignmentStage,
    LoraSchedule,
    LoraSettings,
    TrainBudget,
    WeightStorage,
)

DEFAULT_ABSTENTION_TAU = math.log(2.0)
"""Abstention band of the sensitivity column: |margin| < ln 2 nats, i.e. p(yes) within [1/3, 2/3]."""


class TaxonomyTrain(TrainBudget, AlignmentStage, WeightStorage):
    """Training of the demo's known-answer models (``demo_training``): the base model's budget and
    architecture, then ``lora_steps`` / ``lora_lr`` for ``consistency_lora``. Only the
    ``image_reliant`` model runs the alignment stage (:class:`AlignmentStage`).

    ``image_size``: image side of the demo's tiny VLM (pixels). ``patch_size``: its patch side
    (pixels). ``hidden``: its model width. ``layers``: its transformer blocks."""

    max_steps: int = 1500
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 150
    patience: int = 4
    time_budget_s: float | None = 60.0
    image_size: int = 64
    patch_size: int = 16
    hidden: int = 64
    layers: int = 2
    lora_steps: int = Field(default=300, ge=1)
    lora_lr: float = Field(default=2e-3, gt=0)
    align_steps: int = Field(default=1500, ge=0)


RECIPE_SPLITS = ("train", "val", "test")
"""Splits a consistency LoRA may train or select on (``all`` would hold every evaluated sample)."""


class ConsistencyLoraRecipe(TrainBudget, LoraSettings, LoraSchedule):
    """The consistency LoRA of a ``taxonomy.configs[]`` entry with ``lora_of``: a LoRA adapter on a
    local VLM, trained on every question variant of the yes/no records (the original, its
    semantically equivalent paraphrases and, with ``negations``, its negated variants) with the
    record's ground truth as target, flipped for a negated variant: the consistency-oriented
    fine-tune of the "Consistent but Dangerous" paper. The variants come from the builder the
    evaluation uses (:func:`medrobust_lib.tracks.taxonomy.evaluate.item_variants`: the record's own
    paraphrases, ``api_paraphraser`` top-ups, template paraphrases). Trained by the configuration's
    ``taxonomy_model`` asset (:mod:`medrobust_lib.tracks.taxonomy.lora`) with the VLM LoRA trainer
    of ``adapter: finetuned`` (language-model projections, prompt tokens masked), saved as
    safetensors under ``var/checkpoints/<config id>/adapter`` and reused while its fingerprint
    (recipe, base weights, examples) stays the same. ``recipe: consistency`` is this recipe with
    its defaults.

    ``kind``: the recipe (``consistency``). ``r``, ``alpha``, ``dropout``, ``target_regex``: the
    LoRA shape (:class:`~medrobust_lib.config.common.LoraSettings`). ``max_steps``: optimiser
    steps at most. ``batch_size``: examples per micro-batch. ``lr``: peak learning rate (AdamW).
    ``eval_every``: steps between validations on ``select_split``. ``patience``: validations
    without improvement before early stopping. ``time_budget_s``: wall-clock limit in seconds
    (null: none)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["consistency"] = "consistency"
    max_steps: int = 300
    batch_size: int = 8
    lr: float = 2e-4
    eval_every: int = 50
    patience: int = 4
    time_budget_s: float | None = None
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(default=10, ge=0, description="linear learning-rate warm-up steps")
    select_on: Literal["loss", "first_token_accuracy"] = Field(
        default="first_token_accuracy", description="how the best validation step is chosen: mean validation loss, "
        "or the yes/no accuracy of the first answer token")
    seed: int | None = Field(default=None, description="seed of the LoRA initialisation, dropout and batch order "
                             "(null: the suite seed)")
    train_split: Literal["train", "val", "test"] = Field(default="train", description=(
        "the split whose yes/no records it trains on; never taxonomy.split"))
    select_split: Literal["train", "val", "test"] | None = Field(default="val", description=(
        "the split the best step is selected on (null: no selection, the last weights are kept); never "
        "taxonomy.split"))
    negations: bool = Field(default=True, description=(
        "also train on the negated variants (target flipped), as the demo's consistency LoRA does"))
    min_paraphrases: int | None = Field(default=None, ge=0, description=(
        "semantically equivalent paraphrases per training record, topped up as the evaluation tops them up "
        "(null: taxonomy.min_paraphrases)"))

    @model_validator(mode="after")
    def _splits_differ(self) -> ConsistencyLoraRecipe:
        if self.select_split == self.train_split:
            raise ValueError(f"the recipe selects on the split it trains on ({self.train_split!r}): set select_split "
                             "to another split, or null to keep the last weights")
        return self

    def seen_splits(self) -> tuple[str, ...]:
        """The splits this adapter trains or selects on (besides ``all``, which holds both)."""
        return tuple(s for s in (self.train_split, self.select_split) if s is not None)


class TaxonomyConfigEntry(AddedKeys):
    """A named model configuration of the taxonomy. ``model`` names a VLM of ``vlm.models``;
    ``demo_training`` (demo only) says how the demo trains that VLM: ``image_reliant`` (true
    labels, positive paraphrases), ``shortcut`` (labels predicted by the question wording) or
    ``consistency_lora`` (LoRA on every paraphrase, negations included, over another config's
    model, named by ``base``).

    ``id``: the configuration's name in results."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("lora_of", "recipe")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    model: str | None = None
    demo_training: Literal["image_reliant", "shortcut", "consistency_lora"] | None = None
    base: str | None = None
    lora_of: str | None = Field(default=None, description=(
        "a vlm.models id of a LoRA-finetunable local model (kind: hf, no adapter of its own): this configuration "
        "is that model plus the consistency LoRA its taxonomy_model asset trains by 'recipe'"))
    recipe: ConsistencyLoraRecipe | None = Field(default=None, description=(
        "the consistency LoRA of a lora_of configuration: 'consistency' (the defaults) or its settings "
        "(taxonomy.configs[].recipe; null with lora_of: the defaults)"))

    @field_validator("recipe", mode="before")
    @classmethod
    def _recipe_by_name(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    def model_post_init(self, __context: Any) -> None:
        given = [k for k in ("model", "demo_training", "lora_of") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"taxonomy config {self.id!r}: give exactly one of 'model' (a vlm.models id), "
                             "'lora_of' (a vlm.models id to LoRA fine-tune by 'recipe') or 'demo_training'"
                             + (f"; got {', '.join(given)}" if given else ""))
        if (self.demo_training == "consistency_lora") != (self.base is not None):
            raise ValueError(f"taxonomy config {self.id!r}: 'base' (another config) goes with consistency_lora only")
        if self.recipe is not None and self.lora_of is None:
            raise ValueError(f"taxonomy config {self.id!r}: 'recipe' goes with 'lora_of' (the vlm.models id it "
                             "fine-tunes)")
        if self.lora_of is not None and self.recipe is None:
            self.recipe = ConsistencyLoraRecipe()

    def trains(self) -> bool:
        """Its weights are trained by its own ``taxonomy_model`` asset (demo training or a recipe)."""
        return self.demo_training is not None or self.lora_of is not None


class TaxonomyConfig(BaseModel):
    """``configs``: the model configurations classified (see ``taxonomy.configs[]``). ``image_modes``:
    which image each question is also asked with besides the real one: none, blank or noise.
    ``split``: which split is evaluated. ``train``: training of the demo's known-answer models."""

    model_config = ConfigDict(extra="forbid")
    configs: list[TaxonomyConfigEntry] = Field(default_factory=list)
    image_modes: list[Literal["none", "blank", "noise"]] = Field(default_factory=lambda: ["none"])  # type: ignore[arg-type]
    min_paraphrases: int = Field(default=5, ge=0)
    """Semantically equivalent paraphrases (polarity +1) per record; fewer are topped up."""
    negations: bool = False
    """Also score the negated variants (polarity -1) of a record. They never enter consistency or the
    quadrant; they feed the separate negation-robustness columns (``negation_consistent``)."""
    abstention_tau: float = Field(default=DEFAULT_ABSTENTION_TAU, gt=0)
    """Sensitivity analysis only (``share_abstention``): a text-only answer with |margin| below this
    (nats; ln 2: p(yes) within [1/3, 2/3]) counts as changed. The primary quadrant never uses it."""
    known_answer_checks: Literal["off", "log", "fail"] = "off"
    """Demo only: the ``taxonomy_report`` asset checks the demo configurations' known answers
    (:mod:`medrobust_lib.taxonomy.known_answers`) on every image mode and logs them (asset metadata
    ``known_answers``, the run log); ``fail`` also fails the asset when one on the primary image mode
    (``none``) is missed."""
    api_paraphraser: str | None = None
    """A ``kind: api`` model of ``vlm.models`` that writes extra paraphrases for records with too
    few (cached; each candidate passes the recorded equivalence filter before use)."""
    split: str = "test"
    levels: list[int] | None = None
    """Perturbed severity levels the taxonomy evaluates, a subset of ``perturbations.levels`` (None:
    all of them). The ``taxonomy_perturbed`` partitions of other levels are not planned by the
    runner and write nothing when materialised."""
    train: TaxonomyTrain = Field(default_factory=lambda: TaxonomyTrain())


