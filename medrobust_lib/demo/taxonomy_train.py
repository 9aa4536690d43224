"""Known-answer models for the taxonomy, trained on the demo yes/no records (train split, selection
on val; the test split is never seen):

- ``image_reliant``: true labels, original questions and positive paraphrases. The wording carries
  no answer cue (each question template is asked for a yes and for a no), so the answer must come
  from the image. Negations are never seen, so the model may be inconsistent on them (Fragile).
  A yes/no answer here is an XOR of the wording and the image (``is this a CT image?``), which a
  tiny model trained from scratch does not find: it sits at chance for thousands of steps. So,
  as LLaVA's feature-alignment stage precedes instruction tuning, it first learns to *name* what
  the yes/no questions ask about (:func:`attribute_examples`: modality, side, height, size,
  brightness as one-word answers, a function of the image alone), then answers yes/no with some
  attribute naming kept in the mix (``train.align_steps``, ``train.align_share``).
- ``shortcut``: labels that the question wording predicts (a seeded hash of the original question
  text decides yes or no; negations invert it), every paraphrase included. The image carries no
  information about these labels, so the model learns to ignore it: consistent, not image-reliant
  (Dangerous), and confident.
- ``consistency_lora``: the image-reliant model plus a LoRA adapter trained on every paraphrase,
  negations included, with true labels: a consistency-oriented fine-tune.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest, DemoSample
from medrobust_lib.demo.records import NO_BRIGHTNESS, target_noun
from medrobust_lib.demo.vlm_train import _samples_by_split, vocabulary_texts
from medrobust_lib.finetune.vlm_train import VLMExample
from medrobust_lib.seeding import rng_for, stable_fraction
from medrobust_lib.tracks.taxonomy.evaluate import config_entry, taxonomy_config, variants_of
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, VLMItem, load_items
from medrobust_lib.tracks.vlm.runner import checkpoint_dir


def shortcut_answer(question: str, seed: int) -> str:
    """The label the wording dictates in shortcut training: a stable hash of the question text."""
    return "yes" if stable_fraction(seed, "shortcut", question) < 0.5 else "no"


def yes_no_examples(items: list[VLMItem], samples: dict[tuple[str, str], Sample], *, negations: bool,
                    shortcut_seed: int | None, min_paraphrases: int) -> list[VLMExample]:
    out: list[VLMExample] = []
    for it in items:
        s = samples.get((it.dataset, it.sample_id))
        if s is None or it.task != "vqa_yesno":
            continue
        answer = it.answer if shortcut_seed is None else shortcut_answer(it.question, shortcut_seed)
        for text, pol in variants_of(it, min_paraphrases, negations=negations):
            ans = answer if pol == 1 else ("no" if answer == "yes" else "yes")
            out.append(VLMExample(f"{s.dataset}/{s.sample_id}", s.image, text + YESNO_SUFFIX, ans, "vqa_yesno"))
    return out


ATTRIBUTE_QUESTIONS: dict[str, str] = {
    "modality": "What kind of image is this?",
    "horizontal": "Is the {noun} in the left or the right half?",
    "vertical": "Is the {noun} in the upper or the lower half?",
    "size": "Is the {noun} large or small?",
    "brightness": "Is the {noun} brighter or darker than its surroundings?",
}
"""Attribute-naming questions and the :class:`DemoSample` field each one asks for; the answer is the
field's value (``ct``, ``left``, ``upper``, ``large``, ``brighter``, ...)."""

_SWAP = {"horizontal": {"left": "right", "right": "left"}, "vertical": {"upper": "lower", "lower": "upper"}}


def _flip(image: np.ndarray, flip: str) -> np.ndarray:
    out = image[:, ::-1] if "h" in flip else image
    out = out[::-1] if "v" in flip else out
    return np.ascontiguousarray(out)


def attribute_examples(samples: dict[tuple[str, str], Sample], truth: dict[tuple[str, str], DemoSample],
                       flips: tuple[str, ...] = ("", "h", "v", "hv")) -> list[VLMExample]:
    """Attribute-naming examples (:data:`ATTRIBUTE_QUESTIONS`) for every sample with ground truth, on
    the image and each of its ``flips`` (``h``: left-right, ``v``: up-down; the side and height
    answers move with the flip). No brightness question where it is ambiguous (angiography)."""
    out: list[VLMExample] = []
    for key, s in samples.items():
        t = truth.get(key)
        if t is None:
            continue
        for flip in flips:
            img = _flip(s.image, flip)
            name = f"{s.dataset}/{s.sample_id}" + (f"#{flip}" if flip else "")
            for attr, template in ATTRIBUTE_QUESTIONS.items():
                if attr == "brightness" and t.modality in NO_BRIGHTNESS:
                    continue
                value = str(getattr(t, attr))
                if (attr == "horizontal" and "h" in flip) or (attr == "vertical" and "v" in flip):
                    value = _SWAP[attr][value]
                out.append(VLMExample(name, img, template.format(noun=target_noun(t)), value, "attribute"))
    return out


def demo_truth(suite: Suite) -> dict[tuple[str, str], DemoSample]:
    """The demo manifest's ground truth per (dataset, sample id)."""
    return {(t.dataset, t.sample_id): t for t in DemoManifest.load(Path(suite.demo.root)).samples()}


def mixed_in(extra: list[VLMExample], n_main: int, share: float, seed: int) -> list[VLMExample]:
    """A seeded subset of ``extra`` sized so it makes up ``share`` of ``n_main + subset``."""
    if share <= 0 or not extra:
        return []
    n = min(len(extra), round(n_main * share / (1 - share)))
    pick = rng_for(seed, "taxonomy-train", "align-mix").choice(len(extra), size=n, replace=False)
    return [extra[int(i)] for i in sorted(pick)]


@dataclass
class TaxonomyTrainSummary:
    config: str
    kind: str
    folder: str
    seconds: float
    steps: int
    best_val_loss: float
    n_train: int
    extra: dict[str, Any] = field(default_factory=dict)


def train_taxonomy_model(suite: Suite, config_id: str, log: Callable[[str], None] | None = None
                         ) -> TaxonomyTrainSummary:
    """Train the demo model of one taxonomy configuration (see the module docstring)."""
    from medrobust_lib.finetune.vlm_train import VLMTrainConfig, encode_examples, train_vlm

    t0 = time.perf_counter()
    entry = config_entry(suite, config_id)
    if entry.demo_training is None:
        raise ValueError(f"taxonomy config {config_id!r} names a model; it has no demo training")
    tc = taxonomy_config(suite)
    ts = tc.train.model_dump()
    all_items = load_items(suite).items
    items = [it for it in all_items if it.task == "vqa_yesno"]
    by_split = _samples_by_split(suite)
    kind = entry.demo_training
    shortcut = suite.seed if kind == "shortcut" else None
    negations = kind != "image_reliant"
    train = yes_no_examples(items, by_split["train"], negations=negations, shortcut_seed=shortcut,
                            min_paraphrases=tc.min_paraphrases)
    val = yes_no_examples(items, by_split["val"], negations=negations, shortcut_seed=shortcut,
                          min_paraphrases=tc.min_paraphrases)
    cfg = VLMTrainConfig(max_steps=int(ts["max_steps"]), batch_size=int(ts["batch_size"]), lr=float(ts["lr"]),
                         eval_every=int(ts["eval_every"]), patience=int(ts["patience"]),
                         time_budget_s=ts["time_budget_s"], seed=suite.seed,
                         select_on="first_token_accuracy")
    if kind == "consistency_lora":
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from medrobust_lib.finetune.vlm_lora import LoraSettings, finetune_lora
        from medrobust_lib.tracks.vlm.runner import _folder_hash

        assert entry.base is not None
        source = checkpoint_dir(suite, entry.base)
        model = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True)
        proc = AutoProcessor.from_pretrained(source, local_files_only=True)
        lcfg = VLMTrainConfig(max_steps=int(ts["lora_steps"]), batch_size=int(ts["batch_size"]),
                              lr=float(ts["lora_lr"]), eval_every=50, patience=4,
                              time_budget_s=ts["time_budget_s"], seed=suite.seed,
                              select_on="first_token_accuracy")
        res = finetune_lora(model, proc, train, val, LoraSettings(), lcfg, checkpoint_dir(suite, config_id) / "adapter",
                            base_model_hash=_folder_hash(str(source)), log=log)
        return TaxonomyTrainSummary(config_id, kind, str(res.adapter_dir), time.perf_counter() - t0, res.train.steps,
                                    res.train.best_val_loss, len(train), {"n_trainable": res.n_trainable,
                                                                          "adapter_hash": res.adapter_hash})
    import torch

    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny

    align_tr: list[VLMExample] = []
    align: dict[str, Any] = {}
    if kind == "image_reliant" and int(ts["align_steps"]) > 0:
        truth = demo_truth(suite)
        align_tr = attribute_examples(by_split["train"], truth)
        align_va = attribute_examples(by_split["val"], truth, flips=("",))
    tok = build_tokenizer(vocabulary_texts(all_items) + [f"{e.question} {e.answer}" for e in train + val + align_tr])
    model, proc = build_tiny_llava(tok, image_size=int(ts["image_size"]), patch_size=int(ts["patch_size"]),
                                   text_hidden=int(ts["hidden"]), vision_hidden=int(ts["hidden"]),
                                   layers=int(ts["layers"]), seed=suite.seed)
    with torch.random.fork_rng(devices=[]):
        if align_tr:
            acfg = VLMTrainConfig(max_steps=int(ts["align_steps"]), batch_size=cfg.batch_size, lr=cfg.lr,
                                  eval_every=cfg.eval_every, patience=int(ts["align_steps"]), seed=suite.seed,
                                  select_on="first_token_accuracy")
            ra = train_vlm(model, proc, encode_examples(proc, align_tr), encode_examples(proc, align_va), acfg,
                           log=log)
            align = {"steps": ra.steps, "best_step": ra.best_step, "n_train": len(align_tr),
                     "val_accuracy": max((h.get("val_first_token_acc", 0.0) for h in ra.history), default=None)}
        mix = mixed_in(align_tr, len(train), float(ts["align_share"]), suite.seed)
        r = train_vlm(model, proc, encode_examples(proc, train + mix), encode_examples(proc, val), cfg, log=log)
    folder = save_tiny(model, proc, checkpoint_dir(suite, config_id))
    meta = {"config": config_id, "kind": kind, "steps": r.steps, "best_step": r.best_step,
            "best_val_loss": r.best_val_loss, "n_train": len(train), "n_mixed_in": len(mix), "n_val": len(val),
            "alignment": align, "history": r.history}
    (folder / "training.json").write_text(json.dumps(meta, indent=2, default=str))
    return TaxonomyTrainSummary(config_id, kind, str(folder), time.perf_counter() - t0, r.steps, r.best_val_loss,
                                len(train), {"best_step": r.best_step})
