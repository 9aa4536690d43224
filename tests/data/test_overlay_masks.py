"""Masks from DICOM overlay planes (issue 29, item 7): the rule on synthetic overlays and on the
real Siemens MR overlay that pydicom-data installs, the reader option, evaluation-only datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pydicom
import pytest

from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.data.overlay_masks import (
    OverlayRule,
    overlay_components,
    place_overlay,
    structures_from_overlay,
)
from medrobust_lib.data.readers_dicom import DicomOptions
from medrobust_lib.data.splits import EVALUATION_SPLIT, split_for, split_of
from medrobust_lib.demo.real import REAL_FILES, installed_file
from medrobust_lib.tracks.datasets import clean_rows

SPEC = REAL_FILES[0]


def _outline_disk(plane: np.ndarray, cx: int, cy: int, r: int) -> np.ndarray:
    """Draw a 1-pixel circle outline (8-connected, as a viewer draws) and return the filled disk."""
    cv2.circle(plane, (cx, cy), r, 1, thickness=1, lineType=cv2.LINE_8)
    filled = np.zeros_like(plane)
    cv2.circle(filled, (cx, cy), r, 1, thickness=-1, lineType=cv2.LINE_8)
    return filled.astype(bool)


def test_rule_keeps_closed_outlines_and_drops_frames_text_and_open_strokes() -> None:
    plane = np.zeros((200, 200), np.uint8)
    disk = _outline_disk(plane, 60, 60, 20)                        # a traced structure: kept, filled
    cv2.rectangle(plane, (120, 120), (170, 160), 1, thickness=1)    # an axis-aligned frame: dropped
    cv2.circle(plane, (20, 180), 3, 1, thickness=1)                 # a closed glyph ("o"): too small
    cv2.line(plane, (100, 20), (180, 60), 1, thickness=1)           # an open stroke: dropped
    cv2.ellipse(plane, (60, 150), (25, 15), 0, 20, 300, 1, thickness=1)  # an open arc: dropped
    mask, comps = overlay_components(plane)
    assert np.array_equal(mask, disk)
    verdicts = sorted(c.verdict for c in comps)
    assert verdicts == ["kept", "open", "open", "rectangle", "small"]


def test_rotated_square_is_kept_and_thresholds_apply() -> None:
    plane = np.zeros((100, 100), np.uint8)
    pts = np.array([[50, 10], [90, 50], [50, 90], [10, 50]], np.int32)  # a square turned 45 degrees
    cv2.polylines(plane, [pts], True, 1, thickness=1)
    mask = structures_from_overlay(plane)
    assert mask.sum() > 3000 and mask[50, 50]
    assert not structures_from_overlay(plane, OverlayRule(min_area=mask.sum() + 1)).any()
    assert not structures_from_overlay(plane, OverlayRule(max_box_fill=0.4)).any()
    with pytest.raises(ValueError):
        OverlayRule(max_box_fill=0.0)


def test_place_overlay_at_origin() -> None:
    plane = np.ones((3, 4), np.uint8)
    out = place_overlay(plane, (2, 3), (5, 5))  # 1-based (row, column)
    assert out.sum() == 3 * 3 and out[1:4, 2:5].all()
    assert place_overlay(plane, (-10, 1), (5, 5)).sum() == 0
    assert np.array_equal(place_overlay(plane, (1, 1), (3, 4)), plane.astype(bool))


def test_real_siemens_overlay_gives_the_lesion_outline() -> None:
    """The 484 x 484 MR slice: the radiologist's closed outline (box x 46..81, y 239..274) is the
    only kept component; the frame around the "F" is a rectangle; the text "Tra" is dropped."""
    ds = pydicom.dcmread(str(installed_file(SPEC)))
    assert (ds.Rows, ds.Columns) == (484, 484) and ds[0x6000, 0x0022].value == "Siemens MedCom Object Graphics"
    plane = ds.overlay_array(0x6000)
    mask, comps = overlay_components(plane)
    kept = [c for c in comps if c.verdict == "kept"]
    assert len(kept) == 1 and kept[0].box == (46, 239, 81, 274) and int(mask.sum()) == kept[0].area
    assert mask.sum() > 4 * kept[0].drawn  # filled, not just the outline
    rect = [c for c in comps if c.verdict == "rectangle"]
    assert len(rect) == 1 and rect[0].box == (393, 393, 423, 423)
    assert all(c.box[1] < 150 for c in comps if c.verdict in ("open", "small"))  # the "Tra" text row


def _real_cfg(tmp_path: Path, **options: object) -> DatasetConfig:
    dst = tmp_path / "real" / "dicom" / "mr.dcm"
    dst.parent.mkdir(parents=True)
    shutil.copyfile(installed_file(SPEC), dst)
    return DatasetConfig(name="mr_real", modality="mri", format="dicom", root=str(tmp_path / "real"), size=None,
                         options={"image_dir": "dicom", "overlay_mask": True, **options}, evaluation_only=True)


def test_reader_takes_the_mask_from_the_overlay(tmp_path: Path) -> None:
    cfg = _real_cfg(tmp_path)
    refs, bad = index_dataset(cfg)
    assert not bad and len(refs) == 1
    s = load_sample(cfg, refs[0])
    assert s.image.shape == (484, 484) and s.mask is not None and s.mask.shape == (484, 484)
    expected = structures_from_overlay(pydicom.dcmread(str(installed_file(SPEC))).overlay_array(0x6000))
    assert np.array_equal(s.mask, expected)
    assert s.boxes is not None and s.boxes.tolist() == [[46.0, 239.0, 81.0, 274.0]]
    assert "overlay" in s.metadata["mask_rule"]


def test_evaluation_only_puts_every_sample_in_test(tmp_path: Path) -> None:
    cfg = _real_cfg(tmp_path)
    rows = clean_rows(cfg)
    assert [(r["status"], r["split"]) for r in rows] == [("ok", "test")]
    ids = [f"s{i}" for i in range(50)]
    assert {split_of("d", i, evaluation_only=True) for i in ids} == {EVALUATION_SPLIT}
    assert [split_of("d", i) for i in ids] == [split_for("d", i) for i in ids]
    assert {split_for("d", i) for i in ids} != {"test"}  # the hash split would not have done it


def test_missing_overlay_is_quarantined(tmp_path: Path) -> None:
    from pydicom.data import get_testdata_file

    src = get_testdata_file("CT_small.dcm")
    assert src is not None
    (tmp_path / "d").mkdir()
    shutil.copyfile(src, tmp_path / "d" / "ct.dcm")
    cfg = DatasetConfig(name="no_overlay", modality="ct", format="dicom", root=str(tmp_path / "d"),
                        options={"overlay_mask": True})
    rows = clean_rows(cfg)
    assert [(r["status"], r["reason"]) for r in rows] == [("quarantined", "missing_overlay")]


def test_overlay_mask_and_mask_dir_are_exclusive() -> None:
    with pytest.raises(ValueError, match="two mask sources"):
        DicomOptions(overlay_mask=True, mask_dir="masks")
    with pytest.raises(ValueError):
        DicomOptions(overlay_mask=True, overlay_group=0x6001)
