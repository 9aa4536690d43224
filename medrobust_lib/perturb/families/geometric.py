"""Generic geometric (spatial) perturbations: rotation, scaling, translation.

Each function returns backward maps (see :func:`medrobust_lib.perturb.spec.affine_maps`); the spec
resamples the image bilinearly with a zero (black) border and warps the mask and boxes with the same
maps. The direction (sign of the angle, zoom in or out, shift direction) is drawn once from ``rng``
whatever the strength, so the levels of one sample differ in magnitude only.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from medrobust_lib.perturb.spec import affine_maps, perturbation
from medrobust_lib.types import FloatImage

FAMILY = "geometric"

Maps = tuple[np.ndarray, np.ndarray]


def _centre(h: int, w: int) -> tuple[float, float]:
    """Image centre (x, y) in pixel-centre coordinates."""
    return (w - 1) / 2.0, (h - 1) / 2.0


def rotation_matrix(h: int, w: int, angle_deg: float) -> np.ndarray:
    """Forward 2x3 matrix rotating by ``angle_deg`` degrees counter-clockwise (as displayed, y down)
    about the image centre."""
    return cv2.getRotationMatrix2D(_centre(h, w), float(angle_deg), 1.0)


@perturbation(
    "rotation",
    family=FAMILY,
    geometry="spatial",
    strength_range=(0.0, 45.0),
    levels=(0.45, 0.85, 1.5, 2.5, 4.0),
    reference="Rigid in-plane rotation about the image centre (patient / probe / slide orientation); "
    "Hendrycks & Dietterich 2019 (ImageNet-P)",
    unit="|angle| (degrees)",
)
def rotation(image: FloatImage, strength: float, rng: np.random.Generator) -> Maps:
    """Rotate by ``+/- strength`` degrees (0 to 45) about the image centre; the sign
    (counter-clockwise or clockwise) is drawn once from ``rng``. Corners coming into view are black.

    SSIM is very sensitive to misalignment: about 0.5-1 degree already gives L1-L2 on textured
    images. The range stops at 45 degrees because beyond it SSIM has flattened out (about 0.1-0.2 on
    textured images) and wiggles, and near 90 degrees a roughly symmetric image can look more
    similar again; smooth images (e.g. a phantom) may not reach L5 even at 45 degrees."""
    sign = 1.0 if rng.random() < 0.5 else -1.0
    h, w = image.shape[:2]
    return affine_maps(h, w, rotation_matrix(h, w, sign * strength))


@perturbation(
    "scaling",
    family=FAMILY,
    geometry="spatial",
    strength_range=(0.0, 1.0),
    levels=(0.011, 0.019, 0.032, 0.055, 0.1),
    reference="Isotropic magnification change about the image centre (field of view / pixel spacing "
    "mismatch), scale 2^(+/-s); Hendrycks & Dietterich 2019 (ImageNet-P)",
    unit="|log2 scale|",
)
def scaling(image: FloatImage, strength: float, rng: np.random.Generator) -> Maps:
    """Zoom about the image centre by ``2 ** (+/- strength)``; ``strength`` is ``|log2 scale|``
    (0 to 1, i.e. up to 2x in or out). Zoom in or out is drawn once from ``rng``. Zooming out
    leaves a black border."""
    sign = 1.0 if rng.random() < 0.5 else -1.0
    h, w = image.shape[:2]
    scale = 2.0 ** (sign * strength)
    return affine_maps(h, w, cv2.getRotationMatrix2D(_centre(h, w), 0.0, scale))


@perturbation(
    "translation",
    family=FAMILY,
    geometry="spatial",
    strength_range=(0.0, 0.25),
    levels=(0.0028, 0.0045, 0.008, 0.015, 0.027),
    reference="Rigid in-plane shift (patient positioning / cropping offset); Hendrycks & Dietterich "
    "2019 (ImageNet-P)",
    unit="shift (fraction of image size)",
)
def translation(image: FloatImage, strength: float, rng: np.random.Generator) -> Maps:
    """Shift by ``strength`` times the image size (0 to 0.25) along a direction drawn once from
    ``rng`` (uniform angle): ``dx = s W cos(phi)``, ``dy = s H sin(phi)`` pixels. The uncovered part
    is black."""
    phi = float(rng.uniform(0.0, 2.0 * math.pi))
    h, w = image.shape[:2]
    dx = strength * w * math.cos(phi)
    dy = strength * h * math.sin(phi)
    return affine_maps(h, w, np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]]))
