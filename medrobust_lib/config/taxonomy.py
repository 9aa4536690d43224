"""The suite's ``taxonomy:`` section ("Consistent but Dangerous"): which model configurations are
classified, with which image-removal modes and paraphrase requirements."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from medrobust_lib.config.common import AlignmentStage, TrainBudget, WeightStorage

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


class TaxonomyConfigEntry(BaseModel):
    """A named model configuration of the taxonomy. ``model`` names a VLM of ``vlm.models``;
    ``demo_training`` (demo only) says how the demo trains that VLM: ``image_reliant`` (true
    labels, positive paraphrases), ``shortcut`` (labels predicted by the question wording) or
    ``consistency_lora`` (LoRA on every paraphrase, negations included, over another config's
    model, named by ``base``).

    ``id``: the configuration's name in results."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    model: str | None = None
    demo_training: Literal["image_reliant", "shortcut", "consistency_lora"] | None = None
    base: str | None = None

    def model_post_init(self, __context: Any) -> None:
        if (self.model is None) == (self.demo_training is None):
            raise ValueError(f"taxonomy config {self.id!r}: give exactly one of 'model' (a vlm.models id) or "
                             "'demo_training'")
        if (self.demo_training == "consistency_lora") != (self.base is not None):
            raise ValueError(f"taxonomy config {self.id!r}: 'base' (another config) goes with consistency_lora only")


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


