"""Writers for the published on-disk layouts the dataset readers understand.

=========== =============== ========== =========================================================
modality    folder          reader     files (ids)
=========== =============== ========== =========================================================
ct          ct_demo         dicom      ``dicom/ct_0001.dcm`` (CT, int16, RescaleIntercept -1024,
                                       window 40/400) + ``masks/ct_0001.png`` (0/255)
mri         mri_demo        nifti      ``imagesTr/mri_001.nii.gz`` (int16, X x Y x Z) +
                                       ``labelsTr/mri_001.nii.gz`` (uint8 0/1); slice z is the
                                       image transposed (rows = stored y); first/last slice of a
                                       case have no lesion; sample ids ``mri_001_z001``
ultrasound  busi_demo       busi       ``benign/benign (1).png`` (gray stored as RGB) +
                                       ``benign/benign (1)_mask.png``; same for ``malignant``
xray        xray_demo       folder     ``images/xray_0001.png`` (16-bit gray) + ``masks/...png``
fundus      fundus_demo     refuge     ``Images/g0001.jpg`` (q95; ``g`` = cup/disc >= 0.6, else
                                       ``n``) + ``Masks/g0001.bmp`` (0 cup, 128 rim, 255 bg)
oct         oct_demo        folder     ``images/oct_0001.png`` (8-bit gray) + ``masks/...png``
pathology   pathology_demo  folder     ``images/pathology_0001.png`` (RGB) + ``masks/...png``
dermoscopy  isic_demo       isic2016   ``ISBI2016_ISIC_Part1_Training_Data/ISIC_0000000.jpg`` +
                                       ``ISBI2016_ISIC_Part1_Training_GroundTruth/
                                       ISIC_0000000_Segmentation.png`` (0/255)
endoscopy   kvasir_demo     kvasir_seg ``images/<25-char id>.jpg`` + ``masks/<id>.jpg`` (JPEG
                                       0/255; the ground truth is the mask read back and
                                       thresholded at > 127, as the reader does)
angiography angio_demo      folder     ``images/angio_0001.png`` (8-bit gray) + ``masks/...png``
=========== =============== ========== =========================================================

All files are byte-deterministic: fixed PNG compression level, fixed JPEG quality, DICOM UIDs
derived from the seed with SHA-256 (``2.25.<int>``), no dates or times in any file, NIfTI gzip
streams written with ``mtime=0`` and no file name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.data.splits import split_for
from medrobust_lib.demo import generators as gens
from medrobust_lib.demo.geometry import SIZE, SMALL_AREA_FRACTION, Placement, plan_placements
from medrobust_lib.demo.manifest import DemoDataset, DemoSample
from medrobust_lib.seeding import key_digest, rng_for

PNG_PARAMS = [cv2.IMWRITE_PNG_COMPRESSION, 6]
JPEG_QUALITY = 95
MRI_FG_SLICES_PER_CASE = 2


@dataclass(frozen=True)
class LayoutSpec:
    """Where and how one modality's demo dataset is written."""

    modality: str
    folder: str
    format: str
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.modality}_demo"


LAYOUTS: dict[str, LayoutSpec] = {
    s.modality: s
    for s in (
        LayoutSpec("ct", "ct_demo", "dicom", {"image_dir": "dicom", "mask_dir": "masks"}),
        LayoutSpec("mri", "mri_demo", "nifti", {"images_dir": "imagesTr", "labels_dir": "labelsTr"}),
        LayoutSpec("ultrasound", "busi_demo", "busi", {"classes": ["benign", "malignant"]}),
        # 16-bit PNGs written from [0, 1] by scaling with 65535: declared, so they read back exactly
        # (a reader's default for 16-bit is each image's own range)
        LayoutSpec("xray", "xray_demo", "folder",
                   {"image_dir": "images", "mask_dir": "masks", "intensity_range": [0, 65535]}),
        LayoutSpec("fundus", "fundus_demo", "refuge", {"target": "disc"}),
        LayoutSpec("oct", "oct_demo", "folder", {"image_dir": "images", "mask_dir": "masks"}),
        LayoutSpec("pathology", "pathology_demo", "folder", {"image_dir": "images", "mask_dir": "masks"}),
        LayoutSpec("dermoscopy", "isic_demo", "isic2016", {"splits": ["train"]}),
        LayoutSpec("endoscopy", "kvasir_demo", "kvasir_seg", {}),
        LayoutSpec("angiography", "angio_demo", "folder", {"image_dir": "images", "mask_dir": "masks"}),
    )
}
"""Layout per modality, in :data:`~medrobust_lib.types.ALL_MODALITIES` order."""

ISIC_DATA = "ISBI2016_ISIC_Part1_Training_Data"
ISIC_GT = "ISBI2016_ISIC_Part1_Training_GroundTruth"


# ---------------------------------------------------------------- encoders


def _bgr(arr: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(arr, cv2.COLOR_RGB2BGR) if arr.ndim == 3 else arr


def png_bytes(arr: np.ndarray) -> bytes:
    """PNG of a uint8/uint16 (H, W) or RGB (H, W, 3) array, fixed compression level."""
    ok, buf = cv2.imencode(".png", _bgr(arr), PNG_PARAMS)
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def jpeg_bytes(arr: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """Baseline JPEG of a uint8 (H, W) or RGB (H, W, 3) array."""
    ok, buf = cv2.imencode(".jpg", _bgr(arr), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return buf.tobytes()


def bmp_bytes(arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".bmp", arr)
    if not ok:
        raise RuntimeError("BMP encoding failed")
    return buf.tobytes()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _mask_u8(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    return mask.astype(np.uint8) * 255


def demo_uid(*key: object) -> str:
    """A DICOM UID ``2.25.<128-bit int>`` from SHA-256 of the key (deterministic, unique enough)."""
    return "2.25." + str(int.from_bytes(key_digest("medrobust-demo-uid", *key)[:16], "big"))


def dicom_ct_bytes(hu: npt.NDArray[np.int16], *, seed: int, sample_id: str, index: int) -> bytes:
    """A CT Image Storage file: int16 stored values = HU + 1024 (RescaleIntercept -1024, slope 1),
    MONOCHROME2, window 40/400, 0.7 mm pixels, fixed UIDs, no dates."""
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, CTImageStorage, ExplicitVRLittleEndian

    sop = demo_uid(seed, "ct", sample_id, "sop")
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = UID(sop)
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = UID(demo_uid("implementation"))
    meta.ImplementationVersionName = "MEDROBUST_DEMO"
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = sop
    ds.StudyInstanceUID = demo_uid(seed, "ct", sample_id, "study")
    ds.SeriesInstanceUID = demo_uid(seed, "ct", sample_id, "series")
    ds.FrameOfReferenceUID = demo_uid(seed, "ct", sample_id, "frame")
    ds.Modality = "CT"
    ds.ImageType = ["DERIVED", "SECONDARY", "AXIAL"]
    ds.PatientName = "Demo^CT"
    ds.PatientID = f"DEMO-CT-{index:04d}"
    # type 2 attributes present but empty: no dates or times anywhere in the file
    for kw in (
        "PatientBirthDate",
        "PatientSex",
        "StudyDate",
        "StudyTime",
        "ReferringPhysicianName",
        "StudyID",
        "AccessionNumber",
        "KVP",
    ):
        setattr(ds, kw, "")
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.ImagePositionPatient = [0, 0, float(index) * 2.5]
    ds.SeriesNumber = 1
    ds.InstanceNumber = index + 1
    ds.ImageComments = "medrobust synthetic demo image with an inserted lesion"
    ds.BurnedInAnnotation = "NO"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = int(hu.shape[0]), int(hu.shape[1])
    ds.PixelSpacing = [0.7, 0.7]
    ds.SliceThickness = 2.5
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 1
    ds.RescaleIntercept = -1024
    ds.RescaleSlope = 1
    ds.RescaleType = "HU"
    ds.WindowCenter = 40
    ds.WindowWidth = 400
    stored = (hu.astype(np.int32) + 1024).astype("<i2")
    ds.PixelData = stored.tobytes()
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()


def nifti_gz_bytes(data: np.ndarray, spacing: tuple[float, float, float]) -> bytes:
    """A ``.nii.gz`` of ``data`` (X, Y, Z) with a fixed diagonal affine (RAS, mm), gzip mtime 0."""
    import nibabel as nib

    affine = np.diag([spacing[0], spacing[1], spacing[2], 1.0])
    img = nib.Nifti1Image(np.ascontiguousarray(data), affine)
    img.header.set_xyzt_units("mm")
    img.header["descrip"] = b"medrobust synthetic demo"
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    return gzip.compress(img.to_bytes(), compresslevel=6, mtime=0)


# ---------------------------------------------------------------- ground truth


def _intensity(image: np.ndarray, modality: str) -> npt.NDArray[np.float32]:
    if modality == "ct":
        return image.astype(np.float32)  # HU
    x = image.astype(np.float32) / (65535.0 if image.dtype == np.uint16 else 255.0)
    if x.ndim == 3:
        x = 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    return x


def make_truth(
    spec: LayoutSpec,
    sample_id: str,
    image_rel: str,
    mask_rel: str,
    image: np.ndarray,
    background: np.ndarray,
    mask: npt.NDArray[np.bool_],
    gen: gens.Generated | gens.MriCase,
    *,
    slice_index: int | None = None,
    extra: dict[str, Any] | None = None,
) -> DemoSample:
    """Ground-truth record of one written sample (see :class:`DemoSample` for the definitions)."""
    box = mask_to_box(mask)
    if box is None:
        raise RuntimeError(f"{spec.name}/{sample_id}: empty mask")
    ys, xs = np.nonzero(mask)
    cx, cy = float(xs.mean()) + 0.5, float(ys.mean()) + 0.5
    h, w = mask.shape
    area = int(mask.sum())
    frac = area / float(h * w)
    # brightness: did the lesion raise or lower the intensity of the pixels it covers (lesioned vs
    # lesion-free image, mean over the mask), i.e. relative to the tissue it sits in. A ring around
    # the mask is not used: next to bone, air or a vessel it flips for reasons unrelated to the lesion.
    change = float(
        _intensity(image, spec.modality)[mask].mean() - _intensity(background, spec.modality)[mask].mean()
    )
    return DemoSample(
        sample_id=sample_id,
        dataset=spec.name,
        modality=spec.modality,
        image_path=image_rel,
        mask_path=mask_rel,
        box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
        area=area,
        area_fraction=round(frac, 6),
        centroid=(round(cx, 3), round(cy, 3)),
        horizontal="left" if cx < w / 2 else "right",
        vertical="upper" if cy < h / 2 else "lower",
        size="small" if frac < SMALL_AREA_FRACTION else "large",
        brightness="brighter" if change > 0 else "darker",
        contrast=round(change, 4),
        lesion_type=gen.lesion_type,
        anatomy=gen.anatomy,
        source=gen.source,
        split=split_for(spec.name, sample_id),
        image_size=(int(h), int(w)),
        slice_index=slice_index,
        extra=dict(extra or {}),
    )


# ---------------------------------------------------------------- per-modality builders


def _plan(seed: int, modality: str, n: int) -> list[Placement]:
    return plan_placements(rng_for(seed, "demo", modality, "plan"), n)


def _rng(seed: int, modality: str, i: int) -> np.random.Generator:
    return rng_for(seed, "demo", modality, i)


def _folder_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    """ct (DICOM) and the generic folder layouts (xray, oct, pathology, angiography)."""
    out = []
    for i, pl in enumerate(_plan(seed, spec.modality, n)):
        g = gens.GENERATORS[spec.modality](_rng(seed, spec.modality, i), pl)
        prefix = "angio" if spec.modality == "angiography" else spec.modality
        sid = f"{prefix}_{i + 1:04d}"
        if spec.modality == "ct":
            img_rel = f"{spec.folder}/dicom/{sid}.dcm"
            _write(root / img_rel, dicom_ct_bytes(g.image, seed=seed, sample_id=sid, index=i))
        else:
            img_rel = f"{spec.folder}/images/{sid}.png"
            _write(root / img_rel, png_bytes(g.image))
        mask_rel = f"{spec.folder}/masks/{sid}.png"
        _write(root / mask_rel, png_bytes(_mask_u8(g.mask)))
        extra = {k: v for k, v in g.extra.items() if isinstance(v, (int, float, str, bool))}
        out.append(make_truth(spec, sid, img_rel, mask_rel, g.image, g.background, g.mask, g, extra=extra))
    return out


def _mri_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    per = MRI_FG_SLICES_PER_CASE
    n_cases = -(-n // per)
    out = []
    for c, pl in enumerate(_plan(seed, "mri", n_cases)):
        n_fg = min(per, n - c * per)
        case = gens.gen_mri_case(_rng(seed, "mri", c), pl, n_fg)
        name = f"mri_{c + 1:03d}"
        img_rel = f"{spec.folder}/imagesTr/{name}.nii.gz"
        lab_rel = f"{spec.folder}/labelsTr/{name}.nii.gz"
        # (S, H, W) -> (X, Y, Z): slice z of the stored array, transposed, is the image
        _write(root / img_rel, nifti_gz_bytes(case.volume.transpose(2, 1, 0), (0.9375, 0.9375, 4.0)))
        _write(root / lab_rel, nifti_gz_bytes(case.labels.transpose(2, 1, 0), (0.9375, 0.9375, 4.0)))
        for z in case.foreground_slices:
            sid = f"{name}_z{z:03d}"
            out.append(
                make_truth(
                    spec,
                    sid,
                    img_rel,
                    lab_rel,
                    case.volume[z],
                    case.background[z],
                    case.labels[z] > 0,
                    case,
                    slice_index=z,
                    extra={"case": name},
                )
            )
    return out


def _busi_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    counts = {"benign": 0, "malignant": 0}
    out = []
    for i, pl in enumerate(_plan(seed, "ultrasound", n)):
        malignant = i % 2 == 1
        g = gens.gen_ultrasound(_rng(seed, "ultrasound", i), pl, malignant)
        cls = "malignant" if malignant else "benign"
        counts[cls] += 1
        sid = f"{cls} ({counts[cls]})"
        img_rel = f"{spec.folder}/{cls}/{sid}.png"
        mask_rel = f"{spec.folder}/{cls}/{sid}_mask.png"
        _write(root / img_rel, png_bytes(np.dstack([g.image] * 3)))  # BUSI stores gray as RGB
        _write(root / mask_rel, png_bytes(_mask_u8(g.mask)))
        out.append(
            make_truth(spec, sid, img_rel, mask_rel, g.image, g.background, g.mask, g, extra=dict(g.extra))
        )
    return out


def _refuge_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    counts = {"g": 0, "n": 0}
    out = []
    for i, pl in enumerate(_plan(seed, "fundus", n)):
        g = gens.gen_fundus(_rng(seed, "fundus", i), pl)
        letter = "g" if g.extra["glaucoma"] else "n"
        counts[letter] += 1
        sid = f"{letter}{counts[letter]:04d}"
        img_rel = f"{spec.folder}/Images/{sid}.jpg"
        mask_rel = f"{spec.folder}/Masks/{sid}.bmp"
        _write(root / img_rel, jpeg_bytes(g.image))
        code = np.full(g.mask.shape, 255, np.uint8)
        code[g.mask] = 128
        code[g.extra["cup_mask"]] = 0
        _write(root / mask_rel, bmp_bytes(code))
        extra = {
            "cdr": g.extra["cdr"],
            "glaucoma": bool(g.extra["glaucoma"]),
            "cup_area": int(g.extra["cup_mask"].sum()),
        }
        out.append(make_truth(spec, sid, img_rel, mask_rel, g.image, g.background, g.mask, g, extra=extra))
    return out


def _isic_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    out = []
    for i, pl in enumerate(_plan(seed, "dermoscopy", n)):
        g = gens.gen_dermoscopy(_rng(seed, "dermoscopy", i), pl)
        sid = f"ISIC_{i:07d}"
        img_rel = f"{spec.folder}/{ISIC_DATA}/{sid}.jpg"
        mask_rel = f"{spec.folder}/{ISIC_GT}/{sid}_Segmentation.png"
        _write(root / img_rel, jpeg_bytes(g.image))
        _write(root / mask_rel, png_bytes(_mask_u8(g.mask)))
        out.append(make_truth(spec, sid, img_rel, mask_rel, g.image, g.background, g.mask, g))
    return out


def kvasir_id(i: int) -> str:
    """A 25-character lower-case id shaped like Kvasir-SEG's (``cju...``), stable per index."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    v = int.from_bytes(hashlib.sha256(f"kvasir_demo/{i}".encode()).digest()[:16], "big")
    s = ""
    for _ in range(22):
        v, r = divmod(v, 36)
        s += digits[r]
    return "cju" + s


def jpeg_mask_roundtrip(mask: npt.NDArray[np.bool_]) -> tuple[bytes, npt.NDArray[np.bool_]]:
    """Encode a 0/255 mask as JPEG and return the bytes and the mask a reader recovers (> 127)."""
    data = jpeg_bytes(_mask_u8(mask))
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if decoded is None:
        raise RuntimeError("JPEG mask could not be decoded")
    back = np.asarray(decoded)
    if back.ndim == 3:
        back = back.max(axis=2)
    rec: npt.NDArray[np.bool_] = np.asarray(back > 127, dtype=bool)
    inter = float((rec & mask).sum())
    union = float((rec | mask).sum())
    if not rec.any() or inter / union < 0.95:
        raise RuntimeError(f"JPEG mask round trip changed the mask too much (IoU {inter / union:.3f})")
    return data, rec


def _kvasir_dataset(spec: LayoutSpec, root: Path, seed: int, n: int) -> list[DemoSample]:
    out = []
    for i, pl in enumerate(_plan(seed, "endoscopy", n)):
        g = gens.gen_endoscopy(_rng(seed, "endoscopy", i), pl)
        sid = kvasir_id(i)
        img_rel = f"{spec.folder}/images/{sid}.jpg"
        mask_rel = f"{spec.folder}/masks/{sid}.jpg"
        data, mask = jpeg_mask_roundtrip(g.mask)
        g.mask = mask
        _write(root / img_rel, jpeg_bytes(g.image))
        _write(root / mask_rel, data)
        out.append(make_truth(spec, sid, img_rel, mask_rel, g.image, g.background, mask, g))
    return out


BUILDERS: dict[str, Callable[[LayoutSpec, Path, int, int], list[DemoSample]]] = {
    "ct": _folder_dataset,
    "mri": _mri_dataset,
    "ultrasound": _busi_dataset,
    "xray": _folder_dataset,
    "fundus": _refuge_dataset,
    "oct": _folder_dataset,
    "pathology": _folder_dataset,
    "dermoscopy": _isic_dataset,
    "endoscopy": _kvasir_dataset,
    "angiography": _folder_dataset,
}


def write_dataset(modality: str, root: Path, seed: int, n: int) -> DemoDataset:
    """Generate and write ``n`` samples of one modality under ``root/<folder>``."""
    spec = LAYOUTS[modality]
    samples = sorted(BUILDERS[modality](spec, root, seed, n), key=lambda s: s.sample_id)
    if len(samples) != n:
        raise RuntimeError(f"{spec.name}: wrote {len(samples)} samples, expected {n}")
    return DemoDataset(
        spec.name, modality, spec.format, str(root / spec.folder), dict(spec.options), tuple(samples)
    )


__all__ = ["LAYOUTS", "SIZE", "LayoutSpec", "write_dataset"]
