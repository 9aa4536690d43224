"""Gallery PNG: perturbation types (rows) x severity levels (columns) for one sample."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.engine import regenerate

TILE = 128
LABEL_W = 190
HEADER_H = 22


def gallery_image(sample: Sample, rows: Sequence[dict[str, Any]], levels: Sequence[int] = (1, 2, 3, 4, 5)) -> np.ndarray:
    """uint8 RGB (H, W, 3) grid: one row per perturbation type with the clean image first, then
    each level regenerated from its manifest row, captioned with SSIM (a trailing ``!`` marks a
    missed band). ``rows`` are manifest rows of this sample."""
    by_type: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r["sample_id"] == sample.sample_id and r["status"] == "ok":
            by_type.setdefault(str(r["perturbation"]), {})[int(r["level"])] = r
    types = sorted(by_type)
    ncol = 1 + len(levels)
    canvas = np.full((HEADER_H + TILE * max(len(types), 1), LABEL_W + TILE * ncol, 3), 255, np.uint8)
    for j, title in enumerate(["clean"] + [f"L{lv}" for lv in levels]):
        _text(canvas, title, LABEL_W + j * TILE + 4, 16)
    clean = _tile(sample.image)
    for i, t in enumerate(types):
        y = HEADER_H + i * TILE
        _text(canvas, t, 4, y + TILE // 2)
        canvas[y : y + TILE, LABEL_W : LABEL_W + TILE] = clean
        for j, lv in enumerate(levels, start=1):
            if lv not in by_type[t]:
                continue
            r = by_type[t][lv]
            x = LABEL_W + j * TILE
            canvas[y : y + TILE, x : x + TILE] = _tile(regenerate(r, sample).image)
            caption = f"{float(r['ssim']):.3f}" + ("" if r["band_reached"] else "!")
            _text(canvas, caption, x + 3, y + TILE - 5, color=(255, 255, 0), bg=True)
    return canvas


def write_gallery(path: str | Path, sample: Sample, rows: Sequence[dict[str, Any]],
                  levels: Sequence[int] = (1, 2, 3, 4, 5)) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    img = gallery_image(sample, rows, levels)
    cv2.imwrite(str(p), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 6])
    return p


def _tile(image: np.ndarray) -> np.ndarray:
    u8 = np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
    if u8.ndim == 2:
        u8 = np.repeat(u8[..., None], 3, axis=2)
    return np.asarray(cv2.resize(u8, (TILE, TILE), interpolation=cv2.INTER_AREA))


def _text(img: np.ndarray, s: str, x: int, y: int, color: tuple[int, int, int] = (0, 0, 0), bg: bool = False) -> None:
    if bg:
        cv2.putText(img, s, (x, y), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 3, cv2.LINE_AA)
    cv2.putText(img, s, (x, y), cv2.FONT_HERSHEY_SIMPLEX, 0.42, color, 1, cv2.LINE_AA)
