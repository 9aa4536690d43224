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

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from medrobust_lib.metrics.caption import DocumentFrequency, bleu, cider_d, rouge_l

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


RAW_COLUMNS: tuple[str, ...] = ("bleu_4_raw", "rouge_l_raw", "cider_raw")
"""``vlm_results`` columns of the raw scores (``vlm.protocol.caption_raw_scores``)."""


def raw_caption_rows(predictions: Mapping[Hashable, str | None], references: Mapping[Hashable, Sequence[str]],
                     df_references: Iterable[Sequence[str]]) -> dict[Hashable, dict[str, float]]:
    """Per-caption raw scores (:data:`RAW_COLUMNS`) with CIDEr's document frequencies taken from
    ``df_references`` (untokenised): the references of every evaluation record of the dataset,
    which is what the reference's one call per (dataset, condition) uses when every record of the
    condition is scored, so the mean of ``cider_raw`` (and of ``rouge_l_raw``) over a condition is
    the reference's corpus score; ``bleu_4_raw`` is per-sample BLEU (the reference's corpus BLEU
    is not a mean of these)."""
    if not predictions:
        return {}
    hyps = {k: (str(p) if p else "") for k, p in predictions.items()}
    refs = {k: [str(x) for x in references[k]] for k in hyps}
    df = DocumentFrequency.from_references(list(df_references), tokenize=False)
    b = bleu(refs, hyps, tokenize=False)["bleu_4"].per_sample
    r = rouge_l(refs, hyps, tokenize=False).per_sample
    c = cider_d(refs, hyps, df, tokenize=False).per_sample
    return {k: {"bleu_4_raw": b[k], "rouge_l_raw": r[k], "cider_raw": c[k]} for k in hyps}
