"""CT reconstruction artifacts.

Images are displayed CT slices: intensity in [0, 1] is the attenuation inside the display window
(brighter = denser). Where the physics is in projection space (beam hardening, photon starvation),
a small parallel-beam projector (a cached sparse matrix on a coarse grid, with filtered
backprojection) computes the sinogram-domain error and reconstructs it; ring and metal artifacts
are synthesised directly in the image plane. All random draws are made up front with a fixed
count, independent of the strength (common random numbers); strength only scales or selects.
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from medrobust_lib.perturb.field_ops import per_pixel
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "ct"
MODALITIES = ("ct",)

PROJ_GRID = 64
"""Longest side of the coarse grid used by the projector."""
PROJ_ANGLES = 90

METAL_MAX = 3
METAL_STREAKS = 48
"""Streaks drawn through each metal object."""
STARVATION_ANGLES = 6
STARVATION_SPREAD_DEG = 12.0
RINGS = 40


def _gray(image: FloatImage) -> npt.NDArray[np.float32]:
    return image if image.ndim == 2 else image.mean(axis=2, dtype=np.float32)


def _scale(h: int, w: int) -> float:
    """Pixel lengths are specified for a 256-pixel image and scale with the image size."""
    return max(h, w) / 256.0


# ---------------------------------------------------------------------------------------------
# parallel-beam projector on a coarse grid
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _projector(h: int, w: int, n_angles: int = PROJ_ANGLES) -> tuple[sp.csr_matrix, int, npt.NDArray[np.float64]]:
    """Sparse parallel-beam projection matrix (n_angles * n_bins, h * w) with linear
    interpolation onto unit-spaced detector bins; its transpose is the matched backprojector.
    Returns the matrix, the number of bins and the ramp (Ram-Lak) filter for a 2 * n_bins FFT."""
    n_bins = int(np.ceil(np.hypot(h, w))) + 3
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    xs = (xs - (w - 1) / 2.0).ravel()
    ys = (ys - (h - 1) / 2.0).ravel()
    theta = np.arange(n_angles) * np.pi / n_angles
    u = np.cos(theta)[:, None] * xs[None, :] + np.sin(theta)[:, None] * ys[None, :] + (n_bins - 1) / 2.0
    i0 = np.floor(u).astype(np.int64)
    f = u - i0
    rows_base = (np.arange(n_angles) * n_bins)[:, None]
    cols = np.broadcast_to(np.arange(h * w)[None, :], u.shape)
    rows = np.concatenate([(rows_base + i0).ravel(), (rows_base + i0 + 1).ravel()])
    data = np.concatenate([(1.0 - f).ravel(), f.ravel()])
    mat = sp.csr_matrix((data, (rows, np.concatenate([cols.ravel(), cols.ravel()]))),
                        shape=(n_angles * n_bins, h * w))
    ramp = np.abs(np.fft.rfftfreq(2 * n_bins))
    return mat, n_bins, ramp


def _coarse_shape(h: int, w: int) -> tuple[int, int]:
    f = PROJ_GRID / max(h, w)
    return max(int(round(h * f)), 8), max(int(round(w * f)), 8)


def _fbp(sino: np.ndarray, mat: sp.csr_matrix, ramp: np.ndarray, h: int, w: int) -> npt.NDArray[np.float64]:
    """Filtered backprojection of an (n_angles, n_bins) sinogram (unit-spaced bins)."""
    n_angles, n_bins = sino.shape
    q = np.fft.irfft(np.fft.rfft(sino, n=2 * n_bins, axis=1) * ramp, axis=1)[:, :n_bins]
    return (mat.T @ q.ravel()).reshape(h, w) * (np.pi / n_angles)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# metal streaks
# ---------------------------------------------------------------------------------------------


def metal_positions(image: FloatImage, u: np.ndarray) -> npt.NDArray[np.int64]:
    """Pixel (row, col) of each metal object: the drawn quantiles ``u`` pick pixels among the
    denser-than-average ones (inside the patient) in the central 70% of the field, so implants
    never float in the air or sit on the border."""
    gray = _gray(image)
    h, w = gray.shape
    inner = np.zeros((h, w), bool)
    inner[int(0.15 * h) : int(np.ceil(0.85 * h)), int(0.15 * w) : int(np.ceil(0.85 * w))] = True
    cand = np.flatnonzero(inner & (gray > gray.mean()))
    if cand.size == 0:
        cand = np.flatnonzero(inner)
    idx = cand[np.minimum((u * cand.size).astype(np.int64), cand.size - 1)]
    return np.stack(np.unravel_index(idx, gray.shape), axis=1).astype(np.int64)


@perturbation(
    "metal_streaks", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 1.0),
    levels=(0.045, 0.1, 0.16, 0.25, 0.38), unit="streak amplitude (intensity units)",
    reference="Metal artifact: photon starvation and beam hardening through metal corrupt the rays "
              "crossing it, which backproject to bright/dark lines through the implant and dark bands "
              "between implants; sinogram-free line model after Barrett & Keat, RadioGraphics 2004",
)
def metal_streaks(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Streaks radiating from 1 to 3 drawn metal objects inside the patient.

    Each object (a drawn position among the denser-than-average pixels, a drawn radius of 2 to 5
    pixels at 256) gets ``METAL_STREAKS`` full-length lines through it at drawn angles with
    drawn signed amplitudes (N(0, 1): bright and dark streaks), and every pair of objects a
    dark band along the line joining them (the most attenuated rays). The line field is
    rasterised, softened to about 2 pixels width and added with weight ``strength`` (intensity
    units, [0, 1]); the metal itself is added with weight ``4 * strength``, saturating early.
    """
    h, w = image.shape[:2]
    draws = metal_draws(rng, h, w)
    if strength <= 0.0:
        return image.copy()
    lines, core = metal_fields(image, draws)
    field = strength * lines + 4.0 * strength * core
    return (image + per_pixel(field, image)).astype(np.float32)


MetalDraws = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def metal_draws(rng: np.random.Generator, h: int, w: int) -> MetalDraws:
    """The drawn metal objects of :func:`metal_streaks`: how many are on, their position quantiles,
    radii (pixels), streak angles and signed streak amplitudes (a fixed number of draws)."""
    k = _scale(h, w)
    n_on = int(rng.integers(1, METAL_MAX + 1))
    u = rng.random(METAL_MAX)
    radius = rng.uniform(2.0, 5.0, size=METAL_MAX) * k
    angles = rng.uniform(0.0, np.pi, size=(METAL_MAX, METAL_STREAKS))
    amps = rng.normal(0.0, 1.0, size=(METAL_MAX, METAL_STREAKS))
    return n_on, u, radius, angles, amps


def metal_fields(image: FloatImage, draws: MetalDraws) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The softened streak field and metal cores of :func:`metal_streaks` for unit strength,
    float32 (H, W) each: the output is ``image + s * lines + 4 s * core``."""
    h, w = image.shape[:2]
    k = _scale(h, w)
    n_on, u, radius, angles, amps = draws
    pos = metal_positions(image, u)[:n_on]
    streaks = np.zeros((h, w), np.float32)
    core = np.zeros((h, w), np.float32)
    reach = float(np.hypot(h, w))
    shift = 4  # fixed-point bits for sub-pixel line end points
    fix = 1 << shift
    for j, (r, c) in enumerate(pos):
        dx = np.cos(angles[j]) * reach
        dy = np.sin(angles[j]) * reach
        for m in range(METAL_STREAKS):
            p0 = (int((c - dx[m]) * fix), int((r - dy[m]) * fix))
            p1 = (int((c + dx[m]) * fix), int((r + dy[m]) * fix))
            cv2.line(streaks, p0, p1, float(amps[j, m]), 1, cv2.LINE_8, shift)
    for i in range(len(pos)):
        for j in range(i + 1, len(pos)):
            (r0, c0), (r1, c1) = pos[i], pos[j]
            d = np.array([c1 - c0, r1 - r0], np.float64)
            d *= reach / max(float(np.hypot(*d)), 1.0)
            p0 = (int((c0 - d[0]) * fix), int((r0 - d[1]) * fix))
            p1 = (int((c0 + d[0]) * fix), int((r0 + d[1]) * fix))
            cv2.line(streaks, p0, p1, -1.5, max(int(round(2 * k)), 1), cv2.LINE_8, shift)
    for j, (r, c) in enumerate(pos):
        cv2.circle(core, (int(c) * fix, int(r) * fix), int(radius[j] * fix), 1.0, -1, cv2.LINE_8, shift)
    sigma = 0.8 * k
    return (np.asarray(cv2.GaussianBlur(streaks, (0, 0), sigma), np.float32),
            np.asarray(cv2.GaussianBlur(core, (0, 0), sigma), np.float32))


# ---------------------------------------------------------------------------------------------
# beam hardening
# ---------------------------------------------------------------------------------------------


def beam_hardening_error(image: FloatImage) -> npt.NDArray[np.float32]:
    """Reconstructed beam-hardening error for unit coefficient, full resolution (H, W).

    The image (as attenuation) is projected on the coarse grid; the measured line integrals fall
    short of linear by ``p^2`` (``p`` in units of the coarse grid's longest side), and the
    filtered backprojection of that deficit is the error: a cupping bowl inside every large
    object plus dark bands between dense ones (the cross terms ``2 p_a p_b``)."""
    h, w = image.shape[:2]
    ch, cw = _coarse_shape(h, w)
    small = cv2.resize(_gray(image), (cw, ch), interpolation=cv2.INTER_AREA).astype(np.float64)
    mat, n_bins, ramp = _projector(ch, cw)
    p = (mat @ small.ravel()).reshape(PROJ_ANGLES, n_bins)
    n = float(max(ch, cw))
    err = _fbp(p * p / n, mat, ramp, ch, cw)
    return np.asarray(cv2.resize(err.astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC), np.float32)


@perturbation(
    "beam_hardening", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 3.0),
    levels=(0.35, 0.6, 0.8, 1.0, 1.2), unit="beam-hardening coefficient beta (p -> p - beta p^2)",
    reference="Polychromatic beam hardening: measured line integrals p - beta p^2, reconstructed by "
              "FBP into cupping and dark inter-object bands; Brooks & Di Chiro, Phys Med Biol 1976",
)
def beam_hardening(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Cupping (darkening toward the centre of large objects) and dark bands between dense
    objects, from the quadratic line-integral deficit ``p -> p - beta p^2`` reconstructed by
    filtered backprojection (``p`` is the projection of the image intensity in units of the image
    width, so a uniform disk of intensity 0.5 filling 80% of the field is darkened by about 0.25
    beta at its centre). ``strength`` is beta in [0, 3]; small objects in a large field (a head
    phantom) darken less and may keep SSIM above 0.6. Deterministic (the generator is unused)."""
    if strength <= 0.0:
        return image.copy()
    err = beam_hardening_error(image)
    return (image - strength * per_pixel(err, image)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# photon starvation
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _centred_grid(h: int, w: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    return xs - (w - 1) / 2.0, ys - (h - 1) / 2.0


def starvation_field(image: FloatImage, offsets: np.ndarray, noise: np.ndarray) -> npt.NDArray[np.float32]:
    """Unit-level streak noise: ``noise`` (n_angles, n_bins) white detector noise at the angles
    ``offsets`` (radians) around the most attenuating view, weighted per ray by
    ``exp(4 (p / p_max - 1))`` (the quantum noise of log data grows as exp(p)), ramp-filtered and
    backprojected at full resolution; about unit standard deviation along the most starved rays."""
    h, w = image.shape[:2]
    ch, cw = _coarse_shape(h, w)
    small = cv2.resize(_gray(image), (cw, ch), interpolation=cv2.INTER_AREA).astype(np.float64)
    mat, n_bins_c, _ = _projector(ch, cw)
    p = (mat @ small.ravel()).reshape(PROJ_ANGLES, n_bins_c)
    p_max = max(float(p.max()), 1e-6)
    best = int(np.argmax(p.max(axis=1)))
    theta0 = best * np.pi / PROJ_ANGLES
    n_bins = noise.shape[1]
    centre = (n_bins - 1) / 2.0
    scale_c = max(ch, cw) / max(h, w)
    xs, ys = _centred_grid(h, w)
    ramp = np.abs(np.fft.rfftfreq(2 * n_bins))
    gain = 1.0 / np.sqrt(np.mean(ramp**2))  # unit std for white input
    field = np.zeros((h, w), np.float32)
    t_full = np.arange(n_bins) - centre
    for k, off in enumerate(offsets):
        theta = theta0 + float(off)
        a = int(round(theta / np.pi * PROJ_ANGLES)) % PROJ_ANGLES
        flip = 1.0 if (int(np.floor(theta / np.pi * PROJ_ANGLES + 0.5)) // PROJ_ANGLES) % 2 == 0 else -1.0
        pc = np.interp(flip * t_full * scale_c + (n_bins_c - 1) / 2.0, np.arange(n_bins_c), p[a])
        weight = np.exp(4.0 * (pc / p_max - 1.0))
        q = np.fft.irfft(np.fft.rfft(noise[k] * weight, n=2 * n_bins) * ramp, n=2 * n_bins)[:n_bins] * gain
        idx = np.rint(xs * np.float32(np.cos(theta)) + ys * np.float32(np.sin(theta)) + np.float32(centre))
        field += q.astype(np.float32)[np.clip(idx.astype(np.int64), 0, n_bins - 1)]
    return field / np.float32(np.sqrt(len(offsets)))


@perturbation(
    "photon_starvation", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.6),
    levels=(0.02, 0.045, 0.075, 0.11, 0.16), unit="noise std along the most attenuated rays (intensity)",
    strength_is_intensity=True,
    reference="Photon starvation: Poisson noise of log data has variance ~ exp(p)/N0, so views through "
              "the most attenuating path reconstruct into noise streaks; Hsieh, Computed Tomography, "
              "SPIE 2009",
)
def photon_starvation(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Streaky noise along the direction of highest attenuation.

    The coarse projector finds the most attenuating view; ``STARVATION_ANGLES`` views within
    +-12 degrees of it (drawn) get white detector noise (drawn, one value per detector bin),
    weighted per ray by ``exp(4 (p / p_max - 1))`` and ramp-filtered, then backprojected at full
    resolution: thin noise streaks crossing the patient along the long axis. ``strength`` in
    [0, 0.6] is the noise standard deviation (intensity units) along the most starved rays."""
    h, w = image.shape[:2]
    n_bins = int(np.ceil(np.hypot(h, w))) + 3
    offsets = np.deg2rad(rng.uniform(-STARVATION_SPREAD_DEG, STARVATION_SPREAD_DEG, size=STARVATION_ANGLES))
    noise = rng.standard_normal((STARVATION_ANGLES, n_bins))
    if strength <= 0.0:
        return image.copy()
    field = starvation_field(image, offsets, noise)
    return (image + strength * per_pixel(field, image)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# ring artifact
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _radius_index(h: int, w: int, step: float) -> npt.NDArray[np.int64]:
    xs, ys = _centred_grid(h, w)
    return np.rint(np.hypot(xs, ys) / step).astype(np.int64)  # type: ignore[no-any-return]


def ring_profile(rng: np.random.Generator, h: int, w: int, step: float = 0.25) -> npt.NDArray[np.float32]:
    """Drawn radial profile sampled every ``step`` pixels: ``RINGS`` Gaussian rings (radius
    uniform over the field, width 0.6 to 2 px at 256, amplitude N(0, 1)), one per bad detector
    channel."""
    k = _scale(h, w)
    r_max = float(np.hypot(h, w)) / 2.0 + 1.0
    radii = rng.uniform(0.0, r_max, size=RINGS)
    widths = rng.uniform(0.6, 2.0, size=RINGS) * k
    amps = rng.normal(size=RINGS)
    r = np.arange(int(r_max / step) + 2) * step
    prof = (amps * np.exp(-0.5 * ((r[:, None] - radii) / widths) ** 2)).sum(axis=1)
    return prof.astype(np.float32)


@perturbation(
    "ring_artifact", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.5),
    levels=(0.018, 0.033, 0.05, 0.07, 0.095), unit="ring amplitude (intensity units)",
    reference="Ring artifact: a miscalibrated detector channel at distance r from the isocentre "
              "backprojects to a circle of radius r; Hsieh, Computed Tomography, SPIE 2009",
)
def ring_artifact(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Concentric bright and dark rings about the rotation centre (the image centre), one per
    drawn miscalibrated detector channel (``RINGS`` of them). ``strength`` in [0, 0.5] scales the
    ring amplitudes (drawn N(0, 1)), in intensity units."""
    h, w = image.shape[:2]
    step = 0.25
    prof = ring_profile(rng, h, w, step)
    if strength <= 0.0:
        return image.copy()
    field = prof[_radius_index(h, w, step)]
    return (image + strength * per_pixel(field, image)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# window shift
# ---------------------------------------------------------------------------------------------


WINDOW_MIN_WIDTH = 0.25
"""Narrowest window reachable at the strongest setting, in original window widths."""
WINDOW_MAX_MOVE = 4.0


def window_edges(rng: np.random.Generator) -> tuple[float, float]:
    """Drawn direction (a, b) of the moves of the lower and upper window edges: a unit vector,
    shortened where it narrows the window so that ``1 + WINDOW_MAX_MOVE * (b - a)`` stays at
    least ``WINDOW_MIN_WIDTH`` (the window never closes)."""
    psi = float(rng.uniform(0.0, 2.0 * np.pi))
    a, b = float(np.cos(psi)), float(np.sin(psi))
    narrowing = WINDOW_MAX_MOVE * (a - b)
    if narrowing > 1.0 - WINDOW_MIN_WIDTH:
        shrink = (1.0 - WINDOW_MIN_WIDTH) / narrowing
        a, b = a * shrink, b * shrink
    return a, b


@perturbation(
    "window_shift", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, WINDOW_MAX_MOVE),
    levels=(0.08, 0.25, 0.5, 0.9, 1.4), unit="window-edge move (window widths)",
    reference="Display windowing y = clip((HU - L) / W + 1/2) with a wrong level L and width W; "
              "DICOM PS3.3 C.11.2 VOI LUT",
)
def window_shift(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Re-display the slice in a wrong window.

    The image is taken as displayed in a window mapping its [lower, upper] edges to [0, 1]. The
    two edges move by ``strength * a`` and ``strength * b`` window widths along a drawn unit
    direction (a, b) (both up: a raised level, darker; both down: brighter; apart: a wider,
    flatter window; together: a narrower one that clips), and the image is remapped linearly
    and clipped: ``y = (x - s a) / (1 + s (b - a))``. Every pixel then moves monotonically away
    from its value as the strength grows. ``strength`` in [0, 4] is the Euclidean length of the
    edge move in window widths (at most; narrowing directions are shortened so the window keeps
    a quarter of its width at 4). A level error saturates the image by about 1.5; a pure widening
    needs the whole range (6.7x wider at 4) and on flat images (CT soft tissue) may keep SSIM
    above 0.6. Deterministic given the drawn direction. Air at exactly 0 makes SSIM drop fast
    when the window moves down (SSIM's luminance term is sensitive near black)."""
    a, b = window_edges(rng)
    lower = strength * a
    width = 1.0 + strength * (b - a)
    return ((image - np.float32(lower)) / np.float32(width)).astype(np.float32)
