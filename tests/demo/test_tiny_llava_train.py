"""The tiny LLaVA's training data: the vision tower may pretrain on a corpus of its own size while
the text stages keep theirs."""

from __future__ import annotations

from pathlib import Path

from medrobust_lib.config import load_suite
from medrobust_lib.config.vlm import VLMTrainSettings
from medrobust_lib.demo.alignment import demo_truth
from medrobust_lib.demo.corpus import CORPUS_FOLDER, CORPUS_PREFIX, TOWER_CORPUS_FOLDER, load_corpus
from medrobust_lib.demo.tiny_llava_train import tower_data
from medrobust_lib.tracks.finetune.vlm_adapter import samples_by_split as _samples_by_split
from tests.suite_helpers import write_suite


def test_tower_corpus_of_its_own_size_replaces_the_text_corpus(demo_root: Path, tmp_path: Path) -> None:
    from medrobust_lib.tracks.datasets import build_clean_index

    suite = load_suite(write_suite(tmp_path / "s", demo_root, modalities=["ct"]))
    build_clean_index(suite, "ct")
    by_split = _samples_by_split(suite)
    demo_train = dict(by_split["train"])
    text = load_corpus(suite, 2)
    by_split["train"] = demo_train | text.samples
    truth = demo_truth(suite) | text.truth

    same = VLMTrainSettings(corpus_per_modality=2)
    assert tower_data(suite, same, by_split, truth, text) == (by_split["train"], truth)
    unset = VLMTrainSettings(corpus_per_modality=2, tower_corpus_per_modality=None)
    assert tower_data(suite, unset, by_split, truth, text)[0] is by_split["train"]

    none = VLMTrainSettings(corpus_per_modality=2, tower_corpus_per_modality=0)
    assert tower_data(suite, none, by_split, truth, text)[0] == demo_train

    manifest = demo_root.parent / CORPUS_FOLDER / "demo_manifest.json"
    written = manifest.stat().st_mtime_ns
    larger = VLMTrainSettings(corpus_per_modality=2, tower_corpus_per_modality=3)
    train, tower_truth = tower_data(suite, larger, by_split, truth, text)
    corpus_keys = {k for k in train if k[0].startswith(CORPUS_PREFIX)}
    assert set(train) - corpus_keys == set(demo_train)
    assert len(corpus_keys) > len(text.samples)  # 3 images per modality instead of 2
    assert set(train) <= set(tower_truth)
    assert (demo_root.parent / TOWER_CORPUS_FOLDER / "demo_manifest.json").is_file()
    assert manifest.stat().st_mtime_ns == written  # the text stages' corpus is not rebuilt at another size
