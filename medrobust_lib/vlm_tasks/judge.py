"""The optional LLM judge: a separate, recorded scorer for multiple-choice answers, off by default.

The rule-based scorer (:func:`medrobust_lib.vlm_tasks.vqa.extract_choice`) always decides
``correct``. When a judge model is configured, answers the rules could not parse are also shown
to the judge, and its verdict goes to separate columns (``judge_model``, ``judge_letter``,
``judge_correct``), so a table never mixes the two scorers silently. A failed judge call is a
recorded ``judge_outcome`` and leaves the verdict empty; it never changes the rule-based row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from medrobust_lib.vlm_tasks.vqa import LETTERS

JUDGE_PROMPT = (
    "A model answered a multiple-choice question. Decide which option its answer chooses.\n"
    "Question: {question}\n{options}\nModel answer: {answer}\n"
    "Reply with the single option letter, or NONE if the answer chooses no option or several."
)
"""Prompt sent to the judge (text only); ``{options}`` holds one ``X. text`` line per option."""


class TextModel(Protocol):
    def generate(self, images: Sequence[Any], prompts: Sequence[str]) -> list[Any]: ...


@dataclass(frozen=True)
class Verdict:
    """``letter`` A.. or None (NONE, unreadable or failed); ``outcome`` ``ok``, ``none``,
    ``unreadable`` or ``api_<outcome>``."""

    letter: str | None
    outcome: str


def judge_prompt(question: str, options: Sequence[str], answer: str) -> str:
    lines = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    return JUDGE_PROMPT.format(question=question, options=lines, answer=answer)


def parse_verdict(text: str | None, n_options: int) -> Verdict:
    """The judge's reply: a lone valid letter (any case, optional punctuation) or NONE."""
    if text is None:
        return Verdict(None, "unreadable")
    t = text.strip().strip(".()[]*").strip()
    if t.upper() == "NONE":
        return Verdict(None, "none")
    if len(t) == 1 and t.upper() in LETTERS[:n_options]:
        return Verdict(t.upper(), "ok")
    return Verdict(None, "unreadable")


def judge_mc(model: TextModel, questions: Sequence[str], options: Sequence[Sequence[str]],
             answers: Sequence[str]) -> list[Verdict]:
    """One verdict per answer, in order; the judge sees text only (never the image)."""
    if not questions:
        return []
    prompts = [judge_prompt(q, o, a) for q, o, a in zip(questions, options, answers, strict=True)]
    out: list[Verdict] = []
    for r, opts in zip(model.generate([None] * len(prompts), prompts), options, strict=True):
        outcome = getattr(r, "outcome", "ok")
        if outcome != "ok":
            out.append(Verdict(None, f"api_{outcome}"))
        else:
            out.append(parse_verdict(getattr(r, "text", None), len(opts)))
    return out
