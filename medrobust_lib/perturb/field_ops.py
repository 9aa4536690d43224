"""Helpers the perturbation families share for spatial fields (gain maps, masks, windows) and for
layers of discs (endoscopy and slide bubbles).

A family builds a field over the image plane, (H, W) (or (H, 1) / (1, W) for a row or column
profile), and applies it to a grayscale (H, W) or RGB (H, W, 3) float32 image in [0, 1].
"""

from __future__ import annotations

import cv2
import numpy as np


def per_pixel(field: np.ndarray, image: np.ndarray) -> np.ndarray:
    """``field`` (H, W), (H, 1) or (1, W) made broadcastable against ``image``: a trailing channel
    axis is added when ``image`` is (H, W, 3); returned unchanged (a view, same dtype) otherwise."""
    return field[..., None] if image.ndim == 3 else field


def smoothstep(t: np.ndarray) -> np.ndarray:
    """The cubic Hermite step 3t^2 - 2t^3 of ``t`` clipped to [0, 1]: 0 at t <= 0, 1 at t >= 1,
    zero slope at both ends. Same shape as ``t``; float64 for integer input, else ``t``'s dtype."""
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def disc_labels(h: int, w: int, cx: np.ndarray, cy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """int32 (H, W) index of the topmost disc covering each pixel, ``len(r)`` where none (earlier
    discs lie on top, so adding discs never changes pixels already covered)."""
    labels = np.full((h, w), len(r), np.int32)
    shift = 4  # sub-pixel centres and radii (1/16 px)
    fixed = np.round(np.stack([cx, cy, r], axis=1) * (1 << shift)).astype(np.int64).tolist()
    for i in range(len(fixed) - 1, -1, -1):  # earliest last, so it lies on top
        x, y, rad = fixed[i]
        cv2.circle(labels, (x, y), rad, i, -1, cv2.LINE_8, shift)
    return labels


def coverage_opacity(areas: np.ndarray, target: float) -> np.ndarray:
    """Opacity per item so that items are added in order until their summed area reaches
    ``target``; the item that crosses it is partially opaque (continuous in ``target``)."""
    before = np.concatenate([[0.0], np.cumsum(areas)[:-1]])
    return np.clip((target - before) / np.maximum(areas, 1e-9), 0.0, 1.0)
