"""Grounding parsed and scored as the reference does (``parse_bbox_from_text``,
``extract_bbox_from_mask``, ``calculate_iou``), against fixtures from running those functions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.vlm_tasks.grounding_reference import (
    iou_reference,
    mask_box_reference,
    parse_box_reference,
    pixel_box_reference,
    score_grounding_reference,
)

DATA = json.loads((Path(__file__).parent / "fixtures" / "grounding_reference.json").read_text())


def _mask(row: dict) -> np.ndarray:  # type: ignore[type-arg]
    m = np.zeros(row["shape"], bool)
    if row["pixel_box"] is not None:
        x0, y0, x1, y1 = row["pixel_box"]
        m[y0:y1, x0:x1] = True
    return m


def test_parsed_boxes_equal_the_reference() -> None:
    assert [parse_box_reference(t) for t in DATA["texts"]] == DATA["parsed"]


def test_mask_boxes_equal_the_reference() -> None:
    for row in DATA["masks"]:
        assert mask_box_reference(_mask(row)) == row["box"]
        if row["pixel_box"] is not None:  # the project's pixel box maps onto the same 0-1 box
            assert pixel_box_reference(row["pixel_box"], row["shape"]) == pytest.approx(row["box"], abs=1e-12)


def test_ious_equal_the_reference() -> None:
    got = [iou_reference(a, m["box"]) for a in DATA["parsed"] for m in DATA["masks"]]
    assert got == pytest.approx(DATA["ious"], abs=1e-12)


def test_score_row_has_no_scale_reconciliation() -> None:
    gt = [20.0, 10.0, 60.0, 50.0]  # pixels, end exclusive, in a 100 x 100 image
    ok = score_grounding_reference("[0.2, 0.1, 0.59, 0.49]", gt, (100, 100))
    assert ok["outcome"] == "ok" and ok["iou"] == pytest.approx(1.0) and ok["correct"] == 1.0
    thousandths = score_grounding_reference("[200, 100, 590, 490]", gt, (100, 100))
    assert thousandths["outcome"] == "ok" and thousandths["iou"] == 0.0 and thousandths["box_scale"] == "0-1"
    assert score_grounding_reference("no box here", gt, (100, 100))["outcome"] == "unparseable"
    assert score_grounding_reference(None, gt, (100, 100))["outcome"] == "error"
