"""Generic sensor and transmission noise: additive Gaussian, salt-and-pepper, speckle.

Every type draws its complete random field up front with a shape that depends on the image shape
only, never on the strength (common random numbers), and the strength merely scales or thresholds
that field. Values are left unclipped here; the spec clips the result to [0, 1].
"""

from __future__ import annotations

import numpy as np

from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "noise"


@perturbation(
    "gaussian_noise",
    family=FAMILY,
    strength_range=(0.0, 0.3),
    levels=(0.011, 0.019, 0.027, 0.036, 0.047),
    reference="Additive white Gaussian (thermal / read-out) noise x + n, n ~ N(0, sigma^2); "
    "Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="sigma (intensity, image range 0-1)",
    strength_is_intensity=True,
)
def gaussian_noise(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Additive white Gaussian noise, independent per pixel and channel.

    ``strength`` is the noise standard deviation ``sigma`` on the [0, 1] intensity scale,
    range 0 (identity) to 0.3.
    """
    n = rng.standard_normal(image.shape, dtype=np.float32)
    return image + np.float32(strength) * n


@perturbation(
    "salt_pepper_noise",
    family=FAMILY,
    strength_range=(0.0, 0.25),
    levels=(0.003, 0.0075, 0.014, 0.02, 0.028),
    reference="Impulse noise (dead/hot pixels, bit errors): a pixel is set to 0 or 1 with probability p; "
    "Gonzalez & Woods, Digital Image Processing, 4th ed., sec. 5.2",
    unit="fraction of pixels",
)
def salt_pepper_noise(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Impulse noise: a fraction ``strength`` (0 to 0.25) of the pixels is set to 0 or 1.

    Whole pixels are hit (all channels of an RGB pixel together, as for a dead or hot detector
    element), half of them white (salt) and half black (pepper). One uniform field decides which
    pixels are hit (``u < strength``) and a second one which value they take, both drawn at every
    strength, so a pixel hit at one strength stays hit, with the same value, at every stronger one.
    """
    h, w = image.shape[:2]
    u = rng.random((h, w), dtype=np.float32)
    salt = rng.random((h, w), dtype=np.float32) < 0.5
    hit = u < strength
    out = image.copy()
    out[hit & salt] = 1.0
    out[hit & ~salt] = 0.0
    return out


@perturbation(
    "speckle_noise",
    family=FAMILY,
    strength_range=(0.0, 2.0),
    levels=(0.033, 0.058, 0.095, 0.14, 0.2),
    reference="Multiplicative speckle noise x + x n, n ~ N(0, sigma^2); Goodman, Speckle Phenomena in "
    "Optics (2007); as in skimage.util.random_noise(mode='speckle')",
    unit="sigma (relative to the pixel value)",
)
def speckle_noise(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Multiplicative Gaussian speckle ``x + x * n`` with ``n ~ N(0, sigma^2)`` per pixel and channel.

    ``strength`` is ``sigma`` (dimensionless, relative to the pixel value), range 0 (identity) to 2.
    Black pixels stay black, so dark images need a larger sigma to reach a given SSIM; on images that
    are mostly exact black (e.g. a phantom on a zero background) SSIM levels off near 0.57 and L5
    may be unreachable.
    """
    n = rng.standard_normal(image.shape, dtype=np.float32)
    return image + image * (np.float32(strength) * n)
