"""Ultrasound (B-mode) artifacts.

Geometry: a linear probe at the top edge, the beam travelling downwards, so depth is the row
index (axis 0) and lateral position the column. Intensities are log-compressed echo amplitudes in
[0, 1]. All random draws are made up front with a fixed count, independent of the strength
(common random numbers); strength only scales.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.perturb.field_ops import per_pixel, smoothstep
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "us"
MODALITIES = ("ultrasound",)

SHADOW_MAX = 3
TGC_SLIDERS = 8


def _lateral_window(w: int, centre: float, half: float, edge: float) -> npt.NDArray[np.float64]:
    """1 over [centre - half, centre + half] (columns), falling smoothly to 0 over ``edge``."""
    x = np.arange(w, dtype=np.float64)
    return smoothstep((half + edge / 2.0 - np.abs(x - centre)) / max(edge, 1e-6))  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# acoustic shadowing
# ---------------------------------------------------------------------------------------------


def shadow_geometry(rng: np.random.Generator, h: int, w: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """Drawn strong reflectors (like ribs or stones), ``SHADOW_MAX`` of them, one per third of
    the width, each 16 to 30% of the width wide, its surface a convex arc starting 10 to 40%
    deep. Returns per reflector the column slice (c0, c1) it covers, the surface row per column
    and the soft lateral weight per column in [0, 1]."""
    slot = w / SHADOW_MAX
    centre = (np.arange(SHADOW_MAX) + rng.uniform(0.35, 0.65, size=SHADOW_MAX)) * slot
    half = rng.uniform(0.08, 0.15, size=SHADOW_MAX) * w
    top = rng.uniform(0.1, 0.4, size=SHADOW_MAX) * h
    bulge = rng.uniform(0.0, 0.5, size=SHADOW_MAX)
    edge = 0.04 * w
    out = []
    for i in range(SHADOW_MAX):
        c0 = max(int(np.floor(centre[i] - half[i] - edge)), 0)
        c1 = min(int(np.ceil(centre[i] + half[i] + edge)) + 1, w)
        x = np.arange(c0, c1, dtype=np.float64)
        u = np.clip((x - centre[i]) / half[i], -1.0, 1.0)
        depth = top[i] + bulge[i] * half[i] * (1.0 - np.sqrt(1.0 - u * u))
        lateral = smoothstep((half[i] + edge / 2.0 - np.abs(x - centre[i])) / edge)
        out.append((c0, c1, depth.astype(np.float32), lateral.astype(np.float32)))
    return out


@perturbation(
    "acoustic_shadowing", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 6.0),
    levels=(0.22, 0.42, 0.62, 0.85, 1.15), unit="attenuation below the reflector (nepers)",
    reference="Acoustic shadowing: a strongly reflecting/attenuating interface (bone, calculus, gas) "
              "transmits exp(-a) of the beam, darkening the region distal to it along the beam; "
              "Feldman et al., RadioGraphics 2009",
)
def acoustic_shadowing(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Dark shadows below three drawn strong reflectors.

    Each reflector (a convex arc, see ``shadow_geometry``) transmits ``exp(-a (1 + depth below
    it / image height))`` of the echo to every pixel beneath it along the beam (downwards), with
    soft lateral edges, and shows as a bright surface echo of strength ``1 - exp(-a)`` (a strong
    attenuator reflects strongly). ``strength`` a in [0, 6] is the attenuation in nepers right
    below the surface (6: under 0.3% transmitted, a clean black shadow). The shadows cover
    roughly half the image; on images with little texture there SSIM may stay above 0.5."""
    h, w = image.shape[:2]
    geometry = shadow_geometry(rng, h, w)
    if strength <= 0.0:
        return image.copy()
    atten, surface = shadow_fields(geometry, h, w)
    transmit = np.exp(np.float32(-strength) * atten)
    echo = np.float32(1.0 - np.exp(-strength)) * surface
    out = image * per_pixel(transmit, image)
    return (out + per_pixel(echo, image) * (1.0 - out)).astype(np.float32)


def shadow_fields(geometry: list[tuple[int, int, np.ndarray, np.ndarray]], h: int, w: int
                  ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The attenuation (nepers per unit strength) and surface-echo fields, float32 (H, W), of the
    reflectors of :func:`shadow_geometry` (:func:`acoustic_shadowing`)."""
    atten = np.zeros((h, w), np.float32)
    surface = np.zeros((h, w), np.float32)
    y = np.arange(h, dtype=np.float32)[:, None]
    inv_h = np.float32(1.0 / h)
    for c0, c1, depth, lateral in geometry:
        below = y - depth[None, :]
        onset = np.clip(below * np.float32(0.5) + np.float32(0.5), 0.0, 1.0)  # ~2 px soft onset
        atten[:, c0:c1] += onset * lateral * (1.0 + np.maximum(below, 0.0) * inv_h)
        hat = np.maximum(1.0 - np.abs(below) * np.float32(0.25), 0.0) * lateral
        np.maximum(surface[:, c0:c1], hat, out=surface[:, c0:c1])
    return atten, surface


# ---------------------------------------------------------------------------------------------
# reverberation
# ---------------------------------------------------------------------------------------------


def reverberation_draw(rng: np.random.Generator, h: int, w: int) -> tuple[int, float, npt.NDArray[np.float64]]:
    """Drawn near-field interface: its depth in rows (6 to 14% of the height), the echo
    thickness (sigma, 1.5 to 3 rows at 256) and the lateral profile (a soft extent of 75 to
    100% of the width times a speckle-like modulation in [0.6, 1])."""
    k = max(h, w) / 256.0
    depth = max(int(round(rng.uniform(0.06, 0.14) * h)), 2)
    thick = float(rng.uniform(1.5, 3.0) * k)
    extent = rng.uniform(0.75, 1.0) * w
    centre = rng.uniform(extent / 2.0, w - extent / 2.0)
    speck = rng.uniform(0.6, 1.0, size=w)
    speck = np.asarray(cv2.GaussianBlur(speck.reshape(1, -1), (0, 0), 2.0 * k), np.float64).ravel()
    profile = _lateral_window(w, centre, extent / 2.0, 0.08 * w) * speck
    return depth, thick, profile


@perturbation(
    "reverberation", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.99),
    levels=(0.75, 0.85, 0.9, 0.94, 0.97), unit="interface reflection coefficient R",
    reference="Reverberation: sound bouncing between the transducer and a strong near-field interface "
              "at depth d returns echoes at 2d, 3d, ... with amplitude R^k; Feldman et al., "
              "RadioGraphics 2009",
)
def reverberation(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Equally spaced echo copies of a drawn bright near-field interface.

    A horizontal interface at a drawn depth ``d`` (6 to 14% of the height) over a drawn lateral
    extent reflects with coefficient R = ``strength``; the k-th reverberation appears at depth
    ``k d`` with amplitude ``R^k`` (k = 1 is the interface itself), each a bright line plus a
    copy of the near-field band above the interface (the whole path is re-imaged). Echoes add
    to the image as ``y = 1 - (1 - x)(1 - e)``. ``strength`` R in [0, 0.99]: near 1 the
    echoes barely decay and fill the image. Most of the SSIM range lies above R = 0.7."""
    h, w = image.shape[:2]
    depth, thick, profile = reverberation_draw(rng, h, w)
    if strength <= 0.0:
        return image.copy()
    y = np.arange(h, dtype=np.float64)
    order = np.arange(1, h // depth + 2, dtype=np.float64)
    amp = strength**order  # R^k, k = 1, 2, ...
    lines = (amp[None, :] * np.exp(-0.5 * ((y[:, None] - order[None, :] * depth) / thick) ** 2)).sum(axis=1)
    # Rows of the k-th copy of the near-field band [0, d): y in [k d, (k + 1) d), k >= 1.
    band_order = np.floor(y / depth)
    band_amp = np.where(band_order >= 1, strength**band_order, 0.0)
    gray = image if image.ndim == 2 else image.mean(axis=2)
    band = gray[(np.arange(h) % depth)] * band_amp[:, None]
    echo = np.clip((lines[:, None] + band) * profile[None, :], 0.0, 1.0).astype(np.float32)
    e = per_pixel(echo, image)
    return (1.0 - (1.0 - image) * (1.0 - e)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# depth gain variation
# ---------------------------------------------------------------------------------------------


def tgc_profile(rng: np.random.Generator, h: int) -> npt.NDArray[np.float64]:
    """Drawn smooth TGC error over depth, max |profile| = 1: ``TGC_SLIDERS`` slider offsets
    uniform in [-1, 1] at equally spaced depths, interpolated and smoothed as a console does."""
    sliders = rng.uniform(-1.0, 1.0, size=TGC_SLIDERS)
    at = (np.arange(TGC_SLIDERS) + 0.5) / TGC_SLIDERS * h
    prof = np.interp(np.arange(h, dtype=np.float64), at, sliders)
    smooth = cv2.GaussianBlur(prof.reshape(-1, 1), (0, 0), h / (2.0 * TGC_SLIDERS), borderType=cv2.BORDER_REPLICATE)
    prof = np.asarray(smooth, np.float64).ravel()
    return prof / max(float(np.abs(prof).max()), 1e-12)


@perturbation(
    "depth_gain_variation", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 30.0),
    levels=(5.0, 8.0, 11.0, 15.0, 21.0), unit="largest gain error (dB)",
    reference="Time-gain compensation error: a wrong depth-dependent gain G(z) multiplies the echo "
              "amplitude row by row; Szabo, Diagnostic Ultrasound Imaging, 2nd ed. 2014",
)
def depth_gain_variation(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Wrong time-gain compensation: every row (depth) is multiplied by ``10 ** (strength *
    p(z) / 20)`` where ``p`` is a drawn smooth profile over depth with max |p| = 1 (eight
    slider offsets, interpolated). ``strength`` in [0, 30] is the largest gain error in dB, so
    some depths are too dark and others saturate."""
    h = image.shape[0]
    prof = tgc_profile(rng, h)
    gain = (10.0 ** (strength * prof / 20.0)).astype(np.float32)
    return (image * per_pixel(gain[:, None], image)).astype(np.float32)
