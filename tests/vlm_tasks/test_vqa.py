"""VQA prompt building and answer extraction rules."""

from __future__ import annotations

import math

import pytest

from medrobust_lib.vlm_tasks.vqa import (
    MC_INSTRUCTION,
    build_mc_prompt,
    extract_choice,
    extract_yes_no,
    is_refusal,
    yes_no_from_logprobs,
)

OPTIONS = ["Pneumonia", "Pleural effusion", "Pneumothorax", "No finding"]

CHOICE_CASES = [
    # leading letter forms
    ("B", "B", "ok"),
    ("B.", "B", "ok"),
    ("(B)", "B", "ok"),
    ("B)", "B", "ok"),
    ("[C]", "C", "ok"),
    ("  D  ", "D", "ok"),
    ("B. Pleural effusion", "B", "ok"),
    ("C: pneumothorax is visible", "C", "ok"),
    ("A, because of the consolidation", "A", "ok"),
    ("Answer: B", "B", "ok"),
    ("answer: c", "C", "ok"),
    ("The answer is B", "B", "ok"),
    ("The answer is (d).", "D", "ok"),
    ("Looking at the image, the correct option is C.", "C", "ok"),
    ("B. A small effusion is present.", "B", "ok"),
    # option text
    ("Pleural effusion", "B", "ok"),
    ("pleural effusion.", "B", "ok"),
    ("The image shows a pneumothorax on the left.", "C", "ok"),
    ("A large pleural effusion is seen.", "B", "ok"),
    ("No finding", "D", "ok"),
    # letters out of range / several letters / ambiguity
    ("E", None, "unparseable"),
    ("A or B", None, "unparseable"),
    ("(A) or (C)", None, "unparseable"),
    ("B) and C)", None, "unparseable"),
    ("Answer: A/B", None, "unparseable"),
    ("Pneumonia or pneumothorax", None, "unparseable"),
    ("A mass in the lung.", None, "unparseable"),
    ("", None, "unparseable"),
    ("The heart is enlarged.", None, "unparseable"),
    # refusals
    ("I cannot determine this from the image.", None, "refused"),
    ("I'm sorry, but I can't help with medical diagnosis.", None, "refused"),
    ("It is not possible to determine the diagnosis.", None, "refused"),
    ("I am unable to interpret medical images.", None, "refused"),
    ("Sorry, I can\u2019t answer that. Please consult a radiologist.", None, "refused"),
]


@pytest.mark.parametrize(("answer", "letter", "outcome"), CHOICE_CASES)
def test_extract_choice_table(answer: str, letter: str | None, outcome: str) -> None:
    r = extract_choice(answer, OPTIONS)
    assert (r.letter, r.outcome) == (letter, outcome)


def test_table_size() -> None:
    assert len(CHOICE_CASES) >= 25


def test_contained_option_prefers_longer() -> None:
    opts = ["mass", "no mass"]
    assert extract_choice("There is no mass.", opts).letter == "B"
    assert extract_choice("A mass is present.", opts).letter == "A"


def test_build_mc_prompt_shows_options() -> None:
    p = build_mc_prompt("What is the finding?", OPTIONS)
    assert p.splitlines() == [
        "What is the finding?",
        "A. Pneumonia",
        "B. Pleural effusion",
        "C. Pneumothorax",
        "D. No finding",
        MC_INSTRUCTION,
    ]


@pytest.mark.parametrize("opts", [["only"], ["a", "A."], ["x", ""], "AB"])
def test_bad_options_raise(opts: list[str] | str) -> None:
    with pytest.raises(ValueError, match="options"):
        build_mc_prompt("q", opts)
    with pytest.raises(ValueError, match="options"):
        extract_choice("A", opts)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Yes", "yes"),
        ("yes, there is a fracture.", "yes"),
        ("No.", "no"),
        ("NO", "no"),
        ("There is no pneumothorax.", "no"),
        ("No evidence of fracture", "no"),
        ("The lungs are clear without effusion", "no"),
        ("The heart isn't enlarged.", "no"),
        ("There is a small effusion.", "yes"),
        ("A fracture is visible in the radius.", "yes"),
        ("True", "yes"),
        ("I cannot tell from this image.", None),
        ("Maybe.", None),
        ("", None),
    ],
)
def test_extract_yes_no(answer: str, expected: str | None) -> None:
    assert extract_yes_no(answer) == expected


def test_is_refusal() -> None:
    assert is_refusal("Unable to assess.")
    assert not is_refusal("B. Pleural effusion")


def test_yes_no_from_logprobs() -> None:
    label, margin, p_yes, h = yes_no_from_logprobs(math.log(0.75), math.log(0.25))
    assert label == "yes"
    assert margin == pytest.approx(math.log(3))
    assert p_yes == pytest.approx(0.75)
    assert h == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    # Unnormalised over the two options: only the difference matters.
    label, margin, p_yes, h = yes_no_from_logprobs(-5.0, -3.0)
    assert label == "no" and margin == pytest.approx(-2.0)
    assert p_yes == pytest.approx(1 / (1 + math.e**2))
    assert yes_no_from_logprobs(-1.0, -1.0)[2:] == (0.5, 1.0)
    label, _, p_yes, h = yes_no_from_logprobs(0.0, -1000.0)
    assert label == "yes" and p_yes == 1.0 and h == 0.0
    with pytest.raises(ValueError, match="finite"):
        yes_no_from_logprobs(float("nan"), 0.0)
