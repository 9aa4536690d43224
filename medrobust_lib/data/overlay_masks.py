"""Segmentation masks from DICOM overlay planes (graphics a reader drew on the image).

A DICOM overlay (repeating group ``0x60xx``, type ``G`` graphics) is a 1-bit plane of what a
viewer or a radiologist drew over the image: region outlines, but also annotation frames and
text. :func:`structures_from_overlay` turns such a plane into a mask of the outlined regions by
this rule (the defaults, :class:`OverlayRule`):

1. the overlay's set bits are the drawing; :func:`scipy.ndimage.binary_fill_holes` fills every
   closed contour (4-connected background, so an outline drawn with diagonal steps still closes);
2. the filled drawing is split into 8-connected components; a component is kept only if
   * it is **closed**: filling added at least ``min_interior`` pixels to it (an open stroke, a
     line or a single dot adds none);
   * it is **larger than text**: its filled area is at least ``min_area`` pixels (a viewer's
     annotation glyphs are about 8 x 8 pixels; the default 64 keeps any outlined region larger
     than one glyph's bounding box);
   * it is **not an axis-aligned rectangle**: its filled area is less than ``max_box_fill`` (0.95)
     of its bounding box (a frame drawn around text or a region of interest fills its box
     completely; a traced structure does not: a disk fills pi/4 = 0.785 of its box);
3. the kept components' filled pixels are the mask (bool, the overlay's shape).

A rotated rectangle is not caught by the rectangle test and is kept; text larger than
``min_area`` with closed letters ("O", "D") would be kept too, so raise ``min_area`` for overlays
with large lettering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from medrobust_lib.types import BoolMask


@dataclass(frozen=True)
class OverlayRule:
    """The thresholds of :func:`structures_from_overlay` (pixels of the overlay plane)."""

    min_area: int = 64
    min_interior: int = 1
    max_box_fill: float = 0.95

    def __post_init__(self) -> None:
        if self.min_area < 1 or self.min_interior < 1:
            raise ValueError(f"min_area and min_interior must be >= 1, got {self.min_area}, {self.min_interior}")
        if not 0.0 < self.max_box_fill <= 1.0:
            raise ValueError(f"max_box_fill must be in (0, 1], got {self.max_box_fill}")


@dataclass(frozen=True)
class OverlayComponent:
    """One filled component: pixel XYXY bounding box (end exclusive), filled ``area``, ``drawn``
    overlay pixels in it, ``box_fill`` = area / box area, and the rule's verdict (``kept`` or the
    reason it was dropped: ``open``, ``small``, ``rectangle``)."""

    box: tuple[int, int, int, int]
    area: int
    drawn: int
    box_fill: float
    verdict: str


def overlay_components(overlay: npt.ArrayLike, rule: OverlayRule = OverlayRule()
                       ) -> tuple[BoolMask, list[OverlayComponent]]:
    """The mask of :func:`structures_from_overlay` and every component with its verdict (in
    label order: row-major by first pixel).

    ``overlay``: (H, W) array, nonzero = drawn. Returns a bool (H, W) mask."""
    from scipy import ndimage as ndi

    drawn = np.asarray(overlay) != 0
    if drawn.ndim != 2:
        raise ValueError(f"an overlay plane is 2-D, got shape {drawn.shape}")
    filled = ndi.binary_fill_holes(drawn)
    labels, n = ndi.label(filled, structure=np.ones((3, 3), bool))
    mask = np.zeros(drawn.shape, bool)
    comps: list[OverlayComponent] = []
    for i, sl in enumerate(ndi.find_objects(labels), start=1):
        if sl is None:
            continue
        comp = labels[sl] == i
        area = int(comp.sum())
        n_drawn = int((drawn[sl] & comp).sum())
        h, w = comp.shape
        fill = area / float(h * w)
        if area - n_drawn < rule.min_interior:
            verdict = "open"
        elif area < rule.min_area:
            verdict = "small"
        elif fill >= rule.max_box_fill:
            verdict = "rectangle"
        else:
            verdict = "kept"
            mask[sl] |= comp
        comps.append(OverlayComponent((sl[1].start, sl[0].start, sl[1].stop, sl[0].stop), area, n_drawn,
                                      round(fill, 4), verdict))
    return mask, comps


def structures_from_overlay(overlay: npt.ArrayLike, rule: OverlayRule = OverlayRule()) -> BoolMask:
    """Bool (H, W) mask of the closed, non-rectangular, larger-than-text outlines of a DICOM
    overlay plane (H, W; nonzero = drawn), filled (the rule: module docstring)."""
    return overlay_components(overlay, rule)[0]


def place_overlay(plane: npt.ArrayLike, origin: tuple[int, int], shape: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """An overlay plane (h, w) placed on an image of ``shape`` (H, W) at the DICOM Overlay Origin
    (row, column; 1-based, may be < 1 or run past the image): the part outside is cut off."""
    src = np.asarray(plane) != 0
    out: npt.NDArray[np.bool_] = np.zeros(shape, bool)
    r0, c0 = int(origin[0]) - 1, int(origin[1]) - 1
    h, w = src.shape
    rs, cs = max(r0, 0), max(c0, 0)
    re, ce = min(r0 + h, shape[0]), min(c0 + w, shape[1])
    if rs < re and cs < ce:
        out[rs:re, cs:ce] = src[rs - r0:re - r0, cs - c0:ce - c0]
    return out
