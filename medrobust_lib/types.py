"""Shared array aliases and enumerations.

Image convention used everywhere in medrobust: ``float32`` arrays with values in ``[0, 1]``, shaped
``(H, W)`` for grayscale or ``(H, W, 3)`` for RGB. Masks are ``bool`` arrays of shape ``(H, W)``.
Boxes are ``float32`` arrays of shape ``(N, 4)`` in pixel ``XYXY`` order (x0, y0, x1, y1), with
x along columns and y along rows, the end coordinates exclusive (a one-pixel box at column 3,
row 5 is ``[3, 5, 4, 6]``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

import numpy as np
import numpy.typing as npt

FloatImage = npt.NDArray[np.float32]
"""float32, (H, W) or (H, W, 3), values in [0, 1]."""
BoolMask = npt.NDArray[np.bool_]
"""bool, (H, W)."""
Boxes = npt.NDArray[np.float32]
"""float32, (N, 4), pixel XYXY with exclusive end."""
InstanceMap = npt.NDArray[np.int32]
"""int32, (H, W): 0 background, 1..N one label per target instance (each gets its own box prompt)."""


class Modality(StrEnum):
    """Imaging modality groups; the values are partition keys and must stay stable."""

    CT = "ct"
    MRI = "mri"
    ULTRASOUND = "ultrasound"
    XRAY = "xray"
    FUNDUS = "fundus"
    OCT = "oct"
    PATHOLOGY = "pathology"
    DERMOSCOPY = "dermoscopy"
    ENDOSCOPY = "endoscopy"
    ANGIOGRAPHY = "angiography"


ALL_MODALITIES: tuple[str, ...] = tuple(m.value for m in Modality)
SEVERITY_LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
SSIM_BANDS: dict[int, tuple[float, float]] = {1: (0.90, 0.98), 2: (0.80, 0.89), 3: (0.70, 0.79), 4: (0.60, 0.69),
                                              5: (0.50, 0.59)}
"""Default SSIM band (low, high) per severity level (MedFM-Robust); a suite may set its own."""
DEFAULT_MAX_PIXELS: int = 64_000_000
"""Largest 2-D image (height x width, any channel count) a reader decodes: 64 megapixels (the
suite's ``max_pixels`` default)."""
AttackKind = Literal["fgsm", "pgd"]
ATTACK_KINDS: tuple[AttackKind, ...] = ("fgsm", "pgd")
"""The adversarial attacks (:mod:`medrobust_lib.attacks.linf`)."""
DEFAULT_STEP_SIZE_FACTOR = 2.5
"""PGD step size = factor * epsilon / steps (Madry et al.'s 2.5 eps / steps rule)."""
ATTACK_EPSILONS: dict[int, float] = {1: 2 / 255, 2: 4 / 255, 3: 6 / 255, 4: 8 / 255, 5: 10 / 255}
"""L-infinity attack budget per severity level, in [0, 1] pixel units."""
QUADRANTS: tuple[str, ...] = ("Ideal", "Fragile", "Dangerous", "Worst")
"""The taxonomy's quadrants (correct x consistent), in display order (docs/taxonomy.md)."""
IMAGE_MODES: tuple[str, ...] = ("none", "blank", "noise")
"""How the taxonomy removes the image: no image, a blank one, or noise."""


def parse_modality(value: str) -> Modality:
    """Return the Modality for ``value`` or raise ValueError naming the valid choices."""
    try:
        return Modality(value.lower())
    except ValueError:
        raise ValueError(f"unknown modality {value!r}; valid: {', '.join(ALL_MODALITIES)}") from None


def validate_bands(bands: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
    """Bands must be inside [0, 1], low <= high, and strictly lower for higher levels."""
    levels = sorted(bands)
    for lv in levels:
        lo, hi = bands[lv]
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"band for level {lv} must satisfy 0 <= low <= high <= 1, got {bands[lv]}")
    for a, b in zip(levels, levels[1:], strict=False):
        if bands[b][1] > bands[a][0]:
            raise ValueError(f"band of level {b} {bands[b]} must lie below band of level {a} {bands[a]}")
    return bands
