"""VQA prompts and answer extraction (docs/design.md, section 5).

Multiple choice always *shows* the options, one per line as ``A. text``, and asks for the letter.
Answers are parsed by the written rules of :func:`extract_choice`; refused and unparseable answers
are their own outcomes (counted as wrong by the caller and reported separately). Yes/no questions
are scored from the two options' log-probabilities when the model exposes them
(:func:`yes_no_from_logprobs`), else by the rules of :func:`extract_yes_no`.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LETTERS = string.ascii_uppercase
MC_INSTRUCTION = "Answer with the option's letter from the given choices directly."
Outcome = Literal["ok", "refused", "unparseable"]
OUTCOMES: tuple[str, ...] = ("ok", "refused", "unparseable")

REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bi (?:cannot|can ?not|can't|am unable|'m unable|am not able|'m not able)\b",
    r"\bunable to\b",
    r"\bi(?:'m| am) sorry\b",
    r"\bsorry,? (?:but )?i\b",
    r"\bnot (?:possible|able) to (?:determine|tell|say|answer)\b",
    r"\bcannot be determined\b",
    r"\bcan(?:not|'t) (?:determine|tell|answer|provide)\b",
    r"\bas an ai\b",
    r"\bconsult (?:a|your) (?:doctor|physician|radiologist|healthcare)\b",
)
"""Case-insensitive regexes; any hit makes the answer a refusal (checked first)."""
_REFUSAL_RE = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)


# "answer is B", "Answer: (b)", "correct option is B." -- a lowercase bare letter only at the end.
_PREFIX_RE = re.compile(
    r"(?i:\b(?:answer|option|choice)\b(?:\s+is)?)\s*[:\-]?\s*"
    r"(?:[\(\[]([A-Za-z])[\)\]]|([A-Z])(?![\w'])|([a-z])(?=[.)]?\s*$))"
)
_OTHER_LETTER_RE = re.compile(
    r"[\(\[]([A-Z])[\)\]]|(?<![\w'])([A-Z])[.):](?=\s|$)|\b(?:or|and)\s+([A-Z])\b|/\s*([A-Z])\b"
)


@dataclass(frozen=True)
class ChoiceResult:
    """Parsed multiple-choice answer: ``letter`` in A..Z (None unless ``outcome == 'ok'``)."""

    letter: str | None
    outcome: Outcome


def _check_options(options: Sequence[str]) -> None:
    if isinstance(options, str) or not 2 <= len(options) <= len(LETTERS):
        raise ValueError(f"options must be a list of 2..{len(LETTERS)} strings, got {options!r}")
    norm = [_norm(o) for o in options]
    if any(not o for o in norm) or len(set(norm)) != len(norm):
        raise ValueError(f"options must be non-empty and distinct (case/punctuation-insensitive), got {options!r}")


def build_mc_prompt(question: str, options: Sequence[str], instruction: str = MC_INSTRUCTION) -> str:
    """``question``, then one ``"A. option"`` line per option, then ``instruction``.

    Raises ValueError unless there are 2..26 non-empty, distinct options.
    """
    _check_options(options)
    lines = [question.strip()] + [f"{LETTERS[i]}. {o.strip()}" for i, o in enumerate(options)]
    return "\n".join(lines + [instruction])


def is_refusal(answer: str) -> bool:
    """True when ``answer`` matches one of :data:`REFUSAL_PATTERNS` (case-insensitive)."""
    return _REFUSAL_RE.search(answer.replace("\u2019", "'")) is not None


def _norm(text: str) -> str:
    text = re.sub(r"[^\w\s]", " ", text.lower())
    return " ".join(text.split())


def extract_choice(answer: str, options: Sequence[str]) -> ChoiceResult:
    """The letter chosen in a free-text answer to a prompt from :func:`build_mc_prompt`.

    Rules, in order (valid letters are the first ``len(options)`` of A..Z):

    1. Refusal (:func:`is_refusal`: "I cannot", "unable to", "I'm sorry", "not possible to
       determine", ...) -> ``(None, 'refused')``.
    2. Explicit letter forms: an answer prefix anywhere, case-insensitive ("Answer: B",
       "The answer is (b)", "correct option is B"), else a leading letter that is the whole answer
       or is bracketed or followed by ``.`` ``)`` ``:`` ``,`` ("B", "B.", "(B)", "B)", "B: text").
       A single letter of any case that is the whole answer ("b", "(b)", "b.") is a letter form.
       A leading bare capital followed by a space and more words ("A mass is seen") is not a
       letter form (it is the article). If another valid letter also appears in an explicit form
       ("(C)", "C." / "C)" / "C:" followed by space or end, "or C", "and C", "/C") the answer names
       several letters -> ``(None, 'unparseable')``.
    3. Option text (lowercased, punctuation removed, whitespace collapsed): the whole answer equals
       an option, else options contained in the answer as whole words; a contained option that is
       part of a longer contained option is dropped ("no mass" beats "mass"); exactly one left ->
       its letter; several -> unparseable.
    4. Otherwise ``(None, 'unparseable')``.

    Raises ValueError for invalid ``options`` (see :func:`build_mc_prompt`).
    """
    _check_options(options)
    valid = LETTERS[: len(options)]
    text = answer.replace("\u2019", "'").strip()
    if is_refusal(text):
        return ChoiceResult(None, "refused")

    letter: str | None = None
    m = _PREFIX_RE.search(text)
    found = next((g.upper() for g in m.groups() if g), None) if m else None
    if found is not None and found in valid:
        letter = found
    else:
        m = re.match(r"^\s*(?:[\(\[]([A-Z])[\)\]]|([A-Z])(?:[.):,]|\s*$))", text)
        if m and (m.group(1) or m.group(2)) in valid:
            letter = m.group(1) or m.group(2)
        elif re.fullmatch(r"\s*[\(\[]?([A-Za-z])[\)\]]?[.)]?\s*", text) and text.strip(" ([).]").upper() in valid:
            letter = text.strip(" ([).]").upper()  # a single letter, any case, is the whole answer
    if letter is not None:
        others = {g for groups in _OTHER_LETTER_RE.findall(text) for g in groups if g}
        if others & (set(valid) - {letter}):
            return ChoiceResult(None, "unparseable")
        return ChoiceResult(letter, "ok")

    norm_answer = _norm(text)
    norm_opts = [_norm(o) for o in options]
    for i, o in enumerate(norm_opts):
        if norm_answer == o:
            return ChoiceResult(valid[i], "ok")
    padded = f" {norm_answer} "
    hits = [i for i, o in enumerate(norm_opts) if f" {o} " in padded]
    hits = [i for i in hits if not any(j != i and f" {norm_opts[i]} " in f" {norm_opts[j]} " for j in hits)]
    if len(hits) == 1:
        return ChoiceResult(valid[hits[0]], "ok")
    return ChoiceResult(None, "unparseable")


_NEG_CUES = re.compile(
    r"\b(?:there (?:is|are) no|no (?:evidence|sign|signs)|not|n't|absent|absence of|negative for|without|none|"
    r"neither|nor|free of|unremarkable|ruled out)\b|n't\b",
    re.IGNORECASE,
)
_POS_CUES = re.compile(
    r"\b(?:there (?:is|are)|present|presence of|shows?|showing|visible|evident|seen|positive for|consistent with|"
    r"indicates?|suggests?)\b",
    re.IGNORECASE,
)


def extract_yes_no(answer: str) -> Literal["yes", "no"] | None:
    """``'yes'``, ``'no'`` or None (refused or unparseable) from a free-text yes/no answer.

    Rules, in order: (1) a refusal (:func:`is_refusal`) -> None; (2) the first word (punctuation
    stripped, case-insensitive) is yes/yeah/yep/true/correct -> yes, no/nope/false/incorrect -> no;
    (3) a negation cue anywhere ("there is no", "no evidence", "not", "n't", "absent", "negative
    for", "without", "unremarkable", ...) -> no; (4) an affirmative cue ("there is", "present",
    "shows", "visible", "seen", "consistent with", ...) -> yes; (5) otherwise None.
    """
    text = answer.replace("\u2019", "'").strip()
    if is_refusal(text):
        return None
    words = re.findall(r"[a-z']+", text.lower())
    if words:
        if words[0] in ("yes", "yeah", "yep", "true", "correct"):
            return "yes"
        if words[0] in ("no", "nope", "false", "incorrect"):
            return "no"
    if _NEG_CUES.search(text):
        return "no"
    if _POS_CUES.search(text):
        return "yes"
    return None


def yes_no_from_logprobs(lp_yes: float, lp_no: float) -> tuple[Literal["yes", "no"], float, float, float]:
    """Option scoring from the log-probabilities (natural log, <= 0, any finite values) of the
    "yes" and "no" answers.

    Returns ``(label, margin, p_yes, entropy_bits)``: ``p_yes = softmax([lp_yes, lp_no])[0]`` in
    [0, 1] (renormalised over the two options), ``label = 'yes'`` iff ``lp_yes >= lp_no`` (a tie
    reads yes), ``margin = lp_yes - lp_no`` (signed, nats), ``entropy_bits`` the binary entropy of
    ``p_yes`` in [0, 1] bits. Raises ValueError on NaN/inf input.
    """
    if not (math.isfinite(lp_yes) and math.isfinite(lp_no)):
        raise ValueError(f"log-probabilities must be finite, got lp_yes={lp_yes}, lp_no={lp_no}")
    margin = lp_yes - lp_no
    # Numerically stable sigmoid of the margin.
    p_yes = 1.0 / (1.0 + math.exp(-margin)) if margin >= 0 else math.exp(margin) / (1.0 + math.exp(margin))
    entropy = 0.0
    for p in (p_yes, 1.0 - p_yes):
        if p > 0:
            entropy -= p * math.log2(p)
    return ("yes" if margin >= 0 else "no"), margin, p_yes, entropy


__all__ = [
    "LETTERS",
    "MC_INSTRUCTION",
    "OUTCOMES",
    "REFUSAL_PATTERNS",
    "ChoiceResult",
    "Outcome",
    "build_mc_prompt",
    "extract_choice",
    "extract_yes_no",
    "is_refusal",
    "yes_no_from_logprobs",
]
