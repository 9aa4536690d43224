"""Dermoscopy acquisition artifacts: lens vignetting, specular glare from the contact plate and
occluding hair.

All types take RGB ``(H, W, 3)`` images and also accept grayscale ``(H, W)`` (the drawn colours
are then reduced to their Rec. 601 luma). Every random quantity (optical centre, spot positions
and shapes, every hair path) is drawn up front in a fixed number of draws, so strength only scales
or selects what was drawn (common random numbers).
"""

from __future__ import annotations

import cv2
import numpy as np

from medrobust_lib.perturb.field_ops import per_pixel
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "derm"
MODALITIES = ("dermoscopy",)
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _colour(image: FloatImage, rgb: np.ndarray) -> np.ndarray:
    """``rgb`` as a value broadcastable against ``image`` (luma for grayscale images)."""
    rgb = np.asarray(rgb, np.float32)
    return rgb if image.ndim == 3 else np.asarray(rgb @ _LUMA, np.float32)


# --------------------------------------------------------------------------------------------
# Vignetting


@perturbation(
    "vignetting",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 4.0),
    levels=(0.63, 0.87, 1.08, 1.28, 1.5),
    reference="Natural vignetting, cos^4 law of illumination falloff E = E0 cos^4(theta); Ray, Applied Photographic Optics (2002)",
    unit="tan of the field half-angle at the image corner",
)
def vignetting(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Radial darkening by the cos^4 law about a slightly off-centre optical axis.

    A pixel at normalised radius ``r`` (1 at the half-diagonal) receives the gain
    ``cos^4(atan(strength * r)) = 1 / (1 + (strength * r)^2)^2``, so ``strength`` is the tangent of
    the field half-angle seen at the image corner: 0 is the identity, 1 leaves 25 % of the light in
    the corners, 4 (the maximum) leaves under 10 % of the light beyond half the radius. The
    optical centre is drawn within about 5 % of the image size of the geometric centre.
    """
    h, w = image.shape[:2]
    cx, cy = rng.normal(0.0, 0.05, size=2)
    if strength <= 0:
        return image.copy()
    half_diag = 0.5 * float(np.hypot(h, w))
    xs = (np.arange(w, dtype=np.float32) - (w - 1) / 2 - float(cx) * w) / half_diag
    ys = (np.arange(h, dtype=np.float32) - (h - 1) / 2 - float(cy) * h) / half_diag
    r2 = ys[:, None] ** 2 + xs[None, :] ** 2
    gain = 1.0 / (1.0 + np.float32(strength * strength) * r2) ** 2
    return (image * per_pixel(gain.astype(np.float32), image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Specular light reflection (glare)

_N_SPOTS = 10


def _ellipse_alpha(h: int, w: int, spots: np.ndarray, scale: float) -> np.ndarray:
    """Union opacity of soft-edged ellipses. ``spots`` rows: cx, cy (pixels), semi-major a,
    semi-minor b (pixels before ``scale``), angle (rad), core radius ``lo`` < 1. The opacity is 1
    (saturated) inside normalised radius ``lo`` and falls to 0 (smoothstep) at radius 1."""
    keep = np.ones((h, w), np.float32)  # product of (1 - alpha_i): the light that is not glare
    for cx, cy, a, b, ang, lo in spots:
        a_s, b_s = a * scale, b * scale
        if a_s < 1e-3:
            continue
        reach = a_s + 1.0
        x0, x1 = max(int(np.floor(cx - reach)), 0), min(int(np.ceil(cx + reach)) + 1, w)
        y0, y1 = max(int(np.floor(cy - reach)), 0), min(int(np.ceil(cy + reach)) + 1, h)
        if x0 >= x1 or y0 >= y1:
            continue
        dx = np.arange(x0, x1, dtype=np.float32)[None, :] - np.float32(cx)
        dy = np.arange(y0, y1, dtype=np.float32)[:, None] - np.float32(cy)
        c, s = np.float32(np.cos(ang)), np.float32(np.sin(ang))
        u = (c * dx + s * dy) / np.float32(a_s)
        v = (-s * dx + c * dy) / np.float32(max(b_s, 1e-3))
        q = np.sqrt(u * u + v * v)
        t = np.clip((1.0 - q) / np.float32(1.0 - lo), 0.0, 1.0)
        alpha = t * t * (3 - 2 * t)
        keep[y0:y1, x0:x1] *= 1.0 - alpha
    return 1.0 - keep


@perturbation(
    "light_reflection",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 0.32),
    levels=(0.051, 0.1, 0.15, 0.204, 0.263),
    reference="Specular (Fresnel) reflection of the light source at the skin / contact-plate surface in non-polarised dermoscopy; Benvenuto-Andrade et al., Arch Dermatol 2007",
    unit="mean semi-major axis of the glare spots as a fraction of min(H, W)",
)
def light_reflection(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Bright elliptical glare spots blended toward near-white light.

    Ten spots are drawn (centres, relative sizes, aspect ratios, angles, saturated core radii
    40-75 % of the spot); ``strength`` is their mean semi-major axis as a fraction of
    ``min(H, W)`` (0 = identity, max 0.32). Each spot is fully saturated to the light colour in its
    core with a smooth edge, and grows with strength, so a pixel only ever moves toward the light
    colour as strength rises.

    The maximum is capped where spots start to merge into large flat saturated areas: there a
    soft glare edge over flat skin scores a lower SSIM than the uniform glare that replaces it, and
    SSIM would rise again. At 0.32 the SSIM is about 0.35-0.65 (median 0.48), so L5 is out of
    reach for roughly one draw in four, and calibration flags it.
    """
    h, w = image.shape[:2]
    n = _N_SPOTS
    centres = rng.uniform(0.08, 0.92, size=(n, 2))
    rel = rng.uniform(0.5, 1.5, size=n)
    aspect = rng.uniform(0.35, 1.0, size=n)
    angle = rng.uniform(0.0, np.pi, size=n)
    core = rng.uniform(0.4, 0.75, size=n)  # saturated core radius, fraction of the spot
    tint = 1.0 - rng.uniform(0.0, 0.06, size=3)  # light-source colour, close to white
    if strength <= 0:
        return image.copy()
    side = float(min(h, w))
    spots = np.stack(
        [centres[:, 0] * w, centres[:, 1] * h, rel * side, rel * aspect * side, angle, core], axis=1
    )
    alpha = _ellipse_alpha(h, w, spots, float(strength))
    light = _colour(image, tint)
    a = per_pixel(alpha, image)
    return (image + a * (light - image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Hair

_N_HAIRS = 100
_HAIR_POINTS = 24


def _hair_paths(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """(N, P, 2) float64 hair centrelines (x, y in pixels): quadratic Bezier curves with drawn
    start, direction, length and bend; many start outside the image, like real hairs."""
    n, p = _N_HAIRS, _HAIR_POINTS
    side = float(min(h, w))
    start = rng.uniform(-0.1, 1.1, size=(n, 2)) * np.array([w, h])
    theta = rng.uniform(0.0, 2 * np.pi, size=n)
    length = rng.uniform(0.3, 0.9, size=n) * side
    bend = rng.normal(0.0, 0.25, size=n) * length
    direction = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    normal = np.stack([-direction[:, 1], direction[:, 0]], axis=1)
    end = start + direction * length[:, None]
    ctrl = 0.5 * (start + end) + normal * bend[:, None]
    t = np.linspace(0.0, 1.0, p)[None, :, None]
    return (1 - t) ** 2 * start[:, None, :] + 2 * (1 - t) * t * ctrl[:, None, :] + t**2 * end[:, None, :]


@perturbation(
    "hair",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 1.0),
    levels=(0.083, 0.22, 0.35, 0.48, 0.63),
    reference="Occluding hair as dark curvilinear strands; DullRazor, Lee et al., Comput Biol Med 1997; hair simulation, Attia et al., Artif Intell Med 2020",
    unit="fraction of the 100 drawn strands (hair width grows with it)",
)
def hair(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Dark-brown curved hair strands drawn over the skin with anti-aliased edges.

    100 strands (curved paths, colour) are drawn up front. ``strength`` in [0, 1] is the fraction
    of them rendered, counted in total hair length (the last strand is drawn partially, so the
    effect is continuous), and the hair width grows with it from 1.5 to 6 px at a 256-pixel image
    (scaled with ``min(H, W)``). Hairs only ever add occlusion as strength rises.
    """
    h, w = image.shape[:2]
    paths = _hair_paths(h, w, rng)
    colour = np.array([0.22, 0.14, 0.09]) * rng.uniform(0.6, 1.1) + rng.uniform(-0.01, 0.01, size=3)
    if strength <= 0:
        return image.copy()
    n_full, frac = divmod(float(strength) * _N_HAIRS, 1.0)
    n_full = int(n_full)
    curves = [paths[i] for i in range(min(n_full, _N_HAIRS))]
    if n_full < _N_HAIRS and frac > 0:
        # the partial strand: its first `frac` of the path, ending at an interpolated point
        pos = frac * (_HAIR_POINTS - 1)
        k = int(np.floor(pos))
        tail = paths[n_full, k] + (pos - k) * (paths[n_full, min(k + 1, _HAIR_POINTS - 1)] - paths[n_full, k])
        curves.append(np.vstack([paths[n_full, : k + 1], tail[None, :]]))
    canvas = np.full((h, w), 255, np.uint8)
    shift = 4  # sub-pixel vertex precision (1/16 px)
    cv2.polylines(canvas, [np.round(c * (1 << shift)).astype(np.int32) for c in curves], False, 0, 1,
                  cv2.LINE_8, shift)
    dist = cv2.distanceTransform(canvas, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
    scale = min(h, w) / 256.0
    half_width = (0.75 + 2.25 * float(strength)) * scale
    alpha = np.clip(half_width + 0.5 - dist, 0.0, 1.0) * np.float32(0.95)
    a = per_pixel(alpha.astype(np.float32), image)
    return (image + a * (_colour(image, np.clip(colour, 0.0, 1.0)) - image)).astype(np.float32)
