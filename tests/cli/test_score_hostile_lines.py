"""``medrobust score`` isolates every hostile line: deep nesting (RecursionError in the JSON
parser), integers past Python's 4,300-digit conversion limit, 400-digit numbers (OverflowError in
float conversion), out-of-range and mistyped fields. Each such line is listed with its file, line
number and reason; every other line is scored exactly as in a file without the hostile lines;
the exit code stays that of the clean file (0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.vlm_tasks.score_files import score_file

runner = CliRunner()

DEEP = "[" * 200_000 + "]" * 200_000
DIGITS_5000 = "1" + "0" * 4999
DIGITS_400 = "1" + "0" * 399

# task -> (valid references, valid predictions, hostile reference lines, hostile prediction lines);
# every hostile line is (raw JSON text, a word its reason must contain)
CASES: dict[str, tuple[list[str], list[str], list[tuple[str, str]], list[tuple[str, str]]]] = {
    "vqa": (
        ['{"id": "q1", "question_type": "mc", "options": ["CT", "MRI"], "answer": "B"}',
         '{"id": "q2", "question_type": "yesno", "answer": "no"}',
         '{"id": "q3", "question_type": "yesno", "answer": "yes"}'],
        ['{"id": "q1", "prediction": "B"}',
         '{"id": "q2", "prediction": "", "logprobs": {"yes": -2.0, "no": -0.5}}',
         '{"id": "q3", "prediction": "no"}'],
        [(f'{{"id": "r1", "question_type": "yesno", "answer": "no", "x": {DEEP}}}', "nest"),
         (DEEP, "nest"),
         (f'{{"id": "r2", "question_type": "yesno", "answer": "no", "n": {DIGITS_5000}}}', "digits"),
         (f'{{"id": {DIGITS_5000}, "question_type": "yesno", "answer": "no"}}', "digits"),
         ('{"id": "r3", "question_type": "mc", "options": ["CT", "MRI"], "answer": "AB"}', "answer"),
         ('{"id": "r4", "question_type": "mc", "options": ["CT", "MRI"], "answer": ""}', "answer"),
         ('{"id": "r5", "question_type": ["mc"], "answer": "A"}', "question_type"),
         ('{"id": "r6", "question_type": "mc", "options": "CT MRI", "answer": "A"}', "options"),
         ('{"id": {"a": 1}, "question_type": "yesno", "answer": "no"}', "id"),
         ('{"id": "r7", "question_type": "yesno", "answer": 1}', "answer")],
        [(f'{{"id": "q1", "prediction": "B", "x": {DEEP}}}', "nest"),
         (f'{{"id": "p1", "prediction": "yes", "logprobs": {{"yes": {DIGITS_400}, "no": -1}}}}', "logprobs"),
         (f'{{"id": "p2", "prediction": "yes", "logprobs": {{"yes": -{DIGITS_5000}, "no": -1}}}}', "digits"),
         ('{"id": "p3", "prediction": "yes", "logprobs": {"yes": 1e400, "no": -1}}', "logprobs"),
         ('{"id": "p4", "prediction": "yes", "logprobs": [1, 2]}', "logprobs"),
         ('{"id": "p5", "prediction": 5}', "prediction"),
         ('{"id": "p6", "prediction": {"text": "yes"}}', "prediction")],
    ),
    "grounding": (
        ['{"id": "g1", "box": [20, 10, 40, 30], "image_hw": [100, 100]}',
         '{"id": "g2", "box": [0, 0, 50, 50], "image_hw": [100, 100]}'],
        ['{"id": "g1", "prediction": "[20, 10, 40, 30]"}',
         f'{{"id": "g2", "prediction": "[0, 0, {DIGITS_400}, 50]"}}'],  # valid line: the text is scored
        [(f'{{"id": "b1", "box": [0, 0, {DIGITS_400}, 5], "image_hw": [10, 10]}}', "box"),
         (f'{{"id": "b2", "box": [-{DIGITS_400}, 0, 5, 5], "image_hw": [10, 10]}}', "box"),
         ('{"id": "b3", "box": [0, 0, 1e308, 5], "image_hw": [10, 10]}', "box"),
         (f'{{"id": "b4", "box": [0, 0, 5, 5], "image_hw": [{DIGITS_400}, 10]}}', "image_hw"),
         (f'{{"id": "b5", "box": [0, 0, 5, 5], "image_hw": [{DIGITS_5000}, 10]}}', "digits"),
         ('{"id": "b6", "box": [0, 0, NaN, 5], "image_hw": [10, 10]}', "box"),
         ('{"id": "b7", "box": "0, 0, 5, 5", "image_hw": [10, 10]}', "box"),
         ('{"id": "b8", "box": [0, 0, "5", 5], "image_hw": [10, 10]}', "box"),
         ('{"id": "b9", "box": [0, 0, 5, 5], "image_hw": [10.5, 10]}', "image_hw"),
         (f'{{"id": "b10", "box": {DEEP}, "image_hw": [10, 10]}}', "nest")],
        [('{"id": "g1", "prediction": "[1, 2, 3, 4]", "scale": ["0-1"]}', "scale"),
         ('{"id": "g1", "prediction": "[1, 2, 3, 4]", "scale": {"0-1": 1}}', "scale"),
         (f'{{"id": "g9", "prediction": null, "scale": {DEEP}}}', "nest")],
    ),
    "caption": (
        ['{"id": "c1", "references": ["a small lesion in the left lung"]}',
         '{"id": "c2", "references": ["no finding", "normal chest"]}'],
        ['{"id": "c1", "prediction": "a lesion in the left lung"}',
         '{"id": "c2", "prediction": "normal"}'],
        [('{"id": "d1", "references": "one string"}', "references"),
         ('{"id": "d2", "references": [1, 2]}', "references"),
         (f'{{"id": "d3", "references": ["x"], "n": {DIGITS_5000}}}', "digits"),
         (f'{{"id": "d4", "references": {DEEP}}}', "nest")],
        [('{"id": "c1", "prediction": ["a", "lesion"]}', "prediction")],
    ),
}


def _interleave(valid: list[str], hostile: list[tuple[str, str]]) -> tuple[str, dict[int, str]]:
    """File text with the hostile lines between the valid ones, and line number -> reason word."""
    lines: list[str] = []
    expect: dict[int, str] = {}
    for i in range(max(len(valid), len(hostile))):
        if i < len(hostile):
            lines.append(hostile[i][0])
            expect[len(lines)] = hostile[i][1]
        if i < len(valid):
            lines.append(valid[i])
    return "\n".join(lines) + "\n", expect


@pytest.mark.parametrize("task", sorted(CASES))
def test_every_hostile_line_is_reported_and_the_rest_is_scored(task: str, tmp_path: Path) -> None:
    refs_ok, preds_ok, refs_bad, preds_bad = CASES[task]
    clean_refs, clean_preds = tmp_path / "clean_refs.jsonl", tmp_path / "clean_preds.jsonl"
    clean_refs.write_text("\n".join(refs_ok) + "\n")
    clean_preds.write_text("\n".join(preds_ok) + "\n")
    refs_text, refs_expect = _interleave(refs_ok, refs_bad)
    preds_text, preds_expect = _interleave(preds_ok, preds_bad)
    refs, preds = tmp_path / "refs.jsonl", tmp_path / "preds.jsonl"
    refs.write_text(refs_text)
    preds.write_text(preds_text)

    res = runner.invoke(app, ["score", task, "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 0, res.output[-2000:]
    out = json.loads(res.stdout)
    clean = score_file(task, clean_preds, clean_refs)  # type: ignore[arg-type]
    # the rest is scored exactly as without the hostile lines
    skip = {"n_invalid_lines", "invalid_lines", "n_unmatched_predictions"}
    assert {k: v for k, v in out.items() if k not in skip} == {k: v for k, v in clean.items() if k not in skip}
    # every hostile line is listed with its file, line and a reason naming the cause
    n_bad = len(refs_expect) + len(preds_expect)
    assert out["n_invalid_lines"] == n_bad
    listed = {(e["file"], e["line"]): e["reason"] for e in out["invalid_lines"]}
    expected = {("references", n): w for n, w in refs_expect.items()}
    expected.update({("predictions", n): w for n, w in preds_expect.items()})
    assert set(listed) == set(expected), (sorted(listed), sorted(expected))
    for where, word in expected.items():
        assert word in listed[where].lower(), (where, listed[where])
        assert len(listed[where]) < 300, listed[where]  # a reason, not the hostile line echoed back


def test_a_file_of_only_hostile_references_scores_nothing_and_exits_1(tmp_path: Path) -> None:
    refs = tmp_path / "refs.jsonl"
    refs.write_text(DEEP + "\n" + f'{{"id": "b1", "box": [0, 0, {DIGITS_400}, 5], "image_hw": [10, 10]}}\n')
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "b1", "prediction": "[0, 0, 5, 5]"}\n')
    res = runner.invoke(app, ["score", "grounding", "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 1, res.output[-2000:]  # documented: nothing was scored
    out = json.loads(res.stdout)
    assert out["n"] == 0 and out["n_invalid_lines"] == 2
