"""Training of the demo's tiny LLaVA (``source: trained``) on the train split with selection on
val; test is never seen. LoRA adapters of any VLM (``adapter: finetuned``) are trained by
:mod:`medrobust_lib.tracks.finetune.vlm_adapter`, whose example builders this module shares."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMTrainSettings, vlm_model
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.alignment import alignment_sets, demo_truth, mixed_in, run_alignment, train_stage
from medrobust_lib.demo.corpus import TOWER_CORPUS_FOLDER, Corpus, load_corpus
from medrobust_lib.demo.manifest import DemoSample
from medrobust_lib.demo.vision_pretrain import pretrain_tower
from medrobust_lib.paths import checkpoint_dir
from medrobust_lib.tracks.finetune.vlm_adapter import examples_for, samples_by_split
from medrobust_lib.tracks.vlm.items import VLMItem, load_items, prompt_for
from medrobust_lib.training.vlm_train import VLMExample, VLMTrainConfig
from medrobust_lib.vlm_tasks.scoring import score_mc

SELECTION_TASKS = ("vqa_yesno", "vqa_mc")
"""Model selection uses the validation loss of the closed-answer tasks (captions overfit first)."""


def vocabulary_texts(items: list[VLMItem]) -> list[str]:
    """Every text the tiny tokenizer must know: prompts, paraphrases, answers, references, box numbers."""
    texts = [" ".join(f"{i / 100:.2f}" for i in range(101)), "yes no a b c d [ ] ,"]
    for it in items:
        texts.append(prompt_for(it))
        texts.extend(prompt_for(it, k) for k in range(len(it.variants)))
        texts.extend(it.references)
        texts.extend(it.options)
    return texts


@dataclass
class VLMTrainSummary:
    folder: str
    seconds: float
    steps: int
    best_step: int
    best_val_loss: float
    n_train: int
    n_val: int
    heldout: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)


def heldout_accuracy(model_folder: str, adapter: str | None, items: list[VLMItem],
                     samples: dict[tuple[str, str], Sample]) -> dict[str, float]:
    """Yes/no (option scoring, original question) and MC accuracy on held-out samples."""
    from medrobust_lib.models.hf_vlm import HFVisionLanguageModel

    kw: dict[str, Any] = {"adapter": adapter} if adapter else {}
    vlm = HFVisionLanguageModel(model_folder, **kw)
    yn = [it for it in items if it.task == "vqa_yesno" and (it.dataset, it.sample_id) in samples]
    mc = [it for it in items if it.task == "vqa_mc" and (it.dataset, it.sample_id) in samples]
    out: dict[str, float] = {}
    if yn:
        lps = vlm.score([samples[(i.dataset, i.sample_id)].image for i in yn], [prompt_for(i, 0) for i in yn],
                        ["yes", "no"], batch_size=32)
        out["yesno_accuracy"] = float(np.mean([(lp["yes"] >= lp["no"]) == (i.answer == "yes")
                                               for lp, i in zip(lps, yn, strict=True)]))
        out["n_yesno"] = len(yn)
    if mc:
        texts = vlm.generate([samples[(i.dataset, i.sample_id)].image for i in mc], [prompt_for(i) for i in mc],
                             max_new_tokens=4, batch_size=32)
        out["mc_accuracy"] = float(np.mean([score_mc(t, i.options, i.answer)["correct"]
                                            for t, i in zip(texts, mc, strict=True)]))
        out["n_mc"] = len(mc)
    return out


def train_base_vlm(suite: Suite, model_id: str, log: Callable[[str], None] | None = None) -> VLMTrainSummary:
    """Train a tiny LLaVA from scratch on the train split (plus the synthetic corpus when
    ``corpus_per_modality`` > 0), select on val, save it with ``save_pretrained`` under
    ``var/checkpoints/<id>/`` and report held-out accuracy. Stages: the vision tower's supervised
    pretraining (``tower_steps``), attribute naming (``align_steps``), yes/no alone
    (``yesno_steps``), then every task (``max_steps``)."""
    import torch

    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny
    from medrobust_lib.training.vlm_train import encode_examples, train_vlm

    t0 = time.perf_counter()
    vc = suite.vlm
    vlm_model(suite, model_id)
    ts = vc.train
    items = load_items(suite).items
    by_split = samples_by_split(suite)
    corpus = load_corpus(suite, ts.corpus_per_modality) if ts.corpus_per_modality > 0 else None
    train_items = items + (corpus.items if corpus else [])
    if corpus:  # the corpus is training data: it joins the train split of every stage
        by_split["train"] = by_split["train"] | corpus.samples
    truth = demo_truth(suite) | (corpus.truth if corpus else {})
    align_tr, align_va = alignment_sets(suite, by_split, truth) if ts.align_steps > 0 else ([], [])
    tok = build_tokenizer(vocabulary_texts(train_items) + [f"{e.question} {e.answer}" for e in align_tr])
    model, proc = build_tiny_llava(tok, image_size=ts.image_size, patch_size=ts.patch_size, text_hidden=ts.hidden,
                                   vision_hidden=ts.vision_hidden or ts.hidden, layers=ts.layers, seed=suite.seed,
                                   position_std=ts.position_init_std, vision_layers=ts.vision_layers,
                                   vision_heads=ts.vision_heads)
    tower: dict[str, Any] = {}
    if ts.tower_steps > 0:
        tower_train, tower_truth = tower_data(suite, ts, by_split, truth, corpus)
        tower = pretrain_tower(model, proc, tower_train, by_split["val"], tower_truth, steps=ts.tower_steps,
                               lr=ts.tower_lr, batch_size=ts.batch_size, seed=suite.seed,
                               box_loss=ts.tower_box_loss, transposes=ts.tower_transposes, log=log)
    if ts.tower_text_lr_scale == 0:
        model.model.vision_tower.requires_grad_(False)
    examples = examples_for(train_items, by_split["train"], box_step=ts.box_step, flips=ts.grounding_flips,
                            negations=ts.negations)
    val = encode_examples(proc, examples_for(items, by_split["val"], SELECTION_TASKS, all_variants=False))
    cfg = VLMTrainConfig(max_steps=ts.max_steps, batch_size=ts.batch_size, lr=ts.lr, eval_every=ts.eval_every,
                         patience=ts.patience, time_budget_s=ts.time_budget_s, seed=suite.seed,
                         select_on="first_token_accuracy", lr_scales=(("model.vision_tower.", ts.tower_text_lr_scale),))
    with torch.random.fork_rng(devices=[]):
        align = run_alignment(model, proc, align_tr, align_va, ts, cfg, log=log)
        if ts.yesno_steps > 0:
            align["yesno"] = _yes_no_stage(model, proc, train_items, items, by_split, align_tr, ts, cfg, log)
        mix = mixed_in(align_tr, len(examples), ts.align_share, suite.seed)
        train = encode_examples(proc, examples + mix)
        res = train_vlm(model, proc, train, val, cfg, log=log)
    folder = save_tiny(model, proc, checkpoint_dir(suite, model_id), float16=ts.store_float16)
    held = heldout_accuracy(str(folder), None, items, by_split["test"])
    meta = {"model_id": model_id, "train": cfg.__dict__, "architecture": ts.model_dump(), "steps": res.steps,
            "best_step": res.best_step, "best_val_loss": res.best_val_loss, "heldout": held,
            "n_train": len(train), "n_mixed_in": len(mix), "n_val": len(val), "alignment": align,
            "corpus_samples": len(corpus.samples) if corpus else 0, "tower": tower,
            "trainable_after_tower": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "parameters": sum(p.numel() for p in model.parameters()),
            "history": res.history}
    (folder / "training.json").write_text(json.dumps(meta, indent=2, default=str))
    return VLMTrainSummary(str(folder), time.perf_counter() - t0, res.steps, res.best_step, res.best_val_loss,
                           len(train), len(val), held, res.history)


def tower_data(suite: Suite, ts: VLMTrainSettings, by_split: dict[str, dict[tuple[str, str], Sample]],
               truth: dict[tuple[str, str], DemoSample], corpus: Corpus | None
               ) -> tuple[dict[tuple[str, str], Sample], dict[tuple[str, str], DemoSample]]:
    """(train samples, ground truth) of the tower pretraining: the text stages' train split, unless
    ``tower_corpus_per_modality`` names another corpus size; then the demo's train split joined with
    that corpus (built under :data:`TOWER_CORPUS_FOLDER`, seed + 1 as every corpus); 0: the demo's
    train split alone. The ground truth returned covers every sample returned."""
    n = ts.tower_corpus_per_modality
    if n is None or n == ts.corpus_per_modality:
        return by_split["train"], truth
    demo_train = {k: s for k, s in by_split["train"].items() if not (corpus and k in corpus.samples)}
    if n == 0:
        return demo_train, truth
    other = load_corpus(suite, n, TOWER_CORPUS_FOLDER)
    # both corpora name their samples alike (prefix, dataset, sample id): the tower corpus's truth must win
    return demo_train | other.samples, truth | other.truth


def _yes_no_stage(model: Any, proc: Any, train_items: list[VLMItem], items: list[VLMItem],
                  by_split: dict[str, dict[tuple[str, str], Sample]], align_tr: list[VLMExample],
                  ts: VLMTrainSettings, main: VLMTrainConfig, log: Callable[[str], None] | None) -> dict[str, Any]:
    """``ts.yesno_steps`` of yes/no alone (positive paraphrases of ``train_items``, ``ts.align_share``
    attribute naming mixed in), selected on the original questions of val (``items``; see
    :func:`~medrobust_lib.demo.alignment.train_stage`)."""
    yes_no = examples_for(train_items, by_split["train"], ("vqa_yesno",), negations=False)
    val = examples_for(items, by_split["val"], ("vqa_yesno",), all_variants=False)
    mix = mixed_in(align_tr, len(yes_no), ts.align_share, main.seed)
    return train_stage(model, proc, yes_no + mix, val, ts.yesno_steps, main, log)
