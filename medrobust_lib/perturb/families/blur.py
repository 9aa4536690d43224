"""Generic optical blur: Gaussian (out of focus, scatter), linear motion, defocus (pillbox).

All kernels are built continuously from a float strength (anti-aliased line and disk), so a small
change of strength makes a small change of the image; at strength 0 every type is the identity.
The image border is extended by reflection (OpenCV's default ``BORDER_REFLECT_101``).

Reachability: blur leaves flat regions unchanged, so on smooth, low-texture images (lunar surface,
low-resolution MR, fundus with a large dark background) SSIM levels off at about 0.65-0.82 even at
the maximum strength and L4/L5 (sometimes L3) are flagged unreachable by calibration. On textured
images (natural, pathology, CT) all five bands are reached well inside the ranges.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import scipy.fft as sfft

from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "blur"

# Samples along the motion path; fixed (not strength-dependent) so the kernel is continuous in the
# length. 1025 samples keep the spacing under 0.1 pixel up to the cap of 96 pixels at 256 px; longer
# paths (the cap grows with the image) take 10 samples per pixel of length.
_MOTION_SAMPLES = 1025
_MOTION_SAMPLES_PER_PIXEL = 10


# Above this sigma (the cap at 256 px) Gaussian blur is computed exactly in the DCT-I domain
# (:func:`_gaussian_dct`) instead of OpenCV's truncated kernel, whose cost grows with sigma. Only
# images larger than 256 px reach it, so outputs at 256 px are unchanged.
_GAUSSIAN_DIRECT_MAX_SIGMA = 24.0


# Kernels up to this size use OpenCV's direct filter2D; larger ones an FFT, which is 2-5x faster
# than filter2D's own DFT path on 256x256 images.
_DIRECT_MAX = 11


def _filter(image: FloatImage, kernel: np.ndarray) -> FloatImage:
    """Convolve (H, W) or (H, W, 3) with a square, odd-sized, point-symmetric kernel (so correlation
    equals convolution), extending the border by reflection (``BORDER_REFLECT_101``)."""
    k32 = kernel.astype(np.float32)
    if kernel.shape[0] <= _DIRECT_MAX:
        out = cv2.filter2D(image, ddepth=cv2.CV_32F, kernel=k32, borderType=cv2.BORDER_REFLECT_101)
        return np.asarray(out, np.float32).reshape(image.shape)
    h, w = image.shape[:2]
    r = kernel.shape[0] // 2
    padded = cv2.copyMakeBorder(image, r, r, r, r, cv2.BORDER_REFLECT_101).reshape(
        (h + 2 * r, w + 2 * r) + image.shape[2:])
    # A transform at least as large as the padded image never wraps into the pixels kept below.
    shape = (sfft.next_fast_len(h + 2 * r, real=True), sfft.next_fast_len(w + 2 * r, real=True))
    spectrum = sfft.rfft2(padded, s=shape, axes=(0, 1))
    kspec = sfft.rfft2(k32, s=shape)
    spectrum *= kspec if image.ndim == 2 else kspec[..., None]
    full = sfft.irfft2(spectrum, s=shape, axes=(0, 1))
    return np.ascontiguousarray(full[2 * r : 2 * r + h, 2 * r : 2 * r + w], dtype=np.float32)


@perturbation(
    "gaussian_blur",
    family=FAMILY,
    strength_range=(0.0, 24.0),
    levels=(0.9, 1.6, 2.4, 3.4, 4.8),
    reference="Gaussian point-spread function (lens aberration, scatter), G_sigma * x; "
    "Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="sigma (pixels)",
    scales_with_size=True,
    smoothing=True,
)
def gaussian_blur(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Isotropic Gaussian blur; ``strength`` is the PSF standard deviation in pixels, 0 to 24 on a
    256 px image (the cap grows with the image: ``spec.strength_range_for``).

    The kernel size follows from sigma (OpenCV truncates at 4 sigma for float images), so the
    output is continuous in sigma; sigma 0 is the identity. Above sigma 24 (reached only on images
    larger than 256 px) the blur is the untruncated Gaussian computed in the DCT-I domain
    (:func:`_gaussian_dct`; the same reflected border), whose cost does not grow with sigma and
    whose output tends to the image's mean as sigma grows. ``rng`` is not used.
    """
    if strength <= 0.0:
        return image.copy()
    if strength > _GAUSSIAN_DIRECT_MAX_SIGMA:
        return _gaussian_dct(image, float(strength))
    out = cv2.GaussianBlur(image, ksize=(0, 0), sigmaX=float(strength), sigmaY=float(strength),
                           borderType=cv2.BORDER_REFLECT_101)
    return np.asarray(out, np.float32).reshape(image.shape)


def _gaussian_dct(image: FloatImage, sigma: float) -> FloatImage:
    """Gaussian blur of (H, W) or (H, W, C) float32 with standard deviation ``sigma`` pixels on the
    image extended by whole-sample reflection (OpenCV's ``BORDER_REFLECT_101``), untruncated.

    That extension is periodic with period 2(n - 1) along an axis of n pixels, and its DFT is the
    DCT-I of the n pixels; convolving with the periodised sampled Gaussian multiplies DCT-I
    coefficient k by the Gaussian's transfer function at frequency k / (2 (n - 1)),
    ``exp(-(pi sigma k / (n - 1))^2 / 2)`` (its aliases are below 1e-300 for sigma > 1). Separable:
    one axis after the other. Returns float32 of the input's shape.
    """
    out = np.asarray(image, np.float64)
    for axis in (0, 1):
        n = out.shape[axis]
        k = np.arange(n, dtype=np.float64)
        gain = np.exp(-0.5 * (math.pi * sigma * k / (n - 1)) ** 2)
        shape = [1] * out.ndim
        shape[axis] = n
        out = sfft.idct(sfft.dct(out, type=1, axis=axis) * gain.reshape(shape), type=1, axis=axis)
    return np.ascontiguousarray(out, dtype=np.float32)


def motion_kernel(length: float, angle: float) -> np.ndarray:
    """Linear motion PSF: a segment of ``length`` pixels at ``angle`` radians, centred.

    The segment is sampled at a fixed number of points (1025, or 10 per pixel of length beyond 102.4
    pixels) and each point is splatted bilinearly onto
    the pixel grid, i.e. the kernel is the line integral of the bilinear (tent) interpolant. It is
    therefore continuous in ``length`` and ``angle`` and equals the delta kernel at length 0.
    Returns float64 ``(2R+1, 2R+1)`` summing to 1, point-symmetric about the centre.
    """
    radius = int(math.ceil(length / 2.0)) + 1
    size = 2 * radius + 1
    n = max(_MOTION_SAMPLES, int(math.ceil(length * _MOTION_SAMPLES_PER_PIXEL)) + 1)
    t = (np.arange(n, dtype=np.float64) + 0.5) / n - 0.5
    px = radius + length * t * math.cos(angle)
    py = radius + length * t * math.sin(angle)
    x0 = np.floor(px)
    y0 = np.floor(py)
    fx = px - x0
    fy = py - y0
    ix = x0.astype(np.int64)
    iy = y0.astype(np.int64)
    idx = np.concatenate([iy * size + ix, iy * size + ix + 1, (iy + 1) * size + ix, (iy + 1) * size + ix + 1])
    wts = np.concatenate([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy])
    kernel = np.bincount(idx, weights=wts, minlength=size * size).reshape(size, size)
    return kernel / kernel.sum()


@perturbation(
    "motion_blur",
    family=FAMILY,
    strength_range=(0.0, 96.0),
    levels=(4.0, 8.0, 12.0, 17.0, 24.0),
    reference="Uniform linear motion PSF (camera or patient motion during exposure); "
    "Gonzalez & Woods, Digital Image Processing, 4th ed., sec. 5.6",
    unit="blur length (pixels)",
    scales_with_size=True,
    smoothing=True,
    limit_extent=2.0,  # beyond 1024 px: a line twice the longer side (near the means along lines; 1 GB at 2048 px)
)
def motion_blur(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Linear motion blur along a random direction.

    ``strength`` is the length of the motion path in pixels (float, 0 to 96 on a 256 px image, the cap
    growing with the image); the path is centred
    on each pixel so objects do not shift. The direction is drawn once from ``rng`` (uniform over
    [0, 180) degrees) whatever the strength.
    """
    angle = float(rng.uniform(0.0, math.pi))
    if strength <= 0.0:
        return image.copy()
    return _filter(image, motion_kernel(float(strength), angle))


def disk_kernel(radius: float) -> np.ndarray:
    """Anti-aliased pillbox of ``radius`` pixels: weight ``clip(r + 0.5 - d, 0, 1)`` at distance ``d``
    from the centre, normalised to sum 1. Continuous in ``radius``; the delta kernel at 0."""
    half = int(math.ceil(radius + 0.5))
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float64)
    kernel = np.clip(radius + 0.5 - np.hypot(xx, yy), 0.0, 1.0)
    return kernel / kernel.sum()


@perturbation(
    "defocus_blur",
    family=FAMILY,
    strength_range=(0.0, 32.0),
    levels=(1.3, 2.5, 3.5, 4.8, 6.5),
    reference="Geometric-optics defocus: uniform disk (pillbox) PSF of the circle of confusion; "
    "Hendrycks & Dietterich 2019 (ImageNet-C)",
    unit="disk radius (pixels)",
    scales_with_size=True,
    smoothing=True,
)
def defocus_blur(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Defocus blur by a uniform disk PSF; ``strength`` is the radius of the circle of confusion in
    pixels (float, 0 to 32 on a 256 px image, the cap growing with the image), rendered as an
    anti-aliased disk. ``rng`` is not used."""
    if strength <= 0.0:
        return image.copy()
    return _filter(image, disk_kernel(float(strength)))
