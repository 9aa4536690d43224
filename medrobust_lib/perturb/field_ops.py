"""Helpers the perturbation families share for spatial fields (gain maps, masks, windows) and for
layers of discs (endoscopy and slide bubbles).

A family builds a field over the image plane, (H, W) (or (H, 1) / (1, W) for a row or column
profile), and applies it to a grayscale (H, W) or RGB (H, W, 3) float32 image in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


DiscLook = Callable[[tuple[int, int, int, int], Any, Any, Any], tuple[np.ndarray, np.ndarray]]
"""``look(box, cx, cy, r)`` -> (the disc's look over ``box`` = (y0, y1, x0, x1), its anti-aliased
edge weight in [0, 1], (y1 - y0, x1 - x0)); ``cx``, ``cy``, ``r`` are floats for one disc or
per-pixel float32 (y1 - y0, x1 - x0) arrays (each pixel's topmost disc)."""


def layer_discs(image: np.ndarray, cxy: np.ndarray, r: np.ndarray, coverage: float, look: DiscLook) -> np.ndarray:
    """Discs (centres ``cxy`` (N, 2) as (x, y), radii ``r`` (N,), pixels) laid over ``image`` in
    drawn order until their summed area reaches ``coverage`` pixels (:func:`coverage_opacity`):
    the disc that crosses it fades in beneath the others, then the fully opaque ones are blended
    at once, earlier discs on top (:func:`disc_labels`). Returns float32 of ``image``'s shape."""
    h, w = image.shape[:2]
    opacity = coverage_opacity(np.pi * r * r, coverage)
    n_full = int(np.count_nonzero(opacity >= 1.0))
    out: np.ndarray = image.copy()
    if n_full < len(r) and opacity[n_full] > 0:  # the partial disc fades in beneath the others
        cx, cy, rad = float(cxy[n_full, 0]), float(cxy[n_full, 1]), float(r[n_full])
        x0, x1 = max(int(np.floor(cx - rad - 1)), 0), min(int(np.ceil(cx + rad + 1)) + 1, w)
        y0, y1 = max(int(np.floor(cy - rad - 1)), 0), min(int(np.ceil(cy + rad + 1)) + 1, h)
        if x0 < x1 and y0 < y1:
            seen, edge = look((y0, y1, x0, x1), cx, cy, rad)
            a = per_pixel((edge * np.float32(opacity[n_full])).astype(np.float32), seen)
            out[y0:y1, x0:x1] += a * (seen - out[y0:y1, x0:x1])
    if n_full:  # opaque discs at once, on top of the partial one
        labels = disc_labels(h, w, cxy[:n_full, 0], cxy[:n_full, 1], r[:n_full])
        # one row per disc plus a far-away dummy for uncovered pixels (its disc edge is 0 there)
        bx = np.append(cxy[:n_full, 0], -1e4).astype(np.float32)
        by = np.append(cxy[:n_full, 1], -1e4).astype(np.float32)
        rr = np.append(r[:n_full], 1.0).astype(np.float32)
        seen, edge = look((0, h, 0, w), np.take(bx, labels), np.take(by, labels), np.take(rr, labels))
        out = out + per_pixel(edge, image) * (seen - out)
    return out.astype(np.float32)
