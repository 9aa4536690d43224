"""Raw caption scoring equals the reference's ``compute_caption_metrics`` (pycocoevalcap on raw
strings, one call per condition), run by ``tools/reference_protocol_fixtures.py`` on the project's
caption test set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medrobust_lib.metrics.caption import bleu
from medrobust_lib.metrics.caption_raw import raw_caption_scores

DATA = json.loads((Path(__file__).parent / "fixtures" / "caption_raw_reference.json").read_text())
BY_ID = {s["id"]: s for s in DATA["samples"]}
NAMES = {"bleu_1": "BLEU-1", "bleu_4": "BLEU-4", "rouge_l": "ROUGE-L", "cider": "CIDEr"}


@pytest.mark.parametrize("group", sorted(DATA["groups"]))
def test_raw_scores_equal_the_reference(group: str) -> None:
    g = DATA["groups"][group]
    samples = [BY_ID[i] for i in g["ids"]]
    got = raw_caption_scores([s["prediction"] for s in samples], [s["references"] for s in samples])
    for ours, theirs in NAMES.items():
        assert got.corpus[ours] == pytest.approx(g["unrounded"][theirs], abs=1e-9)
        assert round(got.corpus[ours], 4) == g["rounded"][theirs]


def test_document_frequencies_come_from_the_scored_references() -> None:
    """The reference's idf table is its call's references: for a fixed sample set it is the same
    for every condition, so only the set (not the predictions) changes CIDEr's idf."""
    samples = DATA["samples"][:40]
    refs = [s["references"] for s in samples]
    a = raw_caption_scores([s["prediction"] for s in samples], refs)
    b = raw_caption_scores([s["prediction"] for s in samples[::-1]][::-1], refs)
    assert a.corpus == b.corpus
    sub = raw_caption_scores([s["prediction"] for s in samples[:10]], refs[:10])
    assert sub.corpus["cider"] != pytest.approx(sum(list(a.per_sample["cider"].values())[:10]) / 10, abs=1e-9)


def test_raw_differs_from_ptb_tokenised() -> None:
    refs = {0: ["A Large Mass, in the LEFT lung."]}
    hyps = {0: "a large mass in the left lung"}
    raw = raw_caption_scores([hyps[0]], [refs[0]]).corpus["bleu_1"]
    assert bleu(refs, hyps)["bleu_1"].corpus == pytest.approx(1.0)
    assert raw < 0.5  # case and punctuation count in raw scoring


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="references"):
        raw_caption_scores(["a"], [])
    with pytest.raises(ValueError, match="at least one"):
        raw_caption_scores([], [])
