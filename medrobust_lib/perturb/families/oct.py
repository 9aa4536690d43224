"""Optical coherence tomography (and fundus) artifacts: vessel shadowing, blink, axial motion,
speckle and uneven illumination.

OCT B-scans are taken as rows = depth (axial, top is anterior) and columns = A-scans. Images are
usually grayscale ``(H, W)``; RGB ``(H, W, 3)`` is accepted and every field acts on all channels
alike. Every random quantity is drawn up front in a fixed number of draws so that strength only
scales or selects what was drawn (common random numbers).
"""

from __future__ import annotations

import cv2
import numpy as np

from medrobust_lib.perturb.field_ops import per_pixel, smoothstep
from medrobust_lib.perturb.spec import identity_maps, perturbation
from medrobust_lib.types import FloatImage

FAMILY = "oct"
OCT = ("oct",)


# --------------------------------------------------------------------------------------------
# Shadowing

_N_SHADOWS = 8


@perturbation(
    "oct_shadow",
    family=FAMILY,
    modalities=OCT,
    strength_range=(0.0, 1.0),
    levels=(0.09, 0.23, 0.345, 0.455, 0.58),
    reference="Shadowing artifact: A-scans below absorbing vessels/floaters lose signal (Beer-Lambert attenuation along the beam); Chhablani et al., Saudi J Ophthalmol 2014 (artifacts in OCT)",
    unit="shadow half-width (x 0.15 W per band) and attenuation 0.97 sqrt(strength), jointly",
)
def oct_shadow(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Vertical shadow bands: the signal of A-scans under a drawn absorber is attenuated from the
    absorber's depth down to the bottom of the scan.

    Eight bands are drawn (column centre, relative width, absorber depth 15-50 % of H).
    ``strength`` in [0, 1] sets each band's half-width to ``strength * 0.15 * W`` times its drawn
    relative width (0.5-1.5) and the attenuation inside to ``0.97 * sqrt(strength)`` (transmission
    down to 3 %); band edges are anti-aliased over 2 px and the shadow sets in over 3 px of depth.
    """
    h, w = image.shape[:2]
    centre = rng.uniform(0.0, 1.0, size=_N_SHADOWS) * w
    rel = rng.uniform(0.5, 1.5, size=_N_SHADOWS)
    depth = rng.uniform(0.15, 0.5, size=_N_SHADOWS) * h
    if strength <= 0:
        return image.copy()
    s = float(strength)
    atten = np.float32(0.97 * np.sqrt(s))
    xs = np.arange(w, dtype=np.float32)
    ys = np.arange(h, dtype=np.float32)
    trans = np.ones((h, w), np.float32)
    for c, r, d in zip(centre, rel, depth, strict=True):
        half = np.float32(s * 0.15 * w * r)
        across = smoothstep((half - np.abs(xs - np.float32(c))) / np.float32(2.0) + np.float32(0.5))
        below = smoothstep((ys - np.float32(d)) / np.float32(3.0))
        trans *= 1.0 - atten * below[:, None] * across[None, :]
    return (image * per_pixel(trans, image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Blink

_BLINK_FLOOR = 0.03  # fraction of the signal left in a lost A-scan (detection noise floor)


@perturbation(
    "oct_blink",
    family=FAMILY,
    modalities=OCT,
    strength_range=(0.0, 0.8),
    levels=(0.05, 0.147, 0.25, 0.353, 0.456),
    reference="Blink artifact: the eyelid blocks the beam and a run of A-scans/B-scans carries no signal; Chhablani et al., Saudi J Ophthalmol 2014",
    unit="lost band width as a fraction of the image width",
)
def oct_blink(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """A band of A-scans (columns) lost to near-black (3 % of the signal left).

    The band position is drawn once as a fraction ``u``; a band of width ``strength * W`` starts at
    ``u * (W - width)``, so bands of growing strength are nested. Edges are anti-aliased
    (sub-pixel widths), so the effect is continuous in strength (max 0.8 of the width).
    """
    h, w = image.shape[:2]
    u = float(rng.uniform(0.0, 1.0))
    if strength <= 0:
        return image.copy()
    width = float(strength) * w
    lo = u * (w - width)
    centre, half = lo + 0.5 * width, 0.5 * width
    xs = np.arange(w, dtype=np.float32) + np.float32(0.5)  # pixel centres
    # fraction of each column [x, x + 1) inside the band [lo, lo + width)
    lost = np.clip(np.float32(half + 0.5) - np.abs(xs - np.float32(centre)), 0.0, 1.0)
    lost = np.minimum(lost, np.float32(width))
    gain = 1.0 - np.float32(1.0 - _BLINK_FLOOR) * lost
    return (image * per_pixel(np.broadcast_to(gain[None, :], (h, w)), image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Axial motion

_MOTION_KNOTS = 10


@perturbation(
    "oct_motion",
    family=FAMILY,
    modalities=OCT,
    geometry="spatial",
    strength_range=(0.0, 30.0),
    levels=(1.3, 2.6, 4.25, 6.7, 10.9),
    reference="Axial eye motion between A-scans displaces each A-scan along depth (motion artifact); Kraus et al., Biomed Opt Express 2012 (motion correction in OCT)",
    unit="peak axial displacement in pixels",
    scales_with_size=True,
)
def oct_motion(image: FloatImage, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each A-scan (column) moves along depth by ``strength * d(x)`` pixels, ``d`` a smooth drawn
    profile with peak |d| = 1 (a cubic curve through 10 drawn knots plus a drawn tilt).

    Returns backward maps (``map_y = y + strength * d(x)``), so the mask and boxes move with the
    image; rows shifted in from outside are zero. ``strength`` is the peak displacement in
    pixels (0 = identity, max 30 on a 256 px image; the cap grows with the image).
    """
    h, w = image.shape[:2]
    knots = rng.normal(0.0, 1.0, size=_MOTION_KNOTS) + np.linspace(-1.0, 1.0, _MOTION_KNOTS) * rng.normal(0.0, 1.0)
    profile = cv2.resize(knots.astype(np.float32)[None, :], (w, 1), interpolation=cv2.INTER_CUBIC)[0]
    profile = profile / max(float(np.abs(profile).max()), 1e-6)
    map_x, map_y = identity_maps(h, w)
    if strength <= 0:
        return map_x, map_y
    map_y = map_y + np.float32(strength) * profile[None, :].astype(np.float32)
    return map_x, map_y.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Speckle

_SPECKLE_GRAIN = 0.7  # speckle grain (Gaussian correlation length of the field), pixels


@perturbation(
    "oct_speckle",
    family=FAMILY,
    modalities=OCT,
    strength_range=(0.0, 0.95),
    levels=(0.09, 0.16, 0.235, 0.32, 0.43),
    reference="Speckle: coherent sum of a specular phasor and a diffuse circular-Gaussian phasor sum, Rician/Rayleigh amplitude (Goodman, Speckle Phenomena in Optics, 2007; Schmitt et al., J Biomed Opt 1999)",
    unit="diffuse phasor amplitude c (c^2 = diffuse fraction of the backscattered power)",
)
def oct_speckle(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Multiplicative speckle with Rician amplitude statistics that become Rayleigh (fully
    developed speckle) at the strongest setting.

    A complex circular Gaussian field ``n`` (unit power, correlated over ~0.7 px) is drawn once.
    The amplitude multiplier is ``|sqrt(1 - c^2) + c * n|`` with ``c = strength`` (mean power 1):
    a specular phasor plus a diffuse one, ``c^2`` being the diffuse fraction of the backscattered
    power. 0 is the identity; the maximum 0.95 (diffuse power 90 %, intensity contrast 0.995) is
    fully developed speckle for all practical purposes (c = 1 would be exactly Rayleigh amplitude /
    exponential intensity; beyond 0.95 SSIM is flat and bright clipped areas make it wiggle).
    """
    h, w = image.shape[:2]
    field = rng.standard_normal(size=(2, h, w), dtype=np.float32)
    if strength <= 0:
        return image.copy()
    k1 = cv2.getGaussianKernel(5, _SPECKLE_GRAIN, cv2.CV_32F)
    norm = np.float32(1.0 / (np.sqrt(2.0) * float(np.sum(k1 * k1))))  # unit E|n|^2 after blur
    re = cv2.sepFilter2D(field[0], -1, k1, k1, borderType=cv2.BORDER_REFLECT) * norm
    im = cv2.sepFilter2D(field[1], -1, k1, k1, borderType=cv2.BORDER_REFLECT) * norm
    c = float(strength)
    re = re * np.float32(c) + np.float32(np.sqrt(1.0 - c * c))
    im = im * np.float32(c)
    amp = np.sqrt(re * re + im * im)
    return (image * per_pixel(amp, image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Uneven illumination


@perturbation(
    "uneven_illumination",
    family=FAMILY,
    modalities=("fundus", "oct"),
    strength_range=(0.0, 1.0),
    levels=(0.3, 0.455, 0.57, 0.66, 0.745),
    reference="Non-uniform illumination of the fundus (decentred pupil/illumination ring, media opacity), multiplicative shading model I = L * R; Foracchia et al., Med Image Anal 2005",
    unit="darkening amplitude (0 = none, 1 = black where the illumination field is lowest)",
)
def uneven_illumination(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """A smooth multiplicative illumination field ``1 - strength * (1 - L(p))``.

    ``L`` in (0, 1] is the relative illumination: a Gaussian fall-off around a drawn off-centre
    bright spot (sigma 15-35 % of the half-diagonal) times a linear gradient in a drawn direction
    (losing 30-60 % across the image), so part of the image stays lit and the rest darkens.
    ``strength`` in [0, 1] is the amplitude (0 = identity, 1 = the pure field ``L``); nothing is
    brightened.
    """
    h, w = image.shape[:2]
    px, py = rng.uniform(0.2, 0.8, size=2)
    width = rng.uniform(0.15, 0.35)
    theta = rng.uniform(0.0, 2 * np.pi)
    mix = rng.uniform(0.3, 0.6)
    if strength <= 0:
        return image.copy()
    half_diag = 0.5 * float(np.hypot(h, w))
    xs = (np.arange(w, dtype=np.float32) - np.float32(px * w)) / np.float32(half_diag)
    ys = (np.arange(h, dtype=np.float32) - np.float32(py * h)) / np.float32(half_diag)
    d2 = ys[:, None] ** 2 + xs[None, :] ** 2
    ramp = np.float32(np.cos(theta)) * xs[None, :] + np.float32(np.sin(theta)) * ys[:, None]
    ramp = np.clip(0.5 + 0.5 * ramp, 0.0, 1.0)
    lit = np.exp(-d2 / np.float32(2 * width * width)) * (1.0 - np.float32(mix) * ramp)
    gain = 1.0 - np.float32(strength) * (1.0 - lit)
    return (image * per_pixel(gain.astype(np.float32), image)).astype(np.float32)
