"""The ``nifti`` reader: Medical Segmentation Decathlon volumes cut into 2-D slices.

Layout: ``imagesTr/<case>.nii.gz`` + ``labelsTr/<case>.nii.gz`` (``.nii`` also accepted; macOS
``._<case>.nii.gz`` AppleDouble files, which ship inside the MSD tarballs, are skipped). Every
slice along ``axis`` (default 2, axial for the MSD's x, y, z storage) whose label has foreground
is one sample ``<case>_<a><k:03d>`` where ``<a>`` is ``x``, ``y`` or ``z`` for axis 0, 1, 2 (so the
default ids are ``<case>_z007``); ``all_slices`` keeps the empty ones too (with empty masks).
``slice_step`` / ``slice_start`` thin a volume: only slice indices ``k >= slice_start`` with
``(k - slice_start) % slice_step == 0`` are considered (then the foreground rule applies), so
``slice_start: 4, slice_step: 8`` keeps slices 4, 12, 20, ... that have foreground.

Orientation convention: the array is used as stored (no reorientation to RAS, no flips). The
slice ``vol[..., k]`` (for axis 2) with remaining voxel axes ``(a, b)`` is transposed to
``(b, a)`` (:func:`~medrobust_lib.data.imageio.nifti_slice_to_image`): image rows follow the
stored y axis, which is the anterior-posterior axis for MSD volumes, and columns the stored x
axis (left-right). Row 0 is voxel y = 0 as stored, so depending on the affine the anatomy may
appear upside down compared with a radiological viewer; image and mask always share the
transform, which is what the benchmark needs.

Intensity: values after the header's scl_slope/scl_inter (HU for the MSD CT tasks) are windowed
``[c - w/2, c + w/2] -> [0, 1]`` with the options' window, else with the 0.5/99.5 percentiles of
the whole volume (one window per case, so slices of a case stay comparable). 4-D images
(multi-sequence MRI) use ``channel`` (default 0). Labels: values > 0 are foreground, or exactly
``label_values`` when given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from medrobust_lib.data.imageio import (
    check_declared_size,
    check_nifti_bound,
    nifti_slice_to_image,
    percentile_window,
    window_record,
    window_to_unit,
)
from medrobust_lib.data.readers import (
    READERS,
    IndexResult,
    Reader,
    WindowOptions,
    child_dir,
    finish_sample,
    is_hidden,
    make_ref,
    options_for,
    quarantine,
    require_dir,
)
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.lru import LRU, file_stamp

AXIS_LETTERS: tuple[str, str, str] = ("x", "y", "z")
MSD_CITATION = (
    "Antonelli M, Reinke A, Bakas S, et al. The Medical Segmentation Decathlon. Nature "
    "Communications 2022;13:4128. (Simpson AL et al., arXiv:1902.09063.)"
)


class NiftiOptions(WindowOptions):
    """Options of the ``nifti`` reader (folders relative to the root).

    ``images_dir``: the image folder. ``labels_dir``: the label folder. ``axis``: the slicing axis
    (0, 1 or 2). ``channel``: the channel of a 4-D image. ``all_slices``: keep slices without
    foreground too. ``label_values``: label values that are foreground (null: every value > 0).
    ``slice_step``: only every k-th slice index, counted from ``slice_start`` (default 1: all).
    ``slice_start``: the first slice index considered (default 0)."""

    images_dir: str = "imagesTr"
    labels_dir: str = "labelsTr"
    axis: int = Field(default=2, ge=0, le=2)
    channel: int = Field(default=0, ge=0)
    all_slices: bool = False
    label_values: list[int] | None = None
    slice_step: int = Field(default=1, ge=1, description="keep every k-th slice index (from slice_start)")
    slice_start: int = Field(default=0, ge=0, description="the first slice index considered")


def _case_name(p: Path) -> str | None:
    n = p.name
    if n.endswith(".nii.gz"):
        return n[: -len(".nii.gz")]
    if n.endswith(".nii"):
        return n[: -len(".nii")]
    return None


def _label_path(labels_dir: Path, case: str) -> Path | None:
    for ext in (".nii.gz", ".nii"):
        p = labels_dir / f"{case}{ext}"
        if p.is_file():
            return p
    return None


def _foreground(label: np.ndarray, values: list[int] | None) -> np.ndarray:
    lab = np.rint(label).astype(np.int64) if np.issubdtype(label.dtype, np.floating) else label
    if values is None:
        return np.asarray(lab > 0)
    return np.isin(lab, np.asarray(values))


def _load_array(path: Path, what: str) -> np.ndarray:
    import nibabel as nib

    try:
        if path.stat().st_size == 0:
            raise SampleError("empty_file", str(path))
        img = nib.load(str(path))
        shape = tuple(int(d) for d in img.shape)  # type: ignore[attr-defined]
        spatial = shape[:3]
        if len(spatial) >= 2:  # every plane a slice may take, checked before any voxel is read
            a, b = max(((spatial[i], spatial[j]) for i in range(len(spatial)) for j in range(i + 1, len(spatial))),
                       key=lambda ab: ab[0] * ab[1])
            check_declared_size(a, b, path)
        check_nifti_bound(path, img)
        return np.asarray(img.dataobj)  # type: ignore[attr-defined]
    except SampleError:
        raise
    except Exception as e:
        raise SampleError(f"unreadable_{what}", f"{path}: {type(e).__name__}: {e}") from None


def _image_shape(path: Path) -> tuple[int, ...]:
    import nibabel as nib

    try:
        if path.stat().st_size == 0:
            raise SampleError("empty_file", str(path))
        return tuple(int(s) for s in nib.load(str(path)).shape)  # type: ignore[attr-defined]
    except SampleError:
        raise
    except Exception as e:
        raise SampleError("unreadable_nifti", f"{path}: {type(e).__name__}: {e}") from None


_CACHE: LRU[tuple[Any, ...], Any] = LRU(max_items=2, name="data.nifti_volumes")
"""The most recently used volumes (image and label), so that consecutive slices of one case decode
the file once; keyed on the file's stamp."""
_WINDOWS: LRU[tuple[Any, ...], tuple[float, float]] = LRU(max_items=4096, name="data.nifti_windows")
"""The percentile window of every recently read volume (two floats each, same key as the volume): a
volume read again after leaving :data:`_CACHE` skips the percentile pass over all its voxels (23 ms
for a 197 x 233 x 189 volume), which dominated a reload."""


def _file_key(path: Path, *parts: Any) -> tuple[Any, ...]:
    return (*file_stamp(path), *parts)


def _image_volume(path: Path, opts: NiftiOptions) -> tuple[np.ndarray, float, float]:
    """float32 (X, Y, Z) volume of the selected channel and its percentile window."""
    key = _file_key(path, "image", opts.channel, tuple(opts.percentiles))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    vol = _load_array(path, "nifti")
    if vol.ndim == 4:
        if opts.channel >= vol.shape[3]:
            raise SampleError("unsupported_nifti", f"{path}: channel {opts.channel} of {vol.shape[3]}")
        vol = vol[..., opts.channel]
    elif vol.ndim != 3:
        raise SampleError("unsupported_nifti", f"{path}: shape {vol.shape}, need 3-D or 4-D")
    vol = np.asarray(vol, np.float32)
    window = _WINDOWS.get(key)
    if window is None:
        window = percentile_window(vol, opts.percentiles)
        _WINDOWS.put(key, window)
    lo, hi = window
    value = (vol, lo, hi)
    _CACHE.put(key, value)
    return value


def _label_volume(path: Path) -> np.ndarray:
    key = _file_key(path, "label")
    hit = _CACHE.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    lab = _load_array(path, "label")
    if lab.ndim == 4 and lab.shape[3] == 1:
        lab = lab[..., 0]
    _CACHE.put(key, lab)
    return lab


def index_nifti(cfg: DatasetSpec) -> IndexResult:
    """Reads every label volume (to find slices with foreground) and every image header."""
    opts = options_for(cfg, NiftiOptions)
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    img_dir = require_dir(child_dir(root, opts.images_dir) or root / opts.images_dir, "NIfTI images folder")
    lab_dir = child_dir(root, opts.labels_dir) or root / opts.labels_dir
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    letter = AXIS_LETTERS[opts.axis]
    for p in sorted(img_dir.iterdir()):
        case = _case_name(p)
        if case is None or is_hidden(p) or not p.is_file():
            continue
        lp = _label_path(lab_dir, case)
        if lp is None:
            bad.append(quarantine(cfg, case, p, "missing_mask", f"expected {lab_dir / (case + '.nii.gz')}"))
            continue
        try:
            shape = _image_shape(p)
            lab = _label_volume(lp)
        except SampleError as e:
            bad.append(quarantine(cfg, case, p, e.reason, e.detail))
            continue
        if len(shape) not in (3, 4) or lab.ndim != 3 or tuple(lab.shape) != shape[:3]:
            bad.append(quarantine(cfg, case, p, "mask_size_mismatch", f"image {shape} vs label {lab.shape}"))
            continue
        fg = _foreground(lab, opts.label_values)
        other = tuple(a for a in range(3) if a != opts.axis)
        has_fg = np.asarray(fg.any(axis=other), dtype=bool)
        for k in range(opts.slice_start, shape[opts.axis], opts.slice_step):
            if opts.all_slices or has_fg[k]:
                refs.append(
                    make_ref(cfg, f"{case}_{letter}{k:03d}", p, [lp], case=case, axis=opts.axis, slice=k)
                )
    return refs, bad


def load_nifti(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, NiftiOptions)
    axis = int(ref.extra["axis"])
    k = int(ref.extra["slice"])
    vol, plo, phi = _image_volume(Path(ref.image_path), opts)
    lab = _label_volume(Path(ref.mask_paths[0]))
    if lab.shape != vol.shape:
        raise SampleError("mask_size_mismatch", f"image {vol.shape} vs label {lab.shape}")
    if not 0 <= k < vol.shape[axis]:
        raise SampleError("unsupported_nifti", f"slice {k} out of range for shape {vol.shape}")
    # basic indexing gives views of the cached volumes (nibabel's arrays are Fortran-ordered, so an
    # axial slice is one contiguous block); np.take copied each slice element by element, about 4 ms
    # per 512 x 512 slice, and the demo reads its LiTS slices hundreds of times
    at: tuple[slice | int, ...] = (slice(None),) * axis + (k,)
    values = nifti_slice_to_image(vol[at])
    mask = nifti_slice_to_image(_foreground(lab[at], opts.label_values))
    if opts.window_center is not None and opts.window_width is not None:
        lo = opts.window_center - opts.window_width / 2
        hi = opts.window_center + opts.window_width / 2
        source = "options"
    else:
        lo, hi, source = plo, phi, "percentile"
    image = window_to_unit(values, lo, hi)
    if source == "percentile":
        intensity = window_record(
            lo, hi, source=source, unit="stored", percentiles=opts.percentiles, percentile_scope="volume"
        )
    else:
        intensity = window_record(lo, hi, source=source, unit="stored")
    meta: dict[str, Any] = {
        "intensity": intensity,
        "nifti": {
            "case": ref.extra.get("case"),
            "axis": axis,
            "slice": k,
            "volume_shape": [int(s) for s in vol.shape],
            "convention": "stored array, slice transposed: rows = later stored axis",
        },
        "mask_rule": "label > 0" if opts.label_values is None else f"label in {sorted(opts.label_values)}",
    }
    return finish_sample(cfg, ref, image, mask, meta, allow_empty_mask=opts.all_slices)


READERS.register(
    "nifti",
    Reader(
        name="nifti",
        description=(
            "Medical Segmentation Decathlon volumes (imagesTr/labelsTr): one sample per slice with "
            "foreground along axis (default 2); percentile or given window."
        ),
        index=index_nifti,
        load=load_nifti,
        options_model=NiftiOptions,
        layout="imagesTr/<case>.nii.gz + labelsTr/<case>.nii.gz -> samples <case>_z<k:03d>",
        citation=MSD_CITATION,
    ),
)
