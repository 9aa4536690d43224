"""The judge's caption score, the reference benchmark's caption-table metric
(``vlm.protocol.caption_judge``).

The reference (``eval_vlm_perturbation.py``, ``DeepSeekEvaluator.evaluate_caption`` / ``_call_api``)
shows the ground-truth caption and the model's caption to a text-only LLM judge, asks for a score
from 0 to 1, and reads the first unsigned number of the stripped reply (the same reading as its VQA
judge: :func:`medrobust_lib.vlm_tasks.judge_open.parse_score`; "8/10" reads 8.0, "-0.3" reads 0.3, no
clamping). A reply without a number has no score; the reference leaves such captions out of its
mean and median, and so does a NULL here. :data:`CAPTION_JUDGE_PROMPT` and the reading equal the
reference's (``tests/reference_protocol/test_caption_judge.py``, fixtures made by running its
functions). A failed judge call is not a score: the caller records it as an infrastructure error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medrobust_lib.vlm_tasks.judge import TextModel
from medrobust_lib.vlm_tasks.judge_open import judge_scores, parse_score

CAPTION_JUDGE_PROMPT = """Evaluate the quality of the following medical image description.

Ground Truth: {ground_truth}
Prediction: {prediction}

Please score from 0 to 1, considering:
1. Whether key medical information is covered
2. Whether the description is accurate
3. Whether there is incorrect information

Please only answer with a number between 0 and 1 (e.g., 0.8):"""
"""The reference's caption rubric (text only; the judge never sees the image)."""


def caption_judge_prompt(prediction: str, ground_truth: str) -> str:
    return CAPTION_JUDGE_PROMPT.format(ground_truth=ground_truth, prediction=prediction)


def read_caption_score(text: str | None) -> float | None:
    """The reference's reading of the caption judge's reply (:func:`parse_score`)."""
    return parse_score(text)


@dataclass(frozen=True)
class CaptionVerdict:
    """``score`` as read (None: no number in the reply, or the call failed) and ``outcome``:
    ``ok``, ``unreadable`` (the reply held no number) or ``api_<outcome>`` (the call failed)."""

    score: float | None
    outcome: str

    @property
    def failed(self) -> bool:
        """The judge was not reached (an infrastructure failure, never a score)."""
        return self.outcome.startswith("api_")


def judge_captions(model: TextModel, predictions: Sequence[str], truths: Sequence[str]) -> list[CaptionVerdict]:
    """One verdict per caption, in order (text only)."""
    if not predictions:
        return []
    prompts = [caption_judge_prompt(p, t) for p, t in zip(predictions, truths, strict=True)]
    return [CaptionVerdict(score, outcome) for score, outcome in judge_scores(model, prompts)]
