"""Building models: the class of a segmentation ``family`` or VLM ``kind`` is looked up in
the model table (:mod:`medrobust_lib.model_table`) and imported only when asked for
(:func:`load_model_class`): model classes import torch, segment-anything, transformers or httpx,
which cost seconds (and an API-only setup needs none of the local ones), so importing this module
is cheap. Every model class builds itself from its model config with a ``from_config``
classmethod (:func:`build_segmenter`, :func:`build_vlm`), and its instances satisfy the protocol
its entry names (:mod:`medrobust_lib.models.base`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrobust_lib.model_table import Task, model_entry

if TYPE_CHECKING:
    from medrobust_lib.config.segmentation import SegModelConfig
    from medrobust_lib.config.vlm import VLMModelConfig


def load_model_class(name: str, task: Task | None = None) -> type[Any]:
    """Import and return the model class of ``name`` (a segmentation family or VLM kind).
    KeyError (listing the known names) for an unknown name; ImportError when the entry's module
    lacks the class."""
    entry = model_entry(name, task)
    module_name, _, attr = entry.class_path.partition(":")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(cls, type):
        raise ImportError(f"model {name!r}: {module_name} has no class {attr!r} (class_path {entry.class_path!r})")
    return cls


@dataclass(frozen=True)
class VLMInputs:
    """What the suite resolves for a VLM adapter: ``source`` (local folder or cached hub id) and
    ``adapter`` (LoRA folder) for adapters with local weights; ``cache_path`` (SQLite response
    cache) and ``seed`` for endpoints. A model class reads what it needs."""

    source: str | None = None
    adapter: str | None = None
    cache_path: str | None = None
    seed: int = 0


def build_segmenter(m: SegModelConfig, checkpoint: str | Path, *, cache_dir: str | Path | None = None) -> Any:
    """The segmentation model of ``m.family`` loaded from ``checkpoint`` (a local file in the
    family's published layout). ``cache_dir``: where a model keeps what it derives from the
    checkpoint (exported graphs, :mod:`medrobust_lib.models.onnx_engine`; a suite's
    ``cache/exports``; None: the model class's default)."""
    return load_model_class(m.family, "segmentation").from_config(m, checkpoint, cache_dir=cache_dir)


def build_vlm(m: VLMModelConfig, inputs: VLMInputs) -> Any:
    """The VLM model of ``m.kind`` built from ``m`` and what the suite resolved."""
    return load_model_class(m.kind, "vlm").from_config(m, inputs)
