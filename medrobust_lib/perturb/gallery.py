"""Gallery PNG: perturbation types (rows) x severity levels (columns) for one sample.

Pure drawing: the caller passes the clean image and, per (type, level), the regenerated image with
its SSIM and band flag (:class:`GalleryCell`; :func:`medrobust_lib.tracks.perturbed_checks.modality_gallery`
builds them from the manifest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np


@dataclass(frozen=True)
class GalleryCell:
    """One tile: ``image`` float (H, W) or (H, W, C) in [0, 1], its ``ssim`` to the clean image and
    whether the level's SSIM band was reached."""

    image: np.ndarray
    ssim: float
    band_reached: bool

TILE = 128
LABEL_W = 190
HEADER_H = 22
TITLE_LINE_H = 18

MISSED_MARK = "!"
"""Caption suffix of a tile whose SSIM missed its level's band (left out of that level's means by default)."""


def gallery_title(dataset: str, sample_id: str, levels: Sequence[int]) -> tuple[str, ...]:
    """The lines a gallery prints above its grid: what it shows (dataset, sample, levels) and how to
    read a caption."""
    shown = ", ".join(f"L{lv}" for lv in levels)
    return (f"{dataset} / {sample_id}: every type at levels {shown}",
            f"caption: SSIM to clean; {MISSED_MARK} = missed its band (out of the level means)")


def gallery_image(clean: np.ndarray, cells: Mapping[str, Mapping[int, GalleryCell]],
                  levels: Sequence[int] = (1, 2, 3, 4, 5), title: Sequence[str] = ()) -> np.ndarray:
    """uint8 RGB (H, W, 3) grid: ``title`` lines first (if any), then one row per perturbation type
    (sorted) with the clean image first, then each level's tile, captioned with SSIM (a trailing
    :data:`MISSED_MARK` marks a missed band)."""
    types = sorted(cells)
    ncol = 1 + len(levels)
    top = TITLE_LINE_H * len(title)
    canvas = np.full((top + HEADER_H + TILE * max(len(types), 1), LABEL_W + TILE * ncol, 3), 255, np.uint8)
    for k, line in enumerate(title):
        _text(canvas, line, 4, TITLE_LINE_H * (k + 1) - 4)
    for j, head in enumerate(["clean"] + [f"L{lv}" for lv in levels]):
        _text(canvas, head, LABEL_W + j * TILE + 4, top + 16)
    clean_tile = _tile(clean)
    for i, t in enumerate(types):
        y = top + HEADER_H + i * TILE
        _text(canvas, t, 4, y + TILE // 2)
        canvas[y : y + TILE, LABEL_W : LABEL_W + TILE] = clean_tile
        for j, lv in enumerate(levels, start=1):
            cell = cells[t].get(lv)
            if cell is None:
                continue
            x = LABEL_W + j * TILE
            canvas[y : y + TILE, x : x + TILE] = _tile(cell.image)
            caption = f"{cell.ssim:.3f}" + ("" if cell.band_reached else MISSED_MARK)
            _text(canvas, caption, x + 3, y + TILE - 5, color=(255, 255, 0), bg=True)
    return canvas


def write_gallery(path: str | Path, clean: np.ndarray, cells: Mapping[str, Mapping[int, GalleryCell]],
                  levels: Sequence[int] = (1, 2, 3, 4, 5), title: Sequence[str] = ()) -> Path:
    """Draw :func:`gallery_image` and write it as a PNG at ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    img = gallery_image(clean, cells, levels, title)
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
