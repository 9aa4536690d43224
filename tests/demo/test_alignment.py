"""The alignment stage of the tiny demo VLMs: attribute-naming examples follow the image through
flips, and the mix-in share is what it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import load_suite
from medrobust_lib.demo.alignment import ATTRIBUTE_QUESTIONS, attribute_examples, demo_truth, mixed_in
from medrobust_lib.training.vlm_train import VLMExample
from tests.suite_helpers import write_suite


@pytest.fixture(scope="module")
def ct_and_angio(demo_root: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples

    tmp = tmp_path_factory.mktemp("tax")
    suite = load_suite(write_suite(tmp, demo_root, modalities=["ct", "angiography"]))
    samples = {}
    for m in ("ct", "angiography"):
        build_clean_index(suite, m)
        samples.update({(s.dataset, s.sample_id): s for v in load_clean_samples(suite, m).values() for s in v})
    return samples, demo_truth(suite)


def test_attribute_answers_are_the_truth_and_move_with_flips(ct_and_angio) -> None:  # type: ignore[no-untyped-def]
    samples, truth = ct_and_angio
    ex = attribute_examples(samples, truth)
    by = {(e.image_key, e.question): e for e in ex}
    (key, s), = [(k, v) for k, v in samples.items() if truth[k].modality == "ct"][:1]
    t = truth[key]
    name = f"{s.dataset}/{s.sample_id}"
    side = ATTRIBUTE_QUESTIONS["horizontal"].format(noun="lesion")
    height = ATTRIBUTE_QUESTIONS["vertical"].format(noun="lesion")
    other = {"left": "right", "right": "left", "upper": "lower", "lower": "upper"}
    assert by[(name, side)].answer == t.horizontal and by[(name, height)].answer == t.vertical
    assert by[(name + "#h", side)].answer == other[t.horizontal] and by[(name + "#h", height)].answer == t.vertical
    assert by[(name + "#v", side)].answer == t.horizontal and by[(name + "#v", height)].answer == other[t.vertical]
    assert by[(name + "#hv", side)].answer == other[t.horizontal]
    assert by[(name + "#hv", height)].answer == other[t.vertical]
    for flip in ("", "#h", "#v", "#hv"):
        assert by[(name + flip, ATTRIBUTE_QUESTIONS["modality"])].answer == "ct"
        assert by[(name + flip, ATTRIBUTE_QUESTIONS["size"].format(noun="lesion"))].answer == t.size
    np.testing.assert_array_equal(by[(name + "#h", side)].image, s.image[:, ::-1])
    np.testing.assert_array_equal(by[(name + "#hv", side)].image, s.image[::-1, ::-1])
    # angiography has no brightness question (ambiguous there); CT has all five
    n_ct = sum(1 for k in samples if truth[k].modality == "ct")
    n_angio = len(samples) - n_ct
    assert len(ex) == 4 * (5 * n_ct + 4 * n_angio)
    angio = {f"{v.dataset}/{v.sample_id}" for k, v in samples.items() if truth[k].modality == "angiography"}
    asked = {e.image_key.split("#")[0] for e in ex if "brighter or darker" in e.question}
    assert angio and not angio & asked and len(asked) == n_ct


def test_mixed_in_share() -> None:
    extra = [VLMExample(str(i), np.zeros((2, 2)), "q", "a", "attribute") for i in range(100)]
    picked = mixed_in(extra, 300, 0.25, seed=0)
    assert len(picked) == 100 * 1 and picked == mixed_in(extra, 300, 0.25, seed=0)
    assert len(mixed_in(extra, 90, 0.25, seed=0)) == 30
    assert mixed_in(extra, 90, 0.0, seed=0) == []
