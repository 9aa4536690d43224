"""VLM track configuration: the suite's ``vlm:`` section (the items it defines are built by
:mod:`medrobust_lib.tracks.vlm.items`).

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
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from medrobust_lib.config.common import (
    AddedKeys,
    AlignmentStage,
    LoraSchedule,
    LoraSettings,
    TrainBudget,
    WeightStorage,
    by_id,
)
from medrobust_lib.model_table import list_models, model_entry

if TYPE_CHECKING:
    from medrobust_lib.config import Suite


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiSettings(AddedKeys):
    """The endpoint of a ``kind: api`` VLM (any OpenAI-compatible ``/chat/completions``), read by
    :class:`medrobust_lib.models.api_vlm.ApiVLM`. Holds the *name* of the key's environment
    variable, never the key.

    ``model``: the model name the endpoint serves. ``base_url``: the endpoint's base (http:// only
    to a loopback host when a key is sent). ``api_key_env``: the environment variable holding the
    key (null: no Authorization header, e.g. a local vLLM/TGI server). ``temperature``: sampling
    temperature. ``max_tokens``: generated tokens per request. ``timeout_s``: httpx's per-phase
    timeout (connect, read, write, pool), seconds. ``max_retries``: retries of 429, 5xx, timeouts and
    connection errors. ``backoff_base_s`` / ``backoff_max_s``: exponential backoff with full jitter,
    seconds. ``retry_after_max_s``: cap on a server's Retry-After, seconds. ``concurrency``: requests
    in flight per batch. ``cache_path``: the SQLite response cache (null: the suite's cache folder).
    ``request_logprobs``: ask for the first token's top log-probabilities. ``seed``: the request
    seed and the backoff jitter's (unset: the suite's seed). ``deadline_s``: the whole
    life of one request, retries and waits included, seconds. ``max_response_bytes``: largest
    response body accepted. ``top_p``: nucleus sampling mass sent with each request (null: not
    sent, the endpoint's default). With ``temperature`` > 0 the request also carries ``seed``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("top_p",)
    model: str = Field(min_length=1)
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=256, ge=1)
    timeout_s: float = Field(default=60.0, ge=0)
    max_retries: int = Field(default=5, ge=0)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    retry_after_max_s: float = Field(default=300.0, ge=0)
    concurrency: int = Field(default=8, ge=1)
    cache_path: str | None = None
    request_logprobs: bool = False
    seed: int = 0
    deadline_s: float = Field(default=600.0, gt=0)
    max_response_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    top_p: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _url(self) -> ApiSettings:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.base_url.startswith("http://") and self.api_key_env is not None and not is_loopback(self.base_url):
            raise ValueError(f"base_url {self.base_url!r} is plain http:// and an API key ({self.api_key_env}) "
                             "would travel in clear text; use https://, or http:// only to a loopback host "
                             "(127.0.0.1, ::1, localhost)")
        return self


class VLMModelConfig(AddedKeys):
    """One VLM of the suite. ``source``: a local folder or cached hub id, or ``trained`` (the demo
    ``base_checkpoint`` asset trains a tiny LLaVA). ``base``: take the weights of another configured
    model. ``adapter``: a LoRA adapter folder, or ``finetuned`` (this model's own
    ``finetuned_adapter`` asset). ``box_scale``: the declared grounding output scale, when known.

    ``id``: the model's name in results and asset keys. ``kind``: hf (local transformers weights),
    llava_rad (LLaVA-Rad in its original layout: ``source`` its merged folder, or the base LLaMA
    folder with ``adapter`` the LoRA release) or api (an OpenAI-compatible endpoint). ``device``: torch device. ``batch_size``: prompts per
    generation batch. ``max_new_tokens``: generated tokens per answer. ``caption_max_new_tokens``:
    generated tokens per caption. ``api``: the endpoint of a ``kind: api`` model (required there,
    refused for ``kind: hf``; see ``vlm.models[].api``). ``system_prompt``, ``temperature``,
    ``top_p``: decoding (greedy without a system turn by default; an endpoint samples with its
    ``api.temperature`` / ``api.top_p``)."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("system_prompt", "temperature", "top_p")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    kind: Literal["hf", "llava_rad", "api"] = "hf"
    source: str | None = None
    base: str | None = None
    adapter: str | None = None
    device: str = "cpu"
    batch_size: int = 16
    max_new_tokens: int = Field(default=64, ge=1, description="generated tokens per answer (multiple choice, "
                                                             "yes/no as text); an answer that hits it is flagged truncated")
    caption_max_new_tokens: int = Field(default=512, ge=1, description="generated tokens per caption (flagged "
                                                                      "truncated when hit)")
    grounding_max_new_tokens: int = Field(default=128, ge=1, description="generated tokens per grounding answer "
                                                                        "(flagged truncated when hit)")
    box_scale: Literal["0-1", "0-1000", "pixels"] | None = None
    levels: list[int] | None = Field(
        default=None, description="perturbation levels this model is evaluated at (None: every level of the suite)")
    api: ApiSettings | None = None
    system_prompt: str | None = Field(default=None, description=(
        "a system turn before every question (kind hf: the chat template's system role; kind api: a system "
        "message); null: none. The reference: 'You are an expert medical imaging specialist.' for MedGemma and "
        "the API models, none for LLaVA-Med (mistral_instruct's system is empty)"))
    temperature: float = Field(default=0.0, ge=0, description=(
        "kind hf: sampling temperature (0: greedy, the default); with > 0 each batch is sampled from a generator "
        "seeded by the suite seed and the batch's prompts. kind api: set api.temperature instead"))
    top_p: float = Field(default=1.0, gt=0, le=1, description=(
        "kind hf: nucleus sampling mass when temperature > 0 (1: off). kind api: set api.top_p instead"))

    @model_validator(mode="after")
    def _decoding(self) -> VLMModelConfig:
        entry = model_entry(self.kind, "vlm")
        if entry.is_endpoint and ("temperature" in self.model_fields_set or "top_p" in self.model_fields_set):
            raise ValueError(f"VLM {self.id!r} (kind: {self.kind}): set the endpoint's sampling in 'api' "
                             "(api.temperature, api.top_p), not temperature / top_p")
        if entry.fixed_decoding and (self.system_prompt is not None or self.temperature > 0 or self.top_p < 1):
            raise ValueError(f"VLM {self.id!r} (kind: {self.kind}): its prompt has a fixed system turn and it "
                             "decodes greedily; system_prompt, temperature and top_p are for kind hf and api")
        return self

    def decoding(self) -> dict[str, Any]:
        """The decoding settings its rows record: ``system_prompt``, ``temperature``, ``top_p``
        (an endpoint's from ``api``; None where not sent)."""
        if self.api is not None:
            return {"system_prompt": self.system_prompt, "temperature": self.api.temperature, "top_p": self.api.top_p}
        return {"system_prompt": self.system_prompt, "temperature": self.temperature,
                "top_p": self.top_p if self.temperature > 0 else None}

    def samples(self) -> bool:
        """Whether it decodes by sampling (temperature > 0), so that its answers depend on a seed."""
        return (self.api.temperature if self.api is not None else self.temperature) > 0

    @model_validator(mode="after")
    def _api_for_api_kind(self) -> VLMModelConfig:
        endpoint = model_entry(self.kind, "vlm").is_endpoint
        if endpoint and self.api is None:
            raise ValueError(f"VLM {self.id!r} (kind: {self.kind}) needs 'api' with at least its 'model' (the "
                             "endpoint's model name)")
        if not endpoint and self.api is not None:
            raise ValueError(f"VLM {self.id!r}: 'api' settings are for endpoint models (kind: "
                             f"{', '.join(list_models('vlm', is_endpoint=True))}); this one is kind: {self.kind}")
        return self


class YesNoFile(BaseModel):
    """One yes/no (paraphrase) record file of ``records.yesno``: its ``path``, the ``dataset`` its
    records belong to (None: as the file says; a PSF-Med file: its subset) and the folder its image
    paths are relative to (None: ``records.image_root``)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="the yes/no JSONL file")
    dataset: str | None = Field(default=None, description="the dataset its records belong to (None: as the file "
                                                           "says; a PSF-Med file: its subset)")
    image_root: str | None = Field(default=None, description="the folder its image paths are relative to (None: "
                                                             "records.image_root)")


class VLMRecordsConfig(BaseModel):
    """Record files in their published formats; any may be omitted. ``image_root``: the folder the
    records' image paths are relative to. ``omnimedvqa``: an OmniMedVQA QA_information JSON file.
    ``yesno``: a JSONL of yes/no questions with paraphrases, or a list of :class:`YesNoFile`
    (several yes/no datasets in one suite, e.g. PSF-Med's MIMIC-CXR and PadChest subsets, so the
    taxonomy's (configuration, dataset) points come from one run). ``roco_captions``: a ROCOv2
    captions CSV. ``roco_images``: the ROCOv2 image list CSV. ``mecovqa_grounding``: a MeCoVQA-G
    grounding JSON file."""

    model_config = ConfigDict(extra="forbid")
    image_root: str | None = None
    omnimedvqa: str | None = None
    yesno: str | list[YesNoFile] | None = None
    roco_captions: str | None = None
    roco_images: str | None = None
    mecovqa_grounding: str | None = None


class VLMTrainSettings(TrainBudget, AlignmentStage, WeightStorage):
    """Training of the demo base model (``source: trained``), after its alignment stage
    (:class:`AlignmentStage`, none by default).

    ``image_size``: image side of the demo's tiny VLM (pixels). ``patch_size``: its patch side
    (pixels). ``hidden``: its model width. ``layers``: its transformer blocks."""

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
    vision_hidden: int | None = Field(default=None, gt=0, description="width of the vision tower (None: hidden)")
    vision_layers: int | None = Field(default=None, gt=0, description="blocks of the vision tower (None: layers)")
    vision_heads: int = Field(default=2, gt=0, description="attention heads of the vision tower")
    box_step: float = Field(default=0.01, gt=0, le=0.5, description="grid of the taught box answers (fractions of "
                            "width and height): 0.05 teaches 21 values per coordinate instead of 101")
    grounding_flips: bool = Field(default=False, description="also teach grounding on the horizontally, vertically "
                                  "and doubly flipped training images (the boxes flipped with them)")
    yesno_steps: int = Field(default=0, ge=0, description="a yes/no stage between the alignment stage and the main "
                             "training: positive paraphrases only, align_share attribute naming mixed in (0: none)")
    negations: bool = Field(default=True, description="train on the negated yes/no variants too (the VLM track asks "
                            "the original question; a tiny model learns the extra inversion poorly)")
    corpus_per_modality: int = Field(default=0, ge=0, description="images per modality of a synthetic pretraining "
                                     "corpus from the demo's generators (seed + 1, medrobust_lib/demo/corpus.py), "
                                     "added to the train split in every stage (0: none)")
    tower_corpus_per_modality: int | None = Field(default=None, ge=0, description="images per modality of the "
                                                  "synthetic corpus the tower pretraining sees (None: "
                                                  "corpus_per_modality); a larger tower corpus costs one image copy "
                                                  "in memory, the text stages' corpus several")
    tower_steps: int = Field(default=0, ge=0, description="supervised pretraining steps of the vision tower on the "
                             "target's mask, box, side, height and size before any text (demo/vision_pretrain.py)")
    tower_lr: float = Field(default=1e-3, gt=0, description="peak learning rate of the tower pretraining (AdamW, cosine "
                            "decay to a tenth)")
    tower_box_loss: Literal["mse", "l1_giou"] = Field(default="mse", description="box loss of the tower pretraining "
                                                    "(demo/vision_pretrain.py BOX_LOSSES)")
    tower_text_lr_scale: float = Field(default=1.0, ge=0, description="learning-rate factor of the vision tower in "
                                       "the text stages after its pretraining: 0 freezes it (LLaVA's recipe: only "
                                       "the projector and the language model learn), 1 trains it with the rest")
    tower_transposes: bool = Field(default=False, description="tower pretraining draws one of the eight symmetries "
                                   "of the square per image and batch instead of storing the four flips as rows "
                                   "(one copy of the images in memory)")
    position_init_std: float | None = Field(default=None, gt=0, description="std of the tower's initial position "
                                            "embeddings (None: the architecture's own init, 0.02 for CLIP, too faint "
                                            "for a from-scratch tower to tell left from right)")


class VLMFinetuneSettings(TrainBudget, LoraSettings, LoraSchedule, AddedKeys):
    """LoRA fine-tuning (``adapter: finetuned``): task, LoRA shape, training budget.

    ``task``: the task the adapter is trained on (grounding, vqa_mc, vqa_yesno, caption)."""

    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("lr_schedule",)

    task: Literal["grounding", "vqa_mc", "vqa_yesno", "caption"] = "grounding"
    max_steps: int = 400
    batch_size: int = 16
    lr: float = 1e-3
    eval_every: int = 50
    patience: int = 3
    time_budget_s: float | None = 60.0


REFERENCE_TYPE_NAMES: dict[str, tuple[str, ...]] = {
    "gaussian_noise": ("gaussian_noise",), "salt_pepper_noise": ("salt_pepper_noise",),
    "speckle_noise": ("speckle_noise",), "gaussian_blur": ("gaussian_blur",), "motion_blur": ("motion_blur",),
    "brightness_contrast": ("brightness", "contrast"), "compression_artifacts": ("jpeg_compression",),
    "pixelate": ("pixelate",), "rotation": ("rotation",), "scale": ("scaling",), "translation": ("translation",),
    "xray_scatter": ("scatter",), "xray_underexposure": ("underexposure",), "xray_overexposure": ("overexposure",),
    "xray_grid_artifact": ("grid_lines",), "window_level": ("window_level",),
}
"""The reference VLM generator's type names (``VLM/generate_perturbation.py``) -> medrobust's: its one
``brightness_contrast`` draw is two types here; ``window_level`` is its own type here (its windowing on
the image's range, registered for X-ray and CT, as the reference lists it for both; ``window_shift``
is medrobust's CT windowing, not the reference's)."""

REFERENCE_VLM_BASE = ("gaussian_noise", "salt_pepper_noise", "speckle_noise", "gaussian_blur", "motion_blur",
                      "brightness_contrast", "compression_artifacts", "pixelate", "rotation", "scale", "translation")
"""``MedicalPerturbationGenerator.base_perturbations``: the 11 types of every VLM dataset."""
REFERENCE_VLM_XRAY = ("xray_scatter", "xray_underexposure", "xray_overexposure", "xray_grid_artifact", "window_level")
"""``modality_perturbations['XRAY']``: added for every ROCO image (the generator calls them all X-ray)."""


def reference_vlm_types(record_file: str) -> list[str]:
    """The medrobust types the reference perturbs the images of a VLM record file with (a
    ``perturbations.types_by_dataset`` entry): the 11 base types for OmniMedVQA and MeCoVQA
    (``omnimedvqa``, ``mecovqa_grounding``), those plus the 5 X-ray types for ROCO
    (``roco_captions``; ``generate_perturbations``)."""
    if record_file not in ("omnimedvqa", "roco_captions", "mecovqa_grounding"):
        raise ValueError(f"unknown record file {record_file!r}; valid: omnimedvqa, roco_captions, mecovqa_grounding")
    ref = REFERENCE_VLM_BASE + (REFERENCE_VLM_XRAY if record_file == "roco_captions" else ())
    return [n for r in ref for n in REFERENCE_TYPE_NAMES[r]]


class RecordSample(BaseModel):
    """A seeded random draw of ``n`` records per task, as the reference draws them
    (``random.seed(seed); random.sample(records, n)`` over the readable records in file order,
    every record when there are at most ``n``): the same records are drawn from the same file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n: int = Field(ge=1, description="records drawn per task (all when there are at most n)")
    seed: int = Field(default=42, description="seed of Python's random.sample (the reference: 42)")


REFERENCE_CAPTION_PROMPT = "Describe this medical image in detail."
"""The caption prompt of the reference benchmark (``eval_vlm_perturbation.py``)."""


class VLMProtocol(AddedKeys):
    """Where the VLM track may ask and score as the reference benchmark does (all off by default;
    ``configs/reference_protocol.yaml`` turns them on; docs/differences-from-reference.md).

    - ``caption_prompt``: the caption instruction (None: the house one-sentence prompt);
    - ``caption_raw_scores``: also score captions on raw, untokenised strings as pycocoevalcap is
      called there (columns ``bleu_4_raw``, ``rouge_l_raw``, ``cider_raw``, besides the PTB scores);
    - ``grounding_parse``: ``house`` (box forms, scale detection, pixels) or ``reference`` (the first
      four numbers read as 0-1 coordinates, no scale reconciliation);
    - ``open_vqa_judge``: a ``kind: api`` model id (any OpenAI-compatible endpoint): every
      multiple-choice question is also asked alone (``open_vqa_max_new_tokens``) and the answer
      scored by that judge with the reference's rubric (0 / 0.5 / 1, correct at >= 0.5), in rows of
      task ``vqa_open`` beside the lettered ``vqa_mc`` rows;
    - ``caption_judge``: a ``kind: api`` model id (the same kind of judge client): every caption is
      also scored by that judge with the reference's caption rubric (a number from 0 to 1, read as
      the reference reads it), in the ``caption_judge_score`` column of the caption rows (NULL when
      the reply held no number; a failed call makes the row an ``error``, retried by the next run)."""

    model_config = ConfigDict(extra="forbid")
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ("caption_judge",)
    caption_prompt: str | None = None
    caption_raw_scores: bool = False
    grounding_parse: Literal["house", "reference"] = "house"
    open_vqa_judge: str | None = None
    open_vqa_max_new_tokens: int = Field(default=512, ge=1)
    caption_judge: str | None = None

    def is_default(self) -> bool:
        return self == VLMProtocol()


class VLMConfig(BaseModel):
    """``models``: the VLMs evaluated (see ``vlm.models[]``). ``records``: the record files of the VLM
    tasks. ``split``: which split is evaluated. ``train``: training of the demo's tiny VLM.
    ``finetune``: LoRA fine-tuning of a model with ``adapter: finetuned``. ``max_records_per_task``:
    cap on records per task and partition, the first ones (null: all). ``record_sample``: a seeded
    random draw of records per task (:class:`RecordSample`)."""

    model_config = ConfigDict(extra="forbid")
    protocol: VLMProtocol = Field(default_factory=lambda: VLMProtocol(), description=(
        "prompts, caps and scorers of the VLM tasks: the corrected protocol by default, the reference "
        "benchmark's with protocol: reference (docs/differences-from-reference.md)"))
    models: list[VLMModelConfig] = Field(default_factory=list)
    records: VLMRecordsConfig = Field(default_factory=lambda: VLMRecordsConfig())
    split: str = "test"
    train: VLMTrainSettings = Field(default_factory=lambda: VLMTrainSettings())
    finetune: VLMFinetuneSettings = Field(default_factory=lambda: VLMFinetuneSettings())
    max_records_per_task: int | None = None
    record_sample: RecordSample | None = Field(default=None, description=(
        "a seeded random draw of n records per task before anything else (the reference: n 100, seed 42; "
        "configs/reference_protocol.yaml); null: every record (max_records_per_task still caps them, first first)"))
    judge: str | None = None
    """Optional LLM judge (a ``kind: api`` model id) for multiple-choice answers the rules cannot
    parse; recorded in separate columns, never replacing the rule-based ``correct``."""


def yesno_files(records: VLMRecordsConfig) -> list[YesNoFile]:
    """``records.yesno`` as a list of :class:`YesNoFile` (one plain path: one file, dataset as the
    file says)."""
    if records.yesno is None:
        return []
    if isinstance(records.yesno, str):
        return [YesNoFile(path=records.yesno)]
    return list(records.yesno)


ADAPTER_SEEN_SPLITS = ("train", "val", "all")
"""Evaluation splits that hold data an ``adapter: finetuned`` was trained (train) or selected (val) on."""


def adapter_box_scale(suite: Suite, m: VLMModelConfig) -> str:
    """The box scale an ``adapter: finetuned`` model's grounding answers are taught in (and read in):
    its own ``box_scale``, else its base's, else ``0-1``. Raises ValueError for ``pixels`` (a taught
    answer cannot follow every image's size)."""
    scale = m.box_scale
    if scale is None and m.base is not None:
        scale = next((b.box_scale for b in suite.vlm.models if b.id == m.base), None)
    scale = scale or "0-1"
    if scale == "pixels":
        raise ValueError(f"VLM {m.id!r}: a fine-tuned adapter is taught boxes in 0-1 or 0-1000, not pixels; set its "
                         "box_scale")
    return scale


def vlm_model(suite: Suite, model_id: str) -> VLMModelConfig:
    """The suite's VLM ``model_id`` (KeyError naming the configured ids)."""
    return by_id(suite.vlm.models, model_id, "VLM")
