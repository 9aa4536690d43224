"""Helpers the perturbation families share for spatial fields (gain maps, masks, windows).

A family builds a field over the image plane, (H, W) (or (H, 1) / (1, W) for a row or column
profile), and applies it to a grayscale (H, W) or RGB (H, W, 3) float32 image in [0, 1].
"""

from __future__ import annotations

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
