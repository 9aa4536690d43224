"""The reader registry and the helpers every reader shares.

A :class:`Reader` turns a dataset folder into :class:`~medrobust_lib.data.sample.SampleRef`
entries (``index``: paths only, cheap, plus quarantine records for problems visible from the file
listing such as a missing mask) and loads one ref into a :class:`~medrobust_lib.data.sample.Sample`
(``load``: raises :class:`~medrobust_lib.data.sample.SampleError` with a reason code for a bad
file). Readers are registered in :data:`READERS` by the module that defines them
(``readers_folder``, ``readers_presets``, ``readers_dicom``, ``readers_nifti``, ``readers_npy``);
:mod:`medrobust_lib.data.formats` imports them all, so read the complete registry from there.

Every reader's ``options`` are a pydantic model with ``extra="forbid"``, so a misspelt option is a
``ValueError`` naming the valid ones when the :class:`~medrobust_lib.data.dataset.DatasetConfig`
is built.

Shared conventions (implemented by :func:`finish_sample`):

* the mask must have the image's (H, W) at the original resolution (else ``mask_size_mismatch``);
* an all-background mask is ``empty_mask`` unless the reader's ``allow_empty_mask`` option is set;
* with ``cfg.size`` the image is resized to ``size x size`` with ``cv2.INTER_AREA`` and the mask
  with ``cv2.INTER_NEAREST_EXACT`` (pixel-centre nearest neighbour, no half-pixel shift); a mask
  whose foreground disappears in the resize is ``mask_vanished_on_resize``;
* boxes come from the final (resized) mask with :func:`~medrobust_lib.data.boxes.mask_to_boxes`;
* instances (``Sample.instances``): a reader's instance labels (resized with pixel-centre nearest
  neighbour, relabelled 1..N by box position; an instance lost in the resize is counted in
  ``metadata["instances"]["lost_on_resize"]``), else with ``per_component_boxes`` the 8-connected
  components of the final mask; the boxes are then one per instance, in id order;
* metadata always holds ``reader``, ``image_path``, ``mask_paths``, ``original_size`` (H, W
  before resizing), ``size`` (H, W after), ``resized``, ``intensity`` (see
  :mod:`medrobust_lib.data.imageio`) and, when there is a mask, ``mask_rule``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from medrobust_lib.data.boxes import components, instance_boxes, mask_to_boxes, relabel
from medrobust_lib.data.imageio import check_intensity_range, check_min_size
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.registry import Registry
from medrobust_lib.types import BoolMask, Boxes, FloatImage, InstanceMap

IndexResult = tuple[list[SampleRef], list[QuarantineRecord]]
IndexFn = Callable[["DatasetSpec"], IndexResult]
LoadFn = Callable[["DatasetSpec", SampleRef], Sample]

LOSSY_MASK_EXTENSIONS: frozenset[str] = frozenset({".jpg", ".jpeg"})


class ReaderOptions(BaseModel):
    """Base of every reader's options: unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class MaskOptions(ReaderOptions):
    """How a stored mask becomes a bool mask.

    ``mask_values``: if given, exactly these stored values are foreground. Otherwise
    ``mask_threshold`` decides (automatic by default: > 0 for lossless integer masks, > 127 for
    JPEG). A losslessly stored mask whose values are all in {0, 1} is a 0/1 label map (foreground =
    1). Colour masks use the maximum over channels. ``allow_empty_mask`` keeps samples whose mask
    has no foreground (with zero boxes) instead of quarantining them as ``empty_mask``."""

    mask_threshold: float | None = None
    """Null (default): foreground where the stored value is > 0 for a losslessly stored integer mask
    (PNG, TIFF, BMP: every label of a label or instance map, at any bit depth) and > 127 (x 257 for
    16-bit) for a lossy one (JPEG, above its compression noise). A number: foreground where the value
    is > mask_threshold on the 8-bit scale (x 257 for 16-bit masks), e.g. 127 for PNG masks with
    soft (anti-aliased) edges."""
    mask_values: list[int] | None = None
    allow_empty_mask: bool = False


class IntensityOptions(ReaderOptions):
    """How stored image values become [0, 1]: 8-bit /255, wider (16-bit) by each image's own
    range, or a declared ``intensity_range``; the mapping is recorded in ``metadata["intensity"]``
    (source ``bit_depth``, ``actual_range`` or ``declared``)."""

    intensity_range: tuple[float, float] | None = None
    """[low, high] in stored values (finite, low < high), mapped linearly to [0, 1] with clipping, at
    any bit depth: the dataset's declared range, e.g. [0, 4095] for 12-bit data in 16-bit files.
    Null (default): 8-bit images are divided by 255, 16-bit ones scaled by their own [min, max],
    per image (a constant image maps to 0)."""

    @field_validator("intensity_range")
    @classmethod
    def _check_intensity_range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        return None if v is None else check_intensity_range(v)


class RasterOptions(MaskOptions, IntensityOptions):
    """Options shared by the readers of raster image files (PNG, JPEG, TIFF, BMP) with mask files:
    :class:`MaskOptions` plus :class:`IntensityOptions`."""


class WindowOptions(ReaderOptions):
    """Intensity window in native units (HU for CT); both or neither. Without them the file's
    window (DICOM) or the ``percentiles`` of the values are used.

    ``window_center``: window centre in native units (HU for CT). ``window_width``: window width in
    native units (> 0). ``percentiles``: the low and high percentiles mapped to 0 and 1 when no
    window is known."""

    window_center: float | None = None
    window_width: float | None = Field(default=None, gt=0)
    percentiles: tuple[float, float] = (0.5, 99.5)

    @field_validator("percentiles")
    @classmethod
    def _check_percentiles(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] < v[1] <= 100.0:
            raise ValueError(f"percentiles must satisfy 0 <= low < high <= 100, got {v}")
        return v

    @model_validator(mode="after")
    def _check_pair(self) -> WindowOptions:
        if (self.window_center is None) != (self.window_width is None):
            raise ValueError("give both window_center and window_width, or neither")
        return self


@dataclass(frozen=True)
class Reader:
    """One registered dataset reader.

    ``index(cfg) -> (refs, quarantined)`` lists samples sorted by id; ``load(cfg, ref) -> Sample``
    loads one (raises SampleError). ``options_model`` validates ``cfg.options``. ``layout`` is the
    folder layout it expects (for docs); ``citation`` the dataset's publication for presets."""

    name: str
    description: str
    index: IndexFn = field(repr=False, compare=False)
    load: LoadFn = field(repr=False, compare=False)
    options_model: type[ReaderOptions] = field(default=ReaderOptions, repr=False, compare=False)
    layout: str = ""
    citation: str = ""
    kind: str = "generic"  # "generic" or "preset"

    def parse_options(self, options: Mapping[str, Any]) -> ReaderOptions:
        """Validate ``options`` against this reader's model; the ValueError (one line) names each
        offending key (``options.<key>: unknown key`` or what is wrong with its value) and the valid keys."""
        try:
            return self.options_model.model_validate(dict(options))
        except ValidationError as e:
            valid = ", ".join(sorted(self.options_model.model_fields))
            problems = "; ".join(
                f"options.{'.'.join(str(x) for x in err['loc']) or '(all)'}: "
                + ("unknown key" if err["type"] == "extra_forbidden" else err["msg"]) for err in e.errors())
            raise ValueError(f"invalid options for reader {self.name!r}: {problems} (valid keys: {valid})") from None


READERS: Registry[Reader] = Registry("reader")
"""All dataset readers by name (``folder``, ``dicom``, ``nifti`` and the presets)."""

OptionsT = TypeVar("OptionsT", bound=ReaderOptions)


def options_for(cfg: DatasetSpec, model: type[OptionsT]) -> OptionsT:
    """Parse ``cfg.options`` with the given options model."""
    return model.model_validate(dict(cfg.options))


# --------------------------------------------------------------------------------------------------
# files


def is_hidden(path: Path) -> bool:
    """Dot files, including macOS AppleDouble ``._name`` files that ship inside some archives
    (the Medical Segmentation Decathlon tarballs have them next to every volume)."""
    return path.name.startswith(".")


def sample_id_for(rel: Path, strip: str = "") -> str:
    """Sample id from a path relative to the image folder: POSIX path without the extension
    (``strip`` removes a multi-part extension such as ``.nii.gz``)."""
    posix = rel.as_posix()
    if strip and posix.lower().endswith(strip.lower()):
        return posix[: -len(strip)]
    return rel.with_suffix("").as_posix()


def child_dir(parent: Path, *names: str) -> Path | None:
    """The first existing sub-directory of ``parent`` whose name equals one of ``names``, exactly
    or else case-insensitively; None if there is none."""
    for n in names:
        if (parent / n).is_dir():
            return parent / n
    if parent.is_dir():
        lowered = {n.lower() for n in names}
        for c in sorted(parent.iterdir()):
            if c.is_dir() and c.name.lower() in lowered:
                return c
    return None


def require_dir(path: Path, what: str) -> Path:
    """Raise FileNotFoundError (a configuration error, not a bad sample) if ``path`` is missing."""
    if not path.is_dir():
        raise FileNotFoundError(f"{what} not found: {path.absolute()}")
    return path


def quarantine(
    cfg: DatasetSpec, sample_id: str, path: str | Path, reason: str, detail: str = ""
) -> QuarantineRecord:
    return QuarantineRecord(
        dataset=cfg.name, sample_id=sample_id, path=str(path), reason=reason, detail=detail
    )


def make_ref(
    cfg: DatasetSpec,
    sample_id: str,
    image_path: Path,
    mask_paths: Sequence[Path] = (),
    **extra: Any,
) -> SampleRef:
    return SampleRef(
        sample_id=sample_id,
        dataset=cfg.name,
        modality=cfg.modality,
        image_path=str(image_path),
        mask_paths=tuple(str(m) for m in mask_paths),
        extra=dict(extra),
    )


# --------------------------------------------------------------------------------------------------
# masks


def single_channel(raw: np.ndarray, how: str = "max") -> np.ndarray:
    """(H, W) from a (H, W) or (H, W, C) stored mask: ``max`` or ``mean`` over channels."""
    if raw.ndim == 2:
        return raw
    if how == "max":
        return raw.max(axis=2)
    return np.rint(raw.astype(np.float64).mean(axis=2)).astype(raw.dtype)


LOSSY_MASK_THRESHOLD = 127.0
"""The automatic threshold of lossy (JPEG) masks, in the 8-bit scale (x 257 for 16-bit)."""


def binarize_mask(
    raw: np.ndarray,
    *,
    threshold: float | None = None,
    values: Sequence[int] | None = None,
    lossless: bool = True,
) -> tuple[BoolMask, str]:
    """Stored mask values -> bool (H, W) mask and a short description of the rule used.

    See :class:`MaskOptions` for the rules; ``threshold`` None is the automatic rule (> 0 for a
    lossless integer mask, > 127 on the 8-bit scale otherwise); ``lossless`` is False for JPEG
    masks, which keeps their threshold above the compression noise and disables the 0/1 label-map
    detection (JPEG noise around 0 would otherwise become foreground)."""
    m = single_channel(np.asarray(raw), "max")
    if values is not None:
        return np.isin(m, np.asarray(list(values))), f"value in {sorted(int(v) for v in values)}"
    integer = np.issubdtype(m.dtype, np.integer)
    if lossless and integer and m.size and int(m.max()) == 1:
        return m == 1, "label map {0,1}: value == 1"
    if threshold is None and lossless and integer:
        return m > 0, "value > 0 (lossless integer mask: every non-zero label)"
    t = (LOSSY_MASK_THRESHOLD if threshold is None else float(threshold)) * (257.0 if m.dtype == np.uint16 else 1.0)
    return m > t, f"value > {t:g}"


def _read_mask_raw(path: Path) -> np.ndarray:
    """The stored values of a mask file. SampleError ``missing_mask`` if the file is gone,
    ``empty_mask_file`` for an empty one, ``unreadable_mask`` for a broken one."""
    from medrobust_lib.data.imageio import read_raw

    if not path.is_file():
        raise SampleError("missing_mask", str(path))
    try:
        return read_raw(path)
    except SampleError as e:
        raise SampleError(
            "unreadable_mask" if e.reason != "empty_file" else "empty_mask_file", e.detail
        ) from None


def read_binary_mask(path: Path, opts: MaskOptions) -> tuple[BoolMask, str]:
    """Read a stored mask file and binarise it with the options' rule. Raises SampleError
    ``missing_mask`` if the file is gone and ``unreadable_mask`` for a broken one."""
    from medrobust_lib.data.imageio import file_extension

    return binarize_mask(
        _read_mask_raw(path),
        threshold=opts.mask_threshold,
        values=opts.mask_values,
        lossless=file_extension(path) not in LOSSY_MASK_EXTENSIONS,
    )


def read_instance_labels(path: Path) -> tuple[np.ndarray, str]:
    """Read a stored instance-label mask: one integer id per pixel (8 or 16 bit, 0 = background).
    Returns the (H, W) label map as stored and the rule description. SampleError ``missing_mask``,
    ``unreadable_mask`` (a broken file, or a colour or lossy (JPEG) file, whose ids cannot be trusted)
    or ``empty_mask_file``."""
    from medrobust_lib.data.imageio import file_extension

    if path.is_file() and file_extension(path) in LOSSY_MASK_EXTENSIONS:
        raise SampleError("unreadable_mask", f"{path}: instance labels need a lossless file (PNG, TIFF), not JPEG")
    raw = _read_mask_raw(path)
    if raw.ndim != 2 or not np.issubdtype(raw.dtype, np.integer):
        raise SampleError("unreadable_mask", f"{path}: instance labels need a single-channel integer image, "
                                             f"got {raw.dtype} {raw.shape}")
    return raw, "instance labels: value > 0, one instance per id"


def union_masks(masks: Sequence[BoolMask], paths: Sequence[Path]) -> BoolMask:
    """Pixelwise OR of same-shaped masks; different shapes are ``mask_size_mismatch``."""
    out = masks[0].copy()
    for m, p in zip(masks[1:], paths[1:], strict=True):
        if m.shape != out.shape:
            raise SampleError("mask_size_mismatch", f"{p}: {m.shape} != {out.shape} of {paths[0]}")
        out |= m
    return out


# --------------------------------------------------------------------------------------------------
# finishing a sample


def resize_image(image: FloatImage, hw: tuple[int, int]) -> FloatImage:
    """Resize a float32 [0, 1] image to ``hw`` = (H, W) with area interpolation."""
    out = cv2.resize(image, (hw[1], hw[0]), interpolation=cv2.INTER_AREA)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def resize_mask(mask: BoolMask, hw: tuple[int, int]) -> BoolMask:
    """Resize a bool mask to ``hw`` = (H, W) with pixel-centre nearest neighbour."""
    out = cv2.resize(mask.astype(np.uint8), (hw[1], hw[0]), interpolation=cv2.INTER_NEAREST_EXACT)
    return out.astype(bool)


def finish_sample(
    cfg: DatasetSpec,
    ref: SampleRef,
    image: FloatImage,
    mask: BoolMask | None,
    metadata: Mapping[str, Any],
    *,
    allow_empty_mask: bool = False,
    instances: np.ndarray | None = None,
) -> Sample:
    """Validate, resize and box one loaded sample (see the module docstring for the rules).

    ``image``: float32 (H, W) or (H, W, 3) in [0, 1] at the original resolution; ``mask``: bool
    (H, W) or None; ``instances``: an integer (H, W) label map of the mask's instances (0
    background; ``instances > 0`` must equal ``mask``) or None."""
    image = np.ascontiguousarray(image, dtype=np.float32)
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise SampleError("unreadable_image", f"{ref.image_path}: image shape {image.shape}")
    if not np.isfinite(image).all():
        raise SampleError("unreadable_image", f"{ref.image_path}: non-finite values")
    original = (int(image.shape[0]), int(image.shape[1]))
    check_min_size(original[0], original[1], ref.image_path)
    if mask is not None:
        if mask.shape != original:
            raise SampleError("mask_size_mismatch", f"mask {mask.shape} != image {original}")
        if not allow_empty_mask and not mask.any():
            raise SampleError("empty_mask", f"{', '.join(ref.mask_paths) or ref.image_path}: no foreground")
    if instances is not None:
        if mask is None or instances.shape != mask.shape:
            raise SampleError("mask_size_mismatch", f"instance labels {instances.shape} != mask")
        if not np.array_equal(instances > 0, mask):
            raise SampleError("unreadable_mask", "instance labels > 0 differ from the mask")
    n_given = None if instances is None else len(np.unique(instances[instances > 0]))
    had_foreground = bool(mask is not None and mask.any())
    resized = False
    if cfg.size is not None and original != (cfg.size, cfg.size):
        hw = (cfg.size, cfg.size)
        image = resize_image(image, hw)
        if mask is not None:
            mask = resize_mask(mask, hw)
            if had_foreground and not mask.any():
                raise SampleError("mask_vanished_on_resize", f"foreground lost resizing {original} -> {hw}")
            if instances is not None:
                instances = cv2.resize(np.asarray(instances, np.int32), (hw[1], hw[0]),
                                       interpolation=cv2.INTER_NEAREST_EXACT)
        resized = True
    inst: InstanceMap | None = None
    inst_meta: dict[str, Any] | None = None
    if instances is not None and mask is not None:
        inst = relabel(np.asarray(instances))
        inst_meta = {"source": "labels", "n": int(inst.max()), "lost_on_resize": int(n_given or 0) - int(inst.max())}
    elif cfg.per_component_boxes and mask is not None:
        inst = components(mask)
        inst_meta = {"source": "connected_components_8", "n": int(inst.max()), "lost_on_resize": 0}
    boxes: Boxes | None
    if inst is not None and mask is not None:
        mask = inst > 0  # components() keeps every pixel; relabelled labels equal the resized mask
        boxes = instance_boxes(inst)
    else:
        boxes = None if mask is None else mask_to_boxes(mask, per_component=cfg.per_component_boxes)
    meta: dict[str, Any] = {
        "reader": cfg.format,
        "image_path": ref.image_path,
        "mask_paths": list(ref.mask_paths),
        "original_size": list(original),
        "size": [int(image.shape[0]), int(image.shape[1])],
        "resized": resized,
    }
    if inst_meta is not None:
        meta["instances"] = inst_meta
    meta.update(metadata)
    return Sample(
        sample_id=ref.sample_id,
        dataset=cfg.name,
        modality=cfg.modality,
        image=np.clip(image, 0.0, 1.0).astype(np.float32, copy=False),
        mask=mask,
        boxes=boxes,
        metadata=meta,
        instances=inst,
    )


def dataset_root(cfg: DatasetSpec, wrappers: Sequence[str], markers: Sequence[str]) -> Path:
    """The folder of a dataset in its released layout: ``cfg.root`` when it holds one of the
    ``markers`` sub-folders, else the first folder below it, along the archive's ``wrappers`` folder
    names (kept on extraction, e.g. ``hyper-kvasir/segmented-images``), that holds one; ``cfg.root``
    when none does (the reader then reports what is missing). The one root finder of every reader."""
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    frontier = [root]
    for _ in range(len(wrappers) + 1):
        for d in frontier:
            if any(child_dir(d, m) is not None for m in markers):
                return d
        frontier = [c for d in frontier for w in wrappers if (c := child_dir(d, w)) is not None]
    return root
