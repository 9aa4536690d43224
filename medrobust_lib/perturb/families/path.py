"""Histopathology (brightfield whole-slide) artifacts: stain variation, air bubbles under the
coverslip and tissue folds.

Brightfield transmission follows Beer-Lambert: a pixel ``x`` in [0, 1] is ``exp(-OD)`` with the
optical density ``OD`` a sum over stains. The types work on that optical density, multiplying
transmissions instead of adding intensities. ``stain_variation`` needs RGB ``(H, W, 3)``; the
other two also accept grayscale ``(H, W)``. Every random quantity is drawn up front in a fixed
number of draws so that strength only scales or selects what was drawn (common random numbers).
"""

from __future__ import annotations

import cv2
import numpy as np

from medrobust_lib.perturb.field_ops import layer_discs, per_pixel, smoothstep
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "path"
MODALITIES = ("pathology",)

# Ruifrok & Johnston (2001) stain OD vectors, one row per stain (haematoxylin, eosin, DAB): the
# same matrix as skimage.color.rgb_from_hed.
RGB_FROM_HED = np.array([[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]], np.float64)
HED_FROM_RGB = np.linalg.inv(RGB_FROM_HED)
_OD_EPS = 1.0 / 512  # transmission floor before the log (half an 8-bit step)


# --------------------------------------------------------------------------------------------
# Stain variation

_STAIN_SHIFT = 1.0  # OD shift of a stain concentration per unit of the drawn direction


@perturbation(
    "stain_variation",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 3.0),
    levels=(0.44, 0.7, 0.97, 1.31, 1.61),
    reference="Stain variation in optical density space via Ruifrok-Johnston colour deconvolution (Anal Quant Cytol Histol 2001); HED jitter as in Tellez et al., Med Image Anal 2019",
    channels="rgb",
    unit="length of the drawn (log-scale, shift) direction in HED concentration space",
)
def stain_variation(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Per-stain scale and shift of the H, E and DAB/residual concentrations.

    The image is deconvolved into stain concentrations ``C`` (``OD = C @ RGB_FROM_HED``,
    ``OD = -ln x``). A unit direction ``(a, b)`` in 6-D is drawn once, with each ``b_i`` given the
    sign of ``a_i`` (so each stain only gains or only loses as strength grows); the perturbed
    concentrations are ``max(C * exp(strength * a) + strength * b, min(C, 0))`` (a per-stain
    log-scale and an OD shift that cannot take away stain that is not there), so
    ``strength`` (0 = identity, max 3) is the length of the move along the drawn direction. The
    result is re-composed as ``x * exp(-dOD)``, which is exact at 0 and keeps black pixels black.

    Draws that mostly move a stain the slide barely carries (eosin on an IHC slide, DAB on H&E)
    change little: for roughly one draw in ten L5 is out of reach at the maximum (calibration
    flags it); the range stops at 3 because beyond it near-black channels make SSIM wiggle.
    """
    d = rng.normal(0.0, 1.0, size=6)
    d = d / max(float(np.linalg.norm(d)), 1e-12)
    if strength <= 0:
        return image.copy()
    s = float(strength)
    od = -np.log(np.maximum(image.reshape(-1, 3), _OD_EPS).astype(np.float32))
    conc = od @ HED_FROM_RGB.astype(np.float32)
    scale = np.exp(s * d[:3]).astype(np.float32)
    # the shift takes the sign of the scale, so each stain only ever gains or only loses
    shift = (s * _STAIN_SHIFT * np.sign(d[:3]) * np.abs(d[3:])).astype(np.float32)
    # a negative shift removes stain only where there is some: no stain below zero (or below the
    # pixel's own slightly negative deconvolution residue)
    new = np.maximum(conc * scale + shift, np.minimum(conc, 0.0))
    d_od = (new - conc) @ RGB_FROM_HED.astype(np.float32)
    out = image.reshape(-1, 3) * np.exp(-d_od)
    return out.reshape(image.shape).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Air bubbles under the coverslip

_N_BUBBLES = 60
_GLASS = 0.94  # brightness of empty mounted glass


def _slide_bubble_look(
    image: FloatImage, blurred: FloatImage, box: tuple[int, int, int, int],
    bx: np.ndarray | float, by: np.ndarray | float, rr: np.ndarray | float,
) -> tuple[np.ndarray, np.ndarray]:
    """Appearance of bubble pixels in ``box`` = (y0, y1, x0, x1) and their anti-aliased disc
    coverage, for bubble centre/radius ``bx, by, rr`` (scalars or per-pixel arrays)."""
    y0, y1, x0, x1 = box
    rr32 = np.asarray(rr, np.float32)
    dx = np.arange(x0, x1, dtype=np.float32)[None, :] - np.asarray(bx, np.float32)
    dy = np.arange(y0, y1, dtype=np.float32)[:, None] - np.asarray(by, np.float32)
    dist = np.sqrt(dx * dx + dy * dy)  # pixels from the bubble centre
    rim_width = np.float32(0.1) * rr32 + np.float32(1.5)
    depth_in = (rr32 - dist) / rim_width  # 0 at the edge, 1 at the inner side of the rim
    rim = 1.0 - smoothstep(depth_in * np.float32(1.4) - np.float32(0.4))
    halo = np.maximum(1.0 - ((depth_in - np.float32(1.3)) * np.float32(2.5)) ** 2, 0.0)
    sub = image[y0:y1, x0:x1]
    washed = np.float32(_GLASS) + np.float32(0.4) * (blurred[y0:y1, x0:x1] - np.float32(_GLASS))
    washed = washed + per_pixel(np.float32(0.5) * halo, sub) * (1.0 - washed)
    look = washed * per_pixel(1.0 - np.float32(0.85) * rim, sub)
    edge = np.clip(rr32 - dist + np.float32(0.5), 0.0, 1.0)  # anti-aliased disc edge
    return look, edge


@perturbation(
    "slide_bubbles",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 1.5),
    levels=(0.07, 0.22, 0.4, 0.64, 0.9),
    reference="Air bubbles trapped in the mounting medium: refraction at the air/medium interface gives a dark rim, the tissue inside is defocused and washed out; Kanwal et al., 'The devil is in the details: WSI artifacts', 2022",
    unit="summed bubble disc area as a fraction of the image area",
)
def slide_bubbles(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Round air bubbles with thick dark refractive rims and washed-out, defocused interiors.

    60 bubbles (centres, radii log-uniform in 5-25 % of ``min(H, W)``) are drawn up front.
    ``strength`` is the nominal coverage: bubbles are added in drawn order until their summed disc
    area reaches ``strength`` times the image area (overlaps make the covered area smaller), the
    last one fading in beneath the others (earlier bubbles lie on top, so adding bubbles never
    changes pixels already covered). Inside, the tissue is blurred and its contrast lowered to
    40 % toward the glass brightness; the rim (outer ~10 % of the radius plus 1.5 px) is dark,
    with a thin bright halo just inside it.
    """
    h, w = image.shape[:2]
    side = float(min(h, w))
    cxy = rng.uniform(0.0, 1.0, size=(_N_BUBBLES, 2)) * np.array([w, h])
    r = np.exp(rng.uniform(np.log(0.05), np.log(0.25), size=_N_BUBBLES)) * side
    if strength <= 0:
        return image.copy()
    blurred = cv2.GaussianBlur(image, (0, 0), max(side / 128.0, 0.5), borderType=cv2.BORDER_REFLECT)
    blurred = np.asarray(blurred, np.float32).reshape(image.shape)
    return layer_discs(image, cxy, r, float(strength) * h * w,
                       lambda box, bx, by, rr: _slide_bubble_look(image, blurred, box, bx, by, rr))


# --------------------------------------------------------------------------------------------
# Tissue fold


@perturbation(
    "tissue_fold",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 1.0),
    levels=(0.23, 0.39, 0.49, 0.6, 0.69),
    reference="Tissue fold: the section folds over itself, doubling the absorbing layer (Beer-Lambert, OD adds: T = T1 * T2^k); Kanwal et al., 'The devil is in the details: WSI artifacts', 2022",
    unit="band width as a fraction of 0.9 x the distance from the fold line to the far edge (the fold also darkens with it)",
)
def tissue_fold(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """A band where the tissue lies double: the flap beyond a drawn fold line is mirrored over
    the band and its optical density adds to the tissue underneath.

    The fold line (drawn angle and position, 50-95 % of the way from the centre to the edge) is
    fixed; the band grows from it across the image, to ``strength`` times 90 % of the distance
    from the fold line to the far image edge, so bands are nested. Inside, ``x -> x * x_flap^k``
    with ``x_flap`` the mirror image across the fold line and ``k = 3 * strength`` (a narrow fold
    is a faint ridge, a wide one a thick compressed double layer), which is darker and more
    saturated; band edges are anti-aliased. The tissue the flap came from is left in place (the
    section is taken as stretched), so only the band changes.
    """
    h, w = image.shape[:2]
    theta = rng.uniform(0.0, 2 * np.pi)
    u = rng.uniform(0.5, 0.95)
    if strength <= 0:
        return image.copy()
    nx, ny = float(np.cos(theta)), float(np.sin(theta))
    half_extent = 0.5 * (abs(nx) * w + abs(ny) * h)
    t_fold = u * half_extent
    # the band stops short of the far image edge: a band edge leaving the image would turn edge
    # windows into flat ones and raise SSIM again
    width = float(strength) * 0.9 * (t_fold + half_extent)
    xs = np.arange(w, dtype=np.float32)[None, :] - np.float32((w - 1) / 2)
    ys = np.arange(h, dtype=np.float32)[:, None] - np.float32((h - 1) / 2)
    t = np.float32(nx) * xs + np.float32(ny) * ys  # signed distance along the fold normal
    below = np.float32(t_fold) - t  # distance inside from the fold line
    band = np.clip(below + 0.5, 0.0, 1.0) * np.clip(np.float32(width) - below + 0.5, 0.0, 1.0)
    # mirror across the fold line: p' = p + 2 * (t_fold - t) * n
    map_x = (xs + np.float32((w - 1) / 2) + 2 * below * np.float32(nx)).astype(np.float32)
    map_y = (ys + np.float32((h - 1) / 2) + 2 * below * np.float32(ny)).astype(np.float32)
    flap = cv2.remap(image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    flap = np.asarray(flap, np.float32).reshape(image.shape)
    k = per_pixel(band * np.float32(3.0 * float(strength)), image)
    out = image * np.power(np.maximum(flap, np.float32(_OD_EPS)), k)
    return out.astype(np.float32)
