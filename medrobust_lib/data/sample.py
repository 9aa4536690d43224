"""The Sample model and the quarantine record.

A reader turns a dataset folder into :class:`SampleRef` entries (cheap: paths only) and loads each
one into a :class:`Sample`. A file that cannot be used raises :class:`SampleError` with a short
reason; callers turn that into a :class:`QuarantineRecord`, so a bad file is counted and reported,
never silently dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from medrobust_lib.types import BoolMask, Boxes, FloatImage, InstanceMap


class DatasetSpec(Protocol):
    """What a reader needs of a dataset's configuration (:class:`medrobust_lib.data.dataset.DatasetConfig`
    satisfies it); readers type against this so that they never import the config module."""

    @property
    def name(self) -> str: ...
    @property
    def modality(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def root(self) -> str: ...
    @property
    def size(self) -> int | None: ...
    @property
    def per_component_boxes(self) -> bool: ...
    @property
    def options(self) -> dict[str, Any]: ...


class SampleError(Exception):
    """A sample's files cannot be used. ``reason`` is a short machine-friendly code
    (``empty_file``, ``unreadable_image``, ``mask_size_mismatch``, ``empty_mask``,
    ``unreadable_dicom``, ``missing_mask``, ...); ``detail`` is for humans."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class SampleRef:
    """Where one sample lives. ``extra`` holds reader-specific fields (slice index, class label)."""

    sample_id: str
    dataset: str
    modality: str
    image_path: str
    mask_paths: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """One image with optional ground truth.

    image: float32, (H, W) grayscale or (H, W, 3) RGB, values in [0, 1] after the reader's
    documented intensity mapping (recorded in ``metadata["intensity"]``).
    mask: bool (H, W) or None. boxes: float32 (N, 4) pixel XYXY (end exclusive) or None.
    instances: int32 (H, W) instance label map or None: 0 is background, 1..N are the targets
    that each get their own box prompt, prediction and score (``per_component_boxes`` or a
    reader's instance labels); ``instances > 0`` equals ``mask``. None: the mask is one target.
    """

    sample_id: str
    dataset: str
    modality: str
    image: FloatImage
    mask: BoolMask | None = None
    boxes: Boxes | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    instances: InstanceMap | None = None

    def __post_init__(self) -> None:
        if self.image.dtype != np.float32:
            raise ValueError(f"Sample.image must be float32, got {self.image.dtype}")
        if self.image.ndim not in (2, 3) or (self.image.ndim == 3 and self.image.shape[2] != 3):
            raise ValueError(f"Sample.image must be (H, W) or (H, W, 3), got {self.image.shape}")
        if self.mask is not None and self.mask.shape != self.image.shape[:2]:
            raise ValueError(f"Sample.mask shape {self.mask.shape} != image shape {self.image.shape[:2]}")
        if self.instances is not None:
            if self.mask is None or self.instances.shape != self.mask.shape or self.instances.dtype != np.int32:
                raise ValueError("Sample.instances must be an int32 (H, W) label map beside a mask of that shape")
            if not np.array_equal(self.instances > 0, self.mask):
                raise ValueError("Sample.instances > 0 must equal Sample.mask")

    @property
    def n_channels(self) -> int:
        return 1 if self.image.ndim == 2 else int(self.image.shape[2])

    def content_hash(self) -> str:
        """SHA-256 hex of the image and mask (:func:`array_hash`), and of the instance map when
        there is one (a sample without instances hashes as before), computed once per object: a
        sample's arrays are never modified in place (perturbations and readers build new samples)."""
        cached: str | None = self.__dict__.get("_content_hash")
        if cached is None:
            cached = array_hash(self.image, self.mask) if self.instances is None else \
                array_hash(self.image, self.mask, self.instances)
            object.__setattr__(self, "_content_hash", cached)
        return cached


@dataclass(frozen=True)
class QuarantineRecord:
    """A sample that could not be loaded, with the reason. Reported and counted in every table."""

    dataset: str
    sample_id: str
    path: str
    reason: str
    detail: str = ""


def array_hash(*arrays: np.ndarray | None) -> str:
    """SHA-256 hex over the dtype, shape and bytes of each array (None hashes as a marker)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"<none>")
            continue
        c = np.ascontiguousarray(a)
        h.update(f"{c.dtype.str}{c.shape}".encode())
        h.update(c.tobytes())
    return h.hexdigest()
