"""Readers for the published VLM record formats: typed, frozen records plus a quarantine.

Four formats, one reader each, all returning a :class:`ReadResult`:

- :func:`read_omnimedvqa`: OmniMedVQA multiple choice (Hu et al., CVPR 2024), a JSON list of
  ``{question_id, dataset, question_type, modality_type, question, gt_answer, image_path,
  option_A..option_D}`` -> :class:`MCQRecord`.
- :func:`read_roco`: ROCOv2 captions (Rückert et al., Sci Data 2024), ``ID,Caption`` CSV or a
  parquet with ``image_id``/``ID`` and ``caption`` -> :class:`CaptionRecord` (one per ID).
- :func:`read_mecovqa_grounding`: MeCoVQA-G (MedPLIB) LLaVA conversations -> :class:`GroundingRecord`.
- :func:`read_psf_med`: the released PSF-Med question files (MIMIC-CXR, PadChest, VinDr;
  parquet / JSON / JSONL / CSV; paraphrase groups, yes/no labels, image paths) -> :class:`YesNoRecord`.
- :func:`read_binary_paraphrases`: yes/no questions with paraphrases in our schema (JSONL, or CSV
  with one row per paraphrase), or a PSF-Med file (dispatched to :func:`read_psf_med`).

Contract shared by all readers: ``record_id`` is the dataset's own identifier (stable across runs);
``image_path`` is absolute, resolved against ``image_root`` (an absolute path in the file is kept),
and must exist. An entry that cannot become a record is never dropped: it becomes a
:class:`QuarantineEntry` ``(record_id, reason, detail, source)``, and
``len(result.records) + len(result.quarantine) == result.n_total`` always holds. ``source``
(:class:`RecordSource`) is what the entry says about its image (dataset, modality, image path,
sample id) whenever it names one, so that an evaluation can still write a row for it; it is None
for an entry that names no image (``bad_json``, no image field), for a ``duplicate_id`` (the
record of that id is read) and for ``not_yesno`` (not a question of the yes/no task). An entry
with no usable id is named ``"#<index>"`` (JSON lists), ``"line:<n>"`` (JSONL) or ``"row:<n>"``
(CSV; n is the 1-based data row). A file that is missing or is not the expected container at all (a JSON file
that is not a list) raises ``FileNotFoundError`` / ``ValueError``: there are no entries to count.

Quarantine reasons: ``missing_field``, ``bad_json``, ``duplicate_id``, ``missing_image``,
``too_few_options``, ``answer_not_in_options``, ``ambiguous_answer``, ``empty_caption``, ``no_box``,
``invalid_box``, ``missing_mask``, ``empty_mask``, ``unreadable_mask``, ``bad_answer``,
``bad_polarity``, ``bad_paraphrase``, ``inconsistent_rows``, ``not_yesno``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.data.image_headers import BoundedReader
from medrobust_lib.data.imageio import read_raw
from medrobust_lib.data.sample import SampleError

__all__ = [
    "CaptionRecord",
    "GroundingRecord",
    "MCQRecord",
    "QuarantineEntry",
    "ReadResult",
    "RecordSource",
    "YesNoRecord",
    "canonical_modality",
    "read_binary_paraphrases",
    "read_mecovqa_grounding",
    "read_omnimedvqa",
    "read_psf_med",
    "read_roco",
]

T = TypeVar("T")
PathLike = str | Path


# ---------------------------------------------------------------- result types


class RecordSource(NamedTuple):
    """What a quarantined entry says about the image it asks about, as far as it says it: enough to
    name its sample. ``image_path`` is resolved against ``image_root`` like a record's, but it may
    not exist; ``dataset`` and ``modality`` take the readers' defaults."""

    dataset: str
    modality: str
    image_path: Path
    sample_id: str | None = None
    slice_index: int | None = None


class QuarantineEntry(NamedTuple):
    """An entry that could not become a record: its id, a short reason code, a human detail, and
    its :class:`RecordSource` when it names an image (None otherwise)."""

    record_id: str
    reason: str
    detail: str
    source: RecordSource | None = None


@dataclass(frozen=True)
class ReadResult(Generic[T]):
    """Records read from one file plus the quarantined entries; ``n_total`` counts both."""

    records: list[T]
    quarantine: list[QuarantineEntry]
    n_total: int

    def __post_init__(self) -> None:
        if len(self.records) + len(self.quarantine) != self.n_total:
            raise ValueError(
                f"ReadResult: {len(self.records)} records + {len(self.quarantine)} quarantined "
                f"!= n_total {self.n_total}"
            )

    def reasons(self) -> Counter[str]:
        """Quarantine count per reason code."""
        return Counter(q.reason for q in self.quarantine)


@dataclass(frozen=True)
class MCQRecord:
    """One OmniMedVQA multiple-choice question.

    ``options``: letter -> option text in letter order (missing/NaN options dropped, at least 2).
    ``answer_letter`` is the key of ``options`` whose text matches ``gt_answer``. ``modality`` is
    the canonical modality name (:func:`canonical_modality`), ``modality_type`` the file's label."""

    record_id: str
    dataset: str
    modality: str
    image_path: Path
    question: str
    question_type: str
    modality_type: str
    options: dict[str, str]
    answer_letter: str
    sample_id: str | None = None
    slice_index: int | None = None

    @property
    def answer_text(self) -> str:
        """The correct option's text."""
        return self.options[self.answer_letter]


@dataclass(frozen=True)
class CaptionRecord:
    """One ROCOv2 image with its reference captions (several rows per ID -> several references).

    ``split`` is ``train``/``valid``/``test`` when the ID follows ``ROCOv2_<year>_<split>_<n>``."""

    record_id: str
    dataset: str
    modality: str
    image_path: Path
    references: tuple[str, ...]
    split: str | None = None
    sample_id: str | None = None
    slice_index: int | None = None


@dataclass(frozen=True)
class GroundingRecord:
    """One MeCoVQA-G grounding question.

    ``question`` is the human turn without the ``<image>`` token; ``answer`` the first gpt turn
    (may be empty). ``box_xyxy`` is in pixels, ``(x0, y0, x1, y1)``, end exclusive.
    ``image_hw`` is ``(height, width)`` or None when neither ``image_size``, a mask nor a raster
    header gives it. ``box_source`` says where the box came from: ``bbox``, ``mask`` or ``answer``."""

    record_id: str
    dataset: str
    modality: str
    image_path: Path
    question: str
    answer: str
    box_xyxy: tuple[int, int, int, int]
    image_hw: tuple[int, int] | None
    box_source: str
    sample_id: str | None = None
    slice_index: int | None = None


@dataclass(frozen=True)
class YesNoRecord:
    """One binary (yes/no) question with paraphrases.

    ``variants``: ``(text, polarity)`` pairs, the original question first with polarity +1, then the
    paraphrases in file order. Polarity -1 marks a negated paraphrase, whose expected answer is the
    inverse of ``answer`` (see :meth:`expected`)."""

    record_id: str
    dataset: str
    modality: str
    image_path: Path
    question: str
    answer: str
    variants: tuple[tuple[str, int], ...]
    finding: str = ""
    sample_id: str | None = None
    slice_index: int | None = None

    def expected(self, polarity: int) -> str:
        """Expected ``"yes"``/``"no"`` for a variant of the given polarity (+1 or -1)."""
        if polarity == 1:
            return self.answer
        if polarity == -1:
            return "no" if self.answer == "yes" else "yes"
        raise ValueError(f"polarity must be 1 or -1, got {polarity!r}")


# ---------------------------------------------------------------- shared helpers


_MODALITY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # order matters: "X-Ray Angiography" before X-ray, OCT before CT ("tomography" in both)
    ("angiography", ("angiography", "angiogram", "dsa")),
    ("oct", ("oct", "optical coherence")),
    ("ct", ("ct", "computed tomography")),
    ("mri", ("mr", "mri", "magnetic resonance", "mag netic resonance")),
    ("xray", ("x ray", "xray", "radiograph", "cxr")),
    ("ultrasound", ("ultrasound", "us", "sonography", "echography")),
    ("fundus", ("fundus",)),
    ("pathology", ("microscopy", "pathology", "histopathology", "histology")),
    ("dermoscopy", ("dermoscopy", "dermatoscopy")),
    ("endoscopy", ("endoscopy", "colonoscopy")),
)


def canonical_modality(label: str) -> str:
    """Map a free-text modality label (``"CT(Computed Tomography)"``, ``"X-Ray Angiography"``,
    ``"Microscopy Images"``) to a canonical name (``ct``, ``angiography``, ``pathology``, ...).
    Unrecognised labels come back lower-cased and stripped (``"unknown"`` when empty)."""
    words = " " + " ".join(re.findall(r"[a-z0-9]+", label.lower())) + " "
    for name, keys in _MODALITY_RULES:
        if any(f" {k} " in words for k in keys):
            return name
    return label.strip().lower() or "unknown"


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _text(value: Any) -> str:
    """A scalar as text: integral floats lose their ``.0`` (pandas-exported numbers)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _require(entry: Mapping[str, Any], *keys: str) -> None:
    missing = [k for k in keys if _is_missing(entry.get(k))]
    if missing:
        raise SampleError("missing_field", f"missing {', '.join(missing)}")


def _opt_str(value: Any) -> str | None:
    return None if _is_missing(value) else _text(value)


def _opt_int(value: Any) -> int | None:
    if _is_missing(value):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _image_path(image_root: Path, rel: str) -> Path:
    """``image_root / rel`` (absolute ``rel`` kept), whether it exists or not."""
    p = Path(rel)
    return p if p.is_absolute() else image_root / p


def _existing(path: Path) -> Path:
    """``path``; raises ``missing_image`` if it does not exist."""
    if not path.exists():
        raise SampleError("missing_image", str(path))
    return path


def _load_json_list(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


_NO_SOURCE = frozenset({"duplicate_id", "not_yesno"})
"""Quarantine reasons whose entry gets no :class:`RecordSource`: a repeated id (the record of that
id is read) and a question that is not of the yes/no task."""


def _source_of(source: Callable[[str, Mapping[str, Any]], RecordSource | None] | None, rid: str, entry: Any,
               reason: str) -> RecordSource | None:
    """The entry's :class:`RecordSource` (best effort: None when it names no image or cannot be read)."""
    if source is None or reason in _NO_SOURCE or not isinstance(entry, Mapping):
        return None
    try:
        return source(rid, entry)
    except Exception:  # a malformed entry names no image we could use
        return None


def _collect(entries: Iterable[tuple[str, Any]], build: Callable[[str, Any], T],
             source: Callable[[str, Mapping[str, Any]], RecordSource | None] | None = None) -> ReadResult[T]:
    """Run ``build(fallback_id, entry)`` over entries; a SampleError quarantines the entry, with
    ``source(id, entry)`` when the entry is an object (see :func:`_source_of`).

    The quarantine id is the entry's own id when it has one, else ``fallback_id``; a repeated id
    is quarantined as ``duplicate_id``."""
    records: list[T] = []
    quarantine: list[QuarantineEntry] = []
    seen: set[str] = set()
    n = 0
    for fallback, entry in entries:
        n += 1
        rid = fallback
        try:
            if isinstance(entry, SampleError):
                raise entry
            if not isinstance(entry, Mapping):
                raise SampleError("bad_json", f"expected an object, got {type(entry).__name__}")
            rid = _opt_str(entry.get("_rid")) or fallback
            if rid in seen:
                raise SampleError("duplicate_id", f"{rid} appears more than once")
            seen.add(rid)
            records.append(build(rid, entry))
        except SampleError as e:
            quarantine.append(QuarantineEntry(rid, e.reason, e.detail, _source_of(source, rid, entry, e.reason)))
    return ReadResult(records, quarantine, n)


def _with_rid(entries: Iterable[tuple[str, Any]], id_key: str) -> Iterator[tuple[str, Any]]:
    """Attach the entry's own id (under ``_rid``) so :func:`_collect` can name it."""
    for fallback, entry in entries:
        if isinstance(entry, Mapping):
            entry = {**entry, "_rid": entry.get(id_key)}
        yield fallback, entry


def _read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        return [dict(r) for r in csv.DictReader(f)]


# ---------------------------------------------------------------- OmniMedVQA


_OPTION_KEY = re.compile(r"^option_([A-Z])$")


def _norm_answer(s: str) -> str:
    return " ".join(s.casefold().split()).rstrip(".")


def _mcq_source(e: Mapping[str, Any], image_root: Path) -> RecordSource | None:
    if _is_missing(e.get("image_path")):
        return None
    return RecordSource(
        dataset=_opt_str(e.get("dataset")) or "unknown",
        modality=canonical_modality(_opt_str(e.get("modality_type")) or ""),
        image_path=_image_path(image_root, _text(e["image_path"])),
        sample_id=_opt_str(e.get("sample_id")),
        slice_index=_opt_int(e.get("slice_index")),
    )


def _mcq_from_entry(rid: str, e: Mapping[str, Any], image_root: Path) -> MCQRecord:
    _require(e, "question_id", "question", "gt_answer", "image_path")
    options = {
        m.group(1): _text(v)
        for k, v in sorted(e.items())
        if (m := _OPTION_KEY.match(k)) is not None and not _is_missing(v)
    }
    if len(options) < 2:
        raise SampleError("too_few_options", f"{len(options)} usable option(s)")
    gt = _text(e["gt_answer"])
    letters = [k for k, v in options.items() if v == gt]
    if not letters:
        letters = [k for k, v in options.items() if _norm_answer(v) == _norm_answer(gt)]
    if not letters:
        raise SampleError("answer_not_in_options", f"gt_answer {gt!r} not in {list(options.values())}")
    if len(letters) > 1:
        raise SampleError("ambiguous_answer", f"gt_answer {gt!r} matches options {letters}")
    src = _mcq_source(e, image_root)
    assert src is not None  # image_path is required
    return MCQRecord(
        record_id=rid,
        dataset=src.dataset,
        modality=src.modality,
        image_path=_existing(src.image_path),
        question=_text(e["question"]),
        question_type=_opt_str(e.get("question_type")) or "",
        modality_type=_opt_str(e.get("modality_type")) or "",
        options=options,
        answer_letter=letters[0],
        sample_id=src.sample_id,
        slice_index=src.slice_index,
    )


def read_omnimedvqa(path: PathLike, image_root: PathLike) -> ReadResult[MCQRecord]:
    """Read OmniMedVQA QA JSON: one file (a JSON list) or a folder of them (``QA_information/*``,
    read in sorted order). ``image_path`` is relative to ``image_root`` (the OmniMedVQA root)."""
    p, root = Path(path), Path(image_root)
    files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
    entries: list[tuple[str, Any]] = []
    for f in files:
        entries.extend((f"#{len(entries)}", e) for e in _load_json_list(f))
    return _collect(_with_rid(entries, "question_id"), lambda rid, e: _mcq_from_entry(rid, e, root),
                    lambda rid, e: _mcq_source(e, root))


# ---------------------------------------------------------------- ROCOv2


_ROCO_SPLIT = re.compile(r"^ROCOv2_\d{4}_(train|valid|test)_")
_ID_COLS = ("ID", "image_id", "id")
_CAPTION_COLS = ("Caption", "caption")
_PATH_COLS = ("image_path", "path", "file_name", "image")


def _pick(columns: Iterable[str], choices: tuple[str, ...], what: str, path: Path) -> str:
    cols = list(columns)
    for c in choices:
        if c in cols:
            return c
    raise ValueError(f"{path}: no {what} column; expected one of {choices}, got {cols}")


def _roco_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix.lower() == ".parquet":
        import pandas as pd

        df = pd.read_parquet(path)
        keep = [c for c in df.columns if c in _ID_COLS + _CAPTION_COLS + _PATH_COLS + ("dataset", "modality")]
        return [{str(k): v for k, v in r.items()} for r in df[keep].to_dict(orient="records")]
    return list(_read_csv_rows(path))



def _group_rows(rows: Iterable[Mapping[str, Any]], id_col: str) -> list[tuple[str, Any]]:
    """Rows grouped by id, in first-seen order, as ``(id, {"_rid", "rows"})`` entries; a row
    without an id becomes a ``missing_field`` entry named ``row:<n>`` (1-based)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    entries: list[tuple[str, Any]] = []
    for i, r in enumerate(rows, start=1):
        rid = _opt_str(r.get(id_col))
        if rid is None:
            entries.append((f"row:{i}", SampleError("missing_field", f"row {i} has no {id_col}")))
            continue
        if rid not in groups:
            groups[rid] = []
            entries.append((rid, {"_rid": rid, "rows": groups[rid]}))
        groups[rid].append(r)
    return entries

def read_roco(
    path: PathLike, image_root: PathLike, *, images_csv: PathLike | None = None
) -> ReadResult[CaptionRecord]:
    """Read ROCOv2 captions: CSV ``ID,Caption`` or parquet with ``image_id``/``ID`` and ``caption``.

    Image per ID: the ``image_path`` column of ``images_csv`` (a mapping CSV ``ID,image_path`` with
    optional ``dataset``, ``modality``, ``sample_id``, ``slice_index``, like the demo's
    ``roco_images.csv``); else an image path column in the caption file (``image_path``, ``path``,
    ``file_name`` or a string ``image``); else ``<ID>.jpg`` under ``image_root`` or under
    ``image_root/<split>/``. Every row of an ID adds a reference; an empty caption adds none, and an
    ID with no non-empty caption is quarantined ``empty_caption``. ``n_total`` counts distinct IDs
    plus rows without an ID. ``dataset`` defaults to ``rocov2`` and ``modality`` to ``unknown``
    (ROCOv2's caption files carry neither)."""
    p, root = Path(path), Path(image_root)
    rows = _roco_rows(p)
    mapping: dict[str, dict[str, str]] = {}
    if images_csv is not None:
        mp = Path(images_csv)
        m_rows = _read_csv_rows(mp)
        m_id = _pick(m_rows[0].keys() if m_rows else [], _ID_COLS, "ID", mp)
        mapping = {r[m_id]: r for r in m_rows}
    cols = list(rows[0].keys()) if rows else []
    id_col = _pick(cols, _ID_COLS, "ID", p) if rows else "ID"
    cap_col = _pick(cols, _CAPTION_COLS, "caption", p) if rows else "Caption"
    path_col = next((c for c in _PATH_COLS if c in cols), None)

    entries = _group_rows(rows, id_col)

    def locate(rid: str, grp: list[dict[str, Any]]) -> tuple[Mapping[str, Any], list[Path]]:
        """(the row giving the ID's dataset / sample fields, its candidate image paths, in order);
        raises ``missing_image`` when ``images_csv`` maps the ID to no path."""
        if images_csv is not None:
            if rid not in mapping or _is_missing(mapping[rid].get("image_path")):
                raise SampleError("missing_image", f"{rid} has no image_path in {images_csv}")
            return mapping[rid], [_image_path(root, _text(mapping[rid]["image_path"]))]
        if path_col is not None and isinstance(grp[0].get(path_col), str) and grp[0][path_col].strip():
            return grp[0], [_image_path(root, grp[0][path_col].strip())]
        m = _ROCO_SPLIT.match(rid)
        return grp[0], [root / f"{rid}.jpg"] + ([root / m.group(1) / f"{rid}.jpg"] if m else [])

    def source(rid: str, e: Mapping[str, Any]) -> RecordSource:
        extra, cands = locate(rid, e["rows"])
        return RecordSource(
            dataset=_opt_str(extra.get("dataset")) or "rocov2",
            modality=_opt_str(extra.get("modality")) or "unknown",
            image_path=next((c for c in cands if c.exists()), cands[0]),
            sample_id=_opt_str(extra.get("sample_id")),
            slice_index=_opt_int(extra.get("slice_index")),
        )

    def build(rid: str, e: Mapping[str, Any]) -> CaptionRecord:
        grp: list[dict[str, Any]] = e["rows"]
        refs = tuple(_text(r[cap_col]) for r in grp if not _is_missing(r.get(cap_col)))
        if not refs:
            raise SampleError("empty_caption", f"{len(grp)} row(s), all empty")
        m = _ROCO_SPLIT.match(rid)
        src = source(rid, e)
        if not src.image_path.exists():
            raise SampleError("missing_image", " or ".join(str(c) for c in locate(rid, grp)[1]))
        return CaptionRecord(
            record_id=rid,
            dataset=src.dataset,
            modality=src.modality,
            image_path=src.image_path,
            references=refs,
            split=m.group(1) if m else None,
            sample_id=src.sample_id,
            slice_index=src.slice_index,
        )

    return _collect(entries, build, source)


# ---------------------------------------------------------------- MeCoVQA-G


_BOX_TEXT = re.compile(r"\[\s*" + r"\s*,\s*".join([r"(-?\d+(?:\.\d+)?)"] * 4) + r"\s*\]")
_RASTER = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
_MASK_TAG = re.compile(r"<mask>(.*?)</mask>", re.DOTALL)
_SAMED2D_MODALITY = re.compile(r"^(?P<modality>[a-z]+(?:_[a-z]+)*?)(?:_\d+)?$")


def samed2d_name_parts(name: str) -> tuple[str | None, str | None]:
    """``(modality, dataset)`` from an SA-Med2D-16M file stem or MeCoVQA id such as
    ``ct_00--AMOS2022--amos_0001--x_0020`` (``ct``, ``AMOS2022``) or
    ``x_ray--Chest_Image_Pneum--<uid>--2d_none`` (``x_ray``, ``Chest_Image_Pneum``); ``(None, None)``
    for names without the ``--`` separated fields."""
    parts = Path(name).name.split("--")
    if len(parts) < 3:
        return None, None
    m = _SAMED2D_MODALITY.match(parts[0])
    return (m.group("modality") if m else None), (parts[1] or None)


def _turn(conv: list[Any], who: str) -> str | None:
    for t in conv:
        if isinstance(t, Mapping) and t.get("from") == who and isinstance(t.get("value"), str):
            return str(t["value"])
    return None


def _hw(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list | tuple) and len(value) >= 2:
        try:
            h, w = int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
        return (h, w) if h > 0 and w > 0 else None
    return None


def _raster_hw(path: Path) -> tuple[int, int] | None:
    if path.suffix.lower() not in _RASTER:
        return None
    from PIL import Image

    try:  # the header only, through a bounded read (a hostile chunk before the pixels is not read)
        with path.open("rb") as f, Image.open(BoundedReader(f)) as im:  # type: ignore[arg-type]
            w, h = im.size
    except (OSError, Image.DecompressionBombError, ValueError):
        return None
    return int(h), int(w)


def _check_box(box: tuple[float, ...], hw: tuple[int, int] | None) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    ok = 0 <= x0 < x1 and 0 <= y0 < y1
    if ok and hw is not None:
        ok = x1 <= hw[1] and y1 <= hw[0]
    if not ok:
        raise SampleError("invalid_box", f"box {[x0, y0, x1, y1]} for image hw {hw}")
    return x0, y0, x1, y1


def _grounding_source(e: Mapping[str, Any], root: Path) -> RecordSource | None:
    if _is_missing(e.get("image")):
        return None
    name_modality, name_dataset = samed2d_name_parts(_opt_str(e.get("id")) or Path(_text(e["image"])).stem)
    modality = _opt_str(e.get("modality")) or (name_modality or "").replace("_", " ")
    return RecordSource(
        dataset=_opt_str(e.get("dataset")) or name_dataset or "mecovqa_g",
        modality=canonical_modality(modality),
        image_path=_image_path(root, _text(e["image"])),
        sample_id=_opt_str(e.get("sample_id")),
        slice_index=_opt_int(e.get("slice_index")),
    )


def _grounding_from_entry(rid: str, e: Mapping[str, Any], root: Path) -> GroundingRecord:
    _require(e, "image", "conversations")
    conv = e["conversations"]
    if not isinstance(conv, list):
        raise SampleError("missing_field", "conversations is not a list")
    human = _turn(conv, "human")
    if human is None:
        raise SampleError("missing_field", "no human turn")
    raw_answer = _turn(conv, "gpt") or ""
    tagged = _MASK_TAG.search(raw_answer)
    answer = _MASK_TAG.sub("", raw_answer).replace("<SEG>", "").strip()
    src = _grounding_source(e, root)
    assert src is not None  # image is required
    image = _existing(src.image_path)
    hw = _hw(e.get("image_size"))

    box: tuple[float, ...] | None = None
    source = ""
    bbox = e.get("bbox")
    mask_rel = next((_text(e[k]) for k in ("mask", "mask_path") if not _is_missing(e.get(k))), None)
    if mask_rel is None and tagged is not None and tagged.group(1).strip():
        mask_rel = tagged.group(1).strip()
    if isinstance(bbox, list | tuple) and len(bbox) == 4:
        try:
            box, source = tuple(float(v) for v in bbox), "bbox"
        except (TypeError, ValueError):
            raise SampleError("invalid_box", f"bbox {bbox!r} is not 4 numbers") from None
    elif mask_rel is not None:
        mpath = Path(mask_rel) if Path(mask_rel).is_absolute() else root / mask_rel
        if not mpath.exists():
            raise SampleError("missing_mask", str(mpath))
        try:
            raw = read_raw(mpath)
        except ValueError as err:
            raise SampleError("unreadable_mask", str(err)) from None
        mask = (raw.max(axis=2) if raw.ndim == 3 else raw) > 0
        mbox = mask_to_box(np.asarray(mask))
        if mbox is None:
            raise SampleError("empty_mask", str(mpath))
        hw = hw or (int(mask.shape[0]), int(mask.shape[1]))
        box, source = tuple(float(v) for v in mbox), "mask"
    else:
        m = _BOX_TEXT.search(answer)
        if m is None:
            raise SampleError("no_box", f"no bbox, mask or [x0, y0, x1, y1] in answer {answer!r}")
        vals = tuple(float(v) for v in m.groups())
        if all(0.0 <= v <= 1.0 for v in vals):
            if hw is None:
                raise SampleError("no_box", f"normalised box {list(vals)} without image_size")
            h, w = hw
            vals = (vals[0] * w, vals[1] * h, vals[2] * w, vals[3] * h)
        box, source = vals, "answer"
    if hw is None:
        hw = _raster_hw(image)
    return GroundingRecord(
        record_id=rid,
        dataset=src.dataset,
        modality=src.modality,
        image_path=image,
        question=human.replace("<image>", "").strip(),
        answer=answer.strip(),
        box_xyxy=_check_box(box, hw),
        image_hw=hw,
        box_source=source,
        sample_id=src.sample_id,
        slice_index=src.slice_index,
    )


def read_mecovqa_grounding(path: PathLike, image_root: PathLike) -> ReadResult[GroundingRecord]:
    """Read MeCoVQA-G grounding conversations (a JSON list, e.g. ``MeCoVQA_Grounding_test.json``).

    Released layout (MedPLIB's ``LazySupervisedDataset`` and evaluation scripts): each entry is
    ``{"id", "image", "conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt",
    "value": "<SEG><mask>masks/<name>.png</mask>"}]}`` (optional ``answer_type``); ``image`` and the
    mask path are relative to the SA-Med2D ``SAMed2Dv1`` folder (pass it as ``image_root``) and a
    mask pixel >= 1 is foreground. ``id`` (an SA-Med2D name such as
    ``ct_00--AMOS2022--amos_0001--x_0020``) gives the modality (``ct``) and the source dataset
    (``AMOS2022``) unless ``modality`` / ``dataset`` fields are present; an entry without ``id`` is
    named ``#<index>``.

    Also accepted (our own and derived files): ``bbox`` (pixel XYXY, end exclusive), ``image_size``
    (``[h, w]``), ``mask``/``mask_path`` fields. The box comes from, in order: ``bbox``; the tight
    box of the mask (``mask``/``mask_path`` field, else the answer's ``<mask>...</mask>``); the
    first ``[x0, y0, x1, y1]`` in the gpt answer (all values in [0, 1] are normalised and scaled by
    ``image_size``, x by width and y by height, then rounded). None of these -> ``no_box``.
    ``answer`` is the gpt turn without ``<SEG>`` and the mask tag."""
    p, root = Path(path), Path(image_root)
    entries = [(f"#{i}", e) for i, e in enumerate(_load_json_list(p))]
    return _collect(_with_rid(entries, "id"), lambda rid, e: _grounding_from_entry(rid, e, root),
                    lambda rid, e: _grounding_source(e, root))


# ---------------------------------------------------------------- binary paraphrases


def _yes_no(value: Any) -> str:
    a = _text(value).lower().rstrip(".") if not _is_missing(value) else ""
    if a not in ("yes", "no"):
        raise SampleError("bad_answer", f"answer {value!r} is not yes/no")
    return a


def _polarity(value: Any) -> int:
    if isinstance(value, bool):
        raise SampleError("bad_polarity", f"polarity {value!r} must be 1 or -1")
    try:
        pol = int(float(value))
    except (TypeError, ValueError):
        raise SampleError("bad_polarity", f"polarity {value!r} must be 1 or -1") from None
    if pol not in (1, -1) or float(value) != pol:
        raise SampleError("bad_polarity", f"polarity {value!r} must be 1 or -1")
    return pol


def _yesno_source(e: Mapping[str, Any], root: Path) -> RecordSource | None:
    """The source of a yes/no entry in our schema (a JSONL object, or a CSV group's first row)."""
    if "rows" in e and isinstance(e["rows"], list):
        e = e["rows"][0]
    if _is_missing(e.get("image_path")):
        return None
    return RecordSource(
        dataset=_opt_str(e.get("dataset")) or "unknown",
        modality=canonical_modality(_opt_str(e.get("modality")) or ""),
        image_path=_image_path(root, _text(e["image_path"])),
        sample_id=_opt_str(e.get("sample_id")),
        slice_index=_opt_int(e.get("slice_index")),
    )


def _yesno_record(
    rid: str, e: Mapping[str, Any], paraphrases: list[tuple[Any, Any]], root: Path
) -> YesNoRecord:
    _require(e, "id", "image_path", "question", "answer")
    answer = _yes_no(e["answer"])
    question = _text(e["question"])
    variants: list[tuple[str, int]] = [(question, 1)]
    for text, pol in paraphrases:
        if _is_missing(text) or not isinstance(text, str):
            raise SampleError("bad_paraphrase", f"paraphrase text {text!r}")
        variants.append((text.strip(), _polarity(pol)))
    src = _yesno_source(e, root)
    assert src is not None  # image_path is required
    return YesNoRecord(
        record_id=rid,
        dataset=src.dataset,
        modality=src.modality,
        image_path=_existing(src.image_path),
        question=question,
        answer=answer,
        variants=tuple(variants),
        finding=_opt_str(e.get("finding")) or "",
        sample_id=src.sample_id,
        slice_index=src.slice_index,
    )


def _jsonl_entries(path: Path) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"line:{n}", json.loads(line)))
        except json.JSONDecodeError as err:
            out.append((f"line:{n}", SampleError("bad_json", f"line {n}: {err}")))
    return out


def _build_jsonl_yesno(rid: str, e: Mapping[str, Any], root: Path) -> YesNoRecord:
    paras = e.get("paraphrases", [])
    if paras is None:
        paras = []
    if not isinstance(paras, list) or not all(isinstance(p, Mapping) for p in paras):
        raise SampleError("bad_paraphrase", "paraphrases must be a list of {text, polarity}")
    return _yesno_record(rid, e, [(p.get("text"), p.get("polarity")) for p in paras], root)


_CSV_SAME = ("image_path", "question", "answer")


def _build_csv_yesno(rid: str, e: Mapping[str, Any], root: Path) -> YesNoRecord:
    rows: list[dict[str, str]] = e["rows"]
    first = rows[0]
    for k in _CSV_SAME:
        values = {(r.get(k) or "").strip() for r in rows}
        if len(values) > 1:
            raise SampleError("inconsistent_rows", f"{k} differs across rows: {sorted(values)}")
    paras = [
        (r.get("paraphrase"), r.get("polarity"))
        for r in rows
        if not (_is_missing(r.get("paraphrase")) and _is_missing(r.get("polarity")))
    ]
    return _yesno_record(rid, first, paras, root)


def read_binary_paraphrases(path: PathLike, image_root: PathLike) -> ReadResult[YesNoRecord]:
    """Read yes/no questions with paraphrases: a released PSF-Med file (detected by
    :func:`looks_like_psf_med`, read by :func:`read_psf_med`) or our own schema:

    ``.jsonl``: one object per line ``{id, image_path, dataset, modality, question, answer,
    paraphrases: [{text, polarity}], finding}`` (blank lines skipped, not counted). ``.csv``: one
    row per paraphrase with columns ``id, image_path, question, answer, paraphrase, polarity``
    (optional ``dataset, modality, finding``); rows are grouped by ``id`` (first appearance order),
    a row with empty ``paraphrase`` and ``polarity`` adds no variant, and ``image_path``,
    ``question`` and ``answer`` must agree across a group (else ``inconsistent_rows``).
    ``answer`` must be yes/no (case and a trailing period ignored); polarity must be 1 or -1."""
    p, root = Path(path), Path(image_root)
    suffix = p.suffix.lower()
    if p.is_file() and looks_like_psf_med(p):
        return read_psf_med(p, root)
    if suffix in (".jsonl", ".json"):
        return _collect(_with_rid(_jsonl_entries(p), "id"), lambda rid, e: _build_jsonl_yesno(rid, e, root),
                        lambda rid, e: _yesno_source(e, root))
    if suffix != ".csv":
        raise ValueError(f"{p}: unsupported extension {suffix!r}; valid: .jsonl, .json, .csv")
    entries = _group_rows(_read_csv_rows(p), "id")
    return _collect(entries, lambda rid, e: _build_csv_yesno(rid, e, root), lambda rid, e: _yesno_source(e, root))


# ---------------------------------------------------------------- PSF-Med


PSF_MED_FIELDS: dict[str, tuple[str, ...]] = {
    "id": ("question_id", "qid", "id"),
    "question": ("original_question", "question", "original"),
    "paraphrases": ("paraphrases",),
    "paraphrase": ("paraphrase", "paraphrased_question", "paraphrase_text"),
    "phenomenon": ("phenomenon", "transformation", "paraphrase_type"),
    "answer": ("answer", "label", "ground_truth", "gt_answer"),
    "image": ("image_path", "image", "image_file", "filename", "ImageID", "image_id", "dicom_id"),
    "subject_id": ("subject_id",),
    "study_id": ("study_id",),
    "dicom_id": ("dicom_id",),
    "dataset": ("dataset", "subset", "source"),
    "yesno": ("is_yesno_claude", "is_yesno"),
    "polarity": ("polarity",),
}
"""PSF-Med field -> accepted column names, first present wins. The card confirms ``is_yesno``,
``is_yesno_claude``, the phenomenon names and the MIMIC path fields; the other names are the
common spellings (the gated files could not be inspected), so ``fields=`` overrides any of them."""

PSF_MED_SUBSETS: tuple[str, ...] = ("mimic", "padchest", "vindr")
_PSF_MARKERS = frozenset({"original_question", "question_id", "phenomenon", "is_yesno", "is_yesno_claude",
                          "paraphrase", "paraphrased_question", "dicom_id", "ImageID", "study_id"})


def _psf_get(row: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], key: str) -> Any:
    for name in fields.get(key, ()):
        if name in row and not _is_missing_scalar(row[name]):
            return row[name]
    return None


def _is_missing_scalar(value: Any) -> bool:
    if isinstance(value, list | tuple | dict):
        return False
    if isinstance(value, np.ndarray):
        return value.size == 0
    return _is_missing(value)


def _yes_no_value(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return "yes" if bool(value) else "no"
    return _yes_no(value)


def _truthy(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    t = _text(value).lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    return None


class _ImageIndex:
    """Lazy ``file name -> path`` index of ``image_root`` (PadChest ships its PNGs in numbered
    sub-folders, so a bare ``ImageID`` needs a lookup). A name found twice is ambiguous (None)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._names: dict[str, Path | None] | None = None

    def find(self, name: str) -> Path | None:
        if self._names is None:
            self._names = {}
            if self._root.is_dir():
                for p in sorted(self._root.rglob("*")):
                    if p.is_file():
                        self._names[p.name] = None if p.name in self._names else p
        return self._names.get(name)


def _psf_image(row: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], root: Path, index: _ImageIndex,
               check: bool = True) -> Path:
    """The row's image; a missing one raises ``missing_image``, or with ``check=False`` comes back
    as the path it would have (no image field: ``missing_field`` either way)."""
    subject, study = _psf_get(row, fields, "subject_id"), _psf_get(row, fields, "study_id")
    dicom = _psf_get(row, fields, "dicom_id")
    if subject is not None and study is not None and dicom is not None:
        sid, st = _text(subject).lstrip("p"), _text(study).lstrip("s")
        name = _text(dicom)
        name = name if name.lower().endswith((".jpg", ".jpeg", ".png", ".dcm")) else f"{name}.jpg"
        rel = Path("files") / f"p{sid[:2]}" / f"p{sid}" / f"s{st}" / name
        for base in (root, root / "mimic-cxr-jpg"):
            if (base / rel).exists():
                return base / rel
        if not check:
            return root / rel
        raise SampleError("missing_image", str(root / rel))
    value = _psf_get(row, fields, "image")
    if value is None:
        raise SampleError("missing_field", f"no image field (one of {', '.join(fields['image'])})")
    rel_s = _text(value)
    p = Path(rel_s)
    direct = p if p.is_absolute() else root / p
    if direct.exists():
        return direct
    found = index.find(p.name)
    if found is None:
        if not check:
            return direct
        raise SampleError("missing_image", f"{direct} (and no unique {p.name} under {root})")
    return found


def _psf_subset(path: Path, rows: Sequence[Mapping[str, Any]], fields: Mapping[str, tuple[str, ...]],
                subset: str | None) -> str:
    if subset:
        return subset
    if rows:
        v = _psf_get(rows[0], fields, "dataset")
        if v is not None:
            return _text(v)
    low = path.name.lower()
    return next((s for s in PSF_MED_SUBSETS if s in low), "psf_med")


def _psf_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        df = pd.read_parquet(path)
        return [{str(k): v for k, v in r.items()} for r in df.to_dict(orient="records")]
    if suffix == ".csv":
        return [dict(r) for r in _read_csv_rows(path)]
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        data = _load_json_list(path)
        return [e if isinstance(e, dict) else {"_bad": e} for e in data]
    out: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError as err:
            e = {"_bad": f"line {n}: {err}"}
        out.append(e if isinstance(e, dict) else {"_bad": e})
    return out


def _psf_paraphrase_list(value: Any) -> list[tuple[Any, Any, Any]]:
    """A ``paraphrases`` cell -> ``(text, phenomenon, polarity)``; strings or objects with
    ``text``/``paraphrase`` (+ ``phenomenon``, ``polarity``)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SampleError("bad_paraphrase", "paraphrases is a string that is not a JSON list") from None
    if not isinstance(value, list):
        raise SampleError("bad_paraphrase", f"paraphrases must be a list, got {type(value).__name__}")
    out: list[tuple[Any, Any, Any]] = []
    for item in value:
        if isinstance(item, str):
            out.append((item, None, None))
        elif isinstance(item, Mapping):
            text = next((item[k] for k in ("text", "paraphrase", "question") if k in item), None)
            out.append((text, item.get("phenomenon"), item.get("polarity")))
        else:
            raise SampleError("bad_paraphrase", f"paraphrase {item!r}")
    return out


def read_psf_med(
    path: PathLike,
    image_root: PathLike,
    *,
    subset: str | None = None,
    fields: Mapping[str, Sequence[str]] | None = None,
    yesno_only: bool = True,
) -> ReadResult[YesNoRecord]:
    """Read a released PSF-Med question file (MIMIC-CXR, PadChest or VinDr subset) into yes/no
    records whose variants are the original question and its paraphrases.

    Accepted files: the Hugging Face parquet export (``load_dataset("saillab/psf-med", "mimic")``
    -> ``to_parquet``), JSON (a list), JSONL or CSV. Rows are either one per question with a
    ``paraphrases`` list (strings, or objects with ``text``/``paraphrase`` and ``phenomenon``), or
    one per (question, paraphrase) pair with a ``paraphrase`` column, grouped by the question id in
    first-seen order. Column names: :data:`PSF_MED_FIELDS` (``fields`` adds or overrides spellings).

    Labels: ``answer`` yes/no (booleans accepted); a row flagged not yes/no by ``is_yesno_claude``
    (else ``is_yesno``) is quarantined ``not_yesno`` when ``yesno_only``. PSF-Med paraphrases are
    meaning-preserving (LLM-judge bidirectional entailment, clinician audit), so every paraphrase
    has polarity +1 unless a ``polarity`` column says otherwise; ``negation_pattern`` paraphrases
    keep the answer. ``finding`` is the phenomena of the paraphrases (``;``-joined).

    Images (``image_root`` = where the images were put): MIMIC rows with ``subject_id``,
    ``study_id`` and ``dicom_id`` resolve to ``files/p<first 2>/p<subject>/s<study>/<dicom>.jpg``
    (also under ``image_root/mimic-cxr-jpg``); otherwise the image column is a path relative to
    ``image_root`` or a bare file name looked up anywhere below it (PadChest's numbered folders).
    ``dataset`` is ``subset``, else the file's ``dataset``/``subset`` column, else the subset named
    in the file name (mimic, padchest, vindr); ``modality`` is ``xray``."""
    p, root = Path(path), Path(image_root)
    f: dict[str, tuple[str, ...]] = dict(PSF_MED_FIELDS)
    for k, names in (fields or {}).items():
        if k not in PSF_MED_FIELDS:
            raise ValueError(f"unknown PSF-Med field {k!r}; valid: {', '.join(PSF_MED_FIELDS)}")
        f[k] = tuple(names) + tuple(n for n in PSF_MED_FIELDS[k] if n not in names)
    rows = _psf_rows(p)
    dataset = _psf_subset(p, rows, f, subset)
    index = _ImageIndex(root)
    flat = any(_psf_get(r, f, "paraphrase") is not None for r in rows) and not any(
        _psf_get(r, f, "paraphrases") is not None for r in rows)

    entries: list[tuple[str, Any]] = []
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for i, r in enumerate(rows, start=1):
        if "_bad" in r:
            entries.append((f"row:{i}", SampleError("bad_json", _text(r["_bad"]))))
            continue
        rid_v = _psf_get(r, f, "id")
        if rid_v is None:
            q = _psf_get(r, f, "question")
            img = _psf_get(r, f, "image") or _psf_get(r, f, "dicom_id")
            if q is None or img is None:
                entries.append((f"row:{i}", SampleError("missing_field", f"row {i} has no question id")))
                continue
            rid_v = f"{_text(img)}|{_text(q)}"
        rid = _text(rid_v)
        if not flat:
            entries.append((rid, {"_rid": rid, "rows": [r]}))
            continue
        if rid not in groups:
            groups[rid] = []
            entries.append((rid, {"_rid": rid, "rows": groups[rid]}))
        groups[rid].append(r)

    def build(rid: str, e: Mapping[str, Any]) -> YesNoRecord:
        grp: list[Mapping[str, Any]] = e["rows"]
        first = grp[0]
        question = _psf_get(first, f, "question")
        answer = _psf_get(first, f, "answer")
        if question is None or answer is None:
            missing = [k for k, v in (("question", question), ("answer", answer)) if v is None]
            raise SampleError("missing_field", f"missing {', '.join(missing)}")
        if yesno_only and _truthy(_psf_get(first, f, "yesno")) is False:
            raise SampleError("not_yesno", f"flagged not yes/no: {_text(question)!r}")
        ans = _yes_no_value(answer)
        image = _psf_image(first, f, root, index)
        for k in ("question", "answer"):
            values = {_text(_psf_get(r, f, k)) for r in grp}
            if len(values) > 1:
                raise SampleError("inconsistent_rows", f"{k} differs across rows: {sorted(values)}")
        if flat:
            paras = [(_psf_get(r, f, "paraphrase"), _psf_get(r, f, "phenomenon"), _psf_get(r, f, "polarity"))
                     for r in grp if _psf_get(r, f, "paraphrase") is not None]
        else:
            cell = _psf_get(first, f, "paraphrases")
            paras = _psf_paraphrase_list(cell) if cell is not None else []
        variants: list[tuple[str, int]] = [(_text(question), 1)]
        phenomena: list[str] = []
        for text, phen, pol in paras:
            if _is_missing(text) or not isinstance(text, str):
                raise SampleError("bad_paraphrase", f"paraphrase text {text!r}")
            variants.append((text.strip(), 1 if pol is None or _is_missing(pol) else _polarity(pol)))
            if phen is not None and not _is_missing(phen) and _text(phen) not in phenomena:
                phenomena.append(_text(phen))
        return YesNoRecord(
            record_id=rid,
            dataset=dataset,
            modality="xray",
            image_path=image,
            question=_text(question),
            answer=ans,
            variants=tuple(variants),
            finding=";".join(phenomena),
        )

    def source(rid: str, e: Mapping[str, Any]) -> RecordSource:
        return RecordSource(dataset=dataset, modality="xray",
                            image_path=_psf_image(e["rows"][0], f, root, index, check=False))

    return _collect(entries, build, source)


def looks_like_psf_med(path: PathLike) -> bool:
    """True when a yes/no file is in the PSF-Med release's shape rather than our
    ``{id, image_path, question, answer, paraphrases: [{text, polarity}]}`` schema: a parquet
    file, a JSON list, or a first record / CSV header with PSF-Med columns (question id, original
    question, per-row paraphrase, phenomenon, is_yesno, MIMIC ids) and no ``polarity``."""
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        return True
    if p.suffix.lower() == ".csv":
        with p.open(newline="", encoding="utf-8-sig") as fh:
            header = set(next(csv.reader(fh), []))
        return "polarity" not in header and bool(header & _PSF_MARKERS)
    text = p.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return True
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        e = json.loads(first)
    except json.JSONDecodeError:
        return False
    if not isinstance(e, dict):
        return False
    paras = e.get("paraphrases")
    ours = isinstance(paras, list) and all(isinstance(x, Mapping) and "polarity" in x for x in paras)
    return not ours and bool(set(e) & _PSF_MARKERS or (isinstance(paras, list) and paras
                                                         and all(isinstance(x, str) for x in paras)))
