"""Scoring mask folders made elsewhere: scores known by construction, the empty-reference policy,
the binarisation rules, and every problem as a row rather than an exception."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import cv2
import numpy as np
import pytest

from medrobust_lib.metrics.segmentation import EMPTY_GT_POLICY
from medrobust_lib.tracks.segmentation.score_files import CSV_COLUMNS, score_folders, stem_of, write_csv


def _square(top: int, left: int, size: int = 10, hw: tuple[int, int] = (30, 30)) -> np.ndarray:
    m = np.zeros(hw, bool)
    m[top:top + size, left:left + size] = True
    return m


def _png(path: Path, mask: np.ndarray, fg: int = 255) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.where(mask, fg, 0).astype(np.uint8))


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    p, r = tmp_path / "pred", tmp_path / "ref"
    p.mkdir()
    r.mkdir()
    return p, r


def test_half_overlapping_squares_score_a_third_and_a_half(dirs: tuple[Path, Path]) -> None:
    p, r = dirs
    _png(p / "case1.png", _square(5, 5))
    _png(r / "case1.png", _square(5, 10))  # 50 shared pixels of 100 + 100
    _png(p / "same.png", _square(0, 0))
    np.save(r / "same.npy", _square(0, 0))  # matched by stem across file kinds
    res = score_folders(p, r)
    by = {row.stem: row for row in res.rows}
    assert by["case1"].status == "ok" and by["case1"].iou == pytest.approx(1 / 3) and by["case1"].dice == 0.5
    assert (by["case1"].pred_pixels, by["case1"].ref_pixels, by["case1"].height, by["case1"].width) == (100, 100, 30, 30)
    assert by["same"].iou == 1.0 and by["same"].ref_file == "same.npy"
    s = res.summary()
    assert s["n"] == 2 and s["mean_iou"] == pytest.approx((1 / 3 + 1) / 2) and s["mean_dice"] == 0.75
    assert s["n_errors"] == 0 and s["empty_gt_policy"] == EMPTY_GT_POLICY


def test_empty_reference_policy(dirs: tuple[Path, Path]) -> None:
    p, r = dirs
    empty = np.zeros((12, 12), bool)
    _png(p / "both_empty.png", empty)
    _png(r / "both_empty.png", empty)
    _png(p / "pred_on_empty.png", _square(2, 2, 3, (12, 12)))
    _png(r / "pred_on_empty.png", empty)
    _png(p / "missed.png", empty)
    _png(r / "missed.png", _square(2, 2, 3, (12, 12)))
    by = {row.stem: row for row in score_folders(p, r).rows}
    assert (by["both_empty"].iou, by["both_empty"].dice) == (1.0, 1.0)
    assert (by["pred_on_empty"].iou, by["pred_on_empty"].dice) == (0.0, 0.0)
    assert (by["missed"].iou, by["missed"].dice) == (0.0, 0.0)
    assert score_folders(p, r).summary()["n_empty_reference"] == 2


def test_binarisation_rules(dirs: tuple[Path, Path]) -> None:
    p, r = dirs
    ref = _square(0, 0, 2, (4, 4))  # the top-left 2 x 2
    prob = np.zeros((4, 4), np.float32)
    prob[:2, :2] = 0.51
    prob[2:, 2:] = 0.5  # exactly 0.5 is background (prob > 0.5)
    np.save(p / "prob.npy", prob)
    labels = np.zeros((4, 4), np.int16)
    labels[:2, :2] = 3  # integer arrays are label maps: label > 0
    np.save(p / "labels.npy", labels)
    _png(p / "label01.png", ref, fg=1)  # a {0, 1} PNG label map: == 1
    _png(p / "faint.png", ref, fg=100)  # lossless: any value > 0 is foreground, as for datasets
    for stem in ("prob", "labels", "label01", "faint"):
        _png(r / f"{stem}.png", ref)
    res = score_folders(p, r)
    by = {row.stem: row for row in res.rows}
    assert by["prob"].iou == by["labels"].iou == by["label01"].iou == by["faint"].iou == 1.0
    rules = res.summary()["rules"]
    assert rules[".npy float: probability > 0.5"] == 1 and rules[".npy integer: label > 0"] == 1
    assert sum(rules.values()) == 8  # every file read once
    strict = {row.stem: row for row in score_folders(p, r, mask_threshold=127).rows}
    assert strict["faint"].iou == 0.0 and strict["faint"].pred_pixels == 0 and strict["label01"].iou == 1.0


def test_unmatched_mismatched_and_unreadable_files_are_rows(dirs: tuple[Path, Path]) -> None:
    p, r = dirs
    _png(p / "ok.png", _square(0, 0))
    _png(r / "ok.png", _square(0, 0))
    _png(p / "only_pred.png", _square(0, 0))
    _png(r / "only_ref.png", _square(0, 0))
    _png(p / "size.png", _square(0, 0, hw=(30, 31)))
    _png(r / "size.png", _square(0, 0))
    (p / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    _png(r / "broken.png", _square(0, 0))
    _png(p / "dup.png", _square(0, 0))
    np.save(p / "dup.npy", _square(0, 0))
    _png(r / "dup.png", _square(0, 0))
    np.save(p / "logits.npy", np.full((30, 30), 3.0, np.float32))
    _png(r / "logits.png", _square(0, 0))
    (p / "notes.txt").write_text("not a mask")
    (p / ".hidden.png").write_bytes(b"")
    (p / "sub").mkdir()
    res = score_folders(p, r)
    by = {row.stem: row for row in res.rows}
    assert by["ok"].status == "ok"
    assert by["only_pred"].status == "unmatched_prediction" and by["only_ref"].status == "missing_prediction"
    assert by["size"].status == "error" and "size mismatch" in by["size"].error and "(30, 31)" in by["size"].error
    assert by["broken"].status == "error" and by["broken"].error.startswith("prediction broken.png")
    assert by["dup"].status == "error" and "several files" in by["dup"].error
    assert by["logits"].status == "error" and "[0, 1]" in by["logits"].error
    s = res.summary()
    assert s["n"] == 1 and s["mean_iou"] == 1.0
    assert (s["n_errors"], s["n_unmatched_predictions"], s["n_missing_predictions"]) == (4, 1, 1)
    assert s["unmatched_predictions"] == ["only_pred.png"] and s["missing_predictions"] == ["only_ref.png"]
    assert s["ignored"] == ["predictions/notes.txt"]
    assert "n=1 mean_iou=1.0000" in res.summary_line() and "errors=4" in res.summary_line()
    buf = io.StringIO()
    assert write_csv(res, buf) == len(res.rows)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert tuple(rows[0]) == CSV_COLUMNS and {r["stem"] for r in rows} == set(by)
    assert next(r for r in rows if r["stem"] == "ok")["iou"] == "1.0"


def test_nothing_to_score_and_missing_folders(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    p, r = dirs
    s = score_folders(p, r).summary()
    assert s["n"] == 0 and s["mean_iou"] is None
    with pytest.raises(FileNotFoundError, match="predictions folder not found"):
        score_folders(tmp_path / "nope", r)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="references is not a folder"):
        score_folders(p, tmp_path / "file")
    with pytest.raises(ValueError, match="mask_threshold"):
        score_folders(p, r, mask_threshold=255)


def test_stem_of() -> None:
    assert stem_of("a.b.PNG") == "a.b" and stem_of("x.npy") == "x" and stem_of("case.nii.gz") == "case"
