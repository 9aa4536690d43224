"""The suite configuration: what to evaluate, loaded from ``configs/*.yaml``.

Paths in a suite are relative to the working directory (the project root) unless absolute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from medrobust_lib.config.segmentation import SegmentationConfig
from medrobust_lib.config.taxonomy import TaxonomyConfig
from medrobust_lib.config.vlm import ADAPTER_SEEN_SPLITS, VLMConfig, adapter_box_scale
from medrobust_lib.paths import default_locations
from medrobust_lib.types import ALL_MODALITIES, SEVERITY_LEVELS, SSIM_BANDS, validate_bands

DEMO_TRAINED = "trained"
"""A model's weights trained by the demo's own assets (``checkpoint: trained`` / ``source: trained``)."""
DEMO_TRAINED_ADAPTER = "finetuned"
"""A VLM adapter trained by its own ``finetuned_adapter`` asset."""


class DemoConfig(BaseModel):
    """The embedded offline demo dataset (built by ``medrobust_lib.demo.build_demo``)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    root: str = "var/data/demo"
    n_per_modality: int = Field(default=24, ge=4)
    seed: int = 0
    retrain: bool = Field(default=False, description="train the demo models from the embedded data instead of "
                          "copying the committed weights (medrobust_lib/demo/weights; medrobust demo --retrain)")


class PerturbationConfig(BaseModel):
    """Which perturbations to generate and how to calibrate them."""

    model_config = ConfigDict(extra="forbid")
    include: list[str] = Field(default_factory=lambda: ["*"])
    exclude: list[str] = Field(default_factory=list)
    levels: list[int] = Field(default_factory=lambda: list(SEVERITY_LEVELS))
    bands: dict[int, tuple[float, float]] = Field(default_factory=lambda: dict(SSIM_BANDS))
    calibration_subset: int = Field(default=4, ge=1, description="images per dataset used for the warm start")
    split: str = Field(default="test", description="which split to perturb: train, val, test or all")
    max_samples: int | None = Field(default=None, ge=1, description="cap per dataset, after the split filter")

    @field_validator("bands")
    @classmethod
    def _bands(cls, v: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
        return validate_bands(v)

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        bad = [lv for lv in v if lv not in SEVERITY_LEVELS]
        if bad:
            raise ValueError(f"levels must be among {SEVERITY_LEVELS}, got {bad}")
        return sorted(set(v))

    @field_validator("split")
    @classmethod
    def _split(cls, v: str) -> str:
        if v not in ("train", "val", "test", "all"):
            raise ValueError(f"split must be train, val, test or all, got {v!r}")
        return v


class Suite(BaseModel):
    """A whole evaluation suite. Unknown keys are errors (at every level). Outside the demo
    (``demo.enabled: false``) every model must name its weights: a segmentation model its
    ``checkpoint``, a local VLM its ``source`` (or a ``base``); ``trained`` (weights the demo trains)
    is demo-only."""

    model_config = ConfigDict(extra="forbid")
    name: str = "demo"
    seed: int = 0
    results_dir: str = ""
    """Where result tables go; default ``var/<name>/results`` (every other output sits beside it)."""
    mart_path: str = ""
    """The DuckDB mart; default ``var/<name>/marts.duckdb``."""
    workers: int = Field(default=1, ge=1, description="processes used inside one partition")
    modalities: list[str] = Field(default_factory=lambda: list(ALL_MODALITIES))
    demo: DemoConfig = Field(default_factory=lambda: DemoConfig())
    datasets: list[dict[str, Any]] = Field(default_factory=list, description="DatasetConfig fields")
    perturbations: PerturbationConfig = Field(default_factory=lambda: PerturbationConfig())
    segmentation: SegmentationConfig = Field(default_factory=lambda: SegmentationConfig())
    vlm: VLMConfig = Field(default_factory=lambda: VLMConfig())
    taxonomy: TaxonomyConfig = Field(default_factory=lambda: TaxonomyConfig())
    max_error_share: float = Field(default=0.02, ge=0.0, le=1.0, description=(
        "largest share of infrastructure errors (outcome 'error') a VLM or taxonomy partition may have and "
        "still count as complete; above it the partition fails its check and is left out of the mart views"))
    max_pixels: int = Field(default=64_000_000, ge=49,
                            description="largest 2-D image a reader decodes (height x width, read from the "
                                        "header first); larger files are quarantined as too_large. A dataset "
                                        "entry may set its own max_pixels")

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in ALL_MODALITIES]
        if bad:
            raise ValueError(f"unknown modalities {bad}; valid: {', '.join(ALL_MODALITIES)}")
        return v

    @model_validator(mode="after")
    def _own_locations(self) -> Suite:
        results, mart = default_locations(self.name)
        self.results_dir = self.results_dir or results
        self.mart_path = self.mart_path or mart
        return self

    @model_validator(mode="after")
    def _taxonomy_levels_perturbed(self) -> Suite:
        extra = sorted(set(self.taxonomy.levels or ()) - set(self.perturbations.levels))
        if extra:
            raise ValueError(f"taxonomy.levels {extra} are not perturbed: perturbations.levels is "
                             f"{self.perturbations.levels}")
        return self

    def taxonomy_levels(self) -> list[int]:
        """The perturbed levels the taxonomy evaluates (``taxonomy.levels``, else every perturbed level)."""
        wanted = self.taxonomy.levels
        return [lv for lv in self.perturbations.levels if wanted is None or lv in wanted]

    @model_validator(mode="after")
    def _adapters_held_out(self) -> Suite:
        """An ``adapter: finetuned`` (and the taxonomy's ``consistency_lora``) is trained on the train
        split and selected on val: a suite evaluating it on a split holding either is refused, and
        its box scale must be one an adapter can be taught (not pixels)."""
        adapted = {v.id for v in self.vlm.models if v.adapter == DEMO_TRAINED_ADAPTER}
        for v in self.vlm.models:
            if v.id in adapted:
                adapter_box_scale(self, v)
                if self.vlm.split in ADAPTER_SEEN_SPLITS:
                    raise ValueError(f"VLM {v.id!r} would be evaluated on vlm.split {self.vlm.split!r}, which holds "
                                     "its adapter's training (train) or selection (val) data: set vlm.split: test")
        for c in self.taxonomy.configs:
            if (c.model in adapted or c.demo_training == "consistency_lora") and \
                    self.taxonomy.split in ADAPTER_SEEN_SPLITS:
                raise ValueError(f"taxonomy config {c.id!r} (model {c.model or c.demo_training!r}) would be evaluated "
                                 f"on taxonomy.split {self.taxonomy.split!r}, which holds its adapter's training "
                                 "(train) or selection (val) data: set taxonomy.split: test")
        return self

    @model_validator(mode="after")
    def _weights_named_outside_the_demo(self) -> Suite:
        if self.demo.enabled:  # the demo trains what it does not name
            for m in self.segmentation.models:
                m.checkpoint = m.checkpoint or DEMO_TRAINED
            for v in self.vlm.models:
                if v.kind == "hf" and v.base is None:
                    v.source = v.source or DEMO_TRAINED
            return self
        for m in self.segmentation.models:
            if m.checkpoint in (None, DEMO_TRAINED):
                raise ValueError(f"segmentation model {m.id!r} has no checkpoint: set 'checkpoint' to its weights "
                                 f"file ('{DEMO_TRAINED}' is for the demo only)")
        for v in self.vlm.models:
            if v.kind == "hf" and v.base is None and v.source in (None, DEMO_TRAINED):
                raise ValueError(f"VLM {v.id!r} has no source: set 'source' to a local model folder or a cached hub "
                                 f"id ('{DEMO_TRAINED}' is for the demo only)")
            if v.adapter == DEMO_TRAINED_ADAPTER and v.base is None:
                raise ValueError(f"VLM {v.id!r}: 'adapter: {DEMO_TRAINED_ADAPTER}' needs a 'base' model")
        return self


def load_suite(path: str | Path) -> Suite:
    """Read a suite YAML. Raises FileNotFoundError, or ValueError naming the file and each offending
    key (unknown keys included) with its location, e.g. ``segmentation.models.0.chekpoint``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"suite config not found: {p}")
    with p.open() as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a suite is a mapping of sections, got {type(data).__name__}")
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}: {msg}")
        raise ValueError(f"{p}: invalid suite: " + "; ".join(problems)) from None
