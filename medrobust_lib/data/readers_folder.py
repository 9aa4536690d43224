"""Image-folder readers: the generic ``folder`` reader and presets for published 2-D layouts.

Each preset only fixes folder names, file suffixes, colour handling and mask decoding; loading
goes through one shared path (:func:`load_pair`), so every preset follows the rules in
:mod:`medrobust_lib.data.readers` (mask size check, empty masks, resizing, boxes) and maps stored
values to [0, 1] the same way (8-bit /255; 16-bit by each image's own range unless the options
declare ``intensity_range``; see :class:`~medrobust_lib.data.readers.IntensityOptions`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from medrobust_lib.data.imageio import gray_to_rgb, raw_to_float, read_raw, rgb_to_gray
from medrobust_lib.data.readers import (
    READERS,
    IndexResult,
    MaskOptions,
    RasterOptions,
    Reader,
    child_dir,
    dataset_root,
    finish_sample,
    is_hidden,
    make_ref,
    options_for,
    quarantine,
    read_binary_mask,
    read_instance_labels,
    require_dir,
    sample_id_for,
    single_channel,
    union_masks,
)
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.types import BoolMask

ColorMode = Literal["keep", "gray", "rgb"]
MaskDecoder = Callable[[Path], tuple[BoolMask, str]]
InstanceDecoder = Callable[[Path], tuple[np.ndarray, str]]


# --------------------------------------------------------------------------------------------------
# shared loading


def load_pair(
    cfg: DatasetSpec,
    ref: SampleRef,
    *,
    color: ColorMode = "keep",
    channel: int | None = None,
    decode_mask: MaskDecoder | None = None,
    decode_instances: InstanceDecoder | None = None,
    allow_empty_mask: bool = False,
    extra_meta: dict[str, Any] | None = None,
    intensity_range: tuple[float, float] | None = None,
) -> Sample:
    """Load ``ref.image_path`` plus the union of ``ref.mask_paths`` into a Sample.

    The stored values map to [0, 1] by :func:`~medrobust_lib.data.imageio.raw_to_float`: with the
    declared ``intensity_range`` if given, else 8-bit /255 and 16-bit by the image's own range.
    ``channel`` picks one channel of a colour image (-> grayscale); ``color`` then forces gray
    (BT.601 luminance), RGB (gray replicated) or keeps the file's channels. ``decode_mask`` turns
    one mask file into a bool mask and a rule description; ``decode_instances`` (instead) turns
    the one mask file into an integer instance-label map (0 background) and a rule description,
    and the sample gets those instances (:func:`~medrobust_lib.data.readers.finish_sample`)."""
    image_path = Path(ref.image_path)
    raw = read_raw(image_path)
    image, intensity = raw_to_float(raw, intensity_range=intensity_range, scaling="actual_range")
    meta: dict[str, Any] = {}
    if channel is not None:
        if image.ndim == 3:
            image = np.ascontiguousarray(image[..., channel])
            intensity["channel"] = channel
        else:
            intensity["channel"] = "file is grayscale; channel option ignored"
    if color == "gray" and image.ndim == 3:
        image = rgb_to_gray(image)
        intensity["color"] = "bt601_luminance"
    elif color == "rgb" and image.ndim == 2:
        image = gray_to_rgb(image)
        intensity["color"] = "gray_replicated"
    meta["intensity"] = intensity

    mask: BoolMask | None = None
    instances: np.ndarray | None = None
    if ref.mask_paths and decode_instances is not None:
        if len(ref.mask_paths) != 1:
            raise ValueError("decode_instances reads exactly one mask file per sample")
        instances, meta["mask_rule"] = decode_instances(Path(ref.mask_paths[0]))
        mask = instances > 0
    elif ref.mask_paths:
        if decode_mask is None:
            raise ValueError("decode_mask is required when the ref has mask paths")
        paths = [Path(m) for m in ref.mask_paths]
        decoded = [decode_mask(p) for p in paths]
        mask = union_masks([d[0] for d in decoded], paths)
        meta["mask_rule"] = decoded[0][1] + (f" (union of {len(paths)} masks)" if len(paths) > 1 else "")
    if extra_meta:
        meta.update(extra_meta)
    return finish_sample(cfg, ref, image, mask, meta, allow_empty_mask=allow_empty_mask, instances=instances)


def _threshold_decoder(opts: MaskOptions) -> MaskDecoder:
    return lambda p: read_binary_mask(p, opts)


# --------------------------------------------------------------------------------------------------
# folder (generic)


class FolderOptions(RasterOptions):
    """Options of the generic ``folder`` reader (paths relative to ``cfg.root``).

    ``image_dir``: the image folder under root. ``mask_dir``: the mask folder under root (null:
    images without masks). ``image_glob``: which files of image_dir are images. ``mask_suffix``:
    added to an image's stem to name its mask. ``mask_ext``: the mask files' extension.
    ``grayscale``: true reads images as gray, false as RGB, null keeps what the file holds."""

    image_dir: str = "images"
    mask_dir: str | None = "masks"
    image_glob: str = "*.png"
    mask_suffix: str = ""
    mask_ext: str = ".png"
    grayscale: bool | None = None
    instance_labels: bool = False
    """True: each mask file holds instance ids (one integer id per object, 8 or 16 bit, 0 =
    background; lossless files only); the mask is every id > 0 and the sample keeps the instances
    (Sample.instances, one box per instance). Not combined with mask_values or mask_threshold."""

    @model_validator(mode="after")
    def _check_instance_labels(self) -> FolderOptions:
        if self.instance_labels:
            given = [k for k in ("mask_values", "mask_threshold") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"instance_labels cannot be combined with {' or '.join(given)} "
                                 "(every id > 0 is an instance)")
            if self.mask_ext.lower() in (".jpg", ".jpeg"):
                raise ValueError(f"instance_labels needs lossless mask files, not mask_ext {self.mask_ext!r}")
        return self


def _folder_mask_path(img: Path, img_dir: Path, mask_dir: Path, opts: FolderOptions) -> Path:
    rel = img.relative_to(img_dir)
    return mask_dir / rel.parent / f"{img.stem}{opts.mask_suffix}{opts.mask_ext}"


def index_folder(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, FolderOptions)
    root = Path(cfg.root).expanduser()
    img_dir = require_dir(root / opts.image_dir, "image folder")
    mask_dir = None if opts.mask_dir is None else require_dir(root / opts.mask_dir, "mask folder")
    candidates = sorted(p for p in img_dir.glob(opts.image_glob) if p.is_file() and not is_hidden(p))
    masks_of_images: set[Path] = set()
    if mask_dir is not None:
        for p in candidates:
            mp = _folder_mask_path(p, img_dir, mask_dir, opts)
            if mp.resolve() != p.resolve():
                masks_of_images.add(mp.resolve())
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in candidates:
        if p.resolve() in masks_of_images:
            continue  # a mask file living beside the images (e.g. "x_mask.png" next to "x.png")
        sid = sample_id_for(p.relative_to(img_dir))
        if mask_dir is None:
            refs.append(make_ref(cfg, sid, p))
            continue
        mp = _folder_mask_path(p, img_dir, mask_dir, opts)
        if not mp.is_file():
            bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
        else:
            refs.append(make_ref(cfg, sid, p, [mp]))
    return refs, bad


def load_folder(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, FolderOptions)
    color: ColorMode = "keep" if opts.grayscale is None else ("gray" if opts.grayscale else "rgb")
    return load_pair(
        cfg, ref, color=color, decode_mask=_threshold_decoder(opts),
        decode_instances=read_instance_labels if opts.instance_labels else None,
        allow_empty_mask=opts.allow_empty_mask, intensity_range=opts.intensity_range,
    )


READERS.register(
    "folder",
    Reader(
        name="folder",
        description="Generic image folder + mask folder with matching file names.",
        index=index_folder,
        load=load_folder,
        options_model=FolderOptions,
        layout="<image_dir>/<id><ext> (image_glob, default *.png) + <mask_dir>/<id><mask_suffix><mask_ext>",
    ),
)


# --------------------------------------------------------------------------------------------------
# isic2016


ISIC2016_SPLITS: dict[str, tuple[str, str]] = {
    "train": ("ISBI2016_ISIC_Part1_Training_Data", "ISBI2016_ISIC_Part1_Training_GroundTruth"),
    "test": ("ISBI2016_ISIC_Part1_Test_Data", "ISBI2016_ISIC_Part1_Test_GroundTruth"),
}
ISIC2016_CITATION = (
    "Gutman D, Codella NCF, Celebi E, et al. Skin Lesion Analysis toward Melanoma Detection: A "
    "Challenge at the International Symposium on Biomedical Imaging (ISBI) 2016, hosted by the "
    "International Skin Imaging Collaboration (ISIC). arXiv:1605.01397."
)
_ISIC_RE = re.compile(r"^(ISIC_\d+)\.jpg$", re.IGNORECASE)


class Isic2016Options(RasterOptions):
    """Options of the ``isic2016`` reader. ``splits``: which of the published splits are read (train,
    test)."""

    splits: list[Literal["train", "test"]] = Field(default_factory=lambda: ["train", "test"])  # type: ignore[arg-type]


def index_isic2016(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, Isic2016Options)
    root = Path(cfg.root).expanduser()
    require_dir(root, f"dataset root for {cfg.name!r}")
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    found = False
    for split in opts.splits:
        data_name, gt_name = ISIC2016_SPLITS[split]
        data_dir = child_dir(root, data_name)
        if data_dir is None:
            continue
        found = True
        gt_dir = child_dir(root, gt_name) or root / gt_name
        for p in sorted(data_dir.iterdir()):
            m = _ISIC_RE.match(p.name)
            if m is None or not p.is_file():
                continue
            sid = m.group(1)
            mp = gt_dir / f"{sid}_Segmentation.png"
            if not mp.is_file():
                bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
            else:
                refs.append(make_ref(cfg, sid, p, [mp], split=split))
    if not found:
        wanted = ", ".join(ISIC2016_SPLITS[s][0] for s in opts.splits)
        raise FileNotFoundError(f"no ISIC 2016 data folder ({wanted}) under {root}")
    return refs, bad


def load_isic2016(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, Isic2016Options)
    return load_pair(
        cfg,
        ref,
        color="rgb",
        decode_mask=_threshold_decoder(opts),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta={"split": ref.extra.get("split")},
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "isic2016",
    Reader(
        name="isic2016",
        description="ISIC 2016 Part 1 lesion segmentation (dermoscopy, RGB).",
        index=index_isic2016,
        load=load_isic2016,
        options_model=Isic2016Options,
        layout=(
            "ISBI2016_ISIC_Part1_Training_Data/ISIC_0000000.jpg + "
            "ISBI2016_ISIC_Part1_Training_GroundTruth/ISIC_0000000_Segmentation.png "
            "(and the Test_Data / Test_GroundTruth pair if present)"
        ),
        citation=ISIC2016_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# kvasir_seg


KVASIR_CITATION = (
    "Jha D, Smedsrud PH, Riegler MA, et al. Kvasir-SEG: A Segmented Polyp Dataset. MultiMedia "
    "Modeling (MMM) 2020, LNCS 11962, pp. 451-462."
)


class KvasirOptions(RasterOptions):
    pass


def index_kvasir_seg(cfg: DatasetSpec) -> IndexResult:
    root = dataset_root(cfg, ("Kvasir-SEG",), ("images",))
    img_dir = require_dir(child_dir(root, "images") or root / "images", "Kvasir-SEG images folder")
    mask_dir = require_dir(child_dir(root, "masks") or root / "masks", "Kvasir-SEG masks folder")
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in sorted(img_dir.iterdir()):
        if not p.is_file() or is_hidden(p) or p.suffix.lower() not in (".jpg", ".jpeg"):
            continue
        sid = p.stem
        mp = mask_dir / p.name
        if not mp.is_file():
            bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
        else:
            refs.append(make_ref(cfg, sid, p, [mp]))
    return refs, bad


def load_kvasir_seg(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, KvasirOptions)
    return load_pair(
        cfg, ref, color="rgb", decode_mask=_threshold_decoder(opts), allow_empty_mask=opts.allow_empty_mask,
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "kvasir_seg",
    Reader(
        name="kvasir_seg",
        description="Kvasir-SEG polyp segmentation (endoscopy, RGB; JPEG masks thresholded at 127).",
        index=index_kvasir_seg,
        load=load_kvasir_seg,
        options_model=KvasirOptions,
        layout="images/<id>.jpg + masks/<id>.jpg (root may also be the folder holding Kvasir-SEG/)",
        citation=KVASIR_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# busi


BUSI_CLASSES: tuple[str, ...] = ("benign", "malignant", "normal")
BUSI_CITATION = (
    "Al-Dhabyani W, Gomaa M, Khaled H, Fahmy A. Dataset of breast ultrasound images. Data in Brief "
    "2020;28:104863. doi:10.1016/j.dib.2019.104863."
)
_BUSI_RE = re.compile(r"^(benign|malignant|normal) \((\d+)\)\.png$")


class BusiOptions(RasterOptions):
    """Options of the ``busi`` reader. ``classes``: which class folders are read (benign, malignant,
    normal)."""

    classes: list[Literal["benign", "malignant", "normal"]] = Field(
        default_factory=lambda: ["benign", "malignant", "normal"]  # type: ignore[arg-type]
    )


def _busi_masks(folder_names: Sequence[str], stem: str) -> tuple[str | None, list[str]]:
    """(main mask name or None, extra mask names ordered by their number)."""
    main = f"{stem}_mask.png"
    extra_re = re.compile(rf"^{re.escape(stem)}_mask_(\d+)\.png$")
    extras = sorted(
        ((int(m.group(1)), n) for n in folder_names if (m := extra_re.match(n)) is not None),
    )
    return (main if main in folder_names else None), [n for _, n in extras]


def index_busi(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, BusiOptions)
    root = dataset_root(cfg, ("Dataset_BUSI_with_GT",), BUSI_CLASSES)
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    found = False
    for cls in opts.classes:
        d = child_dir(root, cls)
        if d is None:
            continue
        found = True
        names = sorted(n.name for n in d.iterdir() if n.is_file())
        for name in names:
            m = _BUSI_RE.match(name)
            if m is None:
                continue
            sid = name[: -len(".png")]
            main, extras = _busi_masks(names, sid)
            if main is None:
                bad.append(
                    quarantine(cfg, sid, d / name, "missing_mask", f"expected {d / (sid + '_mask.png')}")
                )
                continue
            mask_paths = [d / main] + [d / e for e in extras]
            refs.append(make_ref(cfg, sid, d / name, mask_paths, **{"class": cls, "number": int(m.group(2))}))
    if not found:
        raise FileNotFoundError(f"no BUSI class folder ({', '.join(opts.classes)}) under {root}")
    return refs, bad


def load_busi(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, BusiOptions)
    return load_pair(
        cfg,
        ref,
        color="gray",
        decode_mask=_threshold_decoder(opts),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta={"class": ref.extra.get("class"), "n_mask_files": len(ref.mask_paths)},
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "busi",
    Reader(
        name="busi",
        description=(
            "Breast Ultrasound Images (BUSI): benign/malignant/normal, masks unioned over _mask, "
            "_mask_1, _mask_2; RGB-stored grayscale converted to one channel."
        ),
        index=index_busi,
        load=load_busi,
        options_model=BusiOptions,
        layout=(
            "<class>/<class> (<n>).png + <class>/<class> (<n>)_mask.png [+ _mask_1.png, _mask_2.png], "
            "class in benign, malignant, normal (root may also hold Dataset_BUSI_with_GT/)"
        ),
        citation=BUSI_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# lgg_mri


LGG_CITATION = (
    "Buda M, Saha A, Mazurowski MA. Association of genomic subtypes of lower-grade gliomas with "
    "shape features automatically extracted by a deep learning algorithm. Computers in Biology and "
    "Medicine 2019;109:218-225. Data: Kaggle 'lgg-mri-segmentation' (kaggle_3m), from TCGA-LGG / TCIA."
)
LGG_CHANNELS: tuple[str, ...] = ("pre-contrast", "FLAIR", "post-contrast")
_LGG_RE = re.compile(r"^(.+)_(\d+)\.tif$")


class LggOptions(RasterOptions):
    channel: int | None = Field(default=1, ge=0, le=2)
    """0 = pre-contrast, 1 = FLAIR (default), 2 = post-contrast; None keeps the 3-channel composite."""


def index_lgg_mri(cfg: DatasetSpec) -> IndexResult:
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    root = child_dir(root, "kaggle_3m") or root
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or is_hidden(d):
            continue
        for p in sorted(d.iterdir()):
            m = _LGG_RE.match(p.name)
            if m is None or not p.is_file() or p.name.endswith("_mask.tif"):
                continue
            sid = p.name[: -len(".tif")]
            mp = d / f"{sid}_mask.tif"
            if not mp.is_file():
                bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
            else:
                refs.append(make_ref(cfg, sid, p, [mp], patient=d.name, slice=int(m.group(2))))
    return refs, bad


def load_lgg_mri(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, LggOptions)
    extra: dict[str, Any] = {"patient": ref.extra.get("patient"), "slice": ref.extra.get("slice")}
    if opts.channel is not None:
        extra["channel_name"] = LGG_CHANNELS[opts.channel]
    return load_pair(
        cfg,
        ref,
        color="keep",
        channel=opts.channel,
        decode_mask=_threshold_decoder(opts),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta=extra,
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "lgg_mri",
    Reader(
        name="lgg_mri",
        description=(
            "Kaggle LGG MRI segmentation (kaggle_3m): 3-channel TIFF slices (pre-contrast, FLAIR, "
            "post-contrast); option channel picks one (default FLAIR). Slices without tumour are "
            "quarantined as empty_mask unless allow_empty_mask."
        ),
        index=index_lgg_mri,
        load=load_lgg_mri,
        options_model=LggOptions,
        layout="<patient>/<patient>_<slice>.tif + <patient>/<patient>_<slice>_mask.tif (root: kaggle_3m or its parent)",
        citation=LGG_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# refuge


REFUGE_CITATION = (
    "Orlando JI, Fu H, Barbosa Breda J, et al. REFUGE Challenge: A unified framework for evaluating "
    "automated methods for glaucoma assessment from fundus photographs. Medical Image Analysis "
    "2020;59:101570."
)
REFUGE_DISC_BELOW = 192
"""Stored value < 192 is optic disc (cup 0 or rim 128); the midpoint between 128 and 255."""
REFUGE_CUP_BELOW = 64
"""Stored value < 64 is optic cup (0); the midpoint between 0 and 128."""


class RefugeOptions(RasterOptions):
    """Options of the ``refuge`` reader. ``target``: the structure segmented, the optic disc or cup.
    ``image_ext``: the image files' extension. ``mask_ext``: the mask files' extension."""

    target: Literal["disc", "cup"] = "disc"
    image_ext: str = ".jpg"
    mask_ext: str = ".bmp"


def _refuge_splits(root: Path) -> list[tuple[str, Path, Path]]:
    img = child_dir(root, "Images")
    msk = child_dir(root, "Masks", "Mask")
    if img is not None:
        return [("", img, msk or root / "Masks")]
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and not is_hidden(d):
            img = child_dir(d, "Images")
            if img is not None:
                out.append((d.name, img, child_dir(d, "Masks", "Mask") or d / "Masks"))
    return out


def index_refuge(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, RefugeOptions)
    root = Path(cfg.root).expanduser()
    require_dir(root, f"dataset root for {cfg.name!r}")
    splits = _refuge_splits(root)
    if not splits:
        raise FileNotFoundError(f"no REFUGE Images/ folder under {root} or its sub-folders")
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for split, img_dir, mask_dir in splits:
        for p in sorted(img_dir.iterdir()):
            if not p.is_file() or is_hidden(p) or p.suffix.lower() != opts.image_ext.lower():
                continue
            sid = p.stem
            mp = mask_dir / f"{p.stem}{opts.mask_ext}"
            if not mp.is_file():
                bad.append(quarantine(cfg, sid, p, "missing_mask", f"expected {mp}"))
            else:
                refs.append(make_ref(cfg, sid, p, [mp], split=split))
    return refs, bad


def decode_refuge_mask(path: Path, target: Literal["disc", "cup"]) -> tuple[BoolMask, str]:
    """REFUGE mask (0 = cup, 128 = disc rim, 255 = background) -> bool mask of disc or cup."""
    if not path.is_file():
        raise SampleError("missing_mask", str(path))
    try:
        raw = single_channel(read_raw(path), "mean")
    except SampleError as e:
        raise SampleError("unreadable_mask", e.detail) from None
    if raw.dtype == np.uint16:
        raw = (raw // 257).astype(np.uint8)
    if target == "disc":
        return raw < REFUGE_DISC_BELOW, f"disc: value < {REFUGE_DISC_BELOW} (cup 0 + rim 128)"
    return raw < REFUGE_CUP_BELOW, f"cup: value < {REFUGE_CUP_BELOW} (cup 0)"


def load_refuge(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, RefugeOptions)
    return load_pair(
        cfg,
        ref,
        color="rgb",
        decode_mask=lambda p: decode_refuge_mask(p, opts.target),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta={"split": ref.extra.get("split"), "target": opts.target},
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "refuge",
    Reader(
        name="refuge",
        description="REFUGE optic disc / cup segmentation (fundus, RGB); option target disc (default) or cup.",
        index=index_refuge,
        load=load_refuge,
        options_model=RefugeOptions,
        layout=(
            "Images/<id>.jpg + Masks/<id>.bmp (0 = cup, 128 = rim, 255 = background), "
            "or <split>/Images + <split>/Masks for each split folder"
        ),
        citation=REFUGE_CITATION,
        kind="preset",
    ),
)
