"""Boxes from masks and box rescaling. Boxes are float32 pixel XYXY with exclusive end."""

from __future__ import annotations

import numpy as np

from medrobust_lib.types import BoolMask, Boxes, InstanceMap


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


def components(mask: BoolMask, *, min_area: int = 1) -> InstanceMap:
    """int32 (H, W) instance map of the 8-connected components of ``mask`` with at least
    ``min_area`` pixels, labelled 1..N in the order of :func:`mask_to_boxes` (by (y0, x0));
    smaller components are background."""
    import cv2

    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    keep = [i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= min_area]
    keep.sort(key=lambda i: (int(stats[i, cv2.CC_STAT_TOP]), int(stats[i, cv2.CC_STAT_LEFT])))
    lut = np.zeros(n, np.int32)
    lut[keep] = np.arange(1, len(keep) + 1, dtype=np.int32)
    return lut[labels]


def relabel(labels: np.ndarray) -> InstanceMap:
    """An integer label map (any non-negative ids, gaps allowed) as an int32 instance map with
    ids 1..N ordered by each instance's box (y0, x0, then the old id); 0 stays background."""
    lab = np.asarray(labels)
    if lab.ndim != 2 or not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"instance labels must be an integer (H, W) array, got {lab.dtype} {lab.shape}")
    ids = np.unique(lab[lab > 0])
    order = []
    for i in ids:
        ys, xs = np.nonzero(lab == i)
        order.append((int(ys.min()), int(xs.min()), int(i)))
    order.sort()
    out = np.zeros(lab.shape, np.int32)
    for new, (_, _, old) in enumerate(order, start=1):
        out[lab == old] = new
    return out


def instance_boxes(instances: InstanceMap) -> Boxes:
    """float32 (N, 4) tight XYXY box (end exclusive) of each instance 1..N, in id order; an id
    with no pixel (moved out of view by a spatial perturbation) gives ``[nan, nan, nan, nan]``.
    N is the largest id present."""
    n = int(instances.max()) if instances.size else 0
    out = np.full((n, 4), np.nan, np.float32)
    for i in range(1, n + 1):
        box = mask_to_box(instances == i)
        if box is not None:
            out[i - 1] = box
    return out
