"""Consistency LoRA recipes of the taxonomy (``taxonomy.configs[]`` with ``lora_of``): a LoRA
adapter on any local VLM that the shared trainer can fine-tune (``kind: hf``), trained on every
variant of the yes/no records, so that the "Consistent but Dangerous" classification can compare a
base model with its consistency-oriented fine-tune, as the paper's five configurations do.

Suite YAML::

    vlm:
      models:
        - {id: llava-med, source: /models/llava-med-v1.5-mistral-7b-hf, device: cuda}
    taxonomy:
      configs:
        - {id: llava-med, model: llava-med}
        - id: llava-med-consistency
          lora_of: llava-med            # a vlm.models id (kind hf, no adapter of its own)
          recipe: {r: 16, alpha: 32, lr: 2.0e-4, max_steps: 500, negations: true}
      split: test                       # never the recipe's train_split / select_split

The examples: every yes/no record whose image is on the recipe's ``train_split`` (selection on
``select_split``), each variant from the evaluation's own builder
(:func:`medrobust_lib.tracks.taxonomy.evaluate.item_variants`: the record's paraphrases, the
``api_paraphraser``'s accepted ones, template ones, up to ``min_paraphrases``; negated variants
with ``negations``), the target the record's ground truth, flipped for a negated variant
(:func:`medrobust_lib.taxonomy.paraphrase.variant_targets`). The trainer is
:func:`medrobust_lib.training.vlm_lora.finetune_lora` (``adapter: finetuned``'s: language-model
projections only, prompt tokens masked); the adapter is saved as safetensors under
``var/checkpoints/<config id>/adapter`` next to :data:`RECIPE_FILE`, which records the fingerprint
of everything it was trained from (recipe, seed, base weights, examples, image content). A second
call with the same fingerprint reuses the adapter; any change trains it again. Evaluation loads the
base plus the adapter (:func:`medrobust_lib.tracks.taxonomy.evaluate.model_for`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrobust_lib.config import Suite
from medrobust_lib.config.common import LoraSettings
from medrobust_lib.config.taxonomy import ConsistencyLoraRecipe, TaxonomyConfigEntry
from medrobust_lib.config.vlm import vlm_model
from medrobust_lib.data.sample import Sample
from medrobust_lib.hashing import digest, folder_hash
from medrobust_lib.model_table import model_entry
from medrobust_lib.models.remote_code import refuse_remote_code
from medrobust_lib.taxonomy.paraphrase import variant_targets
from medrobust_lib.tracks.taxonomy.evaluate import (
    RECIPE_FILE,
    config_entry,
    item_variants,
    lora_folder,
    recipe_record,
)
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, VLMItem, load_items
from medrobust_lib.training.vlm_train import VLMExample, adapter_train_config

TASK = "vqa_yesno"


def consistency_examples(pairs: Iterable[tuple[VLMItem, Sequence[tuple[str, int]]]],
                         samples: dict[tuple[str, str], Sample],
                         answer_of: Callable[[VLMItem], str] | None = None) -> list[VLMExample]:
    """One example per (yes/no record whose image is in ``samples``, variant): the variant's
    question with the yes/no suffix, its target the record's answer (``answer_of(item)``, default
    its ground truth), flipped for a negated variant. Records whose answer is not yes/no are left
    out."""
    out: list[VLMExample] = []
    for it, variants in pairs:
        s = samples.get((it.dataset, it.sample_id))
        if s is None or it.task != TASK:
            continue
        answer = it.answer if answer_of is None else answer_of(it)
        if answer not in ("yes", "no"):
            continue
        for text, target in variant_targets(variants, answer):
            out.append(VLMExample(f"{s.dataset}/{s.sample_id}", s.image, text + YESNO_SUFFIX, target, TASK))
    return out


def _split_samples(suite: Suite, split: str) -> dict[tuple[str, str], Sample]:
    """The usable samples of ``split`` over the suite's modalities, by (dataset, sample id)."""
    from medrobust_lib.tracks.datasets import load_clean_samples

    out: dict[tuple[str, str], Sample] = {}
    for modality in suite.modalities:
        for items in load_clean_samples(suite, modality, split=split).values():
            out.update({(s.dataset, s.sample_id): s for s in items})
    return out


@dataclass
class RecipeData:
    """The examples of a recipe: ``train`` (``train_split``), ``val`` (``select_split``; empty
    without one) and ``images``: content hash per sample key of every image they show."""

    train: list[VLMExample]
    val: list[VLMExample]
    images: dict[str, str]


def recipe_examples(suite: Suite, entry: TaxonomyConfigEntry) -> RecipeData:
    """The training and selection examples of a ``lora_of`` configuration's recipe."""
    recipe = _recipe(entry)
    items = [it for it in load_items(suite).items if it.task == TASK]
    sets: dict[str, list[VLMExample]] = {}
    images: dict[str, str] = {}
    for split in recipe.seen_splits():
        samples = _split_samples(suite, split)
        mine = [it for it in items if (it.dataset, it.sample_id) in samples]
        pairs, _ = item_variants(suite, mine, negations=recipe.negations, min_paraphrases=recipe.min_paraphrases)
        sets[split] = consistency_examples(pairs, samples)
        images.update({f"{k[0]}/{k[1]}": samples[k].content_hash()
                       for k in {(it.dataset, it.sample_id) for it, _ in pairs}})
    val = sets.get(recipe.select_split, []) if recipe.select_split is not None else []
    return RecipeData(sets[recipe.train_split], val, dict(sorted(images.items())))


def _recipe(entry: TaxonomyConfigEntry) -> ConsistencyLoraRecipe:
    if entry.lora_of is None or entry.recipe is None:
        raise ValueError(f"taxonomy config {entry.id!r} has no consistency LoRA recipe (no 'lora_of')")
    return entry.recipe


def _examples_digest(examples: Sequence[VLMExample]) -> str:
    return digest([[e.image_key, e.question, e.answer, e.task] for e in examples])


def recipe_inputs(suite: Suite, entry: TaxonomyConfigEntry, base_hash: str, data: RecipeData) -> dict[str, Any]:
    """Everything the adapter is trained from: the recipe, its seed, the base weights' hash, the
    examples (keys, questions, targets) and the content of every image they show."""
    recipe = _recipe(entry)
    return {"kind": f"taxonomy:lora:{recipe.kind}", "recipe": recipe.model_dump(), "seed": _seed(suite, recipe),
            "base_model": base_hash, "train": _examples_digest(data.train), "val": _examples_digest(data.val),
            "images": digest(data.images)}


def _seed(suite: Suite, recipe: ConsistencyLoraRecipe) -> int:
    return suite.seed if recipe.seed is None else recipe.seed


@dataclass
class ConsistencyLoraSummary:
    """What :func:`train_consistency_lora` did: ``reused`` the adapter of the same fingerprint, or
    trained it (``steps``, ``seconds`` of this call)."""

    config: str
    lora_of: str
    folder: str
    adapter_hash: str
    fingerprint: str
    reused: bool
    seconds: float
    steps: int
    best_val_loss: float
    initial_val_loss: float
    n_train: int
    n_val: int
    n_trainable: int


def _stored(folder: Path, fingerprint: str) -> dict[str, Any] | None:
    """The recipe record of an adapter folder trained from ``fingerprint`` whose weights are intact."""
    from medrobust_lib.training.vlm_lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_hash

    if not ((folder / ADAPTER_WEIGHTS).is_file() and (folder / ADAPTER_CONFIG).is_file()):
        return None
    rec = recipe_record(folder)
    if rec is None or rec.get("fingerprint") != fingerprint or rec.get("adapter_hash") != adapter_hash(folder):
        return None
    return rec


def train_consistency_lora(suite: Suite, config_id: str, log: Callable[[str], None] | None = None
                           ) -> ConsistencyLoraSummary:
    """Train (or reuse, by fingerprint) the consistency LoRA of taxonomy configuration
    ``config_id`` (a ``lora_of`` entry) and save it under :func:`lora_folder`."""
    t0 = time.perf_counter()
    entry = config_entry(suite, config_id)
    recipe = _recipe(entry)
    m = vlm_model(suite, str(entry.lora_of))
    me = model_entry(m.kind, "vlm")
    if not me.lora_finetunable:  # the suite refuses it already; a hand-built Suite may not
        raise ValueError(f"taxonomy config {config_id!r}: lora_of {m.id!r} (kind {m.kind}) cannot be LoRA fine-tuned "
                         f"here: {me.lora_refusal}")
    from medrobust_lib.tracks.vlm.model import resolve_source

    source = resolve_source(suite, m)
    data = recipe_examples(suite, entry)
    if not data.train:
        raise ValueError(f"taxonomy config {config_id!r}: no yes/no record has its image on the recipe's train_split "
                         f"{recipe.train_split!r}")
    base_hash = folder_hash(source)
    inputs = recipe_inputs(suite, entry, base_hash, data)
    fingerprint = digest(inputs)
    folder = lora_folder(suite, config_id)
    rec = _stored(folder, fingerprint)
    if rec is not None:
        if log:
            log(f"{config_id}: consistency LoRA of the same recipe and data found at {folder}: reused")
        return ConsistencyLoraSummary(config_id, m.id, str(folder), rec["adapter_hash"], fingerprint, True,
                                      time.perf_counter() - t0, int(rec["steps"]), float(rec["best_val_loss"]),
                                      float(rec["initial_val_loss"]), int(rec["n_train"]), int(rec["n_val"]),
                                      int(rec["n_trainable"]))
    (folder / RECIPE_FILE).unlink(missing_ok=True)  # a folder is reusable only once its record is written again

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from medrobust_lib.training.vlm_lora import finetune_lora

    refuse_remote_code(source)
    model: Any = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    proc = AutoProcessor.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    model.to(m.device)  # the configured device (the trainer moves each batch to it)
    settings = LoraSettings.model_validate(recipe.model_dump(include=set(LoraSettings.model_fields)))
    cfg = adapter_train_config(recipe, len(data.train), _seed(suite, recipe)).model_copy(
        update={"select_on": recipe.select_on})
    res = finetune_lora(model, proc, data.train, data.val, settings, cfg, folder, base_model_hash=base_hash, log=log)
    record = {"config": config_id, "lora_of": m.id, "recipe": recipe.kind, "fingerprint": fingerprint,
              "inputs": inputs, "adapter_hash": res.adapter_hash, "trained_on": recipe.train_split,
              "selected_on": recipe.select_split if data.val else "last", "n_train": len(data.train),
              "n_val": len(data.val), "steps": res.train.steps, "best_val_loss": res.train.best_val_loss,
              "initial_val_loss": res.initial_val_loss, "n_trainable": res.n_trainable}
    (folder / RECIPE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ConsistencyLoraSummary(config_id, m.id, str(folder), res.adapter_hash, fingerprint, False,
                                  time.perf_counter() - t0, res.train.steps, res.train.best_val_loss,
                                  res.initial_val_loss, len(data.train), len(data.val), res.n_trainable)
