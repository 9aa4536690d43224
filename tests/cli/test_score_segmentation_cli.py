"""``medrobust score segmentation``: JSON summary on stdout, one line on stderr, per-file CSV with
--out; exit 1 when nothing was scored, 2 for a missing folder or an option of another task."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.tracks.segmentation.score_files import score_folders

runner = CliRunner()


def _png(path: Path, top: int, left: int, hw: tuple[int, int] = (20, 20)) -> None:
    m = np.zeros(hw, np.uint8)
    m[top:top + 10, left:left + 10] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), m)


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    p, r = tmp_path / "pred", tmp_path / "ref"
    _png(p / "a.png", 0, 0)
    _png(r / "a.png", 0, 5)  # IoU 1/3, Dice 1/2
    _png(p / "b.png", 0, 0, (20, 21))
    _png(r / "b.png", 0, 0)  # size mismatch
    _png(p / "c.png", 0, 0)  # no reference
    _png(r / "d.png", 0, 0)  # no prediction
    return p, r


def test_score_segmentation_prints_json_a_summary_line_and_writes_the_csv(folders: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    p, r = folders
    out = tmp_path / "o" / "scores.csv"
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(p), "--ref", str(r), "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary == score_folders(p, r).summary()
    assert res.stdout.strip() == json.dumps(summary, sort_keys=True, indent=2)
    assert summary["n"] == 1 and summary["mean_iou"] == pytest.approx(1 / 3) and summary["mean_dice"] == 0.5
    assert summary["n_errors"] == 1 and summary["errors"][0]["stem"] == "b"
    assert summary["unmatched_predictions"] == ["c.png"] and summary["missing_predictions"] == ["d.png"]
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "n=1 mean_iou=0.3333 mean_dice=0.5000 unmatched_predictions=1 missing_predictions=1 errors=1" in line
    rows = {row["stem"]: row for row in csv.DictReader(out.open())}
    assert set(rows) == {"a", "b", "c", "d"} and rows["a"]["dice"] == "0.5" and rows["b"]["status"] == "error"


def test_long_option_names_work_too(folders: tuple[Path, Path]) -> None:
    p, r = folders
    res = runner.invoke(app, ["score", "segmentation", "--predictions", str(p), "--references", str(r)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n"] == 1


def test_exit_codes(folders: tuple[Path, Path], tmp_path: Path) -> None:
    p, r = folders
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(empty), "--ref", str(r)])
    assert res.exit_code == 1 and json.loads(res.stdout)["n"] == 0 and "nothing was scored" in res.stderr
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(tmp_path / "nope"), "--ref", str(r)])
    assert res.exit_code == 2 and "predictions folder not found" in res.stderr
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(p)])
    assert res.exit_code == 2 and "required" in res.output
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(p), "--ref", str(r), "--scale", "0-1"])
    assert res.exit_code == 2 and "grounding only" in res.output
    refs = tmp_path / "refs.jsonl"
    refs.write_text('{"id": "c1", "references": ["a"]}\n')
    res = runner.invoke(app, ["score", "caption", "--predictions", str(refs), "--references", str(refs),
                              "--out", str(tmp_path / "x.csv")])
    assert res.exit_code == 2 and "segmentation only" in res.output
    res = runner.invoke(app, ["score", "segmentation", "--pred", str(p), "--ref", str(r), "--out", str(r / "a.png")])
    assert res.exit_code == 2 and "refusing to write" in res.stderr
