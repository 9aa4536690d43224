"""Shared array aliases and enumerations.

Image convention used everywhere in medrobust: ``float32`` arrays with values in ``[0, 1]``, shaped
``(H, W)`` for grayscale or ``(H, W, 3)`` for RGB. Masks are ``bool`` arrays of shape ``(H, W)``.
Boxes are ``float32`` arrays of shape ``(N, 4)`` in pixel ``XYXY`` order (x0, y0, x1, y1), with
x along columns and y along rows, the end coordinates exclusive (a one-pixel box at column 3,
row 5 is ``[3, 5, 4, 6]``).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatImage = npt.NDArray[np.float32]
"""float32, (H, W) or (H, W, 3), values in [0, 1]."""
BoolMask = npt.NDArray[np.bool_]
"""bool, (H, W)."""
Boxes = npt.NDArray[np.float32]
"""float32, (N, 4), pixel XYXY with exclusive end."""


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


def parse_modality(value: str) -> Modality:
    """Return the Modality for ``value`` or raise ValueError naming the valid choices."""
    try:
        return Modality(value.lower())
    except ValueError:
        raise ValueError(f"unknown modality {value!r}; valid: {', '.join(ALL_MODALITIES)}") from None
