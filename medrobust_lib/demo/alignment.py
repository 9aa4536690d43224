"""The alignment stage of the tiny demo VLMs: naming what the questions ask about before answering
them.

A demo yes/no answer is an XOR of the wording and the image (``is this a CT image?``, ``is the
lesion in the left half?``, each wording asked for a yes and for a no), which a tiny LLaVA trained
from scratch does not find: it sits at chance for thousands of steps. As LLaVA's feature-alignment
stage precedes its instruction tuning, the demo models first learn to *name* the attributes the
questions ask about, a function of the image alone (:data:`ATTRIBUTE_QUESTIONS`, one-word answers,
on the train images and their flips), then train on their tasks with some attribute naming kept
in the mix (:class:`~medrobust_lib.config.common.AlignmentStage`). Ground truth comes from the demo
manifest; the validation split selects, the test split is never seen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.common import AlignmentStage
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest, DemoSample
from medrobust_lib.demo.records import NO_BRIGHTNESS, target_noun
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.vlm_train import VLMExample, VLMTrainConfig

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


def flip_array(image: np.ndarray, flip: str) -> np.ndarray:
    """``image`` (H, W[, C]) flipped: ``h`` left-right, ``v`` up-down, ``hv`` both, ``""`` as is (a
    contiguous copy)."""
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
            img = flip_array(s.image, flip)
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
    """A seeded subset of ``extra`` sized so it makes up ``share`` of ``n_main + subset`` (the same
    subset for the same sizes; the generator's key predates its use by the VLM and is kept so the
    committed weights stay reproducible)."""
    if share <= 0 or not extra:
        return []
    n = min(len(extra), round(n_main * share / (1 - share)))
    pick = rng_for(seed, "taxonomy-train", "align-mix").choice(len(extra), size=n, replace=False)
    return [extra[int(i)] for i in sorted(pick)]


def alignment_sets(suite: Suite, by_split: dict[str, dict[tuple[str, str], Sample]],
                   truth: dict[tuple[str, str], DemoSample] | None = None
                   ) -> tuple[list[VLMExample], list[VLMExample]]:
    """(train, val) attribute-naming examples: train with the three flips, val unflipped.
    ``truth``: ground truth of every sample (None: the demo's, :func:`demo_truth`; pass the demo's
    joined with the corpus's when the train split holds corpus samples)."""
    truth = demo_truth(suite) if truth is None else truth
    return attribute_examples(by_split["train"], truth), attribute_examples(by_split["val"], truth, flips=("",))


def train_stage(model: Any, processor: Any, train: list[VLMExample], val: list[VLMExample], steps: int,
                main: VLMTrainConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train a fixed stage of ``steps`` (no early stop; the best validation first-token accuracy is
    kept) with the main loop's batch, learning rate (and its per-parameter factors), cadence and
    seed. Returns a summary for ``training.json``."""
    from medrobust_lib.training.vlm_train import encode_examples, train_vlm

    cfg = VLMTrainConfig(max_steps=steps, batch_size=main.batch_size, lr=main.lr, eval_every=main.eval_every,
                         patience=steps, seed=main.seed, select_on="first_token_accuracy", lr_scales=main.lr_scales)
    r = train_vlm(model, processor, encode_examples(processor, train), encode_examples(processor, val), cfg, log=log)
    return {"steps": r.steps, "best_step": r.best_step, "n_train": len(train), "n_val": len(val),
            "val_accuracy": max((h.get("val_first_token_acc", 0.0) for h in r.history), default=None)}


def run_alignment(model: Any, processor: Any, train: list[VLMExample], val: list[VLMExample], stage: AlignmentStage,
                  main: VLMTrainConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The alignment stage: ``stage.align_steps`` of attribute naming (:func:`train_stage`); {} when
    the stage is off or there is no example."""
    if stage.align_steps <= 0 or not train:
        return {}
    return train_stage(model, processor, train, val, stage.align_steps, main, log)
