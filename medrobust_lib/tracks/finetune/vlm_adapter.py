"""LoRA fine-tuning of a VLM's adapter (``adapter: finetuned``): the supervised examples of the
suite's records on the train split, selection on val (test is never seen), the adapter saved as
safetensors under ``var/checkpoints/<id>/adapter``. Works on any Hugging Face image-text-to-text
model (a real VLM or the demo's tiny LLaVA); the training loop is
:func:`medrobust_lib.training.vlm_lora.finetune_lora`.

Grounding answers are taught in the box scale the adapted model is scored in
(:func:`adapter_box_scale`): a model declared ``box_scale: "0-1000"`` learns ``[x0, y0, x1, y1]``
in thousandths, one declared ``"0-1"`` (or none) in fractions, so the evaluation reads the boxes
the adapter was trained to write.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.common import LoraSettings
from medrobust_lib.config.vlm import VLMModelConfig, adapter_box_scale, vlm_model
from medrobust_lib.data.sample import Sample
from medrobust_lib.hashing import folder_hash
from medrobust_lib.model_table import list_models, model_entry
from medrobust_lib.models.remote_code import refuse_remote_code
from medrobust_lib.paths import checkpoint_dir
from medrobust_lib.tracks.vlm.items import VLMItem, box_in_sample, load_items, prompt_for
from medrobust_lib.tracks.vlm.model import TRAINING_META
from medrobust_lib.training.vlm_train import VLMExample, adapter_train_config


def samples_by_split(suite: Suite) -> dict[str, dict[tuple[str, str], Sample]]:
    """Usable samples of every configured modality, by split (train, val, test), keyed by
    (dataset, sample id)."""
    from medrobust_lib.tracks.datasets import load_clean_samples

    out: dict[str, dict[tuple[str, str], Sample]] = {"train": {}, "val": {}, "test": {}}
    for modality in suite.modalities:
        for split in out:
            for items in load_clean_samples(suite, modality, split=split).values():
                out[split].update({(s.dataset, s.sample_id): s for s in items})
    return out


def box_text(box: np.ndarray, hw: tuple[int, ...], step: float = 0.01, scale: str = "0-1") -> str:
    """A pixel box (1, 4) XYXY as a taught answer ``[x0, y0, x1, y1]``: the fractions of width and
    height rounded to the nearest multiple of ``step`` (0.01: 101 values per coordinate; 0.05: 21),
    written with 2 decimals (``scale`` ``0-1``) or as integers in thousandths (``0-1000``). A side
    that rounding would collapse keeps one ``step`` of extent."""
    x0, y0, x1, y1 = box[0]
    h, w = hw[0], hw[1]
    q = [min(1.0, max(0.0, round(v / step) * step)) for v in (x0 / w, y0 / h, x1 / w, y1 / h)]
    for lo, hi in ((0, 2), (1, 3)):
        if q[hi] <= q[lo]:
            q[hi] = min(1.0, q[lo] + step)
            q[lo] = q[hi] - step
    if scale == "0-1000":
        return "[" + ", ".join(str(round(v * 1000)) for v in q) + "]"
    if scale != "0-1":
        raise ValueError(f"box answers are taught in 0-1 or 0-1000, not {scale!r}")
    return "[" + ", ".join(f"{v:.2f}" for v in q) + "]"


FLIPS = ("h", "v", "hv")
"""Grounding augmentations: horizontal, vertical and both flips (image and box move together)."""


def flipped(image: np.ndarray, box: np.ndarray, flip: str) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W[, C]) flipped (``h``: left-right, ``v``: up-down, ``hv``: both) and the pixel
    box (1, 4) XYXY (end exclusive) moved with it."""
    h, w = image.shape[0], image.shape[1]
    x0, y0, x1, y1 = (float(v) for v in box[0])
    out = image
    if "h" in flip:
        out, x0, x1 = out[:, ::-1], w - x1, w - x0
    if "v" in flip:
        out, y0, y1 = out[::-1], h - y1, h - y0
    return np.ascontiguousarray(out), np.array([[x0, y0, x1, y1]], np.float32)


def examples_for(items: list[VLMItem], samples: dict[tuple[str, str], Sample], tasks: tuple[str, ...] | None = None,
                 all_variants: bool = True, box_step: float = 0.01, flips: bool = False,
                 negations: bool = True, box_scale: str = "0-1") -> list[VLMExample]:
    """Supervised examples for the items whose sample is given: MC -> letter, yes/no -> the
    polarity-adjusted answer for every paraphrase (the negated ones only with ``negations``),
    caption -> first reference, grounding -> box (on the ``box_step`` grid; with ``flips`` also on
    the three flipped images, see :data:`FLIPS`), written in ``box_scale`` (:func:`box_text`)."""
    out: list[VLMExample] = []
    for it in items:
        s = samples.get((it.dataset, it.sample_id))
        if s is None or (tasks is not None and it.task not in tasks):
            continue
        key = f"{s.dataset}/{s.sample_id}"
        if it.task == "vqa_mc":
            out.append(VLMExample(key, s.image, prompt_for(it), it.answer, it.task))
        elif it.task == "vqa_yesno":
            variants = it.variants if all_variants else it.variants[:1]
            for k, (_, pol) in enumerate(variants):
                if pol != 1 and not negations:
                    continue
                ans = it.answer if pol == 1 else ("no" if it.answer == "yes" else "yes")
                out.append(VLMExample(key, s.image, prompt_for(it, k), ans, it.task))
        elif it.task == "caption":
            out.append(VLMExample(key, s.image, prompt_for(it), it.references[0], it.task))
        elif it.task == "grounding" and it.box is not None:
            orig = s.metadata.get("original_size") if s.metadata else None
            hw = (int(s.image.shape[0]), int(s.image.shape[1]))
            box = box_in_sample(it, hw, tuple(orig) if orig else None)  # type: ignore[arg-type]
            out.append(VLMExample(key, s.image, prompt_for(it), box_text(box, hw, box_step, box_scale), it.task))
            for f in FLIPS if flips else ():
                img, fbox = flipped(s.image, box, f)
                out.append(VLMExample(f"{key}#{f}", img, prompt_for(it), box_text(fbox, hw, box_step, box_scale), it.task))
    return out


def adapter_folder(suite: Suite, model_id: str) -> Path:
    return checkpoint_dir(suite, model_id) / "adapter"


@dataclass
class AdapterSummary:
    folder: str
    adapter_hash: str
    task: str
    initial_val_loss: float
    best_val_loss: float
    steps: int
    seconds: float
    n_trainable: int
    n_total: int
    target_modules: list[str]
    heldout: dict[str, float] = field(default_factory=dict)
    box_scale: str = "0-1"


def finetune_adapter(suite: Suite, model_id: str, log: Callable[[str], None] | None = None) -> AdapterSummary:
    """LoRA fine-tune of the model's base weights on the configured task (default grounding):
    language-model projections only, prompt tokens masked, selection on val; the adapter is saved
    as safetensors under ``var/checkpoints/<id>/adapter`` with :data:`TRAINING_META` (task, box
    scale of the taught boxes: :func:`adapter_box_scale`, splits seen)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from medrobust_lib.tracks.vlm.model import resolve_source
    from medrobust_lib.training.vlm_lora import finetune_lora

    t0 = time.perf_counter()
    m = vlm_model(suite, model_id)
    if not model_entry(m.kind, "vlm").lora_finetunable:
        raise ValueError(f"{model_id}: kind {m.kind!r} cannot be LoRA fine-tuned here (kinds that can: "
                         f"{', '.join(list_models('vlm', lora_finetunable=True))})")
    ft = suite.vlm.finetune
    source = resolve_source(suite, m)
    refuse_remote_code(source)
    model = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    proc = AutoProcessor.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    items = load_items(suite).items
    by_split = samples_by_split(suite)
    ts = suite.vlm.train  # the base's answer format (box grid) and augmentation
    scale = adapter_box_scale(suite, m)
    train = examples_for(items, by_split["train"], (ft.task,), box_step=ts.box_step, flips=ts.grounding_flips,
                         box_scale=scale)
    val = examples_for(items, by_split["val"], (ft.task,), box_step=ts.box_step, box_scale=scale)
    settings = LoraSettings.model_validate(ft.model_dump(include=set(LoraSettings.model_fields)))
    cfg = adapter_train_config(ft, len(train), suite.seed)  # steps, or epochs as the reference counts them
    res = finetune_lora(model, proc, train, val, settings, cfg, adapter_folder(suite, model_id),
                        base_model_hash=folder_hash(source), log=log)
    write_training_meta(Path(res.adapter_dir), m, ft.task, scale, selected_on="val" if val else "last")
    return AdapterSummary(str(res.adapter_dir), res.adapter_hash, ft.task, res.initial_val_loss,
                          res.train.best_val_loss, res.train.steps, time.perf_counter() - t0, res.n_trainable,
                          res.n_total, res.target_modules, box_scale=scale)


def write_training_meta(folder: Path, m: VLMModelConfig, task: str, box_scale: str, *,
                        selected_on: str = "val") -> None:
    """:data:`~medrobust_lib.tracks.vlm.model.TRAINING_META` in the adapter folder: what the adapter
    was taught (task, box scale) and on which splits (``selected_on``: ``val``, or ``last`` when the
    suite's ``splits`` have no validation share and the last weights were kept)."""
    meta = {"model": m.id, "task": task, "box_scale": box_scale, "trained_on": "train", "selected_on": selected_on}
    (folder / TRAINING_META).write_text(json.dumps(meta, indent=2) + "\n")
