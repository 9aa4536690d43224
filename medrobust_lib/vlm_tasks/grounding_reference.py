"""Grounding as the reference benchmark parses and scores it (``grounding_parse: reference``).

The code published with the MedFM-Robust paper (``eval_vlm_perturbation.py``:
``parse_bbox_from_text``, ``extract_bbox_from_mask``, ``calculate_iou``) reads the **first four
numbers** matched by three patterns tried in order (a comma list, optionally bracketed; a
parenthesised comma list; four space-separated numbers), takes them as ``[x1, y1, x2, y2]`` in
**0-1 coordinates** with no scale detection (a 0-1000 or pixel box scores IoU 0 unless it happens
to overlap), and compares them with the mask's box ``[x1/w, y1/h, x2/w, y2/h]`` where ``x2, y2``
are the last foreground column and row (inclusive). Signs are not matched (``-0.1`` reads as
``0.1``). The functions here do the same; ``tests/reference_protocol/test_grounding_reference.py``
checks them against fixtures made by running the reference's functions
(``tools/reference_protocol_fixtures.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from medrobust_lib.types import BoolMask
from medrobust_lib.vlm_tasks.grounding import ACC_THRESHOLDS

_N = r"(\d+(?:\.\d+)?)"
_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(rf"\[?\s*{_N}\s*,\s*{_N}\s*,\s*{_N}\s*,\s*{_N}\s*\]?"),
    re.compile(rf"\(\s*{_N}\s*,\s*{_N}\s*,\s*{_N}\s*,\s*{_N}\s*\)"),
    re.compile(rf"{_N}\s+{_N}\s+{_N}\s+{_N}"),
)


def parse_box_reference(text: str | None) -> list[float] | None:
    """The reference's ``parse_bbox_from_text``: the four numbers of the first pattern (in the
    order above) that matches anywhere in ``text``, as floats; None when none matches."""
    if text is None:
        return None
    for pat in _PATTERNS:
        m = pat.search(text)
        if m:
            return [float(x) for x in m.groups()]
    return None


def mask_box_reference(mask: BoolMask) -> list[float] | None:
    """The reference's ``extract_bbox_from_mask`` on a mask array (H, W), foreground ``> 0``:
    ``[x1/w, y1/h, x2/w, y2/h]`` with inclusive last column/row ``x2, y2``; None for an empty mask."""
    m = np.asarray(mask) > 0
    h, w = m.shape
    rows, cols = np.any(m, axis=1), np.any(m, axis=0)
    if not rows.any() or not cols.any():
        return None
    y1, y2 = np.where(rows)[0][[0, -1]]
    x1, x2 = np.where(cols)[0][[0, -1]]
    return [float(x1 / w), float(y1 / h), float(x2 / w), float(y2 / h)]


def pixel_box_reference(box: Sequence[float], image_hw: Sequence[int]) -> list[float]:
    """A pixel XYXY box with exclusive end (the project's convention) in the reference's 0-1 form
    ``[x0/w, y0/h, (x1-1)/w, (y1-1)/h]``: equal to :func:`mask_box_reference` of the mask whose
    tight box it is."""
    h, w = int(image_hw[0]), int(image_hw[1])
    x0, y0, x1, y1 = (float(v) for v in box)
    return [x0 / w, y0 / h, (x1 - 1) / w, (y1 - 1) / h]


def iou_reference(a: Sequence[float] | None, b: Sequence[float] | None) -> float:
    """The reference's ``calculate_iou``: 0 for a missing box, no overlap or a non-positive union;
    corners are not reordered."""
    if a is None or b is None:
        return 0.0
    x1 = max(a[0], b[0])
    y1 = max(a[1], b[1])
    x2 = min(a[2], b[2])
    y2 = min(a[3], b[3])
    if x2 <= x1 or y2 <= y1:
        return 0.0
    inter = (x2 - x1) * (y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    if union <= 0:
        return 0.0
    return float(inter / union)


def score_grounding_reference(prediction: str | None, gt_box: Sequence[float],
                              image_hw: Sequence[int]) -> dict[str, Any]:
    """One grounding answer scored the reference's way against the pixel ground-truth box
    ``gt_box`` (XYXY, end exclusive): fields as :func:`medrobust_lib.vlm_tasks.scoring.score_grounding`
    (``box_scale`` is always ``'0-1'``; ``parsed`` the four numbers as JSON)."""
    out: dict[str, Any] = {"prediction": prediction, "parsed": None, "outcome": "error", "correct": 0.0,
                           "iou": 0.0, "acc_75": 0.0, "box_scale": None}
    if prediction is None:
        return out
    box = parse_box_reference(prediction)
    if box is None:
        out["outcome"] = "unparseable"
        return out
    iou = iou_reference(box, pixel_box_reference(gt_box, image_hw))
    out.update(parsed=json.dumps(box), outcome="ok", iou=iou, box_scale="0-1",
               correct=float(iou >= ACC_THRESHOLDS[0]), acc_75=float(iou >= ACC_THRESHOLDS[1]))
    return out
