"""A synthetic pretraining corpus for the tiny demo LLaVA: more images from the demo's own generators.

Real LLaVA-style models meet a benchmark with a vision tower pretrained on far more images than the
benchmark's training split. The demo's train split has 139 images, too few for a tower trained from
scratch to find a lesion. The corpus is a second build of the embedded demo (same generators, same
released layouts, same record files) with seed ``demo seed + 1`` and ``n`` images per modality,
written beside the demo (``<demo root>/../demo-corpus``). All of it is training data. The demo's
validation split still selects and its test split is never seen. Its dataset names carry
:data:`CORPUS_PREFIX`, so its samples, image keys and items never collide with the demo's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from medrobust_lib.config import Suite
from medrobust_lib.data.dataset import index_dataset, load_sample
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.build import build_demo
from medrobust_lib.demo.manifest import DemoManifest, DemoSample
from medrobust_lib.tracks.datasets import datasets_for
from medrobust_lib.tracks.vlm.items import VLMItem, load_items

CORPUS_PREFIX = "corpus/"
"""Prefix of every corpus dataset name (``corpus/ct_demo``)."""

CORPUS_FOLDER = "demo-corpus"
"""The corpus folder, a sibling of the demo root."""

TOWER_CORPUS_FOLDER = "demo-corpus-tower"
"""The folder of the tower pretraining's own corpus when its size differs (``tower_corpus_per_modality``)."""


@dataclass(frozen=True)
class Corpus:
    """The corpus as training data: samples and ground truth keyed by (prefixed dataset, sample id),
    and its VLM items (yes/no, multiple choice, captions, grounding) with prefixed dataset names."""

    samples: dict[tuple[str, str], Sample]
    truth: dict[tuple[str, str], DemoSample]
    items: list[VLMItem]


def corpus_suite(suite: Suite, n_per_modality: int, folder: str = CORPUS_FOLDER) -> Suite:
    """``suite`` with its demo section pointed at the corpus (root ``<demo root>/../<folder>``,
    seed + 1, ``n_per_modality``)."""
    root = Path(suite.demo.root).parent / folder
    return suite.model_copy(update={"demo": suite.demo.model_copy(update={
        "root": str(root), "seed": suite.demo.seed + 1, "n_per_modality": n_per_modality})})


def load_corpus(suite: Suite, n_per_modality: int, folder: str = CORPUS_FOLDER) -> Corpus:
    """Build (or reuse, see :func:`~medrobust_lib.demo.build.build_demo`) and load the corpus of
    ``n_per_modality`` images per modality under ``folder`` (a sibling of the demo root; one folder
    per corpus size in use, or each load rebuilds it). Every sample is loaded through the dataset
    readers, as the demo's own are."""
    other = corpus_suite(suite, n_per_modality, folder)
    root = Path(other.demo.root)
    build_demo(root, seed=other.demo.seed, n_per_modality=n_per_modality)
    samples: dict[tuple[str, str], Sample] = {}
    for modality in other.modalities:
        for cfg in datasets_for(other, modality):
            for ref in index_dataset(cfg)[0]:
                s = load_sample(cfg, ref)
                samples[(CORPUS_PREFIX + s.dataset, s.sample_id)] = dataclasses.replace(
                    s, dataset=CORPUS_PREFIX + s.dataset)
    truth = {(CORPUS_PREFIX + t.dataset, t.sample_id): t for t in DemoManifest.load(root).samples()}
    items = [dataclasses.replace(it, dataset=CORPUS_PREFIX + it.dataset) for it in load_items(other).items]
    return Corpus(samples, truth, items)
