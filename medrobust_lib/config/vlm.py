"""VLM track configuration (the suite's ``vlm:`` section) and the evaluation items it defines.

Suite YAML::

    vlm:
      models:
        - id: llava-med                 # local Hugging Face folder (save_pretrained layout) or cached hub id
          source: /models/llava-med-v1.5-mistral-7b-hf
          device: cuda
        - id: medgemma-lora
          base: medgemma               # weights of another configured model ...
          adapter: finetuned           # ... plus the LoRA adapter its finetuned_adapter asset trains
        - id: gpt-4o-mini
          kind: api                    # OpenAI-compatible endpoint; key from the environment only
          api: {model: gpt-4o-mini, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}
      records:                          # record files in their published formats (any may be omitted)
        image_root: /data/omnimedvqa
        omnimedvqa: /data/omnimedvqa/qa.json
        yesno: /data/psf/questions.jsonl
        roco_captions: /data/rocov2/test_captions.csv
        roco_images: null
        mecovqa_grounding: /data/mecovqa/grounding.json
      split: test

Images are joined to the clean-sample index on ``(dataset, sample_id)`` (``sample_id`` defaults
to the image file stem), so every perturbed image comes from the same manifest as the
segmentation track. A record whose image is not in the index becomes an
``excluded:image_not_indexed`` row, counted, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from medrobust_lib.config import Suite

YESNO_SUFFIX = " Answer with yes or no."
CAPTION_PROMPT = "Describe the findings in this image in one sentence."
GROUNDING_SUFFIX = " Answer with the box as [x0, y0, x1, y1]."


class VLMModelConfig(BaseModel):
    """One VLM of the suite. ``source``: a local folder or cached hub id, or ``trained`` (the demo
    ``base_checkpoint`` asset trains a tiny LLaVA). ``base``: take the weights of another configured
    model. ``adapter``: a LoRA adapter folder, or ``finetuned`` (this model's own
    ``finetuned_adapter`` asset). ``box_scale``: the declared grounding output scale, when known."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    kind: Literal["hf", "api"] = "hf"
    source: str = "trained"
    base: str | None = None
    adapter: str | None = None
    device: str = "cpu"
    batch_size: int = 16
    max_new_tokens: int = 16
    caption_max_new_tokens: int = 40
    box_scale: Literal["0-1", "0-1000", "pixels"] | None = None
    api: dict[str, Any] = Field(default_factory=dict)


class VLMRecordsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image_root: str | None = None
    omnimedvqa: str | None = None
    yesno: str | None = None
    roco_captions: str | None = None
    roco_images: str | None = None
    mecovqa_grounding: str | None = None


class VLMTrainSettings(BaseModel):
    """Training of the demo base model (``source: trained``)."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 250
    patience: int = 4
    time_budget_s: float | None = 150.0
    image_size: int = 64
    patch_size: int = 16
    hidden: int = 64
    layers: int = 2


class VLMFinetuneSettings(BaseModel):
    """LoRA fine-tuning (``adapter: finetuned``): task, LoRA shape, training budget."""

    model_config = ConfigDict(extra="forbid")
    task: Literal["grounding", "vqa_mc", "vqa_yesno", "caption"] = "grounding"
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_regex: str | None = None
    max_steps: int = 400
    batch_size: int = 16
    lr: float = 1e-3
    eval_every: int = 50
    patience: int = 3
    time_budget_s: float | None = 60.0


class VLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[VLMModelConfig] = Field(default_factory=list)
    records: VLMRecordsConfig = Field(default_factory=lambda: VLMRecordsConfig())
    split: str = "test"
    train: VLMTrainSettings = Field(default_factory=lambda: VLMTrainSettings())
    finetune: VLMFinetuneSettings = Field(default_factory=lambda: VLMFinetuneSettings())
    max_records_per_task: int | None = None
    judge: str | None = None
    """Optional LLM judge (a ``kind: api`` model id) for multiple-choice answers the rules cannot
    parse; recorded in separate columns, never replacing the rule-based ``correct``."""


def vlm_config(suite: Suite) -> VLMConfig:
    raw = getattr(suite, "vlm", None) or {}
    return raw if isinstance(raw, VLMConfig) else VLMConfig.model_validate(raw)


def vlm_model(suite: Suite, model_id: str) -> VLMModelConfig:
    for m in vlm_config(suite).models:
        if m.id == model_id:
            return m
    raise KeyError(f"unknown VLM {model_id!r}; configured: {[m.id for m in vlm_config(suite).models]}")


def records_config(suite: Suite) -> VLMRecordsConfig:
    """The configured record files; with the demo enabled, unset ones point at the demo records."""
    rc = vlm_config(suite).records
    if not suite.demo.enabled:
        return rc
    root = Path(suite.demo.root)
    from medrobust_lib.paths import RECORD_FILES

    demo = {"image_root": str(root), "omnimedvqa": str(root / RECORD_FILES["omnimedvqa"]),
            "yesno": str(root / RECORD_FILES["yesno_paraphrases"]),
            "roco_captions": str(root / RECORD_FILES["roco_captions"]),
            "roco_images": str(root / RECORD_FILES["roco_images"]),
            "mecovqa_grounding": str(root / RECORD_FILES["mecovqa_grounding"])}
    return VLMRecordsConfig(**{k: v if v is not None else demo[k] for k, v in rc.model_dump().items()})


# ---- evaluation items ------------------------------------------------------------------------

@dataclass(frozen=True)
class VLMItem:
    """One question (or caption / grounding request) about one image.

    ``variants``: (question text, polarity) pairs for yes/no, the original first; ``answer``: the
    letter (MC), yes/no (original polarity), or empty. ``box`` is pixel XYXY (end exclusive) in the
    record's image coordinates ``image_hw`` (None: the sample's own size)."""

    task: str
    record_id: str
    dataset: str
    sample_id: str
    modality: str
    question: str
    answer: str = ""
    options: tuple[str, ...] = ()
    variants: tuple[tuple[str, int], ...] = ()
    references: tuple[str, ...] = ()
    box: tuple[float, float, float, float] | None = None
    image_hw: tuple[int, int] | None = None


@dataclass
class LoadedItems:
    items: list[VLMItem]
    quarantine: dict[str, int]
    n_total: int


def _sid(sample_id: str | None, image_path: Path, slice_index: int | None) -> str:
    if sample_id:
        return sample_id
    return image_path.stem if slice_index is None else f"{image_path.stem}_z{slice_index:03d}"


def load_items(suite: Suite) -> LoadedItems:
    """Every configured record as a :class:`VLMItem`; reader quarantine counted per reason."""
    from medrobust_lib.data import vlm_records as vr
    from medrobust_lib.tasks.vqa import LETTERS

    rc = records_config(suite)
    root = Path(rc.image_root or ".")
    items: list[VLMItem] = []
    quarantine: dict[str, int] = {}
    total = 0

    def tally(res: Any) -> list[Any]:
        nonlocal total
        total += res.n_total
        for q in res.quarantine:
            quarantine[q.reason] = quarantine.get(q.reason, 0) + 1
        return list(res.records)

    if rc.omnimedvqa:
        for r in tally(vr.read_omnimedvqa(rc.omnimedvqa, root)):
            letters = list(r.options)
            items.append(VLMItem("vqa_mc", r.record_id, r.dataset, _sid(r.sample_id, r.image_path, r.slice_index),
                                 r.modality, r.question, LETTERS[letters.index(r.answer_letter)],
                                 options=tuple(r.options[k] for k in letters)))
    if rc.yesno:
        for r in tally(vr.read_binary_paraphrases(rc.yesno, root)):
            items.append(VLMItem("vqa_yesno", r.record_id, r.dataset, _sid(r.sample_id, r.image_path, r.slice_index),
                                 r.modality, r.question, r.answer, variants=tuple(r.variants)))
    if rc.roco_captions:
        for r in tally(vr.read_roco(rc.roco_captions, root, images_csv=rc.roco_images)):
            items.append(VLMItem("caption", r.record_id, r.dataset, _sid(r.sample_id, r.image_path, r.slice_index),
                                 r.modality, CAPTION_PROMPT, references=tuple(r.references)))
    if rc.mecovqa_grounding:
        for r in tally(vr.read_mecovqa_grounding(rc.mecovqa_grounding, root)):
            items.append(VLMItem("grounding", r.record_id, r.dataset, _sid(r.sample_id, r.image_path, r.slice_index),
                                 r.modality, r.question, box=tuple(float(v) for v in r.box_xyxy),  # type: ignore[arg-type]
                                 image_hw=r.image_hw))
    return LoadedItems(items, quarantine, total)


def box_in_sample(item: VLMItem, sample_hw: tuple[int, int], original_hw: tuple[int, int] | None) -> np.ndarray:
    """The item's ground-truth box in the loaded sample's pixel coordinates, float32 (1, 4): the
    record box is scaled from the record's (or the original file's) size to the sample size."""
    assert item.box is not None
    src = item.image_hw or original_hw or sample_hw
    sy, sx = sample_hw[0] / src[0], sample_hw[1] / src[1]
    x0, y0, x1, y1 = item.box
    return np.array([[x0 * sx, y0 * sy, x1 * sx, y1 * sy]], np.float32)


def prompt_for(item: VLMItem, variant: int = 0) -> str:
    """The user text sent for an item (MC options shown; yes/no and grounding instructions)."""
    from medrobust_lib.tasks.vqa import build_mc_prompt

    if item.task == "vqa_mc":
        return build_mc_prompt(item.question, list(item.options))
    if item.task == "vqa_yesno":
        text = item.variants[variant][0] if item.variants else item.question
        return text + YESNO_SUFFIX
    if item.task == "grounding":
        return item.question + GROUNDING_SUFFIX
    return CAPTION_PROMPT
