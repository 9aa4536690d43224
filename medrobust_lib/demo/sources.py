"""Real background images that ship inside installed wheels (no download at run time).

Every loader is cached per process and returns a read-only float32 array:

- CT: ``CT_small.dcm`` (pydicom, thoracic level, HU), frame 0 of ``eCT_Supplemental.dcm``
  (pydicom-data, skull-stripped head CT, HU), ``skimage.data.shepp_logan_phantom`` mapped to HU.
- MRI: ``MR_small.dcm`` (pydicom), ``MR2_UNCI.dcm`` (pydicom-data, shoulder), and the Shepp-Logan
  phantom with T2-like contrast. ``skimage.data.brain`` is *not* used: in scikit-image 0.26 it needs
  ``pooch`` and a download, which would make the demo depend on the network.
- Ultrasound: the B-mode area of ``US1_UNCR.dcm`` (pydicom-data), Doppler colour and calipers
  inpainted, in [0, 1].
- X-ray: ``RG1_UNCI.dcm`` (pydicom-data, chest CR, MONOCHROME1 inverted so bone is bright), [0, 1].
- Fundus: ``skimage.data.retina`` with its optic disc inpainted (the demo inserts its own disc with
  an exact mask), RGB [0, 1].
- Pathology: ``skimage.data.immunohistochemistry`` (colon, DAB + haematoxylin), RGB [0, 1].
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np
import numpy.typing as npt
import pydicom
from pydicom.data import get_testdata_file

from medrobust_lib.seeding import rng_for

F32 = npt.NDArray[np.float32]


def _dicom(name: str) -> pydicom.Dataset:
    path = get_testdata_file(name)  # by exact name: the glob helper would try to download
    if path is None:
        raise FileNotFoundError(f"{name} not found in pydicom / pydicom-data test files")
    return pydicom.dcmread(str(path))


def _frozen(a: np.ndarray) -> F32:
    out = np.ascontiguousarray(a, dtype=np.float32)
    out.setflags(write=False)
    return out


def _robust_unit(a: np.ndarray, lo_pct: float = 0.5, hi_pct: float = 99.5) -> np.ndarray:
    lo, hi = np.percentile(a, [lo_pct, hi_pct])
    return np.clip((a - lo) / max(float(hi - lo), 1e-6), 0.0, 1.0)


# ---------------------------------------------------------------- CT (Hounsfield units)


@lru_cache(maxsize=1)
def ct_small_hu() -> F32:
    """``CT_small.dcm`` in HU, float32 (128, 128), about -1024..1200."""
    ds = _dicom("CT_small.dcm")
    a = ds.pixel_array.astype(np.float32) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    return _frozen(a)


@lru_cache(maxsize=1)
def ect_head_hu() -> F32:
    """Frame 0 of ``eCT_Supplemental.dcm`` (skull-stripped head CT) in HU, float32 (512, 512).
    Frame 1 is not used: it shows a large hypodense region that would be an unlabelled lesion."""
    ds = _dicom("eCT_Supplemental.dcm")
    a = ds.pixel_array[0].astype(np.float32) - 1024.0  # RescaleIntercept -1024, slope 1 (shared groups)
    a[a <= -1000] = -1000.0
    return _frozen(a)


@lru_cache(maxsize=1)
def _phantom() -> np.ndarray:
    from skimage.data import shepp_logan_phantom

    return shepp_logan_phantom().astype(np.float32)


def _phantom_head(ph: np.ndarray) -> np.ndarray:
    from scipy.ndimage import binary_fill_holes

    return np.asarray(binary_fill_holes(ph > 0.05))


@lru_cache(maxsize=1)
def phantom_hu() -> F32:
    """Shepp-Logan phantom (400, 400) mapped to plausible head-CT HU: air -1000, skull ~800,
    brain 20-50, ventricles ~5; lightly smoothed so edges are not unnaturally sharp."""
    ph = _phantom()
    head = _phantom_head(ph)
    hu = np.interp(ph, [0.0, 0.1, 0.2, 0.3, 1.0], [5.0, 22.0, 35.0, 48.0, 800.0])
    hu = np.where(head, hu, -1000.0).astype(np.float32)
    return _frozen(cv2.GaussianBlur(hu, (0, 0), 1.2))


# ---------------------------------------------------------------- MRI ([0, 1] relative signal)


@lru_cache(maxsize=1)
def mr_small() -> F32:
    """``MR_small.dcm`` (64, 64) robustly scaled to [0, 1]."""
    return _frozen(_robust_unit(_dicom("MR_small.dcm").pixel_array.astype(np.float32)))


@lru_cache(maxsize=1)
def mr_shoulder() -> F32:
    """``MR2_UNCI.dcm`` (shoulder) area-downsampled to (512, 512), robustly scaled to [0, 1]."""
    a = _dicom("MR2_UNCI.dcm").pixel_array.astype(np.float32)
    a = np.asarray(cv2.resize(a, (512, 512), interpolation=cv2.INTER_AREA), np.float32)
    return _frozen(_robust_unit(a, 0.5, 99.8))


@lru_cache(maxsize=1)
def phantom_t2() -> F32:
    """Shepp-Logan phantom with T2-like contrast in [0, 1]: CSF bright, skull dark, brain grey."""
    ph = _phantom()
    head = _phantom_head(ph)
    sig = np.interp(ph, [0.0, 0.1, 0.2, 0.3, 1.0], [0.95, 0.62, 0.50, 0.42, 0.12])
    sig = np.where(head, sig, 0.0).astype(np.float32)
    return _frozen(cv2.GaussianBlur(sig, (0, 0), 1.5))


# ---------------------------------------------------------------- ultrasound, X-ray


@lru_cache(maxsize=1)
def us_bmode() -> F32:
    """B-mode area (rows 110-333, columns 45-594) of ``US1_UNCR.dcm`` as gray [0, 1], float32
    (224, 550), with the power-Doppler colour, caliper boxes and divider line inpainted."""
    rgb = _dicom("US1_UNCR.dcm").pixel_array
    region = np.ascontiguousarray(rgb[110:334, 45:595])
    sat = region.max(axis=2).astype(np.int16) - region.min(axis=2).astype(np.int16)
    overlay = (sat > 25) | (region.min(axis=2) > 225)
    overlay = cv2.dilate(overlay.astype(np.uint8), np.ones((5, 5), np.uint8))
    gray = cv2.cvtColor(region, cv2.COLOR_RGB2GRAY).astype(np.float32) / 255.0
    valid = (overlay == 0).astype(np.float32)
    # normalised convolution: the local mean of the surviving B-mode pixels (the Doppler sits inside
    # the hypoechoic node, so plain inpainting would smear bright colour edges into it)
    num = cv2.GaussianBlur(gray * valid, (0, 0), 7)
    den = cv2.GaussianBlur(valid, (0, 0), 7)
    local = num / np.maximum(den, 1e-3)
    # fixed texture so the filled pixels are not flat (the demo adds its own speckle on top)
    rng = rng_for("demo-source", "US1_UNCR", "inpaint-texture")  # fixed, independent of the demo seed
    grain = cv2.GaussianBlur(rng.rayleigh(1.0, gray.shape).astype(np.float32), (0, 0), 0.8)
    tex = local * grain / float(grain.mean())
    filled = np.where(valid > 0, gray, np.clip(tex, 0.0, 1.0))
    return _frozen(filled)


@lru_cache(maxsize=1)
def chest_xray() -> F32:
    """``RG1_UNCI.dcm`` chest radiograph, MONOCHROME1 inverted (bone bright), area-downsampled to
    about 720 px on the long side, robustly scaled to [0, 1], float32."""
    ds = _dicom("RG1_UNCI.dcm")
    a = ds.pixel_array.astype(np.float32)
    if str(ds.PhotometricInterpretation) == "MONOCHROME1":
        a = a.max() - a
    h, w = a.shape
    s = 720 / max(h, w)
    a = np.asarray(
        cv2.resize(a, (int(round(w * s)), int(round(h * s))), interpolation=cv2.INTER_AREA), np.float32
    )
    # gamma darkens the lung fields to a typical display (the robust range includes collimator bands)
    return _frozen(_robust_unit(a, 0.2, 99.8) ** 1.7)


# ---------------------------------------------------------------- fundus, pathology (RGB)


@lru_cache(maxsize=1)
def retina_no_disc() -> tuple[F32, npt.NDArray[np.bool_]]:
    """``skimage.data.retina`` area-downsampled to (560, 560) RGB [0, 1] with its optic disc
    inpainted, and the field-of-view mask (bool (560, 560))."""
    from skimage.data import retina

    rgb = cv2.resize(retina(), (560, 560), interpolation=cv2.INTER_AREA)
    gray = rgb.astype(np.float32).mean(axis=2)
    fov = cv2.erode((gray > 20).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    # the real disc: brightest blob in the left third (found, not hard-coded, but stable)
    green = cv2.GaussianBlur(rgb[:, :, 1].astype(np.float32), (0, 0), 8)
    green[:, 200:] = 0
    green[~fov] = 0
    cy, cx = np.unravel_index(int(np.argmax(green)), green.shape)
    hole = np.zeros(gray.shape, np.uint8)
    cv2.circle(hole, (int(cx), int(cy)), 58, 1, -1)
    filled = cv2.inpaint(rgb, hole, 9, cv2.INPAINT_TELEA)
    out = filled.astype(np.float32) / 255.0
    out[~fov] = 0.0
    return _frozen(out), fov


@lru_cache(maxsize=1)
def ihc() -> F32:
    """``skimage.data.immunohistochemistry`` (512, 512, 3) RGB in [0, 1]."""
    from skimage.data import immunohistochemistry

    return _frozen(immunohistochemistry().astype(np.float32) / 255.0)
