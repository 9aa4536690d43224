"""The suite configuration: what to evaluate, loaded from ``configs/*.yaml``.

Paths in a suite are relative to the working directory (the project root) unless absolute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, validate_bands
from medrobust_lib.types import ALL_MODALITIES, SEVERITY_LEVELS


class DemoConfig(BaseModel):
    """The embedded offline demo dataset (built by ``medrobust_lib.data.demo.build_demo``)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    root: str = "var/data/demo"
    n_per_modality: int = Field(default=24, ge=4)
    seed: int = 0


class PerturbationConfig(BaseModel):
    """Which perturbations to generate and how to calibrate them."""

    model_config = ConfigDict(extra="forbid")
    include: list[str] = Field(default_factory=lambda: ["*"])
    exclude: list[str] = Field(default_factory=list)
    levels: list[int] = Field(default_factory=lambda: list(SEVERITY_LEVELS))
    bands: dict[int, tuple[float, float]] = Field(default_factory=lambda: dict(DEFAULT_BANDS))
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
    """A whole evaluation suite."""

    model_config = ConfigDict(extra="allow")
    name: str = "demo"
    seed: int = 0
    results_dir: str = "var/results"
    mart_path: str = "var/marts.duckdb"
    workers: int = Field(default=1, ge=1, description="processes used inside one partition")
    modalities: list[str] = Field(default_factory=lambda: list(ALL_MODALITIES))
    demo: DemoConfig = Field(default_factory=lambda: DemoConfig())
    datasets: list[dict[str, Any]] = Field(default_factory=list, description="DatasetConfig fields")
    perturbations: PerturbationConfig = Field(default_factory=lambda: PerturbationConfig())
    max_error_share: float = Field(default=0.02, ge=0.0, le=1.0, description=(
        "largest share of infrastructure errors (outcome 'error') a VLM or taxonomy partition may have and "
        "still count as complete; above it the partition fails its check and is left out of the mart views"))

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in ALL_MODALITIES]
        if bad:
            raise ValueError(f"unknown modalities {bad}; valid: {', '.join(ALL_MODALITIES)}")
        return v


def load_suite(path: str | Path) -> Suite:
    """Read a suite YAML; raises FileNotFoundError or ValueError with the offending field."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"suite config not found: {p}")
    with p.open() as fh:
        data = yaml.safe_load(fh) or {}
    return Suite.model_validate(data)
