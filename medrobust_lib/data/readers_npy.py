"""NumPy-array readers: ``pannuke_npy`` (stacked arrays) and ``npy_single`` (one array per image).

Arrays are opened with ``np.load(mmap_mode="r", allow_pickle=False)``: a stacked PanNuke part
(2,656 x 256 x 256 x 6 float64 masks, about 8 GB) is never read whole, only the requested
patch, and a pickled object array is refused. A missing layout file is a ``FileNotFoundError``
that names it; an array of the wrong shape is a ``ValueError`` at index time (stacked) or a
``unreadable_image`` / ``unreadable_mask`` quarantine (per-image).

Intensity (recorded in ``metadata["intensity"]``): uint8 arrays are divided by 255; wider unsigned
integer arrays (uint16, uint32) are scaled by each image's own ``[min, max]`` (source
``actual_range``: a 16-bit image rarely fills 0..65535); float arrays are divided by ``float_scale``
(PanNuke ships float64 RGB in 0..255, so 255; MedSAM's per-slice ``imgs`` are float in [0, 1], so 1)
and must then lie in [0, 1] (else ``unreadable_image`` naming the range). ``npy_single``'s
``intensity_range`` declares ``[low, high]`` instead, for any dtype (clipped, source ``declared``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.data.imageio import check_declared_size, check_npy_bound, npy_header, scale_to_unit
from medrobust_lib.data.readers import (
    READERS,
    IndexResult,
    IntensityOptions,
    Reader,
    ReaderOptions,
    child_dir,
    finish_sample,
    is_hidden,
    make_ref,
    options_for,
    quarantine,
    require_dir,
    resize_mask,
)
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.types import FloatImage


def open_npy(path: Path, *, image_axes: tuple[int, int] | None = None) -> np.ndarray:
    """Memory-map a ``.npy`` file read-only (no pickles). FileNotFoundError names a missing file.

    The header is read first (:func:`medrobust_lib.data.imageio.npy_header`): the file must hold
    exactly the bytes its header declares (SampleError ``too_large`` / ``truncated`` otherwise),
    and with ``image_axes`` the two axes of one image must fit ``max_pixels`` (``too_large``). Not
    a .npy file, or a pickled object array: ValueError."""
    if not path.is_file():
        raise FileNotFoundError(f"array file not found: {path}")
    try:
        shape, _, dtype, offset, size = npy_header(path)
    except SampleError as e:
        if e.reason == "unreadable_image":  # not a .npy file or a pickle: ValueError, as np.load says
            raise ValueError(f"{path}: not a plain .npy array ({e.detail}); pickles are refused") from None
        raise SampleError(e.reason, e.detail) from None
    if image_axes is not None and len(shape) > max(image_axes):
        check_declared_size(shape[image_axes[0]], shape[image_axes[1]], path)
    check_npy_bound(path, shape, dtype, offset, size)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:  # pickled object arrays, not a .npy file, ...
        raise ValueError(f"{path}: not a plain .npy array ({e}); pickles are refused") from None


def array_to_unit(
    arr: np.ndarray, float_scale: float, where: str, intensity_range: tuple[float, float] | None = None
) -> tuple[FloatImage, dict[str, Any]]:
    """Stored array -> float32 in [0, 1] and its intensity record (see the module docstring)."""
    a = np.asarray(arr)
    if a.dtype == np.bool_:
        return a.astype(np.float32), {"mapping": "linear", "low": 0.0, "high": 1.0, "invert": False,
                                      "clipped": False, "source": "bool", "unit": "stored"}
    if intensity_range is not None and (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        try:
            return scale_to_unit(a, intensity_range, dtype=str(a.dtype))
        except SampleError as e:
            raise SampleError(e.reason, f"{where}: {e.detail}") from None
    if np.issubdtype(a.dtype, np.integer):
        info = np.iinfo(a.dtype)
        if info.min < 0:
            raise SampleError("unreadable_image", f"{where}: signed integer array ({a.dtype}); store it unsigned or float")
        if info.max > 255:  # wider than 8 bits: the image's own range (issue 42)
            return scale_to_unit(a, None, dtype=str(a.dtype), bit_depth=8 * a.dtype.itemsize)
        high = float(info.max)
        source = "bit_depth"
    elif np.issubdtype(a.dtype, np.floating):
        high = float(float_scale)
        source = "float_scale"
    else:
        raise SampleError("unreadable_image", f"{where}: unsupported dtype {a.dtype}")
    x = a.astype(np.float64) / high
    if not np.isfinite(x).all():
        raise SampleError("unreadable_image", f"{where}: non-finite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0 + 1e-6:
        raise SampleError(
            "unreadable_image",
            f"{where}: values {lo * high:g}..{hi * high:g} outside 0..{high:g} (set float_scale to the stored range)",
        )
    rec = {"mapping": "linear", "low": 0.0, "high": high, "invert": False, "clipped": False,
           "source": source, "unit": "stored", "dtype": str(a.dtype)}
    return np.clip(x, 0.0, 1.0).astype(np.float32), rec


def _image_from_array(
    arr: np.ndarray, float_scale: float, where: str, intensity_range: tuple[float, float] | None = None
) -> tuple[FloatImage, dict[str, Any]]:
    a = np.asarray(arr)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3) or 0 in a.shape:
        raise SampleError("unreadable_image", f"{where}: image shape {a.shape}, need (H, W), (H, W, 1) or (H, W, 3)")
    return array_to_unit(a, float_scale, where, intensity_range)


# --------------------------------------------------------------------------------------------------
# pannuke_npy


PANNUKE_CITATION = (
    "Gamper J, Koohbanani NA, Benet K, Khuram A, Rajpoot N. PanNuke: an open pan-cancer histology "
    "dataset for nuclei instance segmentation and classification. ECDP 2019; Gamper J, et al. PanNuke "
    "Dataset Extension, Insights and Baselines. arXiv:2003.10778. Kaggle distribution: "
    "andrewmvd/cancer-inst-segmentation-and-classification."
)
PANNUKE_CLASSES: tuple[str, ...] = ("neoplastic", "inflammatory", "connective", "dead", "epithelial")
"""Channels 0-4 of ``masks.npy`` (instance ids of that nucleus class); channel 5 is background."""


class PanNukeOptions(ReaderOptions):
    """``float_scale``: float image arrays are divided by it to reach [0, 1]. ``allow_empty_mask``:
    keep patches without foreground."""

    boxes: Literal["per_channel", "merged"] = "per_channel"
    """``per_channel``: one box per nucleus class present in the patch (the tight box over that
    channel's nuclei); ``merged``: the dataset-wide rule (one tight box, or one per component with
    ``per_component_boxes``)."""
    channels: list[Annotated[int, Field(ge=0, le=5)]] = Field(default_factory=lambda: [0, 1, 2, 3, 4], min_length=1)
    """Mask channels that are foreground (0 neoplastic, 1 inflammatory, 2 connective, 3 dead, 4 epithelial)."""
    parts: list[str] | None = None
    """Part folder names to read (default: every sub-folder holding Images/images.npy, sorted)."""
    float_scale: float = Field(default=255.0, gt=0)
    allow_empty_mask: bool = False


def _part_files(part: Path) -> tuple[Path, Path, Path | None]:
    """``(images.npy, masks.npy, types.npy or None)`` of one part folder; FileNotFoundError names
    the missing array."""
    img_dir = child_dir(part, "Images", "images")
    mask_dir = child_dir(part, "Masks", "masks")
    images = (img_dir or part / "Images") / "images.npy"
    masks = (mask_dir or part / "Masks") / "masks.npy"
    if not images.is_file():
        raise FileNotFoundError(f"PanNuke images.npy not found: {images}")
    if not masks.is_file():
        raise FileNotFoundError(f"PanNuke masks.npy not found: {masks}")
    types = images.parent / "types.npy"
    return images, masks, (types if types.is_file() else None)


def _pannuke_parts(root: Path, names: list[str] | None) -> list[Path]:
    if names is not None:
        parts = []
        for n in names:
            d = child_dir(root, n)
            if d is None:
                raise FileNotFoundError(f"PanNuke part folder {n!r} not found under {root}")
            parts.append(d)
        return parts
    if child_dir(root, "Images", "images") is not None:
        return [root]
    parts = [d for d in sorted(root.iterdir()) if d.is_dir() and not is_hidden(d)
             and child_dir(d, "Images", "images") is not None]
    if not parts:
        raise FileNotFoundError(f"no PanNuke part (a folder with Images/images.npy) under {root}")
    return parts


def _part_key(part: Path) -> str:
    return "".join(ch for ch in part.name.lower() if ch.isalnum()) or "part"


def index_pannuke(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, PanNukeOptions)
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    refs: list[SampleRef] = []
    for part in _pannuke_parts(root, opts.parts):
        images_p, masks_p, types_p = _part_files(part)
        images, masks = open_npy(images_p), open_npy(masks_p)
        if images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(f"{images_p}: shape {images.shape}, need (N, H, W, 3)")
        if masks.ndim != 4 or masks.shape[:3] != images.shape[:3] or masks.shape[3] < max(opts.channels) + 1:
            raise ValueError(f"{masks_p}: shape {masks.shape} does not match images {images.shape} (N, H, W, 6)")
        types, types_note = None, None
        if types_p is not None:
            try:
                types = open_npy(types_p)
            except ValueError as e:  # e.g. a pickled object array, refused with allow_pickle=False
                types_note = f"types.npy not read: {e}"
        if types is not None and (types.ndim != 1 or types.shape[0] != images.shape[0]):
            raise ValueError(f"{types_p}: shape {types.shape}, need ({images.shape[0]},)")
        key = _part_key(part)
        width = max(5, len(str(images.shape[0] - 1)))
        for i in range(images.shape[0]):
            tissue = str(types[i]) if types is not None else None
            refs.append(make_ref(cfg, f"{key}_{i:0{width}d}", images_p, [masks_p], index=i, part=part.name,
                                 tissue=tissue, tissue_note=types_note))
    return refs, []


def _channel_boxes(channel_masks: list[np.ndarray], hw: tuple[int, int] | None) -> np.ndarray:
    rows = []
    for m in channel_masks:
        mm = m if hw is None or m.shape == hw else resize_mask(m, hw)
        b = mask_to_box(mm)
        if b is not None:
            rows.append(b)
    return np.asarray(rows, np.float32).reshape(-1, 4)


def load_pannuke(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, PanNukeOptions)
    i = int(ref.extra["index"])
    where = f"{ref.image_path}[{i}]"
    try:
        raw = open_npy(Path(ref.image_path), image_axes=(1, 2))[i]
        masks = np.asarray(open_npy(Path(ref.mask_paths[0]), image_axes=(1, 2))[i])
    except (OSError, ValueError) as e:
        raise SampleError("unreadable_image", f"{where}: {type(e).__name__}: {e}") from None
    image, intensity = _image_from_array(raw, opts.float_scale, where)
    channel_masks = [masks[..., c] > 0 for c in opts.channels]
    mask = np.logical_or.reduce(channel_masks)
    present = [PANNUKE_CLASSES[c] if c < len(PANNUKE_CLASSES) else str(c)
               for c, m in zip(opts.channels, channel_masks, strict=True) if m.any()]
    n_nuclei = {PANNUKE_CLASSES[c] if c < len(PANNUKE_CLASSES) else str(c): int(np.unique(masks[..., c][masks[..., c] > 0]).size)
                for c in opts.channels}
    meta: dict[str, Any] = {
        "intensity": intensity,
        "mask_rule": f"channels {opts.channels} > 0 (union)",
        "index": i,
        "part": ref.extra.get("part"),
        "tissue": ref.extra.get("tissue"),
        "classes_present": present,
        "n_nuclei": n_nuclei,
        "boxes_rule": opts.boxes,
    }
    sample = finish_sample(cfg, ref, image, mask, meta, allow_empty_mask=opts.allow_empty_mask)
    if opts.boxes == "per_channel":
        hw = (int(sample.image.shape[0]), int(sample.image.shape[1]))
        sample = replace(sample, boxes=_channel_boxes([m for m in channel_masks if m.any()], hw))
    return sample


READERS.register(
    "pannuke_npy",
    Reader(
        name="pannuke_npy",
        description=(
            "PanNuke as stacked arrays (andrewmvd cancer-inst): images.npy (N, 256, 256, 3) float 0..255, "
            "masks.npy (N, 256, 256, 6) per-class instance ids; mask = union of the nucleus channels, one box "
            "per present class (boxes: per_channel) or merged."
        ),
        index=index_pannuke,
        load=load_pannuke,
        options_model=PanNukeOptions,
        layout=(
            "<part>/Images/images.npy + <part>/Masks/masks.npy (+ optional <part>/Images/types.npy); root is "
            "one part folder or the folder holding Part 1, Part 2, Part 3"
        ),
        citation=PANNUKE_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# npy_single


class NpySingleOptions(IntensityOptions):
    """Options of the single-array ``.npy`` reader. ``image_dir``: the image folder under root.
    ``mask_dir``: the mask folder under root (null: no masks). ``float_scale``: float arrays are
    divided by it to reach [0, 1]. ``intensity_range``: ``[low, high]`` of the stored values
    mapped to [0, 1] with clipping, for any dtype (not with ``float_scale``); without it uint8 is
    divided by 255 and wider integers are scaled by each image's own range. ``allow_empty_mask``:
    keep samples whose mask has no foreground."""

    image_dir: str = "imgs"
    mask_dir: str | None = "gts"
    label_values: list[int] | None = None
    """Mask values that are foreground (default: every value > 0, i.e. the union of all labels)."""
    float_scale: float = Field(default=1.0, gt=0)
    allow_empty_mask: bool = False

    @model_validator(mode="after")
    def _one_scale(self) -> NpySingleOptions:
        if self.intensity_range is not None and "float_scale" in self.model_fields_set:
            raise ValueError("give intensity_range or float_scale, not both")
        return self


def index_npy_single(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, NpySingleOptions)
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    img_dir = require_dir(root / opts.image_dir, f"npy image folder ({opts.image_dir}/)")
    mask_dir = None if opts.mask_dir is None else require_dir(root / opts.mask_dir, f"npy mask folder ({opts.mask_dir}/)")
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in sorted(img_dir.glob("*.npy")):
        if not p.is_file() or is_hidden(p):
            continue
        if mask_dir is None:
            refs.append(make_ref(cfg, p.stem, p))
            continue
        mp = mask_dir / p.name
        if not mp.is_file():
            bad.append(quarantine(cfg, p.stem, p, "missing_mask", f"expected {mp}"))
        else:
            refs.append(make_ref(cfg, p.stem, p, [mp]))
    return refs, bad


def load_npy_single(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, NpySingleOptions)
    path = Path(ref.image_path)
    try:
        raw = open_npy(path, image_axes=(0, 1))
    except (OSError, ValueError) as e:
        raise SampleError("unreadable_image", f"{path}: {type(e).__name__}: {e}") from None
    image, intensity = _image_from_array(raw, opts.float_scale, str(path), opts.intensity_range)
    meta: dict[str, Any] = {"intensity": intensity}
    mask = None
    if ref.mask_paths:
        mp = Path(ref.mask_paths[0])
        try:
            labels = np.asarray(open_npy(mp, image_axes=(0, 1)))
        except FileNotFoundError:
            raise SampleError("missing_mask", str(mp)) from None
        except (OSError, ValueError) as e:
            raise SampleError("unreadable_mask", f"{mp}: {type(e).__name__}: {e}") from None
        if labels.ndim == 3 and labels.shape[2] == 1:
            labels = labels[..., 0]
        if labels.ndim != 2:
            raise SampleError("unreadable_mask", f"{mp}: mask shape {labels.shape}, need (H, W)")
        if opts.label_values is None:
            mask = labels > 0
            meta["mask_rule"] = "label > 0"
        else:
            mask = np.isin(labels, np.asarray(opts.label_values))
            meta["mask_rule"] = f"label in {sorted(opts.label_values)}"
        meta["labels_present"] = [int(v) for v in np.unique(labels) if v != 0]
    return finish_sample(cfg, ref, image, mask, meta, allow_empty_mask=opts.allow_empty_mask)


READERS.register(
    "npy_single",
    Reader(
        name="npy_single",
        description=(
            "One .npy array per image and per mask (MedSAM-style per-slice npy, e.g. FLARE22 CT_Abd): "
            "image (H, W) or (H, W, 3), mask (H, W) label map; foreground = label > 0 or label_values."
        ),
        index=index_npy_single,
        load=load_npy_single,
        options_model=NpySingleOptions,
        layout="imgs/<id>.npy + gts/<id>.npy (folders configurable: image_dir, mask_dir)",
        kind="generic",
    ),
)
