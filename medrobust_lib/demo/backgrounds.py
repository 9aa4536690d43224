"""Per-modality backgrounds: random views of the real wheel-shipped images, and procedural scenes
where no offline real image exists (OCT, dermoscopy, endoscopy, angiography).

Each function takes an explicit ``np.random.Generator`` and returns float32 arrays of 256 x 256
(x 3 for RGB). Units are stated per function (HU for CT, relative signal in [0, 1] otherwise).
Noise that must be identical with and without the lesion (speckle, quantum noise) is *not* added
here; the generators in :mod:`.generators` draw it once and apply it to both versions.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.demo import sources
from medrobust_lib.demo.geometry import SIZE, random_view, smooth_noise

F32 = npt.NDArray[np.float32]
Bool = npt.NDArray[np.bool_]

_YY, _XX = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)


# ---------------------------------------------------------------- views of real images


def ct_background(rng: np.random.Generator) -> tuple[F32, str, str]:
    """A CT slice view in HU (float32 (256, 256), air -1000), its source name and anatomy."""
    k = int(rng.integers(0, 3))
    if k == 0:
        img = random_view(sources.ct_small_hu(), rng, zoom=(1.35, 1.7), max_rot_deg=12, border=-1000.0)
        return img, "pydicom CT_small.dcm", "chest"
    if k == 1:
        img = random_view(sources.ect_head_hu(), rng, zoom=(0.95, 1.35), max_rot_deg=15, border=-1000.0)
        return img, "pydicom-data eCT_Supplemental.dcm", "head"
    img = random_view(sources.phantom_hu(), rng, zoom=(0.95, 1.3), max_rot_deg=25, border=-1000.0)
    return img, "skimage shepp_logan_phantom", "head"


@dataclass(frozen=True)
class MriView:
    """An MRI case view: base slice in [0, 1] (float32 (256, 256)), source and anatomy."""

    base: F32
    source: str
    anatomy: str


def mri_view(rng: np.random.Generator) -> MriView:
    """A random MRI view in relative signal [0, 1]; slices of one case are small warps of it."""
    k = int(rng.integers(0, 3))
    if k == 0:
        img = random_view(sources.mr_shoulder(), rng, zoom=(1.1, 1.8), max_rot_deg=12)
        return MriView(img, "pydicom-data MR2_UNCI.dcm", "shoulder")
    if k == 1:
        img = random_view(sources.phantom_t2(), rng, zoom=(0.95, 1.3), max_rot_deg=25)
        return MriView(img, "skimage shepp_logan_phantom (T2-like)", "head")
    img = random_view(sources.mr_small(), rng, zoom=(1.0, 1.3), max_rot_deg=20)
    return MriView(img, "pydicom MR_small.dcm", "musculoskeletal")


def mri_slice(view: MriView, dz: float, rng: np.random.Generator) -> F32:
    """Slice at offset ``dz`` (slices) from the case's base view: a small zoom and shift, as
    neighbouring slices differ a little."""
    s = 1.0 + 0.015 * dz
    tx, ty = rng.normal(0, 0.6, 2) + np.array([0.8 * dz, -0.5 * dz])
    m = np.array([[s, 0, (1 - s) * SIZE / 2 + tx], [0, s, (1 - s) * SIZE / 2 + ty]], np.float64)
    return cv2.warpAffine(view.base, m, (SIZE, SIZE), flags=cv2.INTER_LINEAR, borderValue=(0.0,)).astype(
        np.float32
    )


def us_background(rng: np.random.Generator) -> F32:
    """Ultrasound echogenicity in [0, 1] (float32 (256, 256)) from US1_UNCR with depth attenuation;
    horizontal flips only (the transducer stays at the top)."""
    img = random_view(sources.us_bmode(), rng, zoom=(1.0, 1.5), max_rot_deg=4)
    tgc = 1.0 - rng.uniform(0.05, 0.3) * (_YY / SIZE) ** 1.5
    return (img * tgc).astype(np.float32)


def xray_background(rng: np.random.Generator) -> tuple[F32, Bool]:
    """A chest radiograph view in [0, 1] (bone bright) and a lung-field mask (bool) for nodules."""
    img = random_view(sources.chest_xray(), rng, zoom=(1.0, 2.0), max_rot_deg=6, flip=False)
    sm = cv2.GaussianBlur(img, (0, 0), 6)
    lo, hi = np.percentile(sm, [5, 45])
    lungs = (sm > lo) & (sm < hi)
    return img, lungs


def fundus_background(rng: np.random.Generator) -> tuple[F32, Bool]:
    """A fundus view RGB in [0, 1] (float32 (256, 256, 3)) without an optic disc, and its FOV mask."""
    rgb, fov = sources.retina_no_disc()
    stack = np.dstack([rgb, fov.astype(np.float32)])
    v = random_view(stack, rng, zoom=(0.95, 1.6), max_rot_deg=25, border=(0.0, 0.0, 0.0, 0.0))
    img = v[:, :, :3]
    gain = rng.uniform(0.85, 1.1) * np.array(
        [1.0, rng.uniform(0.9, 1.1), rng.uniform(0.85, 1.15)], np.float32
    )
    return np.clip(img * gain, 0, 1).astype(np.float32), v[:, :, 3] > 0.99


def pathology_background(rng: np.random.Generator) -> F32:
    """An immunohistochemistry crop RGB in [0, 1], rotated by multiples of 90 degrees."""
    return random_view(sources.ihc(), rng, zoom=(1.3, 2.6), max_rot_deg=0.0, rot90=True)


# ---------------------------------------------------------------- procedural: OCT


@dataclass(frozen=True)
class OctScene:
    """Layered retina B-scan: reflectivity in [0, 1] (float32 (256, 256), no speckle), the inner
    limiting membrane and the top of the photoreceptor band per column (float32 (256,))."""

    reflectivity: F32
    ilm: F32
    ez: F32


_OCT_LAYERS = (  # (name, thickness px at scale 1, reflectivity, thins at the fovea)
    ("RNFL", 10.0, 0.80, True),
    ("GCL", 10.0, 0.45, True),
    ("IPL", 8.0, 0.58, True),
    ("INL", 8.0, 0.26, True),
    ("OPL", 5.0, 0.55, False),
    ("ONL", 20.0, 0.18, False),
    ("ELM", 2.0, 0.45, False),
    ("MZ", 3.0, 0.22, False),
    ("EZ", 4.0, 0.88, False),
    ("OS", 4.0, 0.35, False),
    ("RPE", 7.0, 0.97, False),
)
OCT_INNER_DEPTH = sum(t for _, t, _, _ in _OCT_LAYERS[:7])
"""Depth (px at scale 1) from the ILM to the bottom of the external limiting membrane."""


def oct_scene(rng: np.random.Generator, anchor_x: float, anchor_ilm: float, scale: float) -> OctScene:
    """A B-scan whose ILM passes through (``anchor_x``, ``anchor_ilm``); layer thicknesses x ``scale``."""
    x = np.arange(SIZE, dtype=np.float32)
    wav = rng.uniform(4, 12) * np.sin(2 * np.pi * x / rng.uniform(300, 700) + rng.uniform(0, 2 * np.pi))
    tilt = rng.uniform(-0.12, 0.12) * (x - anchor_x)
    fx = rng.uniform(40, 216)
    pit = np.exp(-(((x - fx) / rng.uniform(18, 30)) ** 2)).astype(np.float32) * float(rng.random() < 0.7)
    jitter = smooth_noise(rng, 12, (1, SIZE))[0] * 1.2
    shape = wav + tilt + jitter + 14 * scale * pit
    ilm = (shape - shape[int(anchor_x)] + anchor_ilm).astype(np.float32)
    refl = np.full((SIZE, SIZE), 0.03, np.float32)
    top = ilm.copy()
    ez = ilm.copy()
    for name, thick, r, thins in _OCT_LAYERS:
        t = thick * scale * (1 + 0.08 * smooth_noise(rng, 20, (1, SIZE))[0])
        if thins:
            t = t * (1 - 0.85 * pit)
        if name == "ONL":
            t = t * (1 + 0.35 * pit)
        if name == "EZ":
            ez = top.copy()
        bottom = top + t
        band = (_YY >= top[None, :]) & (_YY < bottom[None, :])
        refl[band] = r
        top = bottom
    chor_depth = _YY - top[None, :]
    chor = (0.55 * (1 + 0.5 * smooth_noise(rng, 2.5)) * np.exp(-np.maximum(chor_depth, 0) / 38.0)).clip(
        0.02, 1
    )
    refl = np.where(chor_depth >= 0, chor, refl).astype(np.float32)
    refl = np.asarray(cv2.GaussianBlur(refl, (0, 0), sigmaX=0.6, sigmaY=0.9), np.float32)
    return OctScene(refl, ilm, ez.astype(np.float32))


def oct_speckle(rng: np.random.Generator) -> F32:
    """Multiplicative OCT speckle with mean 1, laterally elongated (float32 (256, 256))."""
    g = rng.gamma(1.6, 1 / 1.6, (SIZE, SIZE)).astype(np.float32)
    g = np.asarray(cv2.GaussianBlur(g, (0, 0), sigmaX=1.3, sigmaY=0.55), np.float32)
    return (g / g.mean()).astype(np.float32)


# ---------------------------------------------------------------- procedural: dermoscopy


def skin_background(rng: np.random.Generator) -> tuple[F32, Bool]:
    """Dermoscopic skin RGB in [0, 1] (float32 (256, 256, 3)): tone, mottling, furrows, hairs and
    a dermatoscope field of view. Returns the image and where a lesion may be centred (bool)."""
    tone = np.array([rng.uniform(0.78, 0.93), rng.uniform(0.55, 0.72), rng.uniform(0.45, 0.62)], np.float32)
    img = np.ones((SIZE, SIZE, 3), np.float32) * tone
    low = smooth_noise(rng, 35)
    img *= (1 + 0.05 * low)[..., None] * np.array([1.0, 0.97, 0.96], np.float32)
    img *= (1 + 0.025 * smooth_noise(rng, 1.2))[..., None]
    ridge = smooth_noise(rng, 3.5)
    furrow = np.exp(-((ridge / 0.12) ** 2))
    img *= (1 - 0.07 * furrow)[..., None]
    redness = np.clip(smooth_noise(rng, 20), 0, None)
    img[..., 1:] *= (1 - 0.05 * redness)[..., None]
    hair = np.zeros((SIZE, SIZE), np.float32)
    for _ in range(int(rng.integers(0, 5))):
        p0 = rng.uniform(-20, SIZE + 20, 2)
        p2 = rng.uniform(-20, SIZE + 20, 2)
        p1 = (p0 + p2) / 2 + rng.normal(0, 40, 2)
        t = np.linspace(0, 1, 40)[:, None]
        pts = (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2
        cv2.polylines(
            hair, [np.round(pts).astype(np.int32)], False, 1.0, int(rng.integers(1, 3)), cv2.LINE_AA
        )
    hair = np.asarray(cv2.GaussianBlur(hair, (0, 0), 0.5), np.float32)
    img = img * (1 - 0.75 * hair[..., None]) + 0.75 * hair[..., None] * np.array(
        [0.22, 0.15, 0.12], np.float32
    )
    cx, cy = SIZE / 2 + rng.normal(0, 8, 2)
    d = np.sqrt((_XX - cx) ** 2 + (_YY - cy) ** 2)
    fov_r = rng.uniform(150, 185)
    vign = np.clip(1 - 0.45 * (d / fov_r) ** 3, 0.15, 1)
    img *= vign[..., None]
    img[d > fov_r] *= 0.08
    return np.clip(img, 0, 1).astype(np.float32), d < fov_r


# ---------------------------------------------------------------- procedural: endoscopy


def mucosa_background(rng: np.random.Generator, avoid: tuple[float, float]) -> tuple[F32, Bool]:
    """Colonoscopy-like mucosa RGB in [0, 1]: a dark lumen away from ``avoid`` (x, y), haustral
    folds with shading, a fine vessel pattern, specular glints and vignetting. Returns the image
    and a mask of where a polyp may sit (outside the lumen)."""
    ax, ay = avoid
    lx = float(np.clip(SIZE - ax + rng.normal(0, 25), 40, SIZE - 40))
    ly = float(np.clip(SIZE - ay + rng.normal(0, 25), 40, SIZE - 40))
    ang = np.arctan2(_YY - ly, _XX - lx)
    wob = 1 + 0.12 * np.cos(2 * ang + rng.uniform(0, 6.3)) + 0.06 * np.cos(3 * ang + rng.uniform(0, 6.3))
    d = np.sqrt((_XX - lx) ** 2 + (_YY - ly) ** 2) / wob
    lumen_r = rng.uniform(18, 40)
    height = np.zeros((SIZE, SIZE), np.float32)
    rad = lumen_r * 1.4
    while rad < 400:
        w = rng.uniform(5, 12)
        height += rng.uniform(0.6, 1.0) * np.exp(-(((d - rad) / w) ** 2)) * (1 + 0.3 * np.cos(ang * 3 + rad))
        rad += rng.uniform(28, 60)
    height += 0.15 * smooth_noise(rng, 10)
    gy, gx = np.gradient(height * 6.0)
    n = np.dstack([-gx, -gy, np.ones_like(gx)])
    n /= np.linalg.norm(n, axis=2, keepdims=True)
    light = np.array([rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3), 1.0])
    light /= np.linalg.norm(light)
    diffuse = np.clip(n @ light, 0, 1).astype(np.float32)
    base = np.array([rng.uniform(0.78, 0.9), rng.uniform(0.36, 0.48), rng.uniform(0.3, 0.42)], np.float32)
    img = np.ones((SIZE, SIZE, 3), np.float32) * base
    img *= (1 + 0.04 * smooth_noise(rng, 25))[..., None]
    vn = smooth_noise(rng, 2.8)
    vessels = np.exp(-((vn / 0.08) ** 2)) * np.clip(smooth_noise(rng, 15) + 0.3, 0, 1)
    img = img * (1 - 0.3 * vessels[..., None]) + 0.3 * vessels[..., None] * np.array(
        [0.55, 0.12, 0.14], np.float32
    )
    falloff = 1 - 0.85 * np.exp(-((d / (lumen_r * 1.6)) ** 2))
    dist_c = np.sqrt((_XX - SIZE / 2) ** 2 + (_YY - SIZE / 2) ** 2) / (SIZE / 2)
    vign = np.clip(1.05 - 0.35 * dist_c**2, 0.3, 1.05)
    shade = (0.45 + 0.65 * diffuse) * falloff * vign
    img *= shade[..., None]
    cand = np.flatnonzero(((diffuse > np.percentile(diffuse, 99)) & (falloff > 0.7)).ravel())
    spec = np.zeros((SIZE, SIZE), np.float32)
    if cand.size:
        for j in rng.choice(cand, size=min(int(rng.integers(2, 9)), cand.size), replace=False):
            y, x = divmod(int(j), SIZE)
            axes = (int(rng.integers(1, 4)), int(rng.integers(1, 3)))
            cv2.ellipse(spec, (x, y), axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1, cv2.LINE_AA)
    spec = np.asarray(cv2.GaussianBlur(spec, (0, 0), 0.8), np.float32)
    img = img + np.clip(spec * 1.5, 0, 1)[..., None] * (1 - img)
    return np.clip(img, 0, 1).astype(np.float32), falloff > 0.8


# ---------------------------------------------------------------- procedural: angiography


@dataclass(frozen=True)
class Vessel:
    """A vessel centreline (float32 (N, 2) of x, y) with a lumen radius in pixels."""

    points: F32
    radius: float


def _grow(
    rng: np.random.Generator,
    start: np.ndarray,
    angle: float,
    radius: float,
    depth: int,
    out: list[Vessel],
    target: np.ndarray | None = None,
) -> None:
    pts = [start.astype(np.float64)]
    p = start.astype(np.float64)
    # a vessel aimed at a target runs until it leaves the image (it must pass the target)
    n_steps = 150 if target is not None else int(rng.integers(35, 70))
    step = 3.0
    reached = False
    for _ in range(n_steps):
        angle += rng.normal(0, 0.12)
        if target is not None and not reached:
            want = np.arctan2(target[1] - p[1], target[0] - p[0])
            diff = (want - angle + np.pi) % (2 * np.pi) - np.pi
            reached = bool(np.hypot(*(target - p)) < 12)
            angle += 0.25 * diff
        p = p + step * np.array([np.cos(angle), np.sin(angle)])
        pts.append(p)
        if not (-20 < p[0] < SIZE + 20 and -20 < p[1] < SIZE + 20):
            break
    arr = np.asarray(pts, np.float32)
    out.append(Vessel(arr, radius))
    if depth >= 3 or radius < 1.2 or len(arr) < 8:
        return
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(3, len(arr) - 2))
        seg = arr[min(i + 1, len(arr) - 1)] - arr[i - 1]
        base_ang = float(np.arctan2(seg[1], seg[0]))
        side = 1 if rng.random() < 0.5 else -1
        _grow(
            rng,
            arr[i],
            base_ang + side * rng.uniform(0.4, 1.0),
            radius * rng.uniform(0.55, 0.8),
            depth + 1,
            out,
            None,
        )


def vessel_tree(rng: np.random.Generator, target: tuple[float, float]) -> list[Vessel]:
    """A coronary-like tree: one main vessel entering from an edge and passing near ``target``
    (where the lesion goes), and one or two further trees."""
    vessels: list[Vessel] = []
    tx, ty = target
    edge = int(rng.integers(0, 2))
    start = np.array([rng.uniform(20, 236), -5.0]) if edge == 0 else np.array([-5.0, rng.uniform(20, 236)])
    ang = float(np.arctan2(ty - start[1], tx - start[0]))
    _grow(rng, start, ang, rng.uniform(4.0, 5.5), 1, vessels, np.array([tx, ty]))
    for _ in range(int(rng.integers(1, 3))):
        s = (
            np.array([rng.uniform(0, 256), -5.0])
            if rng.random() < 0.5
            else np.array([-5.0, rng.uniform(0, 256)])
        )
        a = float(np.arctan2(128 - s[1], 128 - s[0]) + rng.normal(0, 0.5))
        _grow(rng, s, a, rng.uniform(3.0, 4.5), 0, vessels)
    return vessels


def vessel_density(vessels: list[Vessel]) -> F32:
    """Projected contrast path length (px) through cylindrical lumens: 2 sqrt(r^2 - d^2), summed
    over radius groups (float32 (256, 256))."""
    groups: dict[float, list[Vessel]] = {}
    for v in vessels:
        groups.setdefault(round(v.radius * 2) / 2, []).append(v)
    dens = np.zeros((SIZE, SIZE), np.float32)
    for r, vs in groups.items():
        canvas = np.full((SIZE, SIZE), 255, np.uint8)
        for v in vs:
            cv2.polylines(canvas, [np.round(v.points).astype(np.int32)], False, 0, 1, cv2.LINE_8)
        d = cv2.distanceTransform(canvas, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        dens = np.maximum(dens, 2 * np.sqrt(np.clip(r * r - d * d, 0, None)))
    return dens


def angio_background(rng: np.random.Generator) -> F32:
    """Unopacified X-ray background in [0, 1] (bright, soft tissue and a faint rib/spine pattern)."""
    bg = rng.uniform(0.68, 0.82) + 0.06 * smooth_noise(rng, 40) + 0.02 * smooth_noise(rng, 6)
    ang = rng.uniform(-0.5, 0.5)
    ribs = np.sin((np.cos(ang) * _YY + np.sin(ang) * _XX) / rng.uniform(9, 14)) ** 8
    bg -= 0.04 * ribs * np.clip(smooth_noise(rng, 50) + 0.5, 0, 1)
    bg *= np.clip(1 - 0.25 * ((_XX - 128) ** 2 + (_YY - 128) ** 2) / 128**2, 0.6, 1)
    return bg.astype(np.float32)
