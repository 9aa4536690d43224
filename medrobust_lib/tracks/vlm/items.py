"""The VLM track's evaluation items: the records of ``vlm.records`` (or the demo's) joined to the
clean-sample index, and the prompts asked about them.

Images are joined to the clean-sample index on ``(dataset, sample_id)``, so every perturbed image
comes from the same manifest as the segmentation track. A record that names no ``sample_id`` takes
the key of the indexed sample read from the very file it names (its path resolved against
``image_root``, compared with the index's image paths, both made absolute and normalised): nested
layouts such as MIMIC-CXR-JPG (``files/p10/p10000032/s50414267/<dicom>.jpg``, where the folder
reader's sample id is the path below its image folder) and PadChest's numbered folders join
whatever the file stems. A file the index does not list (or lists for several samples: the
slices of a volume) falls back to the record's dataset and the file stem (``_z<slice>`` for a
slice). A record whose image is not in the index becomes an ``excluded:image_not_indexed`` row,
counted, never dropped.

A record its reader quarantines (its image file is gone, a field is malformed, ...) is not an
item, but when the entry still names its image it is kept as a :class:`DroppedRecord`, so that the
evaluations write an ``error`` row for it (``missing: <image path>`` or
``quarantined:<reason>: <detail>``) wherever a readable record of that image would have a row.
"""

from __future__ import annotations

import os
import random
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMRecordsConfig, yesno_files
from medrobust_lib.paths import RECORD_FILES
from medrobust_lib.vlm_tasks.vqa import LETTERS, build_mc_prompt

YESNO_SUFFIX = " Answer with yes or no."
CAPTION_PROMPT = "Describe the findings in this image in one sentence."
GROUNDING_SUFFIX = " Answer with the box as [x0, y0, x1, y1]."


def records_config(suite: Suite) -> VLMRecordsConfig:
    """The configured record files; with the demo enabled, unset ones point at the demo records."""
    rc = suite.vlm.records
    if not suite.demo.enabled:
        return rc
    root = Path(suite.demo.root)

    demo = {"image_root": str(root), "omnimedvqa": str(root / RECORD_FILES["omnimedvqa"]),
            "yesno": str(root / RECORD_FILES["yesno_paraphrases"]),
            "roco_captions": str(root / RECORD_FILES["roco_captions"]),
            "roco_images": str(root / RECORD_FILES["roco_images"]),
            "mecovqa_grounding": str(root / RECORD_FILES["mecovqa_grounding"])}
    return VLMRecordsConfig(**{k: v if v is not None else demo[k] for k, v in rc.model_dump().items()})


# ---- evaluation items ------------------------------------------------------------------------

@dataclass(frozen=True)
class VLMItem:
    """One question (or caption / grounding request) about one image.

    ``variants``: (question text, polarity) pairs for yes/no, the original first; ``answer``: the
    letter (MC), yes/no (original polarity), or empty. ``box`` is pixel XYXY (end exclusive) in the
    record's image coordinates ``image_hw`` (None: the sample's own size)."""

    task: str
    record_id: str
    dataset: str
    sample_id: str
    modality: str
    question: str
    answer: str = ""
    options: tuple[str, ...] = ()
    variants: tuple[tuple[str, int], ...] = ()
    references: tuple[str, ...] = ()
    box: tuple[float, float, float, float] | None = None
    image_hw: tuple[int, int] | None = None


@dataclass(frozen=True)
class DroppedRecord:
    """A record its reader quarantined (``reason`` code and ``detail``) whose entry still names its
    image: enough to write the rows it would have had. ``sample_id`` is derived like an item's."""

    task: str
    record_id: str
    dataset: str
    sample_id: str
    modality: str
    image_path: Path
    reason: str
    detail: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """(dataset, sample_id) of its image."""
        return (self.dataset, self.sample_id)

    @property
    def error(self) -> str:
        """The ``error`` text of its rows: ``missing: <image path>`` when the image file is gone,
        else ``quarantined:<reason>: <detail>`` (at most 300 characters)."""
        if self.reason == "missing_image":
            return f"missing: {self.image_path}"
        return (f"quarantined:{self.reason}: {self.detail}" if self.detail else f"quarantined:{self.reason}")[:300]

    def as_item(self) -> VLMItem:
        """The record as a question-less :class:`VLMItem` that only names it, for the row writers
        (never asked)."""
        return VLMItem(self.task, self.record_id, self.dataset, self.sample_id, self.modality, question="")


@dataclass
class LoadedItems:
    """The readable records as items; the reader quarantine counted per reason; the quarantined
    records that name their image (``dropped``), whose rows the evaluations write as errors."""

    items: list[VLMItem]
    quarantine: dict[str, int]
    n_total: int
    dropped: list[DroppedRecord] = field(default_factory=list)

    def dropped_by_sample(self, keys: Collection[tuple[str, str]], task: str | None = None
                          ) -> dict[tuple[str, str], list[DroppedRecord]]:
        """The dropped records (of ``task``, when given) whose image is one of ``keys``, by image."""
        by: dict[tuple[str, str], list[DroppedRecord]] = {}
        for d in self.dropped:
            if d.key in keys and (task is None or d.task == task):
                by.setdefault(d.key, []).append(d)
        return by


def _sid(sample_id: str | None, image_path: Path, slice_index: int | None) -> str:
    if sample_id:
        return sample_id
    return image_path.stem if slice_index is None else f"{image_path.stem}_z{slice_index:03d}"


def _norm(path: str | Path) -> str:
    """An absolute, normalised path (no file-system access: symbolic links are not followed)."""
    return os.path.normpath(os.path.abspath(os.fspath(path)))


def indexed_by_path(suite: Suite) -> dict[str, tuple[str, str]]:
    """Image file (:func:`_norm`) -> (dataset, sample_id) of the clean index's samples (every
    status); a file several samples share (the slices of a volume, one file in two datasets) is
    left out. Empty before the clean index is built."""
    from medrobust_lib.store import results
    from medrobust_lib.tracks.datasets import CLEAN_TABLE

    df = results.read_table(suite.results_dir, CLEAN_TABLE)
    if df.empty:
        return {}
    out: dict[str, tuple[str, str] | None] = {}
    for d, sid, path in zip(df["dataset"], df["sample_id"], df["image_path"], strict=True):
        if path is None or (isinstance(path, float) and path != path):
            continue
        k = _norm(str(path))
        out[k] = None if k in out and out[k] != (str(d), str(sid)) else (str(d), str(sid))
    return {k: v for k, v in out.items() if v is not None}


def _key(dataset: str, sample_id: str | None, image_path: Path, slice_index: int | None,
         by_path: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """(dataset, sample_id) of a record's image: its own ``sample_id``; else the indexed sample
    read from its file; else ``dataset`` and the file stem (see the module docstring)."""
    if not sample_id and slice_index is None:
        hit = by_path.get(_norm(image_path))
        if hit is not None:
            return hit
    return dataset, _sid(sample_id, image_path, slice_index)


def load_items(suite: Suite) -> LoadedItems:
    """Every configured record as a :class:`VLMItem`, joined to the clean index (:func:`_key`);
    reader quarantine counted per reason, and kept as a :class:`DroppedRecord` when the entry
    names its image. Several yes/no files (``records.yesno`` as a list) are read in order, each
    with its own dataset name and image root."""
    from medrobust_lib.data import vlm_records as vr

    rc = records_config(suite)
    root = Path(rc.image_root or ".")
    by_path = indexed_by_path(suite)
    items: list[VLMItem] = []
    quarantine: dict[str, int] = {}
    dropped: list[DroppedRecord] = []
    total = 0

    def tally(res: Any, task: str, dataset: str | None = None) -> list[Any]:
        nonlocal total
        total += res.n_total
        for q in res.quarantine:
            quarantine[q.reason] = quarantine.get(q.reason, 0) + 1
            if q.source is not None:
                src = q.source
                ds, sid = _key(dataset or src.dataset, src.sample_id, src.image_path, src.slice_index, by_path)
                dropped.append(DroppedRecord(task, q.record_id, ds, sid, src.modality, src.image_path, q.reason,
                                             q.detail))
        return list(res.records)

    def key(r: Any, dataset: str | None = None) -> tuple[str, str]:
        return _key(dataset or r.dataset, r.sample_id, r.image_path, r.slice_index, by_path)

    if rc.omnimedvqa:
        for r in tally(vr.read_omnimedvqa(rc.omnimedvqa, root), "vqa_mc"):
            letters = list(r.options)
            items.append(VLMItem("vqa_mc", r.record_id, *key(r), r.modality, r.question,
                                 LETTERS[letters.index(r.answer_letter)],
                                 options=tuple(r.options[k] for k in letters)))
    for f in yesno_files(rc):
        ds = f.dataset
        yn_root = Path(f.image_root) if f.image_root else root
        for r in tally(vr.read_binary_paraphrases(f.path, yn_root), "vqa_yesno", ds):
            items.append(VLMItem("vqa_yesno", r.record_id, *key(r, ds), r.modality, r.question, r.answer,
                                 variants=tuple(r.variants)))
    if rc.roco_captions:
        for r in tally(vr.read_roco(rc.roco_captions, root, images_csv=rc.roco_images), "caption"):
            items.append(VLMItem("caption", r.record_id, *key(r), r.modality, CAPTION_PROMPT,
                                 references=tuple(r.references)))
    if rc.mecovqa_grounding:
        for r in tally(vr.read_mecovqa_grounding(rc.mecovqa_grounding, root), "grounding"):
            items.append(VLMItem("grounding", r.record_id, *key(r), r.modality, r.question,
                                 box=tuple(float(v) for v in r.box_xyxy),  # type: ignore[arg-type]
                                 image_hw=r.image_hw))
    return LoadedItems(items, quarantine, total, dropped)


def sample_records(loaded: LoadedItems, n: int, seed: int) -> LoadedItems:
    """``n`` records per task drawn as the reference benchmark draws them (``DatasetAdapter.load_data``
    and ``sample_data``: ``random.seed(seed); random.sample(records, n)``, every record when there
    are at most ``n``), over the task's readable records in the order their files list them. The
    reference's population holds only records whose image exists: the quarantined records are left
    out (no rows; still counted in ``quarantine``). Several yes/no files are one population."""
    tasks: dict[str, list[VLMItem]] = {}
    for it in loaded.items:
        tasks.setdefault(it.task, []).append(it)
    kept: set[int] = set()
    for pop in tasks.values():
        drawn = random.Random(seed).sample(pop, n) if len(pop) > n else pop
        kept.update(id(it) for it in drawn)
    return LoadedItems([it for it in loaded.items if id(it) in kept], loaded.quarantine, loaded.n_total, [])


def box_in_sample(item: VLMItem, sample_hw: tuple[int, int], original_hw: tuple[int, int] | None) -> np.ndarray:
    """The item's ground-truth box in the loaded sample's pixel coordinates, float32 (1, 4): the
    record box is scaled from the record's (or the original file's) size to the sample size."""
    assert item.box is not None
    src = item.image_hw or original_hw or sample_hw
    sy, sx = sample_hw[0] / src[0], sample_hw[1] / src[1]
    x0, y0, x1, y1 = item.box
    return np.array([[x0 * sx, y0 * sy, x1 * sx, y1 * sy]], np.float32)


def prompt_for(item: VLMItem, variant: int = 0) -> str:
    """The user text sent for an item (MC options shown; yes/no and grounding instructions)."""

    if item.task == "vqa_mc":
        return build_mc_prompt(item.question, list(item.options))
    if item.task == "vqa_yesno":
        text = item.variants[variant][0] if item.variants else item.question
        return text + YESNO_SUFFIX
    if item.task == "grounding":
        return item.question + GROUNDING_SUFFIX
    return CAPTION_PROMPT
