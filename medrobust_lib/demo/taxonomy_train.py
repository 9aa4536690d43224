"""Known-answer models for the taxonomy, trained on the demo yes/no records (train split, selection
on val; the test split is never seen):

- ``image_reliant``: true labels, original questions and positive paraphrases. The wording carries
  no answer cue (each question template is asked for a yes and for a no), so the answer must come
  from the image. Negations are never seen, so the model may be inconsistent on them (Fragile).
  A yes/no answer here is an XOR of the wording and the image (``is this a CT image?``), which a
  tiny model trained from scratch does not find: it sits at chance for thousands of steps. So,
  as LLaVA's feature-alignment stage precedes instruction tuning, it first learns to *name* what
  the yes/no questions ask about (:mod:`medrobust_lib.demo.alignment`: modality, side, height, size,
  brightness as one-word answers, a function of the image alone), then answers yes/no with some
  attribute naming kept in the mix (``train.align_steps``, ``train.align_share``).
- ``shortcut``: labels that the question wording predicts (a seeded hash of the original question
  text decides yes or no; negations invert it), every paraphrase included. The image carries no
  information about these labels, so the model learns to ignore it: consistent, not image-reliant
  (Dangerous), and confident.
- ``consistency_lora``: the image-reliant model plus a LoRA adapter trained on every paraphrase,
  negations included, with true labels: a consistency-oriented fine-tune. (A real model gets the
  same fine-tune from a suite-level recipe: ``taxonomy.configs[].lora_of``,
  :mod:`medrobust_lib.tracks.taxonomy.lora`.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from medrobust_lib.config import Suite
from medrobust_lib.config.common import LoraSettings
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.alignment import alignment_sets, mixed_in, run_alignment
from medrobust_lib.demo.tiny_llava_train import vocabulary_texts
from medrobust_lib.hashing import folder_hash
from medrobust_lib.models.remote_code import refuse_remote_code
from medrobust_lib.paths import checkpoint_dir
from medrobust_lib.seeding import stable_fraction
from medrobust_lib.tracks.finetune.vlm_adapter import samples_by_split
from medrobust_lib.tracks.taxonomy.evaluate import config_entry, variants_of
from medrobust_lib.tracks.taxonomy.lora import consistency_examples
from medrobust_lib.tracks.vlm.items import VLMItem, load_items
from medrobust_lib.training.vlm_train import VLMExample


def shortcut_answer(question: str, seed: int) -> str:
    """The label the wording dictates in shortcut training: a stable hash of the question text."""
    return "yes" if stable_fraction(seed, "shortcut", question) < 0.5 else "no"


def yes_no_examples(items: list[VLMItem], samples: dict[tuple[str, str], Sample], *, negations: bool,
                    shortcut_seed: int | None, min_paraphrases: int) -> list[VLMExample]:
    """Every variant of the yes/no records whose image is in ``samples`` (the examples builder of
    the suite-level consistency LoRA recipes, :func:`consistency_examples`), labelled with the
    true answers or, with ``shortcut_seed``, the answers the wording dictates."""
    pairs = [(it, variants_of(it, min_paraphrases, negations=negations)) for it in items if it.task == "vqa_yesno"]
    if shortcut_seed is None:
        return consistency_examples(pairs, samples)
    seed = shortcut_seed
    return consistency_examples(pairs, samples, lambda it: shortcut_answer(it.question, seed))


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
    from medrobust_lib.training.vlm_train import VLMTrainConfig, encode_examples, train_vlm

    t0 = time.perf_counter()
    entry = config_entry(suite, config_id)
    if entry.demo_training is None:
        raise ValueError(f"taxonomy config {config_id!r} names a model; it has no demo training")
    tc = suite.taxonomy
    ts = tc.train.model_dump()
    all_items = load_items(suite).items
    items = [it for it in all_items if it.task == "vqa_yesno"]
    by_split = samples_by_split(suite)
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

        from medrobust_lib.training.vlm_lora import finetune_lora

        assert entry.base is not None
        source = checkpoint_dir(suite, entry.base)
        refuse_remote_code(source)
        model = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        proc = AutoProcessor.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        lcfg = VLMTrainConfig(max_steps=int(ts["lora_steps"]), batch_size=int(ts["batch_size"]),
                              lr=float(ts["lora_lr"]), eval_every=50, patience=4,
                              time_budget_s=ts["time_budget_s"], seed=suite.seed,
                              select_on="first_token_accuracy")
        res = finetune_lora(model, proc, train, val, LoraSettings(), lcfg, checkpoint_dir(suite, config_id) / "adapter",
                            base_model_hash=folder_hash(str(source)), log=log)
        return TaxonomyTrainSummary(config_id, kind, str(res.adapter_dir), time.perf_counter() - t0, res.train.steps,
                                    res.train.best_val_loss, len(train), {"n_trainable": res.n_trainable,
                                                                          "adapter_hash": res.adapter_hash})
    import torch

    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny

    align_tr, align_va = alignment_sets(suite, by_split) if kind == "image_reliant" else ([], [])
    tok = build_tokenizer(vocabulary_texts(all_items) + [f"{e.question} {e.answer}" for e in train + val + align_tr])
    model, proc = build_tiny_llava(tok, image_size=int(ts["image_size"]), patch_size=int(ts["patch_size"]),
                                   text_hidden=int(ts["hidden"]), vision_hidden=int(ts["hidden"]),
                                   layers=int(ts["layers"]), seed=suite.seed)
    with torch.random.fork_rng(devices=[]):
        align = run_alignment(model, proc, align_tr, align_va, tc.train, cfg, log=log)
        mix = mixed_in(align_tr, len(train), tc.train.align_share, suite.seed)
        r = train_vlm(model, proc, encode_examples(proc, train + mix), encode_examples(proc, val), cfg, log=log)
    folder = save_tiny(model, proc, checkpoint_dir(suite, config_id), float16=tc.train.store_float16)
    meta = {"config": config_id, "kind": kind, "steps": r.steps, "best_step": r.best_step,
            "best_val_loss": r.best_val_loss, "n_train": len(train), "n_mixed_in": len(mix), "n_val": len(val),
            "alignment": align, "history": r.history}
    (folder / "training.json").write_text(json.dumps(meta, indent=2, default=str))
    return TaxonomyTrainSummary(config_id, kind, str(folder), time.perf_counter() - t0, r.steps, r.best_val_loss,
                                len(train), {"best_step": r.best_step})
