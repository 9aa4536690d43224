"""Per-answer scoring (vlm_tasks/scoring.py) and file scoring (vlm_tasks/score_files.py) with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from medrobust_lib.metrics.caption import DocumentFrequency, bleu, bleu_from_stats, cider_d, rouge_l
from medrobust_lib.vlm_tasks.score_files import MAX_LISTED_INVALID, score_file
from medrobust_lib.vlm_tasks.scoring import score_captions, score_grounding, score_mc, score_yes_no

OPTIONS = ["CT", "MRI", "X-ray"]

# ---- multiple choice ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "parsed", "outcome", "correct"),
    [
        ("b", "B", "ok", 1.0),  # a lone lowercase letter is a letter form
        ("B", "B", "ok", 1.0),
        ("The answer is (b).", "B", "ok", 1.0),
        ("MRI", "B", "ok", 1.0),  # option text
        ("C. X-ray", "C", "ok", 0.0),
        ("I cannot determine the modality from this image.", None, "refused", 0.0),
        ("purple", None, "unparseable", 0.0),
        ("A or B", None, "unparseable", 0.0),
        (None, None, "error", 0.0),
    ],
)
def test_score_mc(prediction: str | None, parsed: str | None, outcome: str, correct: float) -> None:
    row = score_mc(prediction, OPTIONS, "b")  # the answer letter's case does not matter
    assert row == {"prediction": prediction, "parsed": parsed, "outcome": outcome, "correct": correct}


# ---- yes/no ---------------------------------------------------------------------------------------


def test_yes_no_from_logprobs() -> None:
    row = score_yes_no("ignored text", "yes", {"yes": -0.1, "no": -2.3})
    assert row["source"] == "logprobs" and row["parsed"] == "yes" and row["outcome"] == "ok"
    assert row["correct"] == 1.0
    assert row["margin"] == pytest.approx(2.2, abs=1e-12)
    assert row["p_yes"] == pytest.approx(1 / (1 + math.exp(-2.2)), abs=1e-12)
    p = row["p_yes"]
    assert row["entropy"] == pytest.approx(-(p * math.log2(p) + (1 - p) * math.log2(1 - p)), abs=1e-12)
    # logprobs win over the text, and also score a missing text
    row = score_yes_no(None, "yes", {"yes": -3.0, "no": -0.2})
    assert row["parsed"] == "no" and row["correct"] == 0.0 and row["outcome"] == "ok"


@pytest.mark.parametrize(
    ("prediction", "parsed", "outcome", "correct"),
    [
        ("Yes.", "yes", "ok", 0.0),
        ("No, there is no fracture.", "no", "ok", 1.0),
        ("There is no evidence of a mass.", "no", "ok", 1.0),
        ("I'm sorry, I can't tell from this image.", None, "refused", 0.0),
        ("blue", None, "unparseable", 0.0),
        (None, None, "error", 0.0),
    ],
)
def test_yes_no_from_text(prediction: str | None, parsed: str | None, outcome: str, correct: float) -> None:
    row = score_yes_no(prediction, "no")
    assert (row["parsed"], row["outcome"], row["correct"]) == (parsed, outcome, correct)
    assert row["source"] == "generate" and row["margin"] is None and row["p_yes"] is None


# ---- grounding ------------------------------------------------------------------------------------

HW = (100, 200)  # height 100, width 200
GT = [50.0, 25.0, 150.0, 75.0]  # pixels, XYXY, end exclusive: 100 x 50 = 5000 px


def test_grounding_unit_box_against_pixel_ground_truth() -> None:
    row = score_grounding("[0.25, 0.25, 0.75, 0.75]", GT, HW)
    assert row["outcome"] == "ok" and row["box_scale"] == "0-1"
    assert row["iou"] == 1.0 and row["correct"] == 1.0 and row["acc_75"] == 1.0
    assert json.loads(row["parsed"]) == GT
    # x 50..100, y 25..75: 2500 px inside the 5000 px ground truth -> IoU 0.5 exactly
    row = score_grounding("The lesion is at [0.25, 0.25, 0.5, 0.75].", GT, HW)
    assert row["iou"] == 0.5 and row["correct"] == 1.0 and row["acc_75"] == 0.0
    # x 50..100, y 50..75: 1250 px -> IoU 0.25
    row = score_grounding("[0.25, 0.5, 0.5, 0.75]", GT, HW)
    assert row["iou"] == 0.25 and row["correct"] == 0.0


def test_grounding_thousandths_detected_and_declared() -> None:
    row = score_grounding("<|box_start|>(250,250),(750,750)<|box_end|>", GT, HW)  # > 200 px: 0-1000
    assert row["box_scale"] == "0-1000" and row["iou"] == 1.0
    # inside the image, so detection reads pixels; the declared scale says 0-1000
    assert score_grounding("[100, 50, 150, 75]", GT, HW)["box_scale"] == "pixels"
    row = score_grounding("[100, 50, 150, 75]", GT, HW, declared_scale="0-1000")
    assert row["box_scale"] == "0-1000"
    assert json.loads(row["parsed"]) == [20.0, 5.0, 30.0, 7.5]
    assert row["iou"] == 0.0 and row["outcome"] == "ok"
    row = score_grounding("[50, 25, 150, 75]", GT, HW, declared_scale="pixels")
    assert row["iou"] == 1.0


@pytest.mark.parametrize(
    ("prediction", "outcome"),
    [("somewhere in the middle", "unparseable"), ("I cannot locate it.", "refused"), (None, "error")],
)
def test_grounding_failures_score_iou_zero(prediction: str | None, outcome: str) -> None:
    row = score_grounding(prediction, GT, HW)
    assert row["outcome"] == outcome
    assert row["iou"] == 0.0 and row["correct"] == 0.0 and row["acc_75"] == 0.0 and row["parsed"] is None


# ---- captions -------------------------------------------------------------------------------------

CAP_REFS = {
    "a": ["A small bright lesion in the liver.", "Bright hepatic lesion, small."],
    "b": ["Chest x-ray with a right pleural effusion.", "Right-sided pleural effusion on chest x-ray."],
    "c": ["Axial CT of the brain without abnormality.", "Normal brain CT."],
    "d": ["MRI of the knee showing a torn meniscus.", "Knee MRI: meniscal tear."],
}
CAP_PREDS: dict[str, str | None] = {
    "a": "a small bright lesion in the liver",
    "b": "chest x-ray showing an effusion on the right",
    "c": None,
    "d": "...",
}


def test_score_captions_per_sample_fields_and_bleu_stats() -> None:
    rows = score_captions(CAP_PREDS, CAP_REFS)
    assert list(rows) == ["a", "b", "c", "d"]
    assert [rows[i]["outcome"] for i in "abcd"] == ["ok", "ok", "error", "unparseable"]
    assert all(r["correct"] is None for r in rows.values())
    hyps = {i: (t or "") for i, t in CAP_PREDS.items()}
    b = bleu(CAP_REFS, hyps)
    r = rouge_l(CAP_REFS, hyps)
    c = cider_d(CAP_REFS, hyps, DocumentFrequency.from_references(CAP_REFS))
    for i in "abcd":
        assert rows[i]["bleu_4"] == b["bleu_4"].per_sample[i]
        assert rows[i]["rouge_l"] == r.per_sample[i]
        assert rows[i]["cider_d"] == c.per_sample[i]
    assert rows["c"]["hyp_len"] == 0 and rows["c"]["bleu_4"] < 1e-6 and rows["c"]["cider_d"] == 0.0
    assert rows["a"]["rouge_l"] == 1.0  # identical to its first reference after tokenisation

    def corpus(ids: str, n: int) -> float:
        sub = [rows[i] for i in ids]
        return bleu_from_stats([sum(x[f"bleu_c{k + 1}"] for x in sub) for k in range(4)],
                               [sum(x[f"bleu_g{k + 1}"] for x in sub) for k in range(4)],
                               sum(x["hyp_len"] for x in sub), sum(x["ref_len"] for x in sub), n=n)

    for n in (1, 2, 3, 4):
        assert abs(corpus("abcd", n) - b[f"bleu_{n}"].corpus) < 1e-12
    # any subset: its summed statistics give its own corpus BLEU
    sub_refs = {i: CAP_REFS[i] for i in "ab"}
    assert abs(corpus("ab", 4) - bleu(sub_refs, {i: hyps[i] for i in "ab"})["bleu_4"].corpus) < 1e-12


def test_score_captions_document_frequencies_come_from_df_references() -> None:
    sub = {"a": CAP_PREDS["a"]}
    own = score_captions(sub, CAP_REFS)["a"]["cider_d"]  # df from all four reference groups
    alone = score_captions(sub, {"a": CAP_REFS["a"]})["a"]["cider_d"]  # df from one group: idf 0
    assert own > 0 and alone == 0.0
    assert score_captions({}, CAP_REFS) == {}


# ---- score_file -----------------------------------------------------------------------------------


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


VQA_REFS: list[Any] = [
    {"id": "q1", "question_type": "mc", "options": OPTIONS, "answer": "B"},
    {"id": "q2", "question_type": "mc", "options": OPTIONS, "answer": "A"},
    {"id": "q3", "question_type": "mc", "options": OPTIONS, "answer": "C"},
    "",
    {"id": "q4", "question_type": "yesno", "answer": "yes"},
    {"id": "q5", "question_type": "yesno", "answer": "no"},
    {"id": "q6", "question_type": "yesno", "answer": "No"},
    {"id": "q7", "question_type": "mc", "options": OPTIONS, "answer": "A"},  # no prediction
    {"id": "q8", "question_type": "mc", "options": OPTIONS, "answer": "D"},  # invalid: only A..C
    {"id": "q9", "question_type": "open", "answer": "x"},  # invalid type
]
VQA_PREDS: list[Any] = [
    {"id": "q1", "prediction": "b"},  # ok, right
    {"id": "q2", "prediction": "I'm sorry, I cannot answer that."},  # refused
    {"id": "q3", "prediction": "purple"},  # unparseable
    {"id": "q4", "prediction": "no", "logprobs": {"yes": -0.1, "no": -2.3}},  # logprobs win: right
    {"id": "q5", "prediction": "Yes, there is a mass."},  # ok, wrong
    "{not json",
    {"id": "q6"},  # invalid: no prediction -> q6 scores as error
    {"id": "q1", "prediction": "C"},  # duplicate id: ignored
    {"id": "extra", "prediction": "A"},  # no reference
    "[1, 2]",  # not an object
    {"id": "q5b", "prediction": "x", "logprobs": {"yes": "high"}},  # bad logprobs
]


def test_score_file_vqa_join_and_accounting(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", VQA_REFS)
    preds = _write(tmp_path / "preds.jsonl", VQA_PREDS)
    out = score_file("vqa", preds, refs)
    assert out["task"] == "vqa"
    assert out["n"] == 7 and out["n_mc"] == 4 and out["n_yesno"] == 3 and out["n_yesno_logprobs"] == 1
    assert (out["n_scored"], out["n_refused"], out["n_unparseable"], out["n_error"]) == (3, 1, 1, 2)
    assert out["n"] == out["n_scored"] + out["n_refused"] + out["n_unparseable"] + out["n_error"]
    assert out["accuracy"] == pytest.approx(2 / 7)
    assert out["accuracy_mc"] == pytest.approx(1 / 4)
    assert out["accuracy_yesno"] == pytest.approx(1 / 3)
    assert out["n_unmatched_predictions"] == 1
    assert out["n_invalid_lines"] == 7
    where = [(x["file"], x["line"]) for x in out["invalid_lines"]]
    assert where == [("references", 9), ("references", 10), ("predictions", 6), ("predictions", 7),
                     ("predictions", 8), ("predictions", 10), ("predictions", 11)]
    reasons = {x["line"]: x["reason"] for x in out["invalid_lines"] if x["file"] == "predictions"}
    assert "not valid JSON" in reasons[6] and "prediction" in reasons[7] and "duplicate" in reasons[8]
    json.dumps(out, allow_nan=False)  # plain JSON


def test_score_file_lists_at_most_twenty_invalid_lines(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", [{"id": "q1", "question_type": "yesno", "answer": "yes"}])
    preds = _write(tmp_path / "preds.jsonl", ["not json"] * 25 + [{"id": 1, "prediction": "yes"}])
    (tmp_path / "bin.jsonl").write_bytes(b'\xff\xfe{"id": "q1"}\n')
    out = score_file("vqa", preds, refs)
    assert out["n_invalid_lines"] == 25 and len(out["invalid_lines"]) == MAX_LISTED_INVALID
    assert [x["line"] for x in out["invalid_lines"]] == list(range(1, 21))
    assert out["n_unmatched_predictions"] == 1 and out["n_error"] == 1 and out["accuracy"] == 0.0  # "1" != "q1"
    out = score_file("vqa", tmp_path / "bin.jsonl", refs)
    assert out["invalid_lines"] == [{"file": "predictions", "line": 1, "reason": "not UTF-8"}]


def test_score_file_empty_references_and_errors(tmp_path: Path) -> None:
    empty = _write(tmp_path / "empty.jsonl", [""])
    out = score_file("vqa", empty, empty)
    assert out["n"] == 0 and out["accuracy"] is None
    out = score_file("caption", empty, empty)
    assert out["bleu_4"] is None and out["cider_d"] is None
    out = score_file("grounding", empty, empty)
    assert out["acc@0.5"] is None and out["mean_iou"] is None
    with pytest.raises(FileNotFoundError, match="predictions file not found"):
        score_file("vqa", tmp_path / "missing.jsonl", empty)
    with pytest.raises(FileNotFoundError, match="references file not found"):
        score_file("vqa", empty, tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="only applies to the grounding"):
        score_file("vqa", empty, empty, declared_scale="0-1")
    with pytest.raises(ValueError, match="unknown box scale"):
        score_file("grounding", empty, empty, declared_scale="percent")


def test_score_file_caption_matches_the_metrics(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", [{"id": i, "references": r} for i, r in CAP_REFS.items()]
                  + [{"id": "e", "references": []}])  # invalid: no reference
    preds = _write(tmp_path / "preds.jsonl", [{"id": i, "prediction": t} for i, t in CAP_PREDS.items() if i != "c"])
    out = score_file("caption", preds, refs)
    assert out["n"] == 4 and out["n_invalid_lines"] == 1 and out["n_unmatched_predictions"] == 0
    assert (out["n_scored"], out["n_unparseable"], out["n_error"], out["n_refused"]) == (2, 1, 1, 0)
    hyps = {i: (t or "") for i, t in CAP_PREDS.items()}  # c has no prediction: the empty caption
    b = bleu(CAP_REFS, hyps)
    for n in (1, 2, 3, 4):
        assert out[f"bleu_{n}"] == pytest.approx(b[f"bleu_{n}"].corpus, abs=1e-12)
    assert out["rouge_l"] == pytest.approx(rouge_l(CAP_REFS, hyps).corpus, abs=1e-12)
    df = DocumentFrequency.from_references(CAP_REFS)  # from the reference file
    assert out["cider_d"] == pytest.approx(cider_d(CAP_REFS, hyps, df).corpus, abs=1e-12)


def test_score_file_grounding(tmp_path: Path) -> None:
    ref = {"box": GT, "image_hw": list(HW)}
    refs = _write(tmp_path / "refs.jsonl", [
        {"id": "g1", **ref}, {"id": "g2", **ref}, {"id": "g3", **ref}, {"id": "g4", **ref},
        {"id": "g5", **ref}, {"id": "g6", "box": [1, 2, 3], "image_hw": [10, 10]},
    ])
    preds = _write(tmp_path / "preds.jsonl", [
        {"id": "g1", "prediction": "[0.25, 0.25, 0.75, 0.75]"},  # 0-1, IoU 1
        {"id": "g2", "prediction": "[0.25, 0.25, 0.5, 0.75]"},  # 0-1, IoU 0.5
        {"id": "g3", "prediction": "[250, 250, 750, 750]", "scale": "0-1000"},  # IoU 1
        {"id": "g4", "prediction": "no box here"},  # unparseable
        {"id": "g6", "prediction": "[1, 2, 3, 4]"},  # its reference is invalid: unmatched
        {"id": "g7", "prediction": "[1, 2, 3, 4]", "scale": "inches"},  # invalid scale
    ])
    out = score_file("grounding", preds, refs)
    assert out["n"] == 5 and (out["n_scored"], out["n_unparseable"], out["n_error"]) == (3, 1, 1)
    assert out["acc@0.5"] == pytest.approx(3 / 5) and out["acc@0.75"] == pytest.approx(2 / 5)
    assert out["mean_iou"] == pytest.approx(2.5 / 5)
    assert out["box_scales"] == {"0-1": 2, "0-1000": 1, "pixels": 0}
    assert out["n_invalid_lines"] == 2 and out["n_unmatched_predictions"] == 1
    # --scale applies where a record names none; a record's own scale wins
    out = score_file("grounding", preds, refs, declared_scale="pixels")
    assert out["box_scales"] == {"0-1": 0, "0-1000": 1, "pixels": 2}
    assert out["acc@0.5"] == pytest.approx(1 / 5) and out["mean_iou"] == pytest.approx(1 / 5)
