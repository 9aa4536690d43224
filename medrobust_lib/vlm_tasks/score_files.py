"""Score predictions made elsewhere (``medrobust score``): two JSONL files in, one summary dict out.

Each file holds one JSON object per line; blank lines are skipped. A line that is not valid JSON
(or not UTF-8, or nested too deeply, or holds an integer past Python's 4,300-digit limit), is not
an object, or lacks / mistypes a required field (numbers out of range included: a grounding
box coordinate or image side beyond :data:`MAX_PIXELS_PER_SIDE`) is counted in
``n_invalid_lines`` and listed in ``invalid_lines`` (the first :data:`MAX_LISTED_INVALID`, as
``{"file": "references"|"predictions", "line": <1-based physical line>, "reason": ...}``); it never
stops the run. A second record with an id already seen in the same file is an invalid line too
(the first one is kept).

Predictions are joined to references on ``id`` (a JSON string; an integer id is read as its
decimal string). A reference without a (valid) prediction scores as outcome ``error`` (no answer,
counted wrong); a prediction whose id is not among the valid references is counted in
``n_unmatched_predictions`` and ignored. Every rate's denominator is ``n``, the number of valid
references; ``n == n_scored + n_unparseable + n_refused + n_error`` (``n_scored``: outcome ``ok``).

Record fields (per-answer rules: :mod:`medrobust_lib.vlm_tasks.scoring`):

- ``vqa`` references ``{"id", "question_type": "mc"|"yesno", "options": [...] (mc, 2..26),
  "answer": "B" (mc letter) | "yes"/"no"}``; predictions ``{"id", "prediction": text|null}``,
  optionally ``"logprobs": {"yes": lp, "no": lp}`` (natural log) for yes/no questions, which are
  then scored by the two options' log-probabilities (``prediction`` may then be omitted).
- ``caption`` references ``{"id", "references": ["...", ...]}``; predictions
  ``{"id", "prediction": text|null}``. CIDEr-D document frequencies come from the whole reference
  file. Corpus BLEU-1..4 follow pycocoevalcap (summed sufficient statistics), ROUGE-L and CIDEr-D
  are means over the ``n`` captions; a missing answer is scored as the empty caption.
- ``grounding`` references ``{"id", "box": [x0, y0, x1, y1] (pixels, XYXY, end exclusive),
  "image_hw": [h, w]}``; predictions ``{"id", "prediction": text|null}``, optionally
  ``"scale": "0-1"|"0-1000"|"pixels"``. The box scale is the prediction's ``scale`` if given, else
  ``declared_scale`` (``--scale``), else detected (:func:`medrobust_lib.vlm_tasks.grounding.detect_scale`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from medrobust_lib.metrics.caption import BLEU_N, bleu_from_stats
from medrobust_lib.vlm_tasks.grounding import ACC_THRESHOLDS, SCALES, grounding_metrics
from medrobust_lib.vlm_tasks.scoring import (
    SCORED_OUTCOMES,
    score_captions,
    score_grounding,
    score_mc,
    score_yes_no,
)
from medrobust_lib.vlm_tasks.vqa import LETTERS, _check_options

Task = Literal["vqa", "caption", "grounding"]
TASKS: tuple[str, ...] = ("vqa", "caption", "grounding")
MAX_LISTED_INVALID = 20
MAX_ABS_NUMBER = 1e300
"""Largest magnitude a numeric field (a log-probability) may have."""
MAX_PIXELS_PER_SIDE = 2**31
"""Largest box coordinate magnitude and image side (pixels) a grounding reference may give;
keeps every area and IoU finite in float64."""


class InvalidRecord(ValueError):
    """A JSONL record that cannot be used (the message is the reason)."""


Record = dict[str, Any]


# ---- field checks -----------------------------------------------------------------------------


def _id(obj: Record) -> str:
    if "id" not in obj:
        raise InvalidRecord("missing field 'id'")
    v = obj["id"]
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise InvalidRecord(f"'id' must be a string, got {type(v).__name__}")
    return str(v)


def _finite(v: Any, bound: float = MAX_ABS_NUMBER) -> bool:
    """A JSON number (not a bool) with ``|v| <= bound``; False for NaN, infinities and integers
    too large for a float (no OverflowError)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return False
    try:
        f = float(v)
    except OverflowError:
        return False
    return math.isfinite(f) and abs(f) <= bound


def _text_or_none(obj: Record, key: str) -> str | None:
    if key not in obj:
        raise InvalidRecord(f"missing field {key!r}")
    v = obj[key]
    if v is not None and not isinstance(v, str):
        raise InvalidRecord(f"{key!r} must be a string or null, got {type(v).__name__}")
    return v


def _vqa_reference(obj: Record) -> Record:
    qt = obj.get("question_type")
    answer = obj.get("answer")
    if qt == "mc":
        opts = obj.get("options")
        if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
            raise InvalidRecord("'options' must be a list of strings")
        try:
            _check_options(opts)
        except ValueError:
            raise InvalidRecord(f"'options' must be 2..{len(LETTERS)} non-empty, distinct strings") from None
        if not isinstance(answer, str) or len(answer.strip()) != 1 or answer.strip().upper() not in LETTERS[: len(opts)]:
            raise InvalidRecord(f"'answer' must be one of the letters {LETTERS[: len(opts)]}")
        return {"question_type": "mc", "options": opts, "answer": answer.strip().upper()}
    if qt == "yesno":
        if not isinstance(answer, str) or answer.strip().lower() not in ("yes", "no"):
            raise InvalidRecord("'answer' must be 'yes' or 'no'")
        return {"question_type": "yesno", "answer": answer.strip().lower()}
    raise InvalidRecord("'question_type' must be 'mc' or 'yesno'")


def _vqa_prediction(obj: Record) -> Record:
    lp = obj.get("logprobs")
    if lp is not None:
        if not isinstance(lp, dict) or not all(_finite(lp.get(k)) for k in ("yes", "no")):
            raise InvalidRecord("'logprobs' must be {\"yes\": number, \"no\": number} with finite values")
        pred = _text_or_none(obj, "prediction") if "prediction" in obj else None
        return {"prediction": pred, "logprobs": {"yes": float(lp["yes"]), "no": float(lp["no"])}}
    return {"prediction": _text_or_none(obj, "prediction"), "logprobs": None}


def _caption_reference(obj: Record) -> Record:
    refs = obj.get("references")
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise InvalidRecord("'references' must be a non-empty list of strings")
    return {"references": refs}


def _caption_prediction(obj: Record) -> Record:
    return {"prediction": _text_or_none(obj, "prediction")}


def _grounding_reference(obj: Record) -> Record:
    box = obj.get("box")
    hw = obj.get("image_hw")
    if not isinstance(box, list) or len(box) != 4 or not all(_finite(v, MAX_PIXELS_PER_SIDE) for v in box):
        raise InvalidRecord(f"'box' must be [x0, y0, x1, y1] (4 finite numbers, pixels, within "
                            f"+-{MAX_PIXELS_PER_SIDE})")
    if (not isinstance(hw, list) or len(hw) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_PIXELS_PER_SIDE for v in hw)):
        raise InvalidRecord(f"'image_hw' must be [height, width] (2 integers in 1..{MAX_PIXELS_PER_SIDE})")
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (x1 > x0 and y1 > y0):
        raise InvalidRecord(f"'box' {box} is inverted or empty: need x0 < x1 and y0 < y1 (XYXY, end exclusive)")
    return {"box": [x0, y0, x1, y1], "image_hw": [int(v) for v in hw]}


def _grounding_prediction(obj: Record) -> Record:
    scale = obj.get("scale")
    if scale is not None and (not isinstance(scale, str) or scale not in SCALES):
        raise InvalidRecord(f"'scale' must be one of {', '.join(SCALES)}")
    return {"prediction": _text_or_none(obj, "prediction"), "scale": scale}


_PARSERS: dict[str, tuple[Callable[[Record], Record], Callable[[Record], Record]]] = {
    "vqa": (_vqa_reference, _vqa_prediction),
    "caption": (_caption_reference, _caption_prediction),
    "grounding": (_grounding_reference, _grounding_prediction),
}


# ---- reading ----------------------------------------------------------------------------------


def _short(exc: BaseException, limit: int = 160) -> str:
    """An exception's message cut to ``limit`` characters (a reason, never the hostile line)."""
    msg = str(exc)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def read_jsonl(path: Path, parse: Callable[[Record], Record], file_label: str,
               invalid: list[dict[str, Any]]) -> dict[str, Record]:
    """id -> parsed record for every valid line of ``path``; invalid lines are appended to
    ``invalid``. Raises FileNotFoundError when ``path`` is not a file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{file_label} file not found: {path}")
    out: dict[str, Record] = {}
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        def bad(reason: str, lineno: int = lineno) -> None:
            invalid.append({"file": file_label, "line": lineno, "reason": reason})

        try:
            text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError:
            bad("not UTF-8")
            continue
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            bad(f"not valid JSON ({exc.msg})")
            continue
        except RecursionError:
            bad("JSON nested too deeply")
            continue
        except ValueError as exc:  # an integer past Python's digit limit (int_max_str_digits)
            bad(f"not usable JSON ({_short(exc)})")
            continue
        if not isinstance(obj, dict):
            bad("not a JSON object")
            continue
        try:
            rid = _id(obj)
            rec = parse(obj)
        except InvalidRecord as exc:
            bad(str(exc))
            continue
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:  # a check that missed a case
            bad(f"unusable record ({type(exc).__name__}: {_short(exc)})")
            continue
        if rid in out:
            bad(f"duplicate id {rid!r} (the first record is kept)")
            continue
        out[rid] = rec
    return out


# ---- scoring ----------------------------------------------------------------------------------


def _rate(rows: list[Record]) -> float | None:
    return sum(r["correct"] for r in rows) / len(rows) if rows else None


def _score_vqa(refs: dict[str, Record], preds: dict[str, Record]) -> tuple[list[Record], dict[str, Any]]:
    rows: list[Record] = []
    for rid, ref in refs.items():
        p = preds.get(rid)
        text = p["prediction"] if p else None
        if ref["question_type"] == "mc":
            row = score_mc(text, ref["options"], ref["answer"])
        else:
            row = score_yes_no(text, ref["answer"], p["logprobs"] if p else None)
        row["question_type"] = ref["question_type"]
        rows.append(row)
    mc = [r for r in rows if r["question_type"] == "mc"]
    yn = [r for r in rows if r["question_type"] == "yesno"]
    metrics = {"accuracy": _rate(rows), "accuracy_mc": _rate(mc), "accuracy_yesno": _rate(yn),
               "n_mc": len(mc), "n_yesno": len(yn),
               "n_yesno_logprobs": sum(1 for r in yn if r.get("source") == "logprobs")}
    return rows, metrics


def _score_caption(refs: dict[str, Record], preds: dict[str, Record]) -> tuple[list[Record], dict[str, Any]]:

    references = {rid: ref["references"] for rid, ref in refs.items()}
    texts: dict[str, str | None] = {rid: (preds[rid]["prediction"] if rid in preds else None) for rid in refs}
    per = score_captions(texts, references, df_references=references)
    rows = [per[rid] for rid in refs]
    metrics: dict[str, Any] = {f"bleu_{k}": None for k in range(1, BLEU_N + 1)}
    metrics.update(rouge_l=None, cider_d=None)
    if rows:
        correct = [sum(r[f"bleu_c{k + 1}"] for r in rows) for k in range(BLEU_N)]
        guess = [sum(r[f"bleu_g{k + 1}"] for r in rows) for k in range(BLEU_N)]
        hyp_len = sum(r["hyp_len"] for r in rows)
        ref_len = sum(r["ref_len"] for r in rows)
        for k in range(1, BLEU_N + 1):
            metrics[f"bleu_{k}"] = bleu_from_stats(correct, guess, hyp_len, ref_len, n=k)
        metrics["rouge_l"] = sum(r["rouge_l"] for r in rows) / len(rows)
        metrics["cider_d"] = sum(r["cider_d"] for r in rows) / len(rows)
    return rows, metrics


def _score_grounding(refs: dict[str, Record], preds: dict[str, Record],
                     declared_scale: str | None) -> tuple[list[Record], dict[str, Any]]:
    rows: list[Record] = []
    for rid, ref in refs.items():
        p = preds.get(rid)
        scale = (p["scale"] or declared_scale) if p else declared_scale
        rows.append(score_grounding(p["prediction"] if p else None, ref["box"], ref["image_hw"], scale))
    metrics: dict[str, Any] = {f"acc@{t:g}": None for t in ACC_THRESHOLDS}
    metrics["mean_iou"] = None
    if rows:
        gm = grounding_metrics([r["iou"] for r in rows])
        metrics.update({k: v for k, v in gm.items() if k not in ("n", "n_unparseable")})
    scales = Counter(r["box_scale"] for r in rows if r["box_scale"] is not None)
    metrics["box_scales"] = {s: scales.get(s, 0) for s in SCALES}
    return rows, metrics


def score_file(task: Task, predictions: Path, references: Path, *, declared_scale: str | None = None) -> dict[str, Any]:
    """Summary of ``predictions`` (JSONL) scored against ``references`` (JSONL) for ``task``.

    Returns ``task``, ``n`` (valid references), ``n_scored``, ``n_unparseable``, ``n_refused``,
    ``n_error``, ``n_invalid_lines``, ``invalid_lines``, ``n_unmatched_predictions``,
    ``n_matched_predictions`` (predictions whose id has a reference; 0: nothing was scored) and the task's
    metrics (None when ``n == 0``): vqa ``accuracy``, ``accuracy_mc``, ``accuracy_yesno``, ``n_mc``,
    ``n_yesno``, ``n_yesno_logprobs``; caption ``bleu_1``..``bleu_4``, ``rouge_l``, ``cider_d``;
    grounding ``acc@0.5``, ``acc@0.75``, ``mean_iou``, ``box_scales`` (answers per scale used).

    Raises FileNotFoundError for a missing file, ValueError for an unknown task or scale (or a
    scale given for another task than grounding).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    if declared_scale is not None:
        if task != "grounding":
            raise ValueError("a box scale only applies to the grounding task")
        if declared_scale not in SCALES:
            raise ValueError(f"unknown box scale {declared_scale!r}; valid: {', '.join(SCALES)}")
    parse_ref, parse_pred = _PARSERS[task]
    invalid: list[dict[str, Any]] = []
    refs = read_jsonl(Path(references), parse_ref, "references", invalid)
    preds = read_jsonl(Path(predictions), parse_pred, "predictions", invalid)

    if task == "vqa":
        rows, metrics = _score_vqa(refs, preds)
    elif task == "caption":
        rows, metrics = _score_caption(refs, preds)
    else:
        rows, metrics = _score_grounding(refs, preds, declared_scale)

    outcomes = Counter(r["outcome"] for r in rows)
    unknown = set(outcomes) - set(SCORED_OUTCOMES)
    if unknown:  # pragma: no cover - scoring.py only returns SCORED_OUTCOMES
        raise RuntimeError(f"unexpected outcomes {sorted(unknown)}")
    out: dict[str, Any] = {
        "task": task,
        "n": len(rows),
        "n_scored": outcomes["ok"],
        "n_unparseable": outcomes["unparseable"],
        "n_refused": outcomes["refused"],
        "n_error": outcomes["error"],
        "n_invalid_lines": len(invalid),
        "invalid_lines": invalid[:MAX_LISTED_INVALID],
        "n_unmatched_predictions": sum(1 for pid in preds if pid not in refs),
        "n_matched_predictions": sum(1 for pid in preds if pid in refs),
    }
    out.update(metrics)
    return out


__all__ = ["MAX_ABS_NUMBER", "MAX_LISTED_INVALID", "MAX_PIXELS_PER_SIDE", "TASKS", "InvalidRecord", "Task", "read_jsonl", "score_file"]
