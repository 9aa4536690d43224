"""Caption scores as the reference benchmark computes them (``caption_scoring: raw``).

The code published with the MedFM-Robust paper (``eval_vlm_perturbation.py``,
``compute_caption_metrics``) hands pycocoevalcap's ``Bleu(4)``, ``Rouge()`` and ``Cider()`` the
**raw, untokenised** strings (no PTB tokenizer, no lower-casing, punctuation glued to words),
one call per evaluated condition, so CIDEr's document frequencies come from that call's
references. This module scores the same way with the project's own implementation
(:mod:`medrobust_lib.metrics.caption` with ``tokenize=False`` and ``df=None``); the equality with
the reference's function is checked in ``tests/reference_protocol/test_caption_raw.py`` against
fixtures made by running it (``tools/reference_protocol_fixtures.py``). The reference rounds to 4
decimals for its tables; the scores here are unrounded.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from medrobust_lib.metrics.caption import bleu, cider_d, rouge_l

RAW_METRICS: tuple[str, ...] = ("bleu_1", "bleu_4", "rouge_l", "cider")
"""Corpus scores of :func:`raw_caption_scores`; the reference calls them BLEU-1, BLEU-4, ROUGE-L, CIDEr."""


@dataclass(frozen=True)
class RawCaptionScores:
    """``corpus``: metric -> score over the scored set (BLEU corpus-level; ROUGE-L and CIDEr the
    mean of ``per_sample``); ``per_sample``: metric -> (id -> score), ids in input order."""

    corpus: dict[str, float]
    per_sample: dict[str, dict[Hashable, float]]


def raw_caption_scores(predictions: Sequence[str | None], references: Sequence[str | Sequence[str]],
                       ids: Sequence[Hashable] | None = None) -> RawCaptionScores:
    """Score ``predictions`` against ``references`` (one string or a list of strings each) as the
    reference does: a missing or empty prediction is the empty caption, references are ``str()``-ed,
    nothing is tokenised, document frequencies come from these references. ``ids`` default to
    0..n-1. Raises ValueError on unequal lengths or an empty set."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("need at least one caption to score")
    keys = list(ids) if ids is not None else list(range(len(predictions)))
    if len(keys) != len(predictions) or len(set(keys)) != len(keys):
        raise ValueError("ids must be unique, one per prediction")
    hyps = {k: (str(p) if p else "") for k, p in zip(keys, predictions, strict=True)}
    refs: dict[Hashable, list[str]] = {
        k: ([str(x) for x in r] if isinstance(r, list | tuple) else [str(r)])
        for k, r in zip(keys, references, strict=True)}
    b = bleu(refs, hyps, tokenize=False)
    r = rouge_l(refs, hyps, tokenize=False)
    c = cider_d(refs, hyps, None, tokenize=False)
    return RawCaptionScores(
        corpus={"bleu_1": b["bleu_1"].corpus, "bleu_4": b["bleu_4"].corpus, "rouge_l": r.corpus, "cider": c.corpus},
        per_sample={"bleu_1": b["bleu_1"].per_sample, "bleu_4": b["bleu_4"].per_sample,
                    "rouge_l": r.per_sample, "cider": c.per_sample},
    )
