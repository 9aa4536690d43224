"""Presets for the 2-D image + mask layouts of the MedFM-Robust reference datasets.

``hyper_kvasir``, ``brain_tumor_kaggle`` and ``glaucoma`` read the folders as their publishers
ship them (the layouts are listed in each reader's ``layout`` and in the dataset table of docs/own-data.md)
and load through :func:`~medrobust_lib.data.readers_folder.load_pair`, so every rule of
:mod:`medrobust_lib.data.readers` (mask size check, empty masks, resizing, boxes from the resized
mask) applies unchanged. A missing layout file or folder is a ``FileNotFoundError`` that names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from medrobust_lib.data import (
    readers_folder,  # module import: readers.py imports this module while readers_folder loads
)
from medrobust_lib.data.readers import (
    READERS,
    IndexResult,
    RasterOptions,
    Reader,
    child_dir,
    dataset_root,
    is_hidden,
    make_ref,
    options_for,
    quarantine,
    read_binary_mask,
    require_dir,
)
from medrobust_lib.data.sample import DatasetSpec, QuarantineRecord, Sample, SampleRef

_JPEG = (".jpg", ".jpeg")


def _pair_index(
    cfg: DatasetSpec, img_dir: Path, mask_dir: Path, exts: tuple[str, ...], mask_ext: str | None
) -> IndexResult:
    """One ref per image in ``img_dir`` with one of ``exts``; the mask has the same stem in
    ``mask_dir`` (with ``mask_ext``, or the image's own extension when None)."""
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in sorted(img_dir.iterdir()):
        if not p.is_file() or is_hidden(p) or p.suffix.lower() not in exts:
            continue
        mp = mask_dir / (p.stem + (mask_ext if mask_ext is not None else p.suffix))
        if not mp.is_file():
            bad.append(quarantine(cfg, p.stem, p, "missing_mask", f"expected {mp}"))
        else:
            refs.append(make_ref(cfg, p.stem, p, [mp]))
    return refs, bad


# --------------------------------------------------------------------------------------------------
# hyper_kvasir


HYPER_KVASIR_CITATION = (
    "Borgli H, Thambawita V, Smedsrud PH, et al. HyperKvasir, a comprehensive multi-class image and "
    "video dataset for gastrointestinal endoscopy. Scientific Data 2020;7:283."
)
HYPER_KVASIR_BOXES = "bounding-boxes.json"


class HyperKvasirOptions(RasterOptions):
    pass


def read_hyper_kvasir_boxes(path: Path) -> dict[str, list[list[float]]]:
    """``bounding-boxes.json``: ``{stem: {"height", "width", "bbox": [{"label", "xmin", "ymin",
    "xmax", "ymax"}, ...]}}`` -> ``{stem: [[xmin, ymin, xmax, ymax], ...]}`` in stored pixels
    (as published; the file does not say whether the max edge is inclusive)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object keyed by image id, got {type(data).__name__}")
    out: dict[str, list[list[float]]] = {}
    for key, entry in data.items():
        boxes = entry.get("bbox", []) if isinstance(entry, dict) else []
        out[str(key)] = [
            [float(b["xmin"]), float(b["ymin"]), float(b["xmax"]), float(b["ymax"])]
            for b in boxes
            if isinstance(b, dict) and all(k in b for k in ("xmin", "ymin", "xmax", "ymax"))
        ]
    return out


def index_hyper_kvasir(cfg: DatasetSpec) -> IndexResult:
    root = dataset_root(cfg, ("hyper-kvasir", "segmented-images"), ("images",))
    img_dir = require_dir(child_dir(root, "images") or root / "images", "Hyper-Kvasir segmented-images/images folder")
    mask_dir = require_dir(child_dir(root, "masks") or root / "masks", "Hyper-Kvasir segmented-images/masks folder")
    boxes_path = root / HYPER_KVASIR_BOXES
    if not boxes_path.is_file():
        raise FileNotFoundError(f"Hyper-Kvasir {HYPER_KVASIR_BOXES} not found: {boxes_path}")
    boxes = read_hyper_kvasir_boxes(boxes_path)
    refs, bad = _pair_index(cfg, img_dir, mask_dir, _JPEG, None)
    refs = [
        make_ref(cfg, r.sample_id, Path(r.image_path), [Path(m) for m in r.mask_paths],
                 published_boxes=boxes.get(r.sample_id))
        for r in refs
    ]
    return refs, bad


def load_hyper_kvasir(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, HyperKvasirOptions)
    published = ref.extra.get("published_boxes")
    return readers_folder.load_pair(
        cfg,
        ref,
        color="rgb",
        decode_mask=lambda p: read_binary_mask(p, opts),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta={"published_boxes_xyxy": published, "n_published_boxes": len(published or [])},
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "hyper_kvasir",
    Reader(
        name="hyper_kvasir",
        description=(
            "Hyper-Kvasir segmented-images (endoscopy polyps, RGB; JPEG masks thresholded at 127); "
            "the published boxes of bounding-boxes.json are kept in metadata (boxes come from the mask)."
        ),
        index=index_hyper_kvasir,
        load=load_hyper_kvasir,
        options_model=HyperKvasirOptions,
        layout=(
            "segmented-images/images/<id>.jpg + segmented-images/masks/<id>.jpg + "
            "segmented-images/bounding-boxes.json (root: segmented-images or a parent holding it)"
        ),
        citation=HYPER_KVASIR_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# brain_tumor_kaggle


BRAIN_TUMOR_CITATION = (
    "Cheng J. Brain Tumor Dataset. figshare 2017, https://figshare.com/articles/dataset/brain_tumor_dataset/1512427 "
    "(3,064 T1-CE slices). Kaggle re-release as PNG images and masks: nikhilroxtomar/brain-tumor-segmentation."
)


class BrainTumorOptions(RasterOptions):
    pass


def index_brain_tumor(cfg: DatasetSpec) -> IndexResult:
    root = dataset_root(cfg, ("brain-tumor-segmentation",), ("images",))
    img_dir = require_dir(child_dir(root, "images") or root / "images", "brain tumor images folder")
    mask_dir = require_dir(child_dir(root, "masks") or root / "masks", "brain tumor masks folder")
    return _pair_index(cfg, img_dir, mask_dir, (".png",), ".png")


def load_brain_tumor(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, BrainTumorOptions)
    return readers_folder.load_pair(
        cfg, ref, color="gray", decode_mask=lambda p: read_binary_mask(p, opts), allow_empty_mask=opts.allow_empty_mask,
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "brain_tumor_kaggle",
    Reader(
        name="brain_tumor_kaggle",
        description=(
            "Kaggle brain tumour segmentation (nikhilroxtomar; 3,064 T1-CE MRI slices from the figshare set), "
            "grayscale; PNG masks, foreground > 0 (lossless masks; see mask_threshold)."
        ),
        index=index_brain_tumor,
        load=load_brain_tumor,
        options_model=BrainTumorOptions,
        layout="images/<n>.png + masks/<n>.png (root may also hold brain-tumor-segmentation/)",
        citation=BRAIN_TUMOR_CITATION,
        kind="preset",
    ),
)


# --------------------------------------------------------------------------------------------------
# glaucoma (SMDG)


GLAUCOMA_CITATION = (
    "Standardized Multi-Channel Dataset for Glaucoma (SMDG-19), Kaggle "
    "deathtrooper/multichannel-glaucoma-benchmark-dataset; github.com/TheBeastCoding/"
    "standardized-multichannel-dataset-glaucoma. Cite the source datasets of the images used."
)
GLAUCOMA_FOLDERS: dict[str, str] = {"image": "full-fundus", "disc": "optic-disc", "cup": "optic-cup"}


class GlaucomaOptions(RasterOptions):
    target: Literal["disc", "cup"] = "disc"
    """Which mask set is the ground truth: ``disc`` (optic-disc/) or ``cup`` (optic-cup/)."""
    missing_target: Literal["skip", "quarantine"] = "skip"
    """Fundus images without a mask of ``target`` (most SMDG images have none): ``skip`` leaves them
    out of the dataset (the mask set defines it), ``quarantine`` reports each as ``missing_mask``."""


def _smdg_dir(root: Path, name: str) -> Path:
    """``root/<name>``, descending into the same-named folder Kaggle's archive nests inside."""
    d = child_dir(root, name)
    if d is None:
        raise FileNotFoundError(f"SMDG glaucoma folder {name}/ not found under {root}")
    inner = child_dir(d, name)
    return inner if inner is not None else d


def index_glaucoma(cfg: DatasetSpec) -> IndexResult:
    opts = options_for(cfg, GlaucomaOptions)
    root = require_dir(Path(cfg.root).expanduser(), f"dataset root for {cfg.name!r}")
    img_dir = _smdg_dir(root, GLAUCOMA_FOLDERS["image"])
    mask_dir = _smdg_dir(root, GLAUCOMA_FOLDERS[opts.target])
    refs: list[SampleRef] = []
    bad: list[QuarantineRecord] = []
    for p in sorted(img_dir.iterdir()):
        if not p.is_file() or is_hidden(p) or p.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            continue
        mp = mask_dir / f"{p.stem}.png"
        if mp.is_file():
            refs.append(make_ref(cfg, p.stem, p, [mp], target=opts.target))
        elif opts.missing_target == "quarantine":
            bad.append(quarantine(cfg, p.stem, p, "missing_mask", f"expected {mp}"))
    return refs, bad


def load_glaucoma(cfg: DatasetSpec, ref: SampleRef) -> Sample:
    opts = options_for(cfg, GlaucomaOptions)
    extra: dict[str, Any] = {"target": opts.target, "source_dataset": ref.sample_id.rsplit("-", 1)[0]}
    return readers_folder.load_pair(
        cfg,
        ref,
        color="rgb",
        decode_mask=lambda p: read_binary_mask(p, opts),
        allow_empty_mask=opts.allow_empty_mask,
        extra_meta=extra,
        intensity_range=opts.intensity_range,
    )


READERS.register(
    "glaucoma",
    Reader(
        name="glaucoma",
        description=(
            "SMDG-19 glaucoma fundus set: optic disc or optic cup (option target; one dataset per target), "
            "RGB; only images with a mask of the target are samples unless missing_target: quarantine."
        ),
        index=index_glaucoma,
        load=load_glaucoma,
        options_model=GlaucomaOptions,
        layout=(
            "full-fundus/<id>.png + optic-disc/<id>.png + optic-cup/<id>.png (each folder may be nested "
            "once in a same-named folder, as the Kaggle archive extracts)"
        ),
        citation=GLAUCOMA_CITATION,
        kind="preset",
    ),
)
