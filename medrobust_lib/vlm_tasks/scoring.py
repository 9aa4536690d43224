"""Per-answer scoring, shared by the evaluation pipeline and ``medrobust score``.

Every function turns one model answer into a dict of result fields with an explicit ``outcome``:

- ``ok``: parsed and scored;
- ``unparseable``: no letter / yes-no / box could be read (counted wrong, IoU 0);
- ``refused``: the model declined (counted wrong);
- ``error``: no answer at all (model or API failure; counted wrong).

``correct`` is 1.0 or 0.0 for every outcome above, never missing, so a failure cannot leave
a denominator. Rows a condition cannot score at all (a failed perturbation, a ground-truth box
moved out of view) are marked by the caller with outcome ``excluded:<reason>`` and ``correct``
None, and are counted separately.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from medrobust_lib.metrics.caption import (
    DocumentFrequency,
    bleu,
    bleu_stats_all,
    cider_d,
    ptb_tokenize,
    rouge_l,
)
from medrobust_lib.vlm_tasks.grounding import ACC_THRESHOLDS, box_iou, detect_scale, parse_box, to_pixels
from medrobust_lib.vlm_tasks.vqa import extract_choice, extract_yes_no, is_refusal, yes_no_from_logprobs

SCORED_OUTCOMES: tuple[str, ...] = ("ok", "unparseable", "refused", "error")


def _base(prediction: str | None) -> dict[str, Any]:
    return {"prediction": prediction, "parsed": None, "outcome": "error", "correct": 0.0}


def score_mc(prediction: str | None, options: Sequence[str], answer_letter: str) -> dict[str, Any]:
    """Multiple choice: ``parsed`` is the extracted letter (rules of :func:`extract_choice`)."""
    out = _base(prediction)
    if prediction is None:
        return out
    res = extract_choice(prediction, options)
    out.update(parsed=res.letter, outcome=res.outcome, correct=float(res.letter == answer_letter.upper()))
    return out


def score_yes_no(prediction: str | None, expected: str, logprobs: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Yes/no. With ``logprobs`` (``{"yes": lp, "no": lp}``, natural log) the answer is the option
    with the higher log-probability (source ``logprobs``; margin, p_yes and entropy in bits are
    filled); otherwise the text is parsed by :func:`extract_yes_no` (source ``generate``)."""
    out = _base(prediction)
    out.update(source="logprobs" if logprobs else "generate", margin=None, p_yes=None, entropy=None)
    if logprobs:
        label, margin, p_yes, ent = yes_no_from_logprobs(float(logprobs["yes"]), float(logprobs["no"]))
        out.update(parsed=label, outcome="ok", correct=float(label == expected), margin=margin, p_yes=p_yes,
                   entropy=ent)
        return out
    if prediction is None:
        return out
    parsed = extract_yes_no(prediction)
    if parsed is None:
        out.update(outcome="refused" if is_refusal(prediction) else "unparseable")
        return out
    out.update(parsed=parsed, outcome="ok", correct=float(parsed == expected))
    return out


def score_grounding(prediction: str | None, gt_box: Sequence[float], image_hw: Sequence[int],
                    declared_scale: str | None = None) -> dict[str, Any]:
    """Grounding: the first box of the answer, its detected (or declared) scale, converted to
    pixels and compared with ``gt_box`` (pixel XYXY, end exclusive). ``correct`` is IoU >= 0.5;
    ``acc_75`` IoU >= 0.75; ``parsed`` the pixel box as JSON; unparseable -> IoU 0."""
    out = _base(prediction)
    out.update(iou=0.0, acc_75=0.0, box_scale=None)
    if prediction is None:
        return out
    if is_refusal(prediction):
        out["outcome"] = "refused"
        return out
    box = parse_box(prediction)
    if box is None:
        out["outcome"] = "unparseable"
        return out
    scale = detect_scale(box, image_hw, declared_scale)
    px = to_pixels(box, scale, image_hw)
    iou = box_iou(px, [float(v) for v in gt_box])
    out.update(parsed=json.dumps([round(v, 2) for v in px]), outcome="ok", iou=iou, box_scale=scale,
               correct=float(iou >= ACC_THRESHOLDS[0]), acc_75=float(iou >= ACC_THRESHOLDS[1]))
    return out


def score_captions(predictions: Mapping[str, str | None], references: Mapping[str, Sequence[str]],
                   df_references: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
    """Per-caption fields for a set of predictions (id -> text, None = no answer).

    ``df_references``: the clean reference set that fixes CIDEr-D document frequencies (default:
    ``references``). Returns id -> ``{outcome, correct (None), bleu_4, rouge_l, cider_d, and the
    BLEU sufficient statistics bleu_c1..4, bleu_g1..4, hyp_len, ref_len}``: summing the statistics
    over any subset and applying :func:`medrobust_lib.metrics.caption.bleu_from_stats` gives that
    subset's corpus BLEU exactly. A missing or empty answer scores as the empty caption (outcome
    ``error`` or ``unparseable``)."""

    ids = list(predictions)
    if not ids:
        return {}
    hyps: dict[Hashable, str] = {i: (predictions[i] or "") for i in ids}
    refs: dict[Hashable, Sequence[str]] = {i: list(references[i]) for i in ids}
    df_src: dict[Hashable, Sequence[str]] = dict(df_references.items() if df_references is not None
                                                 else references.items())
    df = DocumentFrequency.from_references(df_src)
    b = bleu(refs, hyps)
    r = rouge_l(refs, hyps)
    c = cider_d(refs, hyps, df)
    stats = bleu_stats_all(refs, hyps)
    out: dict[str, dict[str, Any]] = {}
    for i in ids:
        st = stats[i]
        pred = predictions[i]
        outcome = "error" if pred is None else ("unparseable" if not ptb_tokenize(pred) else
                                                "refused" if is_refusal(pred) else "ok")
        row: dict[str, Any] = {"prediction": pred, "parsed": None, "outcome": outcome, "correct": None,
                               "bleu_4": b["bleu_4"].per_sample[i], "rouge_l": r.per_sample[i],
                               "cider_d": c.per_sample[i], "hyp_len": st.hyp_len, "ref_len": st.ref_len}
        for k in range(4):
            row[f"bleu_c{k + 1}"] = st.correct[k]
            row[f"bleu_g{k + 1}"] = st.guess[k]
        out[i] = row
    return out
