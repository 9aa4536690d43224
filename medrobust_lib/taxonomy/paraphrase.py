"""Question variants for the consistency test of the "Consistent but Dangerous" taxonomy.

Two sources of paraphrases for a yes/no question:

* :func:`template_paraphrases`: fixed, deterministic templates (no model, no randomness).
* :func:`api_paraphrases`: rewrites written by a text model (any object with a ``generate(images,
  prompts)`` method, e.g. :class:`medrobust_lib.models.api_vlm.ApiVLM`), kept only when they pass
  the recorded filter :func:`check_equivalence`; every candidate is returned in an audit list.

**Polarity rule.** Each paraphrase carries a polarity: ``+1`` when its correct answer equals the
correct answer of the original question, ``-1`` when it is the inverse (a negation: "Is the
answer ... *no*?"). Predictions on ``-1`` variants are inverted before they are compared with the
original, and only for the separate negation-robustness statistic: a negation is not a
paraphrase, so it never enters the consistency test (see
:mod:`medrobust_lib.taxonomy.quadrants`). The original question itself is never
part of the returned list; callers put it first with polarity ``+1``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

POSITIVE = 1
NEGATED = -1

TEMPLATES: tuple[tuple[str, int], ...] = (
    ("Based on the image, {lower}", POSITIVE),
    ("Looking at this image, {lower}", POSITIVE),
    ("Answer yes or no: {question}", POSITIVE),
    ('Is the answer to the question "{question}" yes?', POSITIVE),
    ("Regarding this image: {question}", POSITIVE),
    ('Is the answer to the question "{question}" no?', NEGATED),
    ('Would a radiologist answer no to the question "{question}"?', NEGATED),
)
"""``(template, polarity)`` pairs. ``{question}`` is the stripped original question,
``{lower}`` the same with its first letter lower-cased (unless the first word is an acronym such
as ``CT`` or ``MRI``). Five keep the answer (+1: semantically equivalent paraphrases, the only
ones a consistency test uses), two invert it (-1: negations, kept only for the separate
negation-robustness statistic)."""

NEGATION_CUES: frozenset[str] = frozenset({"not", "no", "without", "absent", "false", "cannot"})
"""Negation tokens counted by :func:`negation_count`; any token ending in ``n't`` counts too."""

STOPWORDS: frozenset[str] = frozenset({
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did",
    "has", "have", "had", "can", "could", "will", "would", "shall", "should", "may", "might", "must",
    "there", "this", "that", "these", "those", "it", "its", "of", "in", "on", "at", "to", "for",
    "with", "by", "from", "as", "and", "or", "any", "some", "you", "your", "we", "i", "me", "my",
    "image", "picture", "scan", "shown", "show", "shows", "seen", "see", "visible", "present",
    "here", "what", "which", "yes", "please", "answer", "question",
})
"""Small built-in stopword list (function words and image/question boilerplate) removed before
the content-word overlap of :func:`content_overlap`."""

API_PARAPHRASE_PROMPT = (
    "Rewrite the following yes/no question about a medical image in {n} different ways. "
    "Every rewrite must keep the exact meaning and the same correct answer: do not negate it, "
    "do not add or remove findings, and end each rewrite with a question mark. "
    "Write exactly one question per line, with no numbering and no other text.\n"
    "Question: {question}"
)
"""Prompt sent (text only, no image) by :func:`api_paraphrases`; ``{n}`` and ``{question}`` are
filled in. Accepted rewrites get polarity +1."""

MIN_LENGTH_RATIO = 0.5
MAX_LENGTH_RATIO = 2.5
"""A candidate's word count must lie within [0.5, 2.5] x the original's."""

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]+\s*|\(?\d{1,3}\s*[.):\]-]\s*|q\d{1,3}\s*[.):-]\s*)", re.IGNORECASE)
_QUOTES = "\"'\u201c\u201d\u2018\u2019`"


def _validate_question(question: str) -> str:
    q = " ".join(question.split())
    if not q.endswith("?") or len(q) < 2:
        raise ValueError(f"a yes/no question must end with '?', got {question!r}")
    return q


def _lower_first(question: str) -> str:
    """Lower-case the first letter unless the first word is an acronym (all caps, >= 2 letters)."""
    first = question.split(" ", 1)[0]
    letters = [c for c in first if c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return question
    return question[:1].lower() + question[1:]


def template_paraphrases(question: str) -> list[tuple[str, int]]:
    """Deterministic paraphrases of a yes/no question, the original excluded.

    ``question``: any text ending in ``'?'`` (whitespace is collapsed); raises ValueError
    otherwise. Returns ``len(TEMPLATES)`` (7) ``(text, polarity)`` pairs, polarity in {+1, -1}
    (see the module's polarity rule); at least one has polarity -1. Same input, same output.
    """
    q = _validate_question(question)
    lower = _lower_first(q)
    return [(template.format(question=q, lower=lower), polarity) for template, polarity in TEMPLATES]


def variant_targets(variants: Sequence[tuple[str, int]], answer: str) -> list[tuple[str, str]]:
    """(question text, target answer) per yes/no variant: ``answer`` (``yes`` / ``no``) for a
    polarity +1 variant, the other one for a negated (-1) variant. The targets of a consistency
    fine-tune (:mod:`medrobust_lib.tracks.taxonomy.lora`, the demo's ``consistency_lora``)."""
    if answer not in ("yes", "no"):
        raise ValueError(f"a yes/no target must be 'yes' or 'no', got {answer!r}")
    flipped = "no" if answer == "yes" else "yes"
    return [(text, answer if pol == POSITIVE else flipped) for text, pol in variants]


def tokens(text: str) -> list[str]:
    """Lower-case word tokens (letters/digits, with an optional ``'suffix`` such as ``n't``)."""
    return _TOKEN.findall(text.lower().replace("\u2019", "'"))


def _is_negation(token: str) -> bool:
    return token in NEGATION_CUES or token.endswith("n't")


def negation_count(text: str) -> int:
    """Number of negation cues (:data:`NEGATION_CUES`, ``*n't``) in ``text``, >= 0."""
    return sum(1 for t in tokens(text) if _is_negation(t))


def content_words(text: str) -> frozenset[str]:
    """Tokens that are neither stopwords nor negation cues."""
    return frozenset(t for t in tokens(text) if t not in STOPWORDS and not _is_negation(t))


def content_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the content words of ``a`` and ``b``, in [0, 1]; 1.0 when both are empty."""
    wa, wb = content_words(a), content_words(b)
    union = wa | wb
    return 1.0 if not union else len(wa & wb) / len(union)


@dataclass(frozen=True)
class EquivalenceCheck:
    """Result of :func:`check_equivalence`: ``accepted``, the first failed rule as ``reason``
    (``ok`` when accepted) and the content-word ``overlap`` in [0, 1]."""

    accepted: bool
    reason: str
    overlap: float


def check_equivalence(original: str, candidate: str, polarity: int = 1, min_overlap: float = 0.5) -> EquivalenceCheck:
    """Filter for a model-written paraphrase of ``original`` declared with ``polarity`` (+1/-1).

    Rules, checked in order (the first failure is the ``reason``):

    1. ``not_question``: the candidate must end with ``'?'``;
    2. ``identical``: it must differ from the original (case and whitespace ignored);
    3. ``length``: its word count must be within [0.5, 2.5] x the original's;
    4. ``low_overlap``: content-word Jaccard overlap (:func:`content_overlap`) >= ``min_overlap``;
    5. ``negation_mismatch``: the parity of negation cues (:func:`negation_count`) must match the
       original's for polarity +1 and differ for -1.

    ``min_overlap`` in [0, 1]; raises ValueError for a polarity other than +1/-1.
    """
    if polarity not in (POSITIVE, NEGATED):
        raise ValueError(f"polarity must be +1 or -1, got {polarity}")
    if not 0.0 <= min_overlap <= 1.0:
        raise ValueError(f"min_overlap must be in [0, 1], got {min_overlap}")
    cand = " ".join(candidate.split())
    orig = " ".join(original.split())
    overlap = content_overlap(orig, cand)
    n_orig, n_cand = len(orig.split()), len(cand.split())
    same_parity = negation_count(orig) % 2 == negation_count(cand) % 2
    if not cand.endswith("?"):
        reason = "not_question"
    elif cand.casefold() == orig.casefold():
        reason = "identical"
    elif not MIN_LENGTH_RATIO * n_orig <= n_cand <= MAX_LENGTH_RATIO * n_orig:
        reason = "length"
    elif overlap < min_overlap:
        reason = "low_overlap"
    elif same_parity != (polarity == POSITIVE):
        reason = "negation_mismatch"
    else:
        reason = "ok"
    return EquivalenceCheck(reason == "ok", reason, overlap)


class _Result(Protocol):
    @property
    def text(self) -> str | None: ...

    @property
    def outcome(self) -> str: ...


class TextGenerator(Protocol):
    """Anything with ``generate(images, prompts) -> [result with .text, .outcome]`` (ApiVLM)."""

    def generate(self, images: Sequence[Any], prompts: Sequence[str]) -> Sequence[_Result]: ...


def parse_candidates(text: str) -> list[str]:
    """One candidate per non-empty line, with list numbering/bullets and wrapping quotes stripped."""
    out: list[str] = []
    for line in text.splitlines():
        cand = _BULLET.sub("", line.strip()).strip().strip(_QUOTES).strip()
        if cand:
            out.append(cand)
    return out


def _audit(candidate: str | None, accepted: bool, reason: str, overlap: float | None) -> dict[str, Any]:
    return {"candidate": candidate, "accepted": accepted, "reason": reason, "overlap": overlap}


def api_paraphrases(api: TextGenerator, question: str, n: int = 5,
                    min_overlap: float = 0.5) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    """Model-written paraphrases of ``question`` (ending in '?'), filtered by :func:`check_equivalence`.

    Sends :data:`API_PARAPHRASE_PROMPT` once, text only (``images=[None]``), parses the reply with
    :func:`parse_candidates` and checks every line with polarity +1. Returns ``(accepted, audit)``:
    ``accepted`` holds at most ``n`` (>= 1) ``(text, +1)`` pairs in reply order; ``audit`` has one
    ``{candidate, accepted, reason, overlap}`` record per parsed line (repeats are rejected as
    ``duplicate``, accepted lines beyond ``n`` as ``surplus``). A failed request (outcome not
    ``ok``) or an empty reply gives ``([], [{candidate: None, accepted: False, reason:
    "api_<outcome>" | "api_empty", overlap: None}])``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    q = _validate_question(question)
    result = api.generate([None], [API_PARAPHRASE_PROMPT.format(n=n, question=q)])[0]
    if result.outcome != "ok":
        return [], [_audit(None, False, f"api_{result.outcome}", None)]
    candidates = parse_candidates(result.text or "")
    if not candidates:
        return [], [_audit(None, False, "api_empty", None)]
    accepted: list[tuple[str, int]] = []
    audit: list[dict[str, Any]] = []
    seen: set[str] = set()
    for cand in candidates:
        check = check_equivalence(q, cand, POSITIVE, min_overlap)
        key = " ".join(cand.split()).casefold()
        reason = check.reason
        if check.accepted and key in seen:
            reason = "duplicate"
        elif check.accepted and len(accepted) >= n:
            reason = "surplus"
        ok = reason == "ok"
        if ok:
            accepted.append((cand, POSITIVE))
            seen.add(key)
        audit.append(_audit(cand, ok, reason, check.overlap))
    return accepted, audit


__all__ = [
    "API_PARAPHRASE_PROMPT",
    "NEGATED",
    "NEGATION_CUES",
    "POSITIVE",
    "STOPWORDS",
    "TEMPLATES",
    "EquivalenceCheck",
    "TextGenerator",
    "api_paraphrases",
    "check_equivalence",
    "content_overlap",
    "content_words",
    "negation_count",
    "parse_candidates",
    "template_paraphrases",
    "tokens",
]
