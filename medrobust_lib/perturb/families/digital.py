"""Generic digital and display degradations: JPEG compression, pixelation, contrast, brightness,
saturation.

None of these rescales the image per image: a darkening stays dark, a contrast loss stays flat.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "digital"

# ITU-R BT.601 luma weights (as PIL's ImageEnhance.Color and JPEG's YCbCr use).
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


# As ImageMagick: chroma is not subsampled at quality >= 90 (4:4:4), 4:2:0 below.
_JPEG_FULL_CHROMA_QUALITY = 90


def _to_uint8(image: FloatImage) -> np.ndarray:
    return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)


@perturbation(
    "jpeg_compression",
    family=FAMILY,
    strength_range=(1.0, 100.0),
    levels=(70.0, 20.0, 8.0, 4.0, 2.0),
    reference="Lossy baseline JPEG (8x8 DCT quantisation with the IJG tables scaled by quality q; 4:2:0 "
    "chroma below q 90 as ImageMagick); ITU-T T.81, IJG libjpeg via OpenCV",
    inverse=True,
    integer=True,
    unit="JPEG quality (1-100, lower is stronger)",
)
def jpeg_compression(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Encode and decode as 8-bit JPEG at quality ``strength`` (integer 1..100; 100 is the weakest,
    1 the strongest). Grayscale is coded as one-channel JPEG, RGB as YCbCr with 4:4:4 chroma at
    quality >= 90 and 4:2:0 below (ImageMagick's rule). ``rng`` is not used.

    SSIM falls with quality overall but not strictly: flat black or near-black regions decode with a
    small, quality-dependent DC offset (the DC quantisation step does not divide the level-shifted
    black value), and SSIM is very sensitive to offsets near 0, so neighbouring qualities can
    swap order by up to a few hundredths on images with a black background.
    """
    quality = int(round(min(max(strength, 1.0), 100.0)))
    u8 = _to_uint8(image)
    if image.ndim == 3:
        u8 = cv2.cvtColor(u8, cv2.COLOR_RGB2BGR)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    if quality >= _JPEG_FULL_CHROMA_QUALITY:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444]
    ok, buf = cv2.imencode(".jpg", u8, params)
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    flag = cv2.IMREAD_COLOR if image.ndim == 3 else cv2.IMREAD_GRAYSCALE
    dec = cv2.imdecode(buf, flag)
    if dec is None:
        raise RuntimeError("JPEG decoding failed")
    if image.ndim == 3:
        dec = cv2.cvtColor(dec, cv2.COLOR_BGR2RGB)
    return dec.astype(np.float32).reshape(image.shape) * np.float32(1.0 / 255.0)


def _cells(n: int, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Cell boundaries (clipped to [0, n]) and the cell index of every pixel along one axis, for cells
    ``factor`` pixels wide anchored at pixel ``n // 2``."""
    centre = n // 2
    first = math.floor((0.5 - centre) / factor)
    last = math.floor((n - 0.5 - centre) / factor)
    bounds = np.clip(centre + np.arange(first, last + 2) * factor, 0.0, float(n))
    index = np.floor((np.arange(n) + 0.5 - centre) / factor).astype(np.int64) - first
    return bounds, index


def _interp(table: np.ndarray, t: np.ndarray, axis: int) -> np.ndarray:
    """Linear interpolation of ``table`` (positions 0..n along ``axis``) at fractional positions
    ``t`` in [0, n]."""
    i = np.minimum(np.floor(t).astype(np.int64), table.shape[axis] - 2)
    shape = [1] * table.ndim
    shape[axis] = -1
    frac = (t - i).reshape(shape)
    lo = np.take(table, i, axis=axis)
    hi = np.take(table, i + 1, axis=axis)
    hi -= lo
    hi *= frac
    lo += hi
    return lo


def _cell_average(image: FloatImage, factor: float) -> FloatImage:
    """Replace every pixel by the mean of its ``factor x factor`` cell (fractional, grid anchored at
    the centre pixel); partly covered pixels count by their overlap area.

    The integral image of a piecewise-constant image is bilinear inside each pixel, so interpolating
    it at fractional cell corners gives exact cell sums, continuous in ``factor``.
    """
    h, w = image.shape[:2]
    by, cy = _cells(h, factor)
    bx, cx = _cells(w, factor)
    table = cv2.integral(image, sdepth=cv2.CV_64F).reshape((h + 1, w + 1) + image.shape[2:])
    corners = _interp(_interp(table, by, 0), bx, 1)
    sums = corners[1:, 1:] - corners[:-1, 1:] - corners[1:, :-1] + corners[:-1, :-1]
    area = np.outer(np.diff(by), np.diff(bx)).reshape(sums.shape[:2] + (1,) * (image.ndim - 2))
    means = (sums / area).astype(np.float32)
    return np.take(np.take(means, cy, axis=0), cx, axis=1)


@perturbation(
    "pixelate",
    family=FAMILY,
    strength_range=(1.0, 16.0),
    levels=(1.5, 2.5, 3.7, 5.5, 8.0),
    reference="Resolution loss: detector cells f pixels wide (area average) shown on the original "
    "grid (nearest neighbour), i.e. block pixelation; Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="cell size (pixels)",
    scales_with_size=True,
    smoothing=True,
    limit_extent=0.5,  # beyond 1024 px: cells of half the image: the four quadrant means, pixelate's limit
)
def pixelate(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Pixelation with cells of ``strength`` x ``strength`` pixels (float, 1 = identity, up to 16 on a
    256 px image; the cap grows with the image: 1 + 15 x :func:`~medrobust_lib.perturb.spec.cap_factor`).

    Equivalent to area down-sampling by the factor ``f`` and nearest-neighbour up-sampling back to
    the original size, but with a fractional cell size on a grid anchored at the image centre, so
    the output moves continuously with ``f`` (a cell partly covering a pixel weights it by the
    overlap). ``rng`` is not used.

    SSIM falls with ``f`` overall but can wiggle by a few thousandths where the cell grid happens to
    line up with the image content (e.g. an image up-sampled by an integer factor). Smooth images
    (lunar surface, fundus, low-resolution MR) level off at SSIM 0.6-0.8 and may not reach L5 within
    16-pixel cells.
    """
    f = max(float(strength), 1.0)
    if f == 1.0:
        return image.copy()
    return _cell_average(image, f)


@perturbation(
    "contrast",
    family=FAMILY,
    strength_range=(0.0, 0.95),
    levels=(0.1, 0.3, 0.48, 0.62, 0.74),
    reference="Linear contrast reduction toward the mean, m + (x - m)(1 - s) (window/level or display "
    "gain loss); Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="fraction of contrast removed",
)
def contrast(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Contrast loss: ``m + (x - m) * (1 - s)`` with ``m`` the per-channel image mean.

    ``strength`` ``s`` is the fraction of contrast removed, 0 (identity) to 0.95. The mean
    intensity (and colour) is kept. ``rng`` is not used. On images that already have low contrast
    (e.g. a lunar surface) SSIM stays above about 0.8 and only L1-L2 are reachable; on images with
    a black background SSIM falls fast, because the background is lifted toward the mean.
    """
    m = np.asarray(cv2.mean(image)[: 1 if image.ndim == 2 else 3], np.float32)
    # written as x - s (x - m), which is exactly x at s = 0
    return image - (image - m) * np.float32(strength)


@perturbation(
    "brightness",
    family=FAMILY,
    strength_range=(0.0, 0.8),
    levels=(0.045, 0.1, 0.18, 0.27, 0.37),
    reference="Additive intensity offset x +/- b with clipping (exposure / display brightness error); "
    "Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="|shift| (intensity, image range 0-1)",
)
def brightness(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Brightness shift by ``+/- strength`` (0 to 0.8 on the [0, 1] scale), clipped to [0, 1].

    The sign is drawn once from ``rng`` (darker or brighter with probability 1/2 each), whatever the
    strength. Darkening a dark medical image clips its shadows to black quickly, brightening
    saturates the highlights; both are kept as is (no per-image rescaling).
    """
    sign = np.float32(1.0 if rng.random() < 0.5 else -1.0)
    return image + sign * np.float32(strength)


@perturbation(
    "saturation",
    family=FAMILY,
    strength_range=(0.0, 1.0),
    levels=(0.1, 0.17, 0.26, 0.4, 0.65),
    reference="Chroma scaling about BT.601 luma, Y + k (x - Y) (white balance / colour processing "
    "error), as PIL ImageEnhance.Color; Hendrycks & Dietterich 2019 (ImageNet-C)",
    channels="rgb",
    unit="s: chroma gain 1 - s (desaturate) or 1 + 9 s (over-saturate)",
)
def saturation(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Colour saturation change ``Y + k (x - Y)`` with ``Y`` the BT.601 luma; RGB only.

    The direction is drawn once from ``rng``: with probability 1/2 the image is desaturated,
    ``k = 1 - s`` (``s = 1`` is grayscale), otherwise over-saturated, ``k = 1 + 9 s`` (up to 10x
    chroma, clipped to [0, 1]; ImageNet-C goes to 20x). ``strength`` ``s`` is in [0, 1], 0 the
    identity.

    Desaturation keeps luma and therefore most structure: even full grayscale gives SSIM about
    0.83-0.95 on fundus, pathology and natural images, so for a sample whose draw is desaturation
    only L1 (sometimes L2) is reachable and the lower bands are flagged by calibration.
    Over-saturation reaches about 0.33-0.52 at ``s = 1``.
    """
    desaturate = rng.random() < 0.5
    gain = np.float32(-strength if desaturate else 9.0 * strength)  # k - 1
    y = (image @ _LUMA)[..., None]
    # written as x + (k - 1)(x - Y), which is exactly x at s = 0
    return (image + (image - y) * gain).astype(np.float32, copy=False)
