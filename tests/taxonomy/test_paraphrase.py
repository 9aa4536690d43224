"""Template paraphrases, the equivalence filter and model-written paraphrases (fake API)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from medrobust_lib.taxonomy.paraphrase import (
    API_PARAPHRASE_PROMPT,
    api_paraphrases,
    check_equivalence,
    content_overlap,
    negation_count,
    parse_candidates,
    template_paraphrases,
)

Q = "Is there a fracture of the left femur?"


# ---- templates -------------------------------------------------------------------------------
def test_templates_give_at_least_five_variants_with_a_negation() -> None:
    out = template_paraphrases(Q)
    assert len(out) >= 5
    assert all(p in (1, -1) for _, p in out)
    assert any(p == -1 for _, p in out)
    assert any(p == 1 for _, p in out)
    assert all(text.endswith("?") for text, _ in out)
    assert Q not in [text for text, _ in out]
    assert len({text for text, _ in out}) == len(out)


def test_templates_are_deterministic_and_lowercase_the_first_letter() -> None:
    assert template_paraphrases(Q) == template_paraphrases(Q)
    texts = [t for t, _ in template_paraphrases(Q)]
    assert "Based on the image, is there a fracture of the left femur?" in texts
    assert 'Is the answer to the question "Is there a fracture of the left femur?" no?' in texts
    # Acronyms keep their case.
    assert "Based on the image, CT shows a bleed?" in [t for t, _ in template_paraphrases("CT shows a bleed?")]


def test_negation_templates_carry_negative_polarity() -> None:
    for text, pol in template_paraphrases(Q):
        assert (pol == -1) == ('" no?' in text or "answer no" in text)


@pytest.mark.parametrize("bad", ["Is there a fracture", "", "   ", "Fracture."])
def test_templates_need_a_question_mark(bad: str) -> None:
    with pytest.raises(ValueError):
        template_paraphrases(bad)


# ---- equivalence filter ----------------------------------------------------------------------
def test_equivalence_accepts_a_close_rewrite() -> None:
    res = check_equivalence(Q, "Does the left femur show a fracture?")
    assert res.accepted and res.reason == "ok"
    assert res.overlap == pytest.approx(1.0)  # {fracture, left, femur} on both sides


@pytest.mark.parametrize(("candidate", "polarity", "reason"), [
    ("Does the left femur show a fracture", 1, "not_question"),
    ("is there a  fracture of the LEFT femur?", 1, "identical"),
    ("Fracture?", 1, "length"),
    ("Is there a fracture of the left femur or of the right tibia or of the pelvis or of the lumbar spine "
     "or of the skull or of the ribs?", 1, "length"),
    ("Is the heart enlarged in this patient?", 1, "low_overlap"),
    ("Is there no fracture of the left femur?", 1, "negation_mismatch"),
    ("Does the left femur show a fracture?", -1, "negation_mismatch"),
])
def test_equivalence_rejects_with_a_reason(candidate: str, polarity: int, reason: str) -> None:
    res = check_equivalence(Q, candidate, polarity)
    assert not res.accepted
    assert res.reason == reason


def test_equivalence_accepts_a_declared_negation() -> None:
    res = check_equivalence(Q, "Is the left femur free of fracture, i.e. is a fracture absent?", -1)
    assert res.accepted, res


def test_negation_cues_and_overlap() -> None:
    assert negation_count("Isn't there no lesion, not absent?") == 4
    assert negation_count("Is there a lesion?") == 0
    assert content_overlap("Is there a lesion?", "Is a lesion present?") == 1.0
    assert content_overlap("a b c?", "d e?") == 0.0
    with pytest.raises(ValueError):
        check_equivalence(Q, Q, polarity=0)


# ---- model-written paraphrases ---------------------------------------------------------------
@dataclass
class FakeResult:
    text: str | None
    outcome: str


class FakeApi:
    def __init__(self, text: str | None, outcome: str = "ok") -> None:
        self.text, self.outcome = text, outcome
        self.calls: list[tuple[list[Any], list[str]]] = []

    def generate(self, images: Sequence[Any], prompts: Sequence[str]) -> list[FakeResult]:
        self.calls.append((list(images), list(prompts)))
        return [FakeResult(self.text, self.outcome) for _ in prompts]


def test_parse_candidates_strips_numbering_bullets_and_quotes() -> None:
    text = '1. First?\n2) Second?\n\n- Third?\n* "Fourth?"\n(5) Fifth?\n  Sixth?  '
    assert parse_candidates(text) == ["First?", "Second?", "Third?", "Fourth?", "Fifth?", "Sixth?"]


def test_api_paraphrases_filters_and_audits_every_candidate() -> None:
    reply = "\n".join([
        "1. Does the left femur show a fracture?",
        "2. Is the left femur fractured? ",
        "3. Is there no fracture of the left femur?",
        "4. Is the heart enlarged?",
        "5. Does the left femur show a fracture?",
    ])
    api = FakeApi(reply)
    accepted, audit = api_paraphrases(api, Q, n=5)
    assert api.calls == [([None], [API_PARAPHRASE_PROMPT.format(n=5, question=Q)])]
    assert accepted == [("Does the left femur show a fracture?", 1), ("Is the left femur fractured?", 1)]
    assert [a["reason"] for a in audit] == ["ok", "ok", "negation_mismatch", "low_overlap", "duplicate"]
    assert [a["accepted"] for a in audit] == [True, True, False, False, False]
    assert audit[1]["overlap"] == pytest.approx(0.5)  # {left, femur} / {left, femur, fracture, fractured}
    assert all(set(a) == {"candidate", "accepted", "reason", "overlap"} for a in audit)
    assert audit[1]["candidate"] == "Is the left femur fractured?"


def test_api_paraphrases_caps_at_n() -> None:
    reply = "Does the left femur show a fracture?\nIn the left femur, is a fracture seen?"
    accepted, audit = api_paraphrases(FakeApi(reply), Q, n=1)
    assert len(accepted) == 1
    assert [a["reason"] for a in audit] == ["ok", "surplus"]


@pytest.mark.parametrize(("text", "outcome", "reason"), [
    (None, "http_error", "api_http_error"), ("", "ok", "api_empty"), (None, "ok", "api_empty")])
def test_api_paraphrases_failed_call(text: str | None, outcome: str, reason: str) -> None:
    accepted, audit = api_paraphrases(FakeApi(text, outcome), Q)
    assert accepted == []
    assert audit == [{"candidate": None, "accepted": False, "reason": reason, "overlap": None}]
