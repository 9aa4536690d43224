"""Settings shared by several sections: a training budget, a LoRA shape and a demo model's
attribute-naming (alignment) stage."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)


class AddedKeys(BaseModel):
    """Base of a settings model that gained keys after results were fingerprinted from its dumps:
    the fields named in ``ADDED_KEYS`` are left out of ``model_dump`` / ``model_dump_json`` while
    they hold their default, so a suite that does not set them keeps every fingerprint (recipes of
    fine-tuned checkpoints, committed demo weights, resumable partitions) it had before they
    existed. A key set to anything else is dumped, and so changes the fingerprints it enters."""

    ADDED_KEYS: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            fields = type(self).model_fields
            for name in self.ADDED_KEYS:
                if name in data and getattr(self, name) == fields[name].get_default(call_default_factory=True):
                    del data[name]
        return data


class TrainBudget(BaseModel):
    """How long a training loop may run: steps, batch, learning rate, validation cadence, early
    stopping patience (evaluations without improvement) and a wall-clock safety net in seconds
    (None: none). Each section sets its own defaults.

    ``max_steps``: optimiser steps at most. ``batch_size``: samples per step. ``lr``: learning rate.
    ``eval_every``: steps between validations. ``patience``: validations without improvement before
    early stopping. ``time_budget_s``: wall-clock limit in seconds (null: none)."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int = Field(default=400, ge=1)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    eval_every: int = Field(default=50, ge=1)
    patience: int = Field(default=4, ge=1)
    time_budget_s: float | None = 100.0

    @model_validator(mode="after")
    def _budget_in_range(self) -> TrainBudget:
        # checked here, not only by the fields' bounds: a section that sets its own default
        # (``max_steps: int = 200``) replaces the field and its bounds with it
        for name in ("max_steps", "batch_size", "eval_every", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be > 0 or null (no limit), got {self.time_budget_s}")
        return self


class TrainLoop(TrainBudget):
    """What a training loop runs with: a :class:`TrainBudget` plus AdamW ``weight_decay``, a linear
    warm-up of ``warmup_steps``, gradient clipping at ``grad_clip`` (global L2 norm) and the ``seed``
    its generators derive from; no wall-clock limit unless set. Not a suite section: the base of the
    two trainers' settings, :class:`medrobust_lib.training.train.TrainConfig` (a promptable
    segmenter: Dice + BCE weights, box jitter, augmentation, epochs, encoder learning-rate factor) and
    :class:`medrobust_lib.training.vlm_train.VLMTrainConfig` (a VLM: model selection, per-parameter
    learning rates, gradient accumulation), which each add only what their loop has and the other's
    has not. Built by the tracks from the suite's training sections."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    time_budget_s: float | None = None
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_steps: int = Field(default=30, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    seed: int = 0


class LoraSettings(BaseModel):
    """A LoRA adapter: rank ``r``, scaling ``alpha`` (update scaled by alpha / r), dropout on the
    LoRA branch and the modules it goes on. The one LoRA description of the project: the
    segmentation ``lora`` strategy (``segmentation.finetune.lora``), the VLM adapters
    (``vlm.finetune``) and the taxonomy's ``consistency_lora`` all read it.

    ``dropout``: dropout on the LoRA branch. ``target_regex``: a full-match regex over module names
    (None: the default targets: for a segmentation model image-encoder attention plus mask-decoder
    attention, for a VLM the language model's projections)."""

    model_config = ConfigDict(extra="forbid")
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_regex: str | None = None


class LoraSchedule(BaseModel):
    """The optimisation schedule of a VLM LoRA fine-tune, shared by ``vlm.finetune`` and the
    taxonomy's consistency LoRA recipes (``taxonomy.configs[].recipe``; their defaults differ where
    they say so)."""

    model_config = ConfigDict(extra="forbid")
    epochs: int | None = Field(default=None, ge=1, description="train this many epochs (optimizer steps of "
                               "batch_size x grad_accumulation examples) instead of max_steps")
    grad_accumulation: int = Field(default=1, ge=1, description="micro-batches of batch_size per optimizer step")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(default=30, ge=0, description="linear learning-rate warm-up steps")
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1, description="warmup as a share of the optimizer "
                                       "steps (overrides warmup_steps)")
    lr_schedule: Literal["cosine", "linear"] = Field(
        default="cosine", description="learning-rate decay after the warmup: cosine, or linear (the reference's "
        "transformers get_linear_schedule_with_warmup)")


class AlignmentStage(BaseModel):
    """A tiny demo VLM's attribute-naming stage (:mod:`medrobust_lib.demo.alignment`): ``align_steps``
    of naming what the questions ask about (modality, side, height, size, brightness) before the
    main training (0: none), then ``align_share`` of each main epoch still attribute naming."""

    model_config = ConfigDict(extra="forbid")
    align_steps: int = Field(default=0, ge=0)
    align_share: float = Field(default=0.25, ge=0, lt=1)


class WeightStorage(BaseModel):
    """How a tiny demo VLM's trained weights are saved: ``store_float16`` rounds every floating
    tensor to float16 in the safetensors files (half the bytes of the committed demo weights) while
    ``config.json`` keeps float32, so they load back as float32 (:func:`~medrobust_lib.models.tiny_vlm.save_tiny`)."""

    model_config = ConfigDict(extra="forbid")
    store_float16: bool = False


DEFAULT_MIN_N = 5
"""Smallest n a cell needs for a confidence interval or a p-value (``stats.min_n`` of a suite)."""
MIN_X_POSITIONS = 3
"""Fewest distinct x values a correlation needs: through two positions any line fits perfectly
(|r| = 1 whatever the data), so below this no r, CI or p is reported."""


class StatsConfig(BaseModel):
    """How much data a statistic needs before it is shown (docs/statistics.md)."""

    model_config = ConfigDict(extra="forbid")
    min_n: int = Field(default=DEFAULT_MIN_N, ge=2, description=(
        "smallest n (images, pairs, samples or points) a cell needs for a bootstrap CI, a p / q value or a rank "
        "among the fine-tuning strategies; below it the mean is shown without them and the table says why"))


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_T = TypeVar("_T", bound=_HasId)


def by_id(entries: Iterable[_T], entry_id: str, what: str) -> _T:
    """The entry of ``entries`` (models, taxonomy configurations, ...) whose ``id`` is ``entry_id``.

    Raises:
        KeyError: none has it; the message names ``what`` and the configured ids.
    """
    listed = list(entries)
    for e in listed:
        if e.id == entry_id:
            return e
    raise KeyError(f"unknown {what} {entry_id!r}; configured: {[e.id for e in listed]}")
