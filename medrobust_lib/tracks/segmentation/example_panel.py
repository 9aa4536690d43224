"""Worst-case example panel: one sample under one corruption, side by side.

Pure drawing (the caller runs the model; :mod:`medrobust_lib.tracks.segmentation.examples`):
five tiles of :data:`TILE` px, left to right: the clean image with its box prompt, the ground
truth, the clean prediction (with its IoU), the perturbed image with its box prompt (spatial types
move it), the perturbed prediction (with its IoU); a header line names model, type, level, SSIM
and sample. Images are float (H, W) or (H, W, 3) in [0, 1]; masks bool (H, W); boxes pixel XYXY.
"""

from __future__ import annotations

import cv2
import numpy as np

TILE = 192
HEADER_H = 40
GREEN = (40, 200, 40)
RED = (230, 40, 40)
BLUE = (60, 120, 255)


def _rgb(image: np.ndarray) -> np.ndarray:
    x = np.clip(np.asarray(image, np.float64), 0.0, 1.0)
    if x.ndim == 2:
        x = np.repeat(x[..., None], 3, axis=2)
    return (x * 255.0 + 0.5).astype(np.uint8)


def _fit(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    """The image scaled into a TILE x TILE tile (aspect kept, letterboxed), and the scale."""
    h, w = rgb.shape[:2]
    s = TILE / max(h, w)
    nh, nw = max(1, round(h * s)), max(1, round(w * s))
    tile = np.full((TILE, TILE, 3), 255, np.uint8)
    tile[:nh, :nw] = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_NEAREST)
    return tile, s


def _overlay(image: np.ndarray, mask: np.ndarray, color: tuple[int, int, int]) -> np.ndarray:
    rgb = _rgb(image).astype(np.float64)
    m = np.asarray(mask, bool)
    rgb[m] = 0.55 * rgb[m] + 0.45 * np.array(color, np.float64)
    return rgb.astype(np.uint8)


def _box(tile: np.ndarray, boxes: np.ndarray, scale: float) -> None:
    for x0, y0, x1, y1 in np.asarray(boxes, np.float64).reshape(-1, 4):
        cv2.rectangle(tile, (int(x0 * scale), int(y0 * scale)), (int(x1 * scale) - 1, int(y1 * scale) - 1), BLUE, 1)


def _caption(tile: np.ndarray, text: str) -> None:
    cv2.rectangle(tile, (0, TILE - 18), (TILE, TILE), (255, 255, 255), -1)
    cv2.putText(tile, text, (3, TILE - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 1, cv2.LINE_AA)


def example_panel(*, image: np.ndarray, mask: np.ndarray, boxes: np.ndarray, clean_pred: np.ndarray,
                  clean_iou: float, perturbed: np.ndarray, perturbed_mask: np.ndarray, perturbed_boxes: np.ndarray,
                  perturbed_pred: np.ndarray, perturbed_iou: float, title: str, subtitle: str) -> np.ndarray:
    """uint8 RGB (HEADER_H + TILE, 5 * TILE, 3): clean image, ground truth, clean prediction,
    perturbed image, perturbed prediction (module docstring). The ground-truth tile shows the
    clean mask; the perturbed prediction is scored against ``perturbed_mask`` (moved by a spatial
    type)."""
    tiles = []
    t, s = _fit(_rgb(image))
    _box(t, boxes, s)
    _caption(t, "clean image + box")
    tiles.append(t)
    t, _ = _fit(_overlay(image, mask, GREEN))
    _caption(t, "ground truth")
    tiles.append(t)
    t, _ = _fit(_overlay(image, clean_pred, RED))
    _caption(t, f"clean prediction IoU {clean_iou:.3f}")
    tiles.append(t)
    t, s = _fit(_rgb(perturbed))
    _box(t, perturbed_boxes, s)
    _caption(t, "perturbed image + box")
    tiles.append(t)
    t, _ = _fit(_overlay(perturbed, perturbed_pred, RED))
    _caption(t, f"perturbed prediction IoU {perturbed_iou:.3f}")
    tiles.append(t)
    canvas = np.full((HEADER_H + TILE, 5 * TILE, 3), 255, np.uint8)
    canvas[HEADER_H:] = np.concatenate(tiles, axis=1)
    cv2.putText(canvas, title, (4, 16), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(canvas, subtitle, (4, 34), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (60, 60, 60), 1, cv2.LINE_AA)
    return canvas


def png_bytes(rgb: np.ndarray) -> bytes:
    """A uint8 RGB array encoded as PNG."""
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:  # pragma: no cover - cv2 encodes any uint8 array
        raise ValueError("PNG encoding failed")
    return bytes(buf.tobytes())
