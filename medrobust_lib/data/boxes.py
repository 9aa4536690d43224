"""Boxes from masks and box rescaling. Boxes are float32 pixel XYXY with exclusive end."""

from __future__ import annotations

import numpy as np

from medrobust_lib.types import BoolMask, Boxes


def mask_to_box(mask: BoolMask) -> np.ndarray | None:
    """Tight box over all foreground as float32 ``[x0, y0, x1, y1]`` (end exclusive), or None if empty."""
    ys = np.flatnonzero(mask.any(axis=1))
    if ys.size == 0:
        return None
    xs = np.flatnonzero(mask.any(axis=0))
    return np.array([xs[0], ys[0], xs[-1] + 1, ys[-1] + 1], np.float32)


def mask_to_boxes(mask: BoolMask, *, per_component: bool = False, min_area: int = 1) -> Boxes:
    """Boxes for a mask: one tight box over all foreground (default), or one per 8-connected
    component with at least ``min_area`` pixels, ordered by (y0, x0). Shape (N, 4); N = 0 if empty."""
    if not per_component:
        box = mask_to_box(mask)
        return np.zeros((0, 4), np.float32) if box is None else box[None, :]
    import cv2  # only the per-component split needs OpenCV; box prompts (and the config) stay light

    n, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    rows = []
    for i in range(1, n):
        x, y, w, h, area = stats[i]
        if area >= min_area:
            rows.append([x, y, x + w, y + h])
    rows.sort(key=lambda b: (b[1], b[0]))
    return np.asarray(rows, np.float32).reshape(-1, 4)


def rescale_boxes(boxes: Boxes, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> Boxes:
    """Rescale pixel XYXY boxes from an image of size ``src_hw`` to one of size ``dst_hw``."""
    sy = dst_hw[0] / src_hw[0]
    sx = dst_hw[1] / src_hw[1]
    return (np.asarray(boxes, np.float32) * np.array([sx, sy, sx, sy], np.float32)).astype(np.float32)
