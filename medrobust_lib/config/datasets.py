"""One dataset of a suite (``datasets:`` entries): which reader reads which folder, and how its
samples are sized. Validated when the suite loads; the reader's own options model checks
``options`` (the readers are imported only then, so loading the config needs no codec).
Reading the samples is :mod:`medrobust_lib.data.dataset`'s job."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medrobust_lib.types import DEFAULT_MAX_PIXELS, parse_modality

READERS_MODULE = "medrobust_lib.data.formats"
"""Where the reader registry lives. Loaded by name when a dataset entry is validated, as the
model table (:mod:`medrobust_lib.model_table`) loads model classes: the config (core) names the
readers (domain) without importing them, so loading a suite needs no codec and no import cycle."""


def _readers() -> Any:
    """The registry of dataset readers (:data:`medrobust_lib.data.formats.READERS`)."""
    return importlib.import_module(READERS_MODULE).READERS

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ReferenceDice(BaseModel):
    """A model family's official clean Dice on a dataset: ``dice`` in [0, 1], the mean over ``n``
    samples, and what produced it (``source``: a script and commit, a paper table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dice: float = Field(ge=0.0, le=1.0)
    n: int = Field(ge=1)
    source: str


class SampleDraw(BaseModel):
    """A seeded random subset of a dataset: ``n`` sample ids drawn with ``seed`` (the same ids on
    every machine and in any listing order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n: int = Field(ge=1)
    seed: int = 0


class DatasetConfig(BaseModel):
    """One dataset: which reader reads which folder, and how samples are sized.

    ``name``: snake_case, starts with a letter, at most 64 characters (a partition-safe key).
    ``modality``: a :class:`~medrobust_lib.types.Modality` value (stored as its string value).
    ``format``: a registered reader (see :data:`medrobust_lib.data.readers.READERS`).
    ``size``: resize every sample to ``size x size`` (None keeps the original size).
    ``max_samples``: keep the first N sample ids (loadable and quarantined together) in sorted
    order. ``sample``: keep a seeded random draw of ``n`` sample ids instead (:class:`SampleDraw`;
    with ``max_samples`` too, the first N of the draw). ``options``: reader-specific, validated by the reader (unknown keys are an error).

    ``root``: the dataset's folder (relative: to the project root). ``per_component_boxes``: one box
    prompt per connected mask component instead of one box around all foreground.
    ``evaluation_only``: every sample of the dataset is in the test split (never trained or
    validated on) instead of the hash split (:func:`medrobust_lib.data.splits.split_of`).
    ``synthetic_labels``: the masks were generated together with the images (the demo's synthetic
    lesions; a user's datasets have real labels: false, the default), so they are exact by
    construction and say nothing about how a model does on labels drawn by people; the report shows
    such datasets apart from the real-label ones. ``description``: what the dataset is (source,
    licence, how its labels were made), shown in the report. ``reference_dice``: a published or
    independently measured clean Dice of a model family's official inference on exactly these
    samples (family -> :class:`ReferenceDice`), shown beside the family's own clean Dice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    modality: str
    format: str
    root: str
    size: int | None = Field(default=256, ge=1)
    per_component_boxes: bool = False
    max_samples: int | None = Field(default=None, ge=1)
    sample: SampleDraw | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    evaluation_only: bool = False
    synthetic_labels: bool = False
    description: str | None = None
    reference_dice: dict[str, ReferenceDice] = Field(default_factory=dict)
    max_pixels: int = Field(default=DEFAULT_MAX_PIXELS, ge=49,
                            description="largest 2-D image decoded (height x width, from the header); "
                                        "larger files are quarantined as too_large")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"dataset name {v!r} must be snake_case: a lower-case letter, then lower-case letters, "
                "digits or '_' (at most 64 characters)"
            )
        return v

    @field_validator("modality", mode="before")
    @classmethod
    def _check_modality(cls, v: Any) -> str:
        if not isinstance(v, str):
            raise ValueError(f"modality must be a string, got {type(v).__name__}")
        return parse_modality(v).value

    @field_validator("root", mode="before")
    @classmethod
    def _check_root(cls, v: Any) -> str:
        if isinstance(v, Path):
            v = str(v)
        if not isinstance(v, str) or not v.strip():
            raise ValueError("root must be a non-empty path")
        return v

    @model_validator(mode="after")
    def _check_format_and_options(self) -> DatasetConfig:
        READERS = _readers()
        if self.format not in READERS:
            raise ValueError(f"unknown format {self.format!r}; valid: {', '.join(READERS)}")
        READERS.get(self.format).parse_options(self.options)
        return self

    def reader(self) -> Any:
        """The registered reader (a :class:`medrobust_lib.data.readers.Reader`) named by ``format``."""
        return _readers().get(self.format)
