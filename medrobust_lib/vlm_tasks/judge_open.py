"""Judge-scored open VQA, the reference benchmark's protocol (``vlm.protocol.open_vqa_judge``).

The reference (``eval_vlm_perturbation.py``, ``DeepSeekEvaluator.evaluate_vqa`` / ``_call_api``)
asks the VQA question alone, then shows the question, the ground-truth answer and the model's
answer to a text-only LLM judge with a three-level rubric and reads the first number of its reply:
1 correct, 0.5 partially correct, 0 incorrect; an answer counts as correct at a score >= 0.5.
:data:`OPEN_JUDGE_PROMPT` and :func:`parse_score` equal the reference's (checked in
``tests/reference_protocol/test_judge_open.py`` against fixtures made by running its functions).
The judge is any OpenAI-compatible endpoint configured as a ``kind: api`` model (the reference used
``deepseek-chat`` at temperature 0.1, at most 100 tokens).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from medrobust_lib.vlm_tasks.judge import TextModel

OPEN_JUDGE_PROMPT = """Judge whether the following medical VQA prediction answer is correct.

Question: {question}
Ground Truth: {ground_truth}
Prediction: {prediction}

Please only answer with a number:
- 1 means completely correct (semantically consistent)
- 0.5 means partially correct
- 0 means incorrect

Answer:"""
"""The reference's rubric prompt (text only; the judge never sees the image)."""

CORRECT_AT = 0.5
"""A judged answer counts as correct at this score or above."""

_NUMBER = re.compile(r"(\d+\.?\d*)")


def open_judge_prompt(question: str, prediction: str, ground_truth: str) -> str:
    return OPEN_JUDGE_PROMPT.format(question=question, ground_truth=ground_truth, prediction=prediction)


def parse_score(text: str | None) -> float | None:
    """The reference's reading of the judge's reply (stripped): the first unsigned number, as a
    float (a reply "2" reads 2.0, "-1" reads 1.0, as there); None when there is none."""
    if text is None:
        return None
    m = _NUMBER.search(text.strip())
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class OpenVerdict:
    """``score`` (None when the judge failed or gave no number) and ``outcome``: ``ok``,
    ``unreadable`` or ``api_<outcome>``."""

    score: float | None
    outcome: str

    @property
    def correct(self) -> float | None:
        return None if self.score is None else float(self.score >= CORRECT_AT)


def judge_open(model: TextModel, questions: Sequence[str], predictions: Sequence[str],
               truths: Sequence[str]) -> list[OpenVerdict]:
    """One verdict per open answer, in order (text only)."""
    if not questions:
        return []
    prompts = [open_judge_prompt(q, p, t) for q, p, t in zip(questions, predictions, truths, strict=True)]
    return [OpenVerdict(score, outcome) for score, outcome in judge_scores(model, prompts)]


def judge_scores(model: TextModel, prompts: Sequence[str]) -> list[tuple[float | None, str]]:
    """One ``(score, outcome)`` per prompt, in order (text only; the VQA and caption judges share it):
    the reference's number reading (:func:`parse_score`); ``outcome`` is ``ok``, ``unreadable`` (the
    reply held no number; score None) or ``api_<outcome>`` (the call failed; score None)."""
    out: list[tuple[float | None, str]] = []
    for r in model.generate([None] * len(prompts), prompts):
        outcome = getattr(r, "outcome", "ok")
        if outcome != "ok":
            out.append((None, f"api_{outcome}"))
            continue
        score = parse_score(getattr(r, "text", None))
        out.append((score, "ok" if score is not None else "unreadable"))
    return out
