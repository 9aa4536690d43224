"""Geometry helpers for the demo generator: lesion shapes, placement, views and noise fields.

All arrays are 256 x 256 unless stated otherwise. Coordinates are pixel (x, y) with x along columns
and y along rows. Randomness always comes in as an explicit ``np.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

SIZE = 256
"""Side of every demo image in pixels."""

SMALL_AREA_FRACTION = 0.015
"""A lesion is 'small' when its mask covers less than this fraction of the image, else 'large'."""

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Placement:
    """Where a lesion should go: ``right`` (False: left half), ``lower`` (False: upper half), ``large``."""

    right: bool
    lower: bool
    large: bool

    @property
    def quadrant(self) -> str:
        return f"{'lower' if self.lower else 'upper'} {'right' if self.right else 'left'}"


def plan_placements(rng: np.random.Generator, n: int) -> list[Placement]:
    """``n`` placements in blocks of 4: each block covers all 4 quadrants, 2 small and 2 large, and
    each pair of blocks covers all 8 (quadrant, size) combinations, in a seeded order."""
    out: list[Placement] = []
    while len(out) < n:
        sizes = rng.permutation([0, 1, 0, 1])
        for block in (0, 1):
            quads = rng.permutation(4)
            for q in quads:
                large = bool(sizes[q] ^ block)
                out.append(Placement(right=bool(q & 1), lower=bool(q & 2), large=large))
    return out[:n]


@dataclass(frozen=True)
class Blob:
    """A star-shaped lesion outline: an ellipse (radius ``r`` px, ``aspect`` = minor/major, rotated by
    ``angle`` radians) whose radius is modulated by low-order harmonics ``amps``/``phases``."""

    cx: float
    cy: float
    r: float
    aspect: float = 1.0
    angle: float = 0.0
    amps: tuple[float, ...] = ()
    phases: tuple[float, ...] = ()

    @property
    def reach(self) -> float:
        """Upper bound of the outline's distance from the centre in pixels."""
        return self.r * (1.0 + sum(abs(a) for a in self.amps))


def random_blob(
    rng: np.random.Generator,
    cx: float,
    cy: float,
    r: float,
    *,
    irregularity: float = 0.15,
    aspect: tuple[float, float] = (0.7, 1.0),
    n_harmonics: int = 4,
) -> Blob:
    """A random blob; ``irregularity`` bounds the sum of the harmonic amplitudes (0 = ellipse)."""
    raw = rng.uniform(0.2, 1.0, n_harmonics) / np.arange(1, n_harmonics + 1) ** 0.5
    amps = raw / raw.sum() * irregularity
    amps[0] *= 0.3  # the first harmonic shifts the centre rather than shaping the outline
    phases = rng.uniform(0, 2 * np.pi, n_harmonics)
    return Blob(
        float(cx),
        float(cy),
        float(r),
        float(rng.uniform(*aspect)),
        float(rng.uniform(0, np.pi)),
        tuple(float(a) for a in amps),
        tuple(float(p) for p in phases),
    )


def blob_rho(blob: Blob, shape: tuple[int, int] = (SIZE, SIZE)) -> F32:
    """Normalised radial distance (float32, ``shape``): < 1 inside the outline, 0 at the centre.
    Computed only in a window around the blob; elsewhere the value is 2 (outside)."""
    out = np.full(shape, 2.0, np.float32)
    pad = blob.reach + 2.0
    x0, x1 = max(0, int(np.floor(blob.cx - pad))), min(shape[1], int(np.ceil(blob.cx + pad)) + 1)
    y0, y1 = max(0, int(np.floor(blob.cy - pad))), min(shape[0], int(np.ceil(blob.cy + pad)) + 1)
    if x0 >= x1 or y0 >= y1:
        return out
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx = xx - blob.cx
    dy = yy - blob.cy
    c, s = np.cos(blob.angle), np.sin(blob.angle)
    u = c * dx + s * dy
    v = (-s * dx + c * dy) / max(blob.aspect, 1e-3)
    dist = np.sqrt(u * u + v * v)
    theta = np.arctan2(v, u)
    mod = np.ones_like(dist)
    for k, (a, p) in enumerate(zip(blob.amps, blob.phases, strict=True), start=1):
        mod += a * np.cos(k * theta + p)
    out[y0:y1, x0:x1] = np.minimum(dist / (blob.r * mod), 2.0)
    return out


def soft_alpha(rho: F32, feather: float = 0.3, floor: float = 0.3) -> F32:
    """Lesion weight in [``floor``, 1] inside ``rho < 1`` and exactly 0 outside (float32).

    The mask of a lesion is ``rho < 1``. The weight ramps smoothly from ``floor`` at the outline to
    1 at depth ``feather``; the floor keeps the edge visible (lesions have borders) and makes every
    mask pixel change by a clearly non-zero amount, so the mask is the set of pixels the lesion
    modifies."""
    t = np.clip((1.0 - rho) / feather, 0.0, 1.0)
    a = floor + (1.0 - floor) * t * t * (3.0 - 2.0 * t)
    return np.where(rho < 1.0, a, 0.0).astype(np.float32)


def choose_center(
    rng: np.random.Generator,
    placement: Placement,
    reach: float,
    allowed: npt.NDArray[np.bool_] | None = None,
    *,
    size: int = SIZE,
) -> tuple[float, float]:
    """A centre in the quadrant of ``placement``, far enough from the midlines that the lesion's
    centroid is unambiguously in that half and ``reach`` px away from the border. When ``allowed``
    (bool, (size, size)) is given, centres are drawn from allowed pixels in that window if any."""
    half = size / 2
    gap = max(16.0, 0.55 * reach)
    margin = reach + 4.0
    lo_x, hi_x = (half + gap, size - margin) if placement.right else (margin, half - gap)
    lo_y, hi_y = (half + gap, size - margin) if placement.lower else (margin, half - gap)
    if lo_x > hi_x:
        lo_x = hi_x = (lo_x + hi_x) / 2
    if lo_y > hi_y:
        lo_y = hi_y = (lo_y + hi_y) / 2
    if allowed is not None:
        win = np.zeros_like(allowed)
        win[int(np.ceil(lo_y)) : int(hi_y) + 1, int(np.ceil(lo_x)) : int(hi_x) + 1] = True
        ys, xs = np.nonzero(allowed & win)
        if ys.size:
            i = int(rng.integers(0, ys.size))
            return float(xs[i]), float(ys[i])
    return float(rng.uniform(lo_x, hi_x)), float(rng.uniform(lo_y, hi_y))


def lesion_radius(
    rng: np.random.Generator,
    large: bool,
    small_range: tuple[float, float] = (8, 14),
    large_range: tuple[float, float] = (24, 38),
) -> float:
    """A nominal radius in pixels for the size class (areas fall clearly either side of the threshold)."""
    lo, hi = large_range if large else small_range
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def smooth_noise(rng: np.random.Generator, sigma: float, shape: tuple[int, ...] = (SIZE, SIZE)) -> F32:
    """Gaussian-blurred white noise, rescaled to zero mean and unit standard deviation (float32).
    For large ``sigma`` the noise is drawn on a coarser grid and upsampled (same statistics up to
    interpolation, much faster than a huge kernel)."""
    f = max(1, int(sigma // 3))
    if f > 1 and len(shape) == 2:
        small = (-(-shape[0] // f) + 2, -(-shape[1] // f) + 2)
        n = rng.standard_normal(small).astype(np.float32)
        n = np.asarray(
            cv2.GaussianBlur(n, (0, 0), sigmaX=sigma / f, sigmaY=sigma / f, borderType=cv2.BORDER_REFLECT),
            np.float32,
        )
        n = np.asarray(
            cv2.resize(n, (small[1] * f, small[0] * f), interpolation=cv2.INTER_LINEAR), np.float32
        )
        n = np.ascontiguousarray(n[f : f + shape[0], f : f + shape[1]])
    else:
        n = rng.standard_normal(shape).astype(np.float32)
        if sigma > 0:
            n = np.asarray(
                cv2.GaussianBlur(n, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT),
                np.float32,
            )
    n -= n.mean()
    return (n / (n.std() + 1e-8)).astype(np.float32)


def erode_disk(mask: npt.NDArray[np.bool_], radius: float) -> npt.NDArray[np.bool_]:
    """Binary erosion of ``mask`` by a disk of ``radius`` px (pixels outside the image count as outside)."""
    r = int(round(radius))
    if r <= 0:
        return mask.copy()
    k = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1))
    return cv2.erode(mask.astype(np.uint8), k, borderType=cv2.BORDER_CONSTANT, borderValue=0).astype(bool)


def random_view(
    src: npt.NDArray[np.float32],
    rng: np.random.Generator,
    *,
    zoom: tuple[float, float] = (1.0, 1.5),
    max_rot_deg: float = 15.0,
    flip: bool = True,
    border: float | tuple[float, ...] = 0.0,
    out: int = SIZE,
    jitter: float = 1.0,
    rot90: bool = False,
) -> npt.NDArray[np.float32]:
    """A random square view of ``src`` (float32 (H, W) or (H, W, C)) resampled to ``out`` x ``out``.

    ``zoom`` >= 1 crops a square of side ``min(H, W) / zoom``; ``jitter`` in [0, 1] scales how far the
    crop centre may wander (staying inside the image); rotation is uniform in +-``max_rot_deg`` (plus a
    multiple of 90 degrees if ``rot90``); pixels from outside ``src`` are ``border``."""
    h, w = src.shape[:2]
    z = float(rng.uniform(*zoom))
    side = min(h, w) / z
    cx = w / 2 + jitter * rng.uniform(-1, 1) * max(0.0, (w - side) / 2)
    cy = h / 2 + jitter * rng.uniform(-1, 1) * max(0.0, (h - side) / 2)
    ang = np.deg2rad(rng.uniform(-max_rot_deg, max_rot_deg))
    if rot90:
        ang += np.pi / 2 * int(rng.integers(0, 4))
    s = out / side
    fx = -1.0 if (flip and rng.random() < 0.5) else 1.0
    c, si = np.cos(ang), np.sin(ang)
    # dst = s * R * F * (src - centre) + out/2
    a = s * np.array([[c * fx, -si], [si * fx, c]], np.float64)
    t = np.array([out / 2, out / 2]) - a @ np.array([cx, cy])
    m = np.hstack([a, t[:, None]])
    if s < 0.6:  # pre-blur against aliasing when shrinking
        sig = 0.45 / s
        src = np.asarray(cv2.GaussianBlur(src, (0, 0), sigmaX=sig, sigmaY=sig), np.float32)
    bv = border if isinstance(border, tuple) else (border,) * 4
    res = cv2.warpAffine(
        src, m, (out, out), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=bv
    )
    return res.astype(np.float32)


