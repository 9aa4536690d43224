"""The segmentation track's models: a suite entry's config, its checkpoint file, the per-process
model cache, the demo's base checkpoint (trained from scratch) and the train / val / test splits the
training uses. Evaluation (:mod:`medrobust_lib.tracks.segmentation.evaluate`) only asks for a model
here and scores samples with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medrobust_lib.config import Suite
from medrobust_lib.config.common import by_id
from medrobust_lib.config.segmentation import PACKAGE_CHECKPOINT, SegModelConfig
from medrobust_lib.data.sample import Sample
from medrobust_lib.lru import LRU, file_stamp
from medrobust_lib.models.factory import build_segmenter
from medrobust_lib.models.litemedsam_package import packaged_checkpoint, verify_packaged_checkpoint
from medrobust_lib.paths import checkpoint_dir, suite_paths
from medrobust_lib.store import model_registry
from medrobust_lib.tracks.upstream import MissingUpstream


def model_config(suite: Suite, model_id: str | SegModelConfig) -> SegModelConfig:
    """The suite's model ``model_id``; a :class:`SegModelConfig` is returned as it is (fine-tuned
    strategy checkpoints and registry versions are evaluated without being listed in the suite)."""
    if isinstance(model_id, SegModelConfig):
        return model_id
    return by_id(suite.segmentation.models, model_id, "segmentation model")


_SPLITS: LRU[tuple[Any, ...], dict[str, list[Sample]]] = LRU(max_items=1, name="segmentation.splits")
"""Per-process cache of :func:`seg_splits` (the fine-tuning strategies of one run share it)."""


def seg_splits(suite: Suite) -> dict[str, list[Sample]]:
    """Train / val / test samples with a non-empty mask over every modality (hash-based split),
    for training the base model and the fine-tuning strategies. Loaded and checked against their
    recorded hashes once per process while the clean index and the suite's settings stay the same
    (:func:`medrobust_lib.tracks.feed.index_signature`); the lists are new on every call, the
    samples shared: callers must not change them."""
    from medrobust_lib.tracks.datasets import load_clean_samples
    from medrobust_lib.tracks.feed import index_signature

    key = tuple(index_signature(suite, m) for m in suite.modalities)
    held = _SPLITS.get(key)
    if held is None:
        held = {"train": [], "val": [], "test": []}
        for modality in suite.modalities:
            for name in held:
                for items in load_clean_samples(suite, modality, split=name).values():
                    held[name].extend(s for s in items if s.mask is not None and s.mask.any())
        _SPLITS.put(key, held)
    return {name: list(samples) for name, samples in held.items()}


def resolve_checkpoint(suite: Suite, m: SegModelConfig) -> Path:
    """The local checkpoint file for a model config (clear errors when missing). ``models:/...``
    URIs resolve through the local MLflow registry in ``$MEDROBUST_MLRUNS`` (default ``mlruns``)."""
    if m.checkpoint == "trained":
        p = checkpoint_dir(suite, m.id) / "model.safetensors"
        if not p.is_file():
            raise MissingUpstream(f"no trained checkpoint for {m.id!r} at {p}: materialize '{m.id}/base_checkpoint' first",
                                  f"{m.id}/base_checkpoint")
        return p
    if m.checkpoint is None:
        raise ValueError(f"segmentation model {m.id!r} names no checkpoint")
    if m.checkpoint == PACKAGE_CHECKPOINT:
        return verify_packaged_checkpoint(packaged_checkpoint())
    if m.checkpoint.startswith("models:/"):
        return model_registry.resolve_model_uri(m.checkpoint, model_registry.mlruns_dir())
    return Path(m.checkpoint)


_MODELS: LRU[tuple[Any, ...], Any] = LRU(max_items=2, name="segmentation.models")


def load_model(suite: Suite, m: SegModelConfig, *, fresh: bool = False) -> Any:
    """The segmenter of a model config. Kept per process (keyed on the checkpoint file's path,
    size and mtime and the config), so partitions evaluated in one process share one model and,
    with ``compile``, one compiled encoder. The shared model is for inference only: a caller that
    changes the model (fine-tuning applies a strategy and trains it in place) asks for a ``fresh``
    one, which is never cached. The model class is the one registered for ``m.family``
    (:mod:`medrobust_lib.models.factory`)."""
    path = resolve_checkpoint(suite, m)
    exports = suite_paths(suite).cache / "exports"  # exported inference graphs (models.onnx_engine)
    if fresh:
        return build_segmenter(m, path, cache_dir=exports)
    key = (file_stamp(path) if Path(path).is_file() else str(Path(path).resolve()), m.model_dump_json())
    model = _MODELS.get(key)
    if model is None:
        _MODELS.make_room()  # the oldest model goes before this one loads
        model = build_segmenter(m, path, cache_dir=exports)
        _MODELS.put(key, model)
    return model


@dataclass
class BaseTrainSummary:
    val_dice: float
    test_dice: float
    steps: int
    seconds: float
    n_train: int
    n_val: int
    n_test: int
    checkpoint: str
    history: list[dict[str, float]] = field(default_factory=list)


def train_base_checkpoint(suite: Suite, model_id: str, log: Callable[[str], None] | None = None) -> BaseTrainSummary:
    """Train the configured architecture from scratch on the train split of every modality
    (selection on val), save safetensors + config.json, and report test Dice."""
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam, state_dict_hash
    from medrobust_lib.training.train import (
        TrainConfig,
        config_dict,
        evaluate_dice,
        save_checkpoint,
        train_segmenter,
    )

    m = model_config(suite, model_id)
    tc = suite.segmentation.train
    splits = seg_splits(suite)
    model = SamSegmenter(build_sam(arch_for(m.arch, m.family), seed=suite.seed), m.family, m.id, "untrained", m.device)
    cfg = TrainConfig(max_steps=tc.max_steps, batch_size=tc.batch_size, lr=tc.lr, warmup_steps=tc.warmup_steps,
                      eval_every=tc.eval_every, patience=tc.patience, time_budget_s=tc.time_budget_s,
                      box_jitter=tc.box_jitter, seed=suite.seed)
    res = train_segmenter(model, splits["train"], splits["val"], cfg, log=log)
    test_dice = evaluate_dice(model, splits["test"], suite.segmentation.prompt)
    meta = {"family": m.family, "arch": m.arch, "model_id": m.id, "train": config_dict(cfg),
            "val_dice": res.best_val_dice, "best_step": res.best_step, "test_dice": test_dice,
            "state_sha256": state_dict_hash(model.sam), "n_train": len(splits["train"])}
    path = save_checkpoint(model, checkpoint_dir(suite, m.id), meta)
    return BaseTrainSummary(res.best_val_dice, test_dice, res.steps, res.seconds, len(splits["train"]),
                            len(splits["val"]), len(splits["test"]), str(path), res.history)


def committed_test_dice(suite: Suite, model_id: str) -> float:
    """Mean test Dice (evaluation prompt) of the checkpoint now in ``var/checkpoints/<id>/``: the
    demo measures the committed tiny SAM again instead of trusting the number recorded with it."""
    from medrobust_lib.training.train import evaluate_dice

    m = model_config(suite, model_id)
    return evaluate_dice(load_model(suite, m), seg_splits(suite)["test"], suite.segmentation.prompt)


def model_precision(model: Any) -> str:
    """The model's ``precision`` (``fp32`` for a model that does not say)."""
    return str(getattr(model, "precision", "fp32"))
