"""Grounding: parse a box from model text, detect its coordinate scale, score IoU (docs/design.md, section 5).

Boxes are XYXY ``(x0, y0, x1, y1)`` floats, x along the width. Pixel boxes use continuous
coordinates with an exclusive end: a box covering columns 0..9 is ``x0=0, x1=10``; area is
``(x1 - x0) * (y1 - y0)``. Image size is given as ``image_hw = (height, width)`` in pixels.

Scales (:data:`SCALES`): ``'0-1'`` (fractions of width/height), ``'0-1000'`` (Qwen-VL style
thousandths), ``'pixels'``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np

Box = tuple[float, float, float, float]
Scale = Literal["0-1", "0-1000", "pixels"]
SCALES: tuple[str, ...] = ("0-1", "0-1000", "pixels")
ACC_THRESHOLDS: tuple[float, ...] = (0.5, 0.75)

_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+))"
_SEP = r"\s*,\s*"
_PAIR = rf"\(\s*{_NUM}{_SEP}{_NUM}\s*\)"
_BOX_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(rf"<\|box_start\|>\s*{_PAIR}\s*,?\s*{_PAIR}\s*<\|box_end\|>"),
    re.compile(r"<box>(.*?)</box>", re.DOTALL),
    re.compile(rf"\[\s*{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}{_SEP}{_NUM}\s*\]"),
    re.compile(rf"{_PAIR}\s*(?:,|to|-)?\s*{_PAIR}"),
)
_NUM_RE = re.compile(_NUM)


def parse_box(text: str) -> Box | None:
    """The first box in ``text`` as ``(x0, y0, x1, y1)`` floats in the model's own scale, or None.

    Recognised forms (the one starting earliest in the text wins): Qwen-VL
    ``<|box_start|>(x0,y0),(x1,y1)<|box_end|>``; ``<box>...</box>`` holding four numbers in any
    bracketing (``<box>[x0, y0, x1, y1]</box>``, ``<box>(x0,y0),(x1,y1)</box>``); a bracketed list
    ``[x0, y0, x1, y1]``; two points ``(x0, y0), (x1, y1)`` (also joined by "to" or "-"). Numbers may
    be integers or decimals. The order of the corners is not checked here (see :func:`to_pixels`).
    """
    best: tuple[int, Box] | None = None
    for pat in _BOX_PATTERNS:
        for m in pat.finditer(text):
            if best is not None and m.start() >= best[0]:
                break
            if pat.pattern.startswith("<box>"):
                nums = _NUM_RE.findall(m.group(1))
                if len(nums) < 4:
                    continue
            else:
                nums = list(m.groups())
            b = (float(nums[0]), float(nums[1]), float(nums[2]), float(nums[3]))
            best = (m.start(), b)
            break
    return None if best is None else best[1]


def _check_hw(image_hw: Sequence[int]) -> tuple[int, int]:
    if len(image_hw) != 2 or min(image_hw) <= 0:
        raise ValueError(f"image_hw must be (height, width) with positive sizes, got {image_hw!r}")
    return int(image_hw[0]), int(image_hw[1])


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown box scale {scale!r}; valid choices: {', '.join(SCALES)}")


def detect_scale(box: Sequence[float], image_hw: Sequence[int], declared_scale: str | None = None) -> Scale:
    """Coordinate scale of a parsed box.

    ``declared_scale`` (from the model's manifest), when given, wins. Otherwise, in order:
    every value <= 1.0 -> ``'0-1'``; some value > max(height, width) and every value <= 1000 ->
    ``'0-1000'``; else ``'pixels'``.

    Ambiguity: for images of at most 1000 px a 0-1000 box whose values all fall inside the image
    (e.g. ``[100, 100, 400, 400]`` on a 512 px image) is read as pixels, and a pixel box inside the
    top-left 1x1 pixel corner is read as 0-1. Models with a known convention should declare it.
    Raises ValueError for a bad ``declared_scale`` or ``image_hw``.
    """
    h, w = _check_hw(image_hw)
    if declared_scale is not None:
        _check_scale(declared_scale)
        return declared_scale  # type: ignore[return-value]
    vals = [float(v) for v in box]
    if len(vals) != 4:
        raise ValueError(f"box must have 4 values (x0, y0, x1, y1), got {box!r}")
    if all(v <= 1.0 for v in vals):
        return "0-1"
    if any(v > max(h, w) for v in vals) and all(v <= 1000.0 for v in vals):
        return "0-1000"
    return "pixels"


def to_pixels(box: Sequence[float], scale: str, image_hw: Sequence[int]) -> Box:
    """Box in ``scale`` -> pixel XYXY (exclusive end) on an image of ``image_hw = (H, W)``.

    Corners are sorted so that ``x0 <= x1`` and ``y0 <= y1``, then clipped to ``[0, W]`` x
    ``[0, H]``. Raises ValueError for an unknown scale (valid: :data:`SCALES`).
    """
    _check_scale(scale)
    h, w = _check_hw(image_hw)
    x0, y0, x1, y1 = (float(v) for v in box)
    if scale == "0-1":
        x0, x1, y0, y1 = x0 * w, x1 * w, y0 * h, y1 * h
    elif scale == "0-1000":
        x0, x1, y0, y1 = x0 / 1000 * w, x1 / 1000 * w, y0 / 1000 * h, y1 / 1000 * h
    x0, x1 = sorted((min(max(x0, 0.0), w), min(max(x1, 0.0), w)))
    y0, y1 = sorted((min(max(y0, 0.0), h), min(max(y1, 0.0), h)))
    return (x0, y0, x1, y1)


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU in [0, 1] of two XYXY boxes in the same frame; degenerate boxes have area 0, and a
    zero union scores 0.0."""
    ax0, ay0, ax1, ay1 = (float(v) for v in a)
    bx0, by0, bx1, by1 = (float(v) for v in b)
    iw = max(0.0, min(ax1, bx1) - max(ax0, bx0))
    ih = max(0.0, min(ay1, by1) - max(ay0, by0))
    inter = iw * ih
    union = max(0.0, ax1 - ax0) * max(0.0, ay1 - ay0) + max(0.0, bx1 - bx0) * max(0.0, by1 - by0) - inter
    return inter / union if union > 0 else 0.0


def grounding_metrics(ious: Sequence[float | None]) -> dict[str, float | int]:
    """Acc@IoU>=0.5, Acc@IoU>=0.75 and mean IoU over samples; None (no box parsed) counts as a
    miss with IoU 0 and is also counted in ``n_unparseable``.

    Returns ``{"acc@0.5", "acc@0.75", "mean_iou"}`` (floats in [0, 1]) plus ``"n"`` and
    ``"n_unparseable"`` (ints). Raises ValueError on an empty list or IoUs outside [0, 1] / NaN.
    """
    if len(ious) == 0:
        raise ValueError("grounding_metrics needs at least one sample")
    vals = np.zeros(len(ious))
    n_unparseable = 0
    for i, v in enumerate(ious):
        if v is None:
            n_unparseable += 1
            continue
        if math.isnan(v) or not 0.0 <= v <= 1.0:
            raise ValueError(f"IoU values must lie in [0, 1] or be None, got {v!r} at index {i}")
        vals[i] = v
    out: dict[str, float | int] = {f"acc@{t:g}": float(np.mean(vals >= t)) for t in ACC_THRESHOLDS}
    out["mean_iou"] = float(np.mean(vals))
    out["n"] = len(ious)
    out["n_unparseable"] = n_unparseable
    return out


__all__ = [
    "ACC_THRESHOLDS",
    "SCALES",
    "Box",
    "Scale",
    "box_iou",
    "detect_scale",
    "grounding_metrics",
    "parse_box",
    "to_pixels",
]
