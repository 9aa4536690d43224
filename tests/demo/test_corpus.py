"""The tiny LLaVA's synthetic pretraining corpus: a second demo build (seed + 1) whose names never
collide with the demo's own, with ground truth and VLM items for every sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from medrobust_lib.config import load_suite
from medrobust_lib.demo.corpus import CORPUS_FOLDER, CORPUS_PREFIX, corpus_suite, load_corpus
from tests.suite_helpers import write_suite


def test_corpus_is_a_second_build_with_its_own_names(demo_root: Path, tmp_path: Path) -> None:
    from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples

    suite = load_suite(write_suite(tmp_path / "s", demo_root, modalities=["ct", "dermoscopy"]))
    other = corpus_suite(suite, 2)
    assert Path(other.demo.root) == demo_root.parent / CORPUS_FOLDER
    assert other.demo.seed == suite.demo.seed + 1 and other.demo.n_per_modality == 2

    corpus = load_corpus(suite, 2)
    assert corpus.samples and set(corpus.samples) <= set(corpus.truth)
    assert {s.modality for s in corpus.samples.values()} == {"ct", "dermoscopy"}
    for (dataset, sample_id), s in corpus.samples.items():
        assert dataset.startswith(CORPUS_PREFIX) and s.dataset == dataset and s.sample_id == sample_id
        assert s.mask is not None and s.mask.any()
    wanted = [it for it in corpus.items if it.dataset.split("/", 1)[1].split("_")[0] in ("ct", "dermoscopy")]
    assert wanted and all(it.dataset.startswith(CORPUS_PREFIX) for it in corpus.items)
    assert all((it.dataset, it.sample_id) in corpus.samples for it in wanted)
    assert {it.task for it in wanted} >= {"vqa_yesno", "vqa_mc", "grounding"}

    # the demo's own samples: other keys, and other pixels under the same sample id (another seed)
    for m in suite.modalities:
        build_clean_index(suite, m)
    demo = {(s.dataset, s.sample_id): s for m in suite.modalities
            for v in load_clean_samples(suite, m).values() for s in v}
    assert not set(demo) & set(corpus.samples)
    same_id = [(k, (CORPUS_PREFIX + k[0], k[1])) for k in demo if (CORPUS_PREFIX + k[0], k[1]) in corpus.samples]
    assert same_id
    for a, b in same_id:
        assert not np.array_equal(demo[a].image, corpus.samples[b].image)

    again = load_corpus(suite, 2)  # the build is reused: same samples, same bytes
    assert {k: s.content_hash() for k, s in again.samples.items()} == \
        {k: s.content_hash() for k, s in corpus.samples.items()}
