"""Angiography (X-ray angiography, fluoroscopy) artifacts.

All random draws are made up front with a fixed count and shape, independent of the strength
(common random numbers); strength only scales.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "angio"
MODALITIES = ("angiography",)

HAZE_GRID = 4
HAZE_RANGE = (0.7, 1.0)
"""Range of the airlight (veil) brightness."""


def haze_airlight(rng: np.random.Generator, h: int, w: int) -> npt.NDArray[np.float32]:
    """Drawn smooth airlight field A in [0.7, 1]: a ``HAZE_GRID`` x ``HAZE_GRID`` grid of uniform
    draws, interpolated bicubically to (H, W) (veiling glare varies slowly across the field)."""
    lo, hi = HAZE_RANGE
    grid = rng.uniform(lo, hi, size=(HAZE_GRID, HAZE_GRID)).astype(np.float32)
    field = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(np.asarray(field, np.float32), lo, hi)


@perturbation(
    "haze", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.95),
    levels=(0.2, 0.4, 0.55, 0.7, 0.83), unit="veil fraction s (transmission 1 - s)",
    reference="Veiling glare / scattered haze as the atmospheric scattering model y = x (1 - s) + s A "
              "with airlight A (Koschmieder; He et al., CVPR 2009); image-intensifier veiling glare, "
              "Seibert et al., Radiology 1985",
)
def haze(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Veiling glare: ``y = x (1 - s) + s A`` with a drawn smooth airlight ``A`` in [0.7, 1].

    Contrast falls by ``1 - s`` everywhere and dark pixels (contrast-filled vessels, background)
    are lifted toward the bright veil more than bright ones. ``strength`` s in [0, 0.95] is the
    veil fraction. RGB images get the same gray veil on every channel."""
    h, w = image.shape[:2]
    airlight = haze_airlight(rng, h, w)
    s = np.float32(strength)
    veil = airlight[..., None] if image.ndim == 3 else airlight
    return (image * (1.0 - s) + s * veil).astype(np.float32)
