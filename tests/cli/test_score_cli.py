"""``medrobust score``: one sorted, indented JSON object on stdout; exit 2 for a missing file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.vlm_tasks.score_files import score_file

runner = CliRunner()


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_score_vqa_prints_one_sorted_json_object(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", [
        {"id": "q1", "question_type": "mc", "options": ["CT", "MRI"], "answer": "B"},
        {"id": "q2", "question_type": "yesno", "answer": "no"},
        {"id": "q3", "question_type": "yesno", "answer": "yes"},
    ])
    preds = _write(tmp_path / "preds.jsonl", [
        {"id": "q1", "prediction": "b"},
        {"id": "q2", "prediction": "", "logprobs": {"yes": -2.0, "no": -0.5}},
        {"id": "q4", "prediction": "yes"},
    ])
    res = runner.invoke(app, ["score", "vqa", "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 0, res.output
    expected = score_file("vqa", preds, refs)
    assert res.stdout.strip() == json.dumps(expected, sort_keys=True, indent=2)
    out = json.loads(res.stdout)
    assert out["accuracy"] == 2 / 3 and out["n_error"] == 1 and out["n_unmatched_predictions"] == 1


def test_score_grounding_scale_option(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", [{"id": "g1", "box": [20, 10, 40, 30], "image_hw": [100, 100]}])
    preds = _write(tmp_path / "preds.jsonl", [{"id": "g1", "prediction": "[20, 10, 40, 30]"}])
    args = ["score", "grounding", "--predictions", str(preds), "--references", str(refs)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # all values inside the image: detected as pixels
    assert out["mean_iou"] == 1.0 and out["box_scales"]["pixels"] == 1
    res = runner.invoke(app, [*args, "--scale", "0-1000"])  # declared: [2, 1, 4, 3] px
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["mean_iou"] == 0.0 and out["acc@0.5"] == 0.0 and out["box_scales"]["0-1000"] == 1
    res = runner.invoke(app, [*args, "--scale", "percent"])
    assert res.exit_code == 2


def test_score_missing_file_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    refs = _write(tmp_path / "refs.jsonl", [{"id": "c1", "references": ["a small lesion"]}])
    res = runner.invoke(app, ["score", "caption", "--predictions", str(tmp_path / "nope.jsonl"),
                              "--references", str(refs)])
    assert res.exit_code == 2
    assert "predictions file not found" in res.output and "nope.jsonl" in res.output
    res = runner.invoke(app, ["score", "vqa", "--predictions", str(refs), "--references", str(refs),
                              "--scale", "0-1"])
    assert res.exit_code == 2 and "grounding" in res.output
