"""The ``dicom`` reader: a folder of single-image DICOM files with optional PNG masks.

Intensity (see :func:`medrobust_lib.data.imageio.read_dicom`): stored values are rescaled with
RescaleSlope/RescaleIntercept (HU for CT), then windowed ``[c - w/2, c + w/2] -> [0, 1]`` with
clipping, using the options' window, else the file's WindowCenter/WindowWidth, else the 0.5/99.5
percentiles of the rescaled values; MONOCHROME1 is inverted. The window and the rescale are kept in
``metadata["intensity"]`` so that :func:`~medrobust_lib.data.imageio.intensity_to_native` maps
the image back to HU. Colour DICOM (ultrasound RGB/YBR) becomes BT.601 luminance unless
``keep_rgb``.

Masks come from PNG files (``mask_dir``) or, with ``overlay_mask``, from the file's own overlay
plane (group ``overlay_group``, default 0x6000): the closed outlines a reader drew, filled, without
annotation frames and text (the rule: :mod:`medrobust_lib.data.overlay_masks`; thresholds
``overlay_min_area`` and ``overlay_max_box_fill``). A file without that overlay, or whose overlay
holds no such outline, is quarantined (``missing_overlay``, ``empty_mask``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from medrobust_lib.data.imageio import read_dicom
from medrobust_lib.data.overlay_masks import OverlayRule, place_overlay, structures_from_overlay
from medrobust_lib.data.readers import (
    READERS,
    IndexResult,
    MaskOptions,
    Reader,
    WindowOptions,
    finish_sample,
    is_hidden,
    make_ref,
    options_for,
    quarantine,
    read_binary_mask,
    require_dir,
    sample_id_for,
    union_masks,
)
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.types import BoolMask


class DicomOptions(MaskOptions, WindowOptions):
    """Options of the ``dicom`` reader. ``image_dir`` and ``mask_dir`` are relative to the root;
    ``extensions`` are matched case-insensitively; ``frame`` selects one frame of multi-frame files.

    ``recursive``: look for DICOM files in sub-folders too. ``mask_suffix``: added to a file's stem
    to name its mask. ``mask_ext``: the mask files' extension. ``keep_rgb``: keep RGB DICOMs in
    colour instead of luminance."""

    image_dir: str = "."
    recursive: bool = True
    extensions: list[str] = Field(default_factory=lambda: [".dcm"])
    mask_dir: str | None = None
    mask_suffix: str = ""
    mask_ext: str = ".png"
    keep_rgb: bool = False
    frame: int | None = Field(default=None, ge=0)
    overlay_mask: bool = Field(default=False, description=(
        "take the mask from the overlay plane (group 0x6000): closed outlines filled, rectangles and text left out "
        "(medrobust_lib/data/overlay_masks.py)"))
    overlay_group: int = Field(default=0x6000, ge=0x6000, le=0x601E, description=(
        "the overlay group read with overlay_mask (0x6000-0x601E)"))
    overlay_min_area: int = Field(default=64, ge=1, description=(
        "smallest filled outline kept, in pixels (text strokes are smaller)"))
    overlay_max_box_fill: float = Field(default=0.95, gt=0.0, le=1.0, description=(
        "a filled region covering at least this share of its bounding box is a drawn rectangle: left out"))

    @model_validator(mode="after")
    def _one_mask_source(self) -> DicomOptions:
        if self.overlay_mask and self.mask_dir is not None:
            raise ValueError("dicom options: overlay_mask and mask_dir are two mask sources; give one")
        if self.overlay_group % 2:
            raise ValueError(f"overlay_group must be an even group 0x6000..0x601E, got {self.overlay_group:#06x}")
        return self


def _mask_path(img: Path, img_dir: Path, mask_dir: Path, opts: DicomOptions) -> Path:
    rel = img.relative_to(img_dir)
    return mask_dir / rel.parent / f"{img.stem}{opts.mask_suffix}{opts.mask_ext}"


def index_dicom(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, DicomOptions)
    root = Path(cfg.root).expanduser()
    img_dir = require_dir(root / opts.image_dir, "DICOM folder")
    mask_dir = None if opts.mask_dir is None else require_dir(root / opts.mask_dir, "mask folder")
    exts = {e.lower() if e.startswith(".") else f".{e.lower()}" for e in opts.extensions}
    walker = img_dir.rglob("*") if opts.recursive else img_dir.glob("*")
    files = sorted(
        p
        for p in walker
        if p.suffix.lower() in exts
        and p.is_file()
        and not any(is_hidden(part) for part in p.relative_to(img_dir).parents if part.name)
        and not is_hidden(p)
    )
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in files:
        if mask_dir is not None and mask_dir.resolve() in p.resolve().parents:
            continue
        sid = sample_id_for(p.relative_to(img_dir))
        if mask_dir is None:
            refs.append(make_ref(cfg, sid, p))
            continue
        mp = _mask_path(p, img_dir, mask_dir, opts)
        if not mp.is_file():
            bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
        else:
            refs.append(make_ref(cfg, sid, p, [mp]))
    return refs, bad


def load_dicom(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, DicomOptions)
    image, meta = read_dicom(
        ref.image_path,
        window_center=opts.window_center,
        window_width=opts.window_width,
        percentiles=opts.percentiles,
        keep_rgb=opts.keep_rgb,
        frame=opts.frame,
    )
    mask: BoolMask | None = None
    if opts.overlay_mask:
        mask = overlay_mask(ref.image_path, opts, image.shape[:2])
        meta["mask_rule"] = (f"overlay {opts.overlay_group:#06x}: closed outlines filled, area >= "
                             f"{opts.overlay_min_area}, box fill < {opts.overlay_max_box_fill}")
    elif ref.mask_paths:
        paths = [Path(m) for m in ref.mask_paths]
        decoded = [read_binary_mask(p, opts) for p in paths]
        mask = union_masks([d[0] for d in decoded], paths)
        meta["mask_rule"] = decoded[0][1]
    return finish_sample(cfg, ref, image, mask, meta, allow_empty_mask=opts.allow_empty_mask)


def overlay_mask(path: str | Path, opts: DicomOptions, shape: tuple[int, ...]) -> BoolMask:
    """The mask of the overlay plane ``opts.overlay_group`` of the DICOM file at ``path``, placed
    at its Overlay Origin on an image of ``shape`` (H, W) (:func:`place_overlay`) and reduced to
    its outlined structures (:func:`structures_from_overlay`).

    Raises:
        SampleError: ``missing_overlay`` (no such overlay, or its data cannot be decoded).
    """
    import pydicom

    ds = pydicom.dcmread(str(path), stop_before_pixels=True)
    g = opts.overlay_group
    if (g, 0x3000) not in ds or (g, 0x0010) not in ds:
        raise SampleError("missing_overlay", f"{path}: no overlay plane in group {g:#06x}")
    try:
        plane = ds.overlay_array(g)
    except Exception as exc:  # malformed overlay attributes
        raise SampleError("missing_overlay", f"{path}: overlay {g:#06x}: {type(exc).__name__}: {exc}") from None
    origin = ds[g, 0x0050].value if (g, 0x0050) in ds else [1, 1]
    if plane.ndim == 3:  # a multi-frame overlay: its first frame
        plane = plane[0]
    placed = place_overlay(plane, (int(origin[0]), int(origin[1])), (int(shape[0]), int(shape[1])))
    return structures_from_overlay(placed, OverlayRule(min_area=opts.overlay_min_area,
                                                       max_box_fill=opts.overlay_max_box_fill))


READERS.register(
    "dicom",
    Reader(
        name="dicom",
        description=(
            "Folder of single-image DICOM files (recursive); HU/VOI window to [0, 1], MONOCHROME1 "
            "inverted, colour to luminance; optional PNG masks <mask_dir>/<stem>.png, or (overlay_mask) "
            "the outlines drawn in the file's overlay plane."
        ),
        index=index_dicom,
        load=load_dicom,
        options_model=DicomOptions,
        layout="<image_dir>/**/<stem>.dcm [+ <mask_dir>/<same sub-path>/<stem><mask_suffix>.png]",
    ),
)
