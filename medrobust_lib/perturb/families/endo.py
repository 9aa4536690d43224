"""Endoscopy artifacts: specular highlights on wet mucosa, bubbles, blood and light-source
overexposure.

Images are RGB ``(H, W, 3)``; grayscale ``(H, W)`` is accepted too (colours and per-channel
absorption are then reduced with Rec. 601 luma weights). Every random quantity is drawn up front
in a fixed number of draws so that strength only scales or selects what was drawn (common random
numbers).
"""

from __future__ import annotations

import cv2
import numpy as np

from medrobust_lib.perturb.field_ops import layer_discs, per_pixel, smoothstep
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "endo"
MODALITIES = ("endoscopy",)
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


# --------------------------------------------------------------------------------------------
# Specular reflection

_N_CLUSTERS = 8
_N_SUB = 6
_CLUSTER_SPREAD = 0.05  # std of the blob positions around a cluster centre, fraction of min(H, W)


@perturbation(
    "specular_reflection",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 0.3),
    levels=(0.019, 0.057, 0.108, 0.171, 0.226),
    reference="Specular reflection of the endoscope light on wet mucosa (dichromatic reflection model, Shafer 1985; Arnold et al., EURASIP JIVP 2010)",
    unit="blob radius scale as a fraction of min(H, W)",
)
def specular_reflection(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Saturated white highlights with soft edges, in clusters as on curved wet tissue.

    8 clusters of 6 Gaussian blobs each are drawn (cluster centres, blob positions scattered by
    5 % of ``min(H, W)`` about them, relative radii). ``strength`` is the radius scale as a
    fraction of ``min(H, W)`` (0 = identity, max 0.3): the highlight field is the maximum of the
    blobs, saturated (pure white) where it exceeds 0.6 and fading out to 0.25; blobs stay in place
    and grow with strength, so pixels only get brighter.

    The maximum is capped where clusters merge into large flat white areas: there a soft
    highlight edge over flat tissue scores a lower SSIM than the uniform white that replaces it,
    and SSIM would rise again. At 0.3 the SSIM is about 0.35-0.65 (median 0.47), so L5 is out of
    reach for roughly one draw in eight, and calibration flags it.
    """
    h, w = image.shape[:2]
    side = float(min(h, w))
    centres = rng.uniform(0.1, 0.9, size=(_N_CLUSTERS, 1, 2))
    offsets = rng.normal(0.0, 1.0, size=(_N_CLUSTERS, _N_SUB, 2))
    radii = rng.uniform(0.15, 0.6, size=(_N_CLUSTERS, _N_SUB))
    if strength <= 0:
        return image.copy()
    scale = float(strength) * side
    pos = centres * np.array([w, h]) + offsets * _CLUSTER_SPREAD * side  # fixed: blobs only grow
    sig = (radii * scale).reshape(-1)
    px, py = pos[..., 0].reshape(-1), pos[..., 1].reshape(-1)
    field = np.zeros((h, w), np.float32)
    for cx, cy, sg in zip(px, py, sig, strict=True):
        reach = 1.7 * sg + 1.0  # exp(-q^2/2) < 0.25 beyond q = 1.67
        x0, x1 = max(int(np.floor(cx - reach)), 0), min(int(np.ceil(cx + reach)) + 1, w)
        y0, y1 = max(int(np.floor(cy - reach)), 0), min(int(np.ceil(cy + reach)) + 1, h)
        if x0 >= x1 or y0 >= y1 or sg < 1e-3:
            continue
        gx = np.exp(-0.5 * ((np.arange(x0, x1, dtype=np.float32) - np.float32(cx)) / np.float32(sg)) ** 2)
        gy = np.exp(-0.5 * ((np.arange(y0, y1, dtype=np.float32) - np.float32(cy)) / np.float32(sg)) ** 2)
        np.maximum(field[y0:y1, x0:x1], gy[:, None] * gx[None, :], out=field[y0:y1, x0:x1])
    alpha = smoothstep((field - 0.25) / 0.35)
    a = per_pixel(alpha, image)
    return (image + a * (1.0 - image)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Bubbles

_N_BUBBLES = 160


def _bubble_look(
    image: FloatImage, box: tuple[int, int, int, int], bx: np.ndarray | float,
    by: np.ndarray | float, rr: np.ndarray | float, glint_dir: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Appearance of bubble pixels in ``box`` = (y0, y1, x0, x1) and their anti-aliased disc
    coverage, for bubble centre/radius ``bx, by, rr`` (scalars or per-pixel arrays)."""
    y0, y1, x0, x1 = box
    bx32, by32 = np.asarray(bx, np.float32), np.asarray(by, np.float32)
    inv_r = np.float32(1.0) / np.asarray(rr, np.float32)
    dx = np.arange(x0, x1, dtype=np.float32)[None, :] - bx32
    dy = np.arange(y0, y1, dtype=np.float32)[:, None] - by32
    u, v = dx * inv_r, dy * inv_r
    rho2 = u * u + v * v
    rho = np.sqrt(rho2)
    # thin-film lens: the centre of the disc shows a magnified view of the scene behind it
    mag = np.float32(0.65) + np.float32(0.35) * np.minimum(rho2, 1.0)
    map_x = np.ascontiguousarray(np.broadcast_to(bx32 + dx * mag, rho.shape), np.float32)
    map_y = np.ascontiguousarray(np.broadcast_to(by32 + dy * mag, rho.shape), np.float32)
    seen = cv2.remap(image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    seen = np.asarray(seen, np.float32).reshape(rho.shape + image.shape[2:])
    # bright rim (reflection at grazing incidence) and a glint toward the light, as bumps in rho
    rim = np.maximum(1.0 - ((rho - np.float32(0.93)) * np.float32(1.0 / 0.09)) ** 2, 0.0)
    gx, gy = np.float32(0.45 * np.cos(glint_dir)), np.float32(0.45 * np.sin(glint_dir))
    # |(u, v) - (gx, gy)|^2 = rho2 - 2 (gx u + gy v) + 0.45^2
    glint = np.maximum(1.0 - (rho2 - 2 * (gx * u + gy * v) + np.float32(0.45**2)) * np.float32(1.0 / 0.2**2), 0.0)
    white = np.minimum(np.float32(0.85) * rim * rim + glint * glint, 1.0)
    # scattered light lifts the view (lower contrast), then the white rim/glint on top
    keep = np.float32(0.85) * (1.0 - per_pixel(white, seen))
    look = 1.0 - keep * (1.0 - seen)
    edge = np.clip((1.0 - rho) / inv_r + 0.5, 0.0, 1.0)  # anti-aliased disc edge, in pixels
    return look, edge


@perturbation(
    "bubbles",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 1.5),
    levels=(0.065, 0.175, 0.33, 0.505, 0.81),
    reference="Air/mucus bubbles in the lumen: thin-film lenses with specular rims; 'bubbles' artefact class of EAD2019, Ali et al., Sci Rep 2020",
    unit="summed bubble disc area as a fraction of the image area",
)
def bubbles(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Translucent circular bubbles with bright rims, a specular glint and lens-like refraction.

    160 bubbles (centres, radii log-uniform in 2-12 % of ``min(H, W)``) are drawn up front.
    ``strength`` is the nominal coverage: bubbles are added in drawn order until their summed disc
    area reaches ``strength`` times the image area (overlaps make the covered area smaller), the
    last one fading in beneath the others (earlier bubbles lie on top, so adding bubbles never
    changes pixels already covered). Inside a bubble the scene is seen magnified through the
    curved film, a bit brighter and lower in contrast; the rim and a glint toward the light are
    bright.
    """
    h, w = image.shape[:2]
    side = float(min(h, w))
    cxy = rng.uniform(0.0, 1.0, size=(_N_BUBBLES, 2)) * np.array([w, h])
    r = np.exp(rng.uniform(np.log(0.02), np.log(0.12), size=_N_BUBBLES)) * side
    glint_dir = float(rng.uniform(0.0, 2 * np.pi))
    if strength <= 0:
        return image.copy()
    return layer_discs(image, cxy, r, float(strength) * h * w,
                       lambda box, bx, by, rr: _bubble_look(image, box, bx, by, rr, glint_dir))


# --------------------------------------------------------------------------------------------
# Blood

_BLOOD_MU = np.array([0.25, 2.6, 2.2], np.float32)  # optical depth per unit thickness, R, G, B
_BLOOD_GRID = 32


@perturbation(
    "blood",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 1.0),
    levels=(0.25, 0.41, 0.545, 0.675, 0.81),
    reference="Beer-Lambert absorption of a haemoglobin film (strong at green/blue, weak at red); Prahl, 'Optical absorption of hemoglobin', OMLC 1999",
    unit="fraction of the image covered by blood (the film also thickens with it)",
)
def blood(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """A translucent red film of blood in smooth drawn blobs: each channel is attenuated by
    ``exp(-mu_c * d)`` with haemoglobin-like ``mu`` (green and blue absorbed much more than red).

    The blob field is drawn once (a 32x32 white-noise grid, low-passed and upsampled).
    ``strength`` in [0, 1] is the covered fraction of the image (the field is thresholded at its
    ``1 - strength`` quantile) and also scales the film thickness ``d`` (up to 1.5 units at 1,
    thicker toward blob centres), so both coverage and opacity only grow with strength.
    """
    h, w = image.shape[:2]
    grid: np.ndarray = rng.normal(0.0, 1.0, size=(_BLOOD_GRID, _BLOOD_GRID)).astype(np.float32)
    if strength <= 0:
        return image.copy()
    # isotropic blobs: low-pass the white-noise grid, then upsample (size set by the grid, not
    # by the image)
    grid = cv2.GaussianBlur(grid, (0, 0), _BLOOD_GRID / 12, borderType=cv2.BORDER_REFLECT)
    field = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
    thr = float(np.quantile(field, 1.0 - float(strength)))
    soft = 0.15 * float(field.std()) + 1e-6
    cover = smoothstep((field - thr) / soft + 0.5)
    depth = cover * np.float32(1.5 * float(strength)) * (np.float32(0.7) + np.float32(0.3) * smoothstep(field - thr))
    trans: np.ndarray
    if image.ndim == 3:
        trans = np.exp(-depth[..., None] * _BLOOD_MU)
    else:
        trans = np.exp(-depth[..., None] * _BLOOD_MU) @ _LUMA
    return (image * trans).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Overexposure

_BLOOM = 0.5  # fraction of the over-full-well charge that spills into neighbouring pixels
_BLOOM_SIGMA = 0.06  # spill radius, fraction of min(H, W)


@perturbation(
    "endoscopy_overexposure",
    family=FAMILY,
    modalities=MODALITIES,
    strength_range=(0.0, 30.0),
    levels=(0.92, 2.2, 4.27, 7.5, 13.1),
    reference="Sensor saturation and blooming under near-field illumination (inverse-square falloff from the tip, clipping at full well); 'saturation' class of EAD2019, Ali et al., Sci Rep 2020",
    unit="extra exposure gain (linear light) at the hot spot",
)
def endoscopy_overexposure(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Light-source saturation: a gain that rises toward a drawn hot spot, applied in linear light
    (display gamma 2.2), then clipped at 1.

    The linear gain is ``1 + strength / (1 + (d / r0)^2)``, a near-field inverse-square profile
    around the drawn hot spot (``r0`` drawn, 25-45 % of ``min(H, W)``). Charge beyond full well
    blooms: half of the excess over 1 is spread with a Gaussian (sigma 6 % of ``min(H, W)``) and
    added back, so dark areas next to saturated ones wash out too. ``strength`` is the extra gain
    at the hot spot (0 = identity, max 30); the display value is ``min(1, linear)^(1/2.2)``.
    """
    h, w = image.shape[:2]
    hx, hy = rng.uniform(0.25, 0.75, size=2)
    r0 = rng.uniform(0.25, 0.45) * min(h, w)
    if strength <= 0:
        return image.copy()
    xs = (np.arange(w, dtype=np.float32) - np.float32(hx * w)) / np.float32(r0)
    ys = (np.arange(h, dtype=np.float32) - np.float32(hy * h)) / np.float32(r0)
    profile = 1.0 / (1.0 + ys[:, None] ** 2 + xs[None, :] ** 2)
    gain = (1.0 + np.float32(strength) * profile).astype(np.float32)
    exposed = image.astype(np.float32) ** np.float32(2.2) * per_pixel(gain, image)
    excess = np.maximum(exposed - 1.0, 0.0)
    # blooming: charge beyond full well spills into the neighbourhood (smooth, so computed at
    # quarter resolution)
    small = cv2.resize(excess, (max(w // 4, 1), max(h // 4, 1)), interpolation=cv2.INTER_AREA)
    small = cv2.GaussianBlur(small, (0, 0), _BLOOM_SIGMA * min(h, w) / 4, borderType=cv2.BORDER_REFLECT)
    bloom = np.asarray(cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR), np.float32).reshape(image.shape)
    exposed = exposed + np.float32(_BLOOM) * bloom
    return (np.minimum(exposed, 1.0) ** np.float32(1.0 / 2.2)).astype(np.float32)
