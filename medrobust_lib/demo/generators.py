"""One generator per modality: background + synthetic lesion with an exact mask.

Every generator takes an explicit ``np.random.Generator`` and a :class:`Placement` and returns a
:class:`Generated` whose ``image`` and ``background`` are the arrays *as written to disk* (dtype per
modality, see :data:`WRITTEN_DTYPES`) and whose ``mask`` is the lesion geometry (bool (256, 256)).
Noise drawn after the lesion (CT noise, speckle, quantum noise) is identical in both arrays, so
outside the mask ``image == background`` except where a modality's physics says otherwise
(ultrasound posterior enhancement/shadowing below the lesion, which is not part of the lesion
mask, exactly as in BUSI annotations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.demo import backgrounds as bgs
from medrobust_lib.demo.geometry import (
    SIZE,
    Blob,
    Placement,
    blob_rho,
    choose_center,
    erode_disk,
    lesion_radius,
    random_blob,
    smooth_noise,
    soft_alpha,
)

F32 = npt.NDArray[np.float32]
Bool = npt.NDArray[np.bool_]

WRITTEN_DTYPES: dict[str, str] = {
    "ct": "int16 HU (stored as HU + 1024 with RescaleIntercept -1024)",
    "mri": "int16 relative signal x 1000",
    "ultrasound": "uint8 gray",
    "xray": "uint16 gray (full 16-bit range, bone bright)",
    "fundus": "uint8 RGB",
    "oct": "uint8 gray",
    "pathology": "uint8 RGB",
    "dermoscopy": "uint8 RGB",
    "endoscopy": "uint8 RGB",
    "angiography": "uint8 gray",
}


@dataclass
class Generated:
    """One generated image. ``image``/``background``: as written (see WRITTEN_DTYPES), (256, 256)
    or (256, 256, 3); ``mask``: bool (256, 256), non-empty; ``extra``: modality specifics."""

    image: np.ndarray
    background: np.ndarray
    mask: Bool
    lesion_type: str
    anatomy: str
    source: str
    extra: dict[str, Any] = field(default_factory=dict)


def _place_blob(
    rng: np.random.Generator,
    pl: Placement,
    *,
    allowed: Bool | None = None,
    small: tuple[float, float] = (8, 14),
    large: tuple[float, float] = (24, 38),
    irregularity: float = 0.15,
    aspect: tuple[float, float] = (0.7, 1.0),
    n_harmonics: int = 4,
    erode_frac: float = 0.5,
) -> Blob:
    r = lesion_radius(rng, pl.large, small, large)
    b = random_blob(rng, 0, 0, r, irregularity=irregularity, aspect=aspect, n_harmonics=n_harmonics)
    ok = None if allowed is None else erode_disk(allowed, b.reach * erode_frac)
    cx, cy = choose_center(rng, pl, b.reach, ok)
    return dataclasses.replace(b, cx=cx, cy=cy)


def _to_u8(x: np.ndarray) -> npt.NDArray[np.uint8]:
    # float32 first: a float64 lesioned array equal to the float32 background outside the mask
    # must quantise to the same bytes there
    x32 = np.asarray(x, np.float32)
    return np.round(np.clip(x32, 0.0, 1.0) * np.float32(255.0)).astype(np.uint8)


def _nonempty(mask: Bool, what: str) -> Bool:
    if not mask.any():  # geometry guarantees a centre pixel; this guards future edits
        raise RuntimeError(f"{what}: empty lesion mask")
    return mask


# ---------------------------------------------------------------- CT


def gen_ct(rng: np.random.Generator, pl: Placement) -> Generated:
    """CT in HU: a hypo- or hyperdense lesion (+-25..70 HU) inside soft tissue; correlated noise."""
    hu, source, anatomy = bgs.ct_background(rng)
    tissue = (hu > -150) & (hu < 200)
    blob = _place_blob(rng, pl, allowed=tissue, irregularity=0.18, erode_frac=0.9)
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.35)
    hyper = bool(rng.random() < 0.5)
    delta = float(rng.uniform(25, 70)) * (1 if hyper else -1)
    tex = 5.0 * smooth_noise(rng, 1.5)
    lesioned = hu + alpha * (delta + tex)
    noise = float(rng.uniform(4, 10)) * smooth_noise(rng, 0.7)

    def q(a: F32) -> np.ndarray:
        return np.clip(np.round(a + noise), -1024, 3071).astype(np.int16)

    return Generated(
        q(lesioned),
        q(hu),
        _nonempty(rho < 1, "ct"),
        "hyperdense lesion" if hyper else "hypodense lesion",
        anatomy,
        source,
        {"delta_hu": round(delta, 1)},
    )


# ---------------------------------------------------------------- MRI (cases of several slices)


@dataclass
class MriCase:
    """A small MRI volume: ``volume``/``background`` int16 (S, 256, 256) (slice-first here; the
    NIfTI writer transposes), ``labels`` uint8 (S, 256, 256) with 1 = lesion; the first and last
    slices have no lesion."""

    volume: npt.NDArray[np.int16]
    background: npt.NDArray[np.int16]
    labels: npt.NDArray[np.uint8]
    lesion_type: str
    anatomy: str
    source: str

    @property
    def foreground_slices(self) -> list[int]:
        return [int(z) for z in np.flatnonzero(self.labels.reshape(self.labels.shape[0], -1).any(axis=1))]


def gen_mri_case(rng: np.random.Generator, pl: Placement, n_fg: int) -> MriCase:
    """``n_fg`` lesion slices between two lesion-free slices; a bright tumour-like lesion whose
    cross-section changes from slice to slice; bias field and Rician noise."""
    view = bgs.mri_view(rng)
    n = n_fg + 2
    tissue = cv2.GaussianBlur(view.base, (0, 0), 2) > 0.15
    blob = _place_blob(rng, pl, allowed=tissue, small=(9, 14), large=(26, 38), irregularity=0.2)
    gain = float(rng.uniform(0.3, 0.5))
    bias = 1 + 0.15 * smooth_noise(rng, 60)
    sigma = float(rng.uniform(0.01, 0.03))
    necrotic = pl.large and rng.random() < 0.5
    vol = np.zeros((n, SIZE, SIZE), np.int16)
    bgv = np.zeros_like(vol)
    lab = np.zeros((n, SIZE, SIZE), np.uint8)
    for z in range(n):
        base = bgs.mri_slice(view, z - (n - 1) / 2, rng)
        les = base.copy()
        if 1 <= z <= n_fg:
            off = (z - 1 - (n_fg - 1) / 2) / (n_fg / 2 + 0.75)
            scale = float(np.sqrt(max(1 - off * off, 0.3)) * rng.uniform(0.92, 1.05))
            b = dataclasses.replace(
                blob, r=blob.r * scale, cx=blob.cx + rng.normal(0, 1.0), cy=blob.cy + rng.normal(0, 1.0)
            )
            rho = blob_rho(b)
            alpha = soft_alpha(rho, 0.4)
            core = np.clip(1.0 - 0.7 * np.exp(-((rho / 0.45) ** 4)), 0, 1) if necrotic else 1.0
            les = base + alpha * (gain * core + 0.05 * smooth_noise(rng, 1.5))
            lab[z] = rho < 1
        n1 = sigma * rng.standard_normal((SIZE, SIZE)).astype(np.float32)
        n2 = sigma * rng.standard_normal((SIZE, SIZE)).astype(np.float32)
        for arr, src in ((vol, les), (bgv, base)):
            sig = np.sqrt((src * bias + n1) ** 2 + n2**2)
            arr[z] = np.clip(np.round(sig * 1000), 0, 32767).astype(np.int16)
    return MriCase(vol, bgv, lab, "hyperintense tumour-like lesion", view.anatomy, view.source)


# ---------------------------------------------------------------- ultrasound


def gen_ultrasound(rng: np.random.Generator, pl: Placement, malignant: bool) -> Generated:
    """Hypoechoic lesion; benign: smooth, wider-than-tall, posterior enhancement; malignant:
    irregular, taller-than-wide, posterior shadowing. Fresh speckle on top of the real B-mode."""
    echo = bgs.us_background(rng)
    sm = cv2.GaussianBlur(echo, (0, 0), 8)
    tissue = sm > np.percentile(sm, 40)  # keep the lesion off the (hypoechoic) node of the source
    if malignant:
        blob = _place_blob(
            rng, pl, allowed=tissue, irregularity=0.35, n_harmonics=7, aspect=(0.75, 1.0), erode_frac=1.0
        )
        blob = dataclasses.replace(blob, angle=float(np.pi / 2 + rng.normal(0, 0.2)))
    else:
        blob = _place_blob(rng, pl, allowed=tissue, irregularity=0.07, aspect=(0.5, 0.8), erode_frac=1.0)
        blob = dataclasses.replace(blob, angle=float(rng.normal(0, 0.15)))
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.25, floor=0.4)
    dark = float(rng.uniform(0.7, 0.9))
    lesioned = echo * (1 - dark * alpha) + 0.02 * alpha
    path = np.cumsum(alpha, axis=0) / max(float(alpha.sum(axis=0).max()), 1.0)
    path = cv2.GaussianBlur(np.clip(path, 0, 1), (0, 0), sigmaX=2.0, sigmaY=0.1)
    depth_decay = np.exp(-np.maximum(np.arange(SIZE, dtype=np.float32)[:, None] - blob.cy, 0) / 140.0)
    post = float(rng.uniform(-0.55, -0.3) if malignant else rng.uniform(0.25, 0.5))
    lesioned = lesioned * (1 + post * path * depth_decay)
    spk = rng.rayleigh(1.0, (SIZE, SIZE)).astype(np.float32)
    spk = np.asarray(cv2.GaussianBlur(spk, (0, 0), sigmaX=1.1, sigmaY=0.6), np.float32)
    spk /= spk.mean()
    gain = float(rng.uniform(1.0, 1.25))

    def q(a: F32) -> npt.NDArray[np.uint8]:
        return _to_u8((np.clip(a, 0, None) * (0.5 + 0.5 * spk) * gain) ** 0.85)

    return Generated(
        q(lesioned),
        q(echo),
        _nonempty(rho < 1, "ultrasound"),
        "hypoechoic mass" if malignant else "hypoechoic nodule",
        "lymph node region (soft tissue)",
        "pydicom-data US1_UNCR.dcm",
        {
            "class": "malignant" if malignant else "benign",
            "posterior": "shadowing" if malignant else "enhancement",
        },
    )


# ---------------------------------------------------------------- X-ray


def gen_xray(rng: np.random.Generator, pl: Placement) -> Generated:
    """Chest radiograph with a nodule (brighter, soft edge) preferably in a lung field."""
    img, lungs = bgs.xray_background(rng)
    blob = _place_blob(rng, pl, allowed=lungs, small=(6, 12), large=(22, 34), irregularity=0.1)
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.6, floor=0.35)
    c = float(rng.uniform(0.08, 0.2))
    lesioned = img + alpha * c * (0.8 + 0.2 * smooth_noise(rng, 2.0))
    noise = float(rng.uniform(0.003, 0.008)) * smooth_noise(rng, 0.6)

    def q(a: F32) -> npt.NDArray[np.uint16]:
        return np.round(np.clip(a + noise, 0, 1) * 65535).astype(np.uint16)

    return Generated(
        q(lesioned),
        q(img),
        _nonempty(rho < 1, "xray"),
        "pulmonary nodule",
        "chest",
        "pydicom-data RG1_UNCI.dcm",
        {"contrast": round(c, 3)},
    )


# ---------------------------------------------------------------- fundus


def gen_fundus(rng: np.random.Generator, pl: Placement) -> Generated:
    """Fundus photograph with a synthetic optic disc (pale, with a brighter cup and vessels).
    ``mask`` is the disc (cup + rim); ``extra['cup_mask']`` the cup; ``extra['cdr']`` the vertical
    cup-to-disc ratio."""
    img, fov = bgs.fundus_background(rng)
    blob = _place_blob(
        rng,
        pl,
        allowed=fov,
        small=(11, 15),
        large=(25, 34),
        irregularity=0.05,
        aspect=(0.85, 0.97),
        erode_frac=1.0,
    )
    blob = dataclasses.replace(blob, angle=float(np.pi / 2 + rng.normal(0, 0.15)))
    rho = blob_rho(blob)
    disc = rho < 1
    cdr = float(rng.uniform(0.3, 0.8))
    cup_b = dataclasses.replace(
        blob,
        r=blob.r * cdr,
        cx=blob.cx + rng.normal(0, 0.06) * blob.r,
        cy=blob.cy + rng.normal(0, 0.06) * blob.r,
        amps=tuple(a * 1.5 for a in blob.amps),
    )
    cup = (blob_rho(cup_b) < 1) & disc
    a_disc = soft_alpha(rho, 0.35, floor=0.35) * 0.85
    a_cup = soft_alpha(blob_rho(cup_b), 0.5, floor=0.2) * cup
    rim_col = np.array([rng.uniform(0.9, 1.0), rng.uniform(0.62, 0.78), rng.uniform(0.38, 0.55)], np.float32)
    cup_col = np.array([1.0, rng.uniform(0.86, 0.95), rng.uniform(0.7, 0.85)], np.float32)
    tex = (1 + 0.04 * smooth_noise(rng, 1.5))[..., None]
    les = img * (1 - a_disc[..., None]) + rim_col * tex * a_disc[..., None]
    les = les * (1 - a_cup[..., None]) + cup_col * a_cup[..., None]
    vess = np.zeros((SIZE, SIZE), np.float32)
    width = 1 if blob.r < 20 else 2
    for k in range(int(rng.integers(3, 6))):
        # the central vessels leave the cup mostly upwards and downwards, curving
        ang = (np.pi / 2 * (1 if k % 2 else -1) + rng.normal(0, 0.45)) if k < 4 else rng.uniform(0, 2 * np.pi)
        bend = rng.normal(0, 0.5)
        t = np.linspace(0, 1.3, 12)[:, None]
        dirs = np.hstack([np.cos(ang + bend * t), np.sin(ang + bend * t)])
        pts = np.array([cup_b.cx, cup_b.cy]) + dirs * t * blob.r
        cv2.polylines(vess, [np.round(pts).astype(np.int32)], False, 1.0, width, cv2.LINE_AA)
    vess = vess * disc * 0.6
    vcol = np.array([0.6, 0.15, 0.1], np.float32)
    les = les * (1 - vess[..., None]) + vcol * vess[..., None]
    return Generated(
        _to_u8(les),
        _to_u8(img),
        _nonempty(disc, "fundus"),
        "optic disc",
        "retina",
        "skimage retina (disc inpainted)",
        {"cup_mask": cup, "cdr": round(cdr, 3), "glaucoma": cdr >= 0.6},
    )


# ---------------------------------------------------------------- OCT


def gen_oct(rng: np.random.Generator, pl: Placement) -> Generated:
    """Procedural B-scan with a dark intraretinal fluid pocket (wider than tall)."""
    scale = float(rng.uniform(1.0, 1.35))
    inner = bgs.OCT_INNER_DEPTH * scale
    rx = lesion_radius(rng, pl.large, (9, 15), (30, 44))
    ry = float(min(rx * rng.uniform(0.35, 0.6), 0.4 * inner))
    if pl.large:
        ry = max(ry, 0.32 * inner)
    b0 = random_blob(rng, 0, 0, rx, irregularity=0.08, aspect=(ry / rx, ry / rx), n_harmonics=3)
    b0 = dataclasses.replace(b0, angle=float(rng.normal(0, 0.08)))
    cx, cy = choose_center(rng, pl, b0.reach)
    cy = float(np.clip(cy, 30 + ry, 220 - ry))
    blob = dataclasses.replace(b0, cx=cx, cy=cy)
    free = inner - 2 * ry - 8
    ilm_at = max(cy - ry - 4 - rng.uniform(0, max(free, 0.0)), 6.0)  # keep the ILM in view
    scene = bgs.oct_scene(rng, cx, ilm_at, scale)
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.3, floor=0.5)
    refl = scene.reflectivity
    les = refl * (1 - 0.92 * alpha) + 0.01 * alpha
    spk = bgs.oct_speckle(rng)
    floor = 0.04 * np.abs(smooth_noise(rng, 0.8))
    gain = float(rng.uniform(0.9, 1.1))

    def q(a: F32) -> npt.NDArray[np.uint8]:
        return _to_u8(((a * spk) ** 0.7) * gain + floor)

    return Generated(
        q(les), q(refl), _nonempty(rho < 1, "oct"), "intraretinal fluid pocket", "retina", "procedural B-scan"
    )


# ---------------------------------------------------------------- pathology


_H_OD = np.array([0.650, 0.704, 0.286], np.float32)  # haematoxylin optical density (Ruifrok & Johnston)


def gen_pathology(rng: np.random.Generator, pl: Placement) -> Generated:
    """IHC crop with a tumour nest: haematoxylin-tinted region packed with large dark nuclei
    (added in optical density, Beer-Lambert)."""
    rgb = bgs.pathology_background(rng)
    blob = _place_blob(rng, pl, small=(10, 16), large=(26, 40), irregularity=0.3, n_harmonics=6)
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.2, floor=0.4)
    nuclei = np.zeros((SIZE, SIZE), np.float32)
    area = float((rho < 1).sum())
    count = int(area / rng.uniform(28, 45)) + 3
    x0, y0 = blob.cx - blob.reach, blob.cy - blob.reach
    for _ in range(count):
        x, y = x0 + rng.uniform(0, 2 * blob.reach), y0 + rng.uniform(0, 2 * blob.reach)
        ax = rng.uniform(2.5, 4.8)
        cv2.ellipse(
            nuclei,
            (int(x), int(y)),
            (int(round(ax)), int(round(ax * rng.uniform(0.6, 0.95)))),
            float(rng.uniform(0, 180)),
            0,
            360,
            float(rng.uniform(0.55, 0.95)),
            -1,
            cv2.LINE_AA,
        )
    nuclei *= 1 + 0.25 * smooth_noise(rng, 0.7)
    od = -np.log(np.clip(rgb, 1 / 255, 1.0))
    conc = alpha * (float(rng.uniform(0.12, 0.25)) + np.clip(nuclei, 0, 1.2))
    # only where the lesion is: exp(-log(x)) is not bit-exact, the rest must stay untouched
    les = np.where((conc > 0)[..., None], np.exp(-(od + conc[..., None] * _H_OD * 1.4)), rgb)
    return Generated(
        _to_u8(les),
        _to_u8(rgb),
        _nonempty(rho < 1, "pathology"),
        "tumour cell cluster",
        "colon",
        "skimage immunohistochemistry",
    )


# ---------------------------------------------------------------- dermoscopy


_MELANIN = np.array([0.9, 1.45, 2.1], np.float32)  # relative absorption R, G, B -> brown


def gen_dermoscopy(rng: np.random.Generator, pl: Placement) -> Generated:
    """Procedural skin with a pigmented lesion: irregular outline, pigment network, darker centre,
    globules and sometimes a blue-grey veil; applied as transmittance so hairs stay visible."""
    skin, fov = bgs.skin_background(rng)
    blob = _place_blob(
        rng,
        pl,
        allowed=fov,
        small=(10, 16),
        large=(28, 42),
        irregularity=float(rng.uniform(0.15, 0.4)),
        n_harmonics=6,
        erode_frac=1.0,
    )
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.35, floor=0.35)
    net = np.clip(1 - np.abs(smooth_noise(rng, 2.0)) / 0.4, 0, 1)
    conc = float(rng.uniform(0.35, 0.8)) + 0.45 * (1 - rho) * float(rng.uniform(0.3, 1.0)) + 0.3 * net
    conc = conc * (1 + 0.15 * smooth_noise(rng, 6))
    glob = np.zeros((SIZE, SIZE), np.float32)
    for _ in range(int(rng.integers(0, 12))):
        t = rng.uniform(0, 2 * np.pi)
        rr = blob.r * rng.uniform(0.5, 0.95)
        cv2.circle(
            glob,
            (int(blob.cx + rr * np.cos(t)), int(blob.cy + rr * np.sin(t))),
            int(rng.integers(1, 4)),
            1.0,
            -1,
            cv2.LINE_AA,
        )
    conc = conc + 0.8 * glob
    trans = np.exp(-(alpha * conc)[..., None] * _MELANIN)
    les = skin * trans
    if rng.random() < 0.35:
        veil = soft_alpha(blob_rho(dataclasses.replace(blob, r=blob.r * 0.5)), 0.5, floor=0.0) * alpha
        les = les * (1 - 0.4 * veil[..., None]) + 0.4 * veil[..., None] * np.array(
            [0.35, 0.4, 0.5], np.float32
        )
    return Generated(
        _to_u8(les),
        _to_u8(skin),
        _nonempty(rho < 1, "dermoscopy"),
        "pigmented skin lesion",
        "skin",
        "procedural skin",
    )


# ---------------------------------------------------------------- endoscopy


def gen_endoscopy(rng: np.random.Generator, pl: Placement) -> Generated:
    """Procedural colon mucosa with a polyp: a shaded dome (diffuse + specular) with pit texture."""
    r = lesion_radius(rng, pl.large, (10, 16), (28, 42))
    b0 = random_blob(rng, 0, 0, r, irregularity=0.12, aspect=(0.75, 1.0))
    cx, cy = choose_center(rng, pl, b0.reach)
    mucosa, _ = bgs.mucosa_background(rng, (cx, cy))
    blob = dataclasses.replace(b0, cx=cx, cy=cy)
    rho = blob_rho(blob)
    alpha = soft_alpha(rho, 0.25, floor=0.5)
    h = np.sqrt(np.clip(1 - rho**2, 0, 1)) * blob.r * 0.8
    gy, gx = np.gradient(h)
    n = np.dstack([-gx, -gy, np.ones_like(gx)])
    n /= np.linalg.norm(n, axis=2, keepdims=True)
    light = np.array([rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4), 1.0])
    light /= np.linalg.norm(light)
    diff = np.clip(n @ light, 0, 1).astype(np.float32)
    half = light + np.array([0, 0, 1.0])
    half /= np.linalg.norm(half)
    spec = np.clip(n @ half, 0, 1).astype(np.float32) ** 60 * float(rng.uniform(0.5, 1.0))
    col = np.array([rng.uniform(0.85, 0.97), rng.uniform(0.45, 0.6), rng.uniform(0.4, 0.52)], np.float32)
    pits = 1 + 0.06 * smooth_noise(rng, 1.2)
    local = float(mucosa[rho < 1].mean()) / float(mucosa.mean() + 1e-6)
    polyp = col * (0.35 + 0.75 * diff * pits)[..., None] * np.clip(local, 0.6, 1.2)
    polyp = polyp + spec[..., None] * (1 - polyp)
    les = mucosa * (1 - alpha[..., None]) + polyp * alpha[..., None]
    return Generated(
        _to_u8(les), _to_u8(mucosa), _nonempty(rho < 1, "endoscopy"), "polyp", "colon", "procedural mucosa"
    )


# ---------------------------------------------------------------- angiography


def gen_angiography(rng: np.random.Generator, pl: Placement) -> Generated:
    """Procedural coronary-like tree (dark, contrast-filled) on a bright background. Large lesions
    are saccular aneurysms (a contrast-filled sac on the vessel wall); small ones an aneurysm or a
    stenosis (the lumen footprint over a short segment, made brighter: less contrast)."""
    # a generous reach keeps the target far from the midlines: the sac sits beside the vessel
    tx, ty = choose_center(rng, pl, 40.0 if pl.large else 26.0)
    vessels = bgs.vessel_tree(rng, (tx, ty))
    main = vessels[0]
    dens = bgs.vessel_density(vessels)
    pts = main.points
    dist = np.hypot(pts[:, 0] - tx, pts[:, 1] - ty)
    half = SIZE / 2
    # prefer centreline points well inside the planned quadrant, so the lesion lands there
    inside = ((pts[:, 0] > half + 12) == pl.right) & ((pts[:, 1] > half + 12) == pl.lower)
    inside &= (np.abs(pts[:, 0] - half) > 12) & (np.abs(pts[:, 1] - half) > 12)
    inside[:2] = False
    inside[-2:] = False
    i = int(np.argmin(np.where(inside, dist, dist + 1e4)))
    i = int(np.clip(i, 2, len(pts) - 3))
    p = main.points[i].astype(np.float64)
    tan = main.points[i + 2].astype(np.float64) - main.points[i - 2]
    tan /= np.linalg.norm(tan) + 1e-9
    stenosis = (not pl.large) and rng.random() < 0.5
    if stenosis:
        canvas = np.full((SIZE, SIZE), 255, np.uint8)
        cv2.polylines(canvas, [np.round(main.points).astype(np.int32)], False, 0, 1, cv2.LINE_8)
        d_line = cv2.distanceTransform(canvas, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        length = float(rng.uniform(6, 12))
        along = np.hypot(bgs._XX - p[0], bgs._YY - p[1])
        region = (d_line < main.radius - 0.25) & (along < length)
        w = 0.5 * (1 + np.cos(np.pi * np.clip(along / length, 0, 1)))
        sev = float(rng.uniform(0.5, 0.8))
        new_dens = dens * np.where(region, 1 - sev * np.maximum(w, 0.25), 1.0)
        mask = region
        kind = "stenosis"
    else:
        rs = lesion_radius(rng, pl.large, (5, 9), (22, 30))
        normal = np.array([-tan[1], tan[0]])
        away = np.array([1.0 if pl.right else -1.0, 1.0 if pl.lower else -1.0])
        if normal @ away < 0:  # grow the sac away from the midlines
            normal = -normal
        c = p + normal * (main.radius + 0.55 * rs)
        b0 = random_blob(rng, c[0], c[1], rs, irregularity=0.08, aspect=(0.8, 1.0))
        rho = blob_rho(b0)
        # a sac fills with contrast like the parent lumen: cap the path length near the vessel's
        sac = 2.8 * main.radius * np.sqrt(np.clip(1 - rho**2, 0, 1)) ** 0.5
        new_dens = np.where(rho < 1, np.maximum(dens, sac) + 1.0, dens)
        mask = rho < 1
        kind = "aneurysm"
    bg = bgs.angio_background(rng)
    mu = float(rng.uniform(0.1, 0.16))
    noise = float(rng.uniform(0.008, 0.018)) * smooth_noise(rng, 0.7)

    def q(dn: F32) -> npt.NDArray[np.uint8]:
        return _to_u8(bg * np.exp(-mu * dn) + noise)

    return Generated(
        q(new_dens.astype(np.float32)),
        q(dens),
        _nonempty(mask, "angiography"),
        kind,
        "coronary arteries",
        "procedural vessel tree",
    )


GENERATORS: dict[str, Callable[[np.random.Generator, Placement], Generated]] = {
    "ct": gen_ct,
    "xray": gen_xray,
    "fundus": gen_fundus,
    "oct": gen_oct,
    "pathology": gen_pathology,
    "dermoscopy": gen_dermoscopy,
    "endoscopy": gen_endoscopy,
    "angiography": gen_angiography,
}
"""2D generators by modality (ultrasound takes a class label and MRI works per case)."""
