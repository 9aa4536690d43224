"""Score segmentation masks made elsewhere against reference masks (``medrobust score segmentation``).

Two folders in (predictions, references), one :class:`FolderScore` out. Files are matched by stem
(the name without its extension; ``case_01.png`` matches ``case_01.npy``); only the folder's own
files count (no sub-folders, no hidden files). Readable kinds: PNG, JPEG, TIFF, BMP and ``.npy``;
any other file is ignored and listed.

How a file becomes a bool (H, W) mask, the same rules as the pipeline and the dataset readers:

- ``.npy`` float array: a probability map, foreground ``p > 0.5``
  (:func:`medrobust_lib.metrics.segmentation.binarize`); values outside [0, 1] or NaN are an error
  (logits are refused rather than silently misread). ``.npy`` integer array: a label map,
  foreground ``label > 0`` (the ``npy_single`` reader's rule). ``.npy`` bool: as it is. Arrays
  must be 2-D; pickles are refused.
- raster masks: :func:`medrobust_lib.data.readers.read_binary_mask` with the dataset readers'
  :class:`~medrobust_lib.data.readers.MaskOptions` (``mask_threshold`` as given, default null):
  a lossless integer mask (PNG, TIFF, BMP) is foreground where ``value > 0`` (every label), a JPEG
  where ``value > 127``; a number makes it ``value > mask_threshold`` on the 8-bit scale (x 257
  for 16-bit); colour masks use the maximum over channels. A 0/255 PNG (what ``medrobust
  export-masks`` writes) reads the same under every rule.

The summary counts the rule each file was read with (``rules``), so a surprising score can be
traced to how a mask was binarised.

IoU and Dice per pair come from :func:`~medrobust_lib.metrics.segmentation.iou` /
:func:`~medrobust_lib.metrics.segmentation.dice` with
:data:`~medrobust_lib.metrics.segmentation.EMPTY_GT_POLICY` (both empty: 1.0; foreground predicted
on an empty reference: 0.0). A pair that cannot be scored (unreadable file, size mismatch, two
files with one stem on a side) is an ``error`` row with the reason, never an exception; a stem
found on one side only is an ``unmatched_prediction`` / ``missing_prediction`` row. Means are over
the scored (``ok``) rows only.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from medrobust_lib.data.imageio import RASTER_EXTENSIONS, file_extension
from medrobust_lib.data.readers import MaskOptions, read_binary_mask
from medrobust_lib.data.readers_npy import open_npy
from medrobust_lib.data.sample import SampleError
from medrobust_lib.metrics.segmentation import EMPTY_GT_POLICY, THRESHOLD, binarize, dice, iou

MASK_EXTENSIONS: tuple[str, ...] = (*RASTER_EXTENSIONS, ".npy")
"""File kinds read as masks (lower-case; matched case-insensitively)."""
MAX_LISTED = 20
"""How many unmatched, ignored and error entries the summary lists (the CSV has them all)."""
CSV_COLUMNS: tuple[str, ...] = ("stem", "status", "iou", "dice", "pred_file", "ref_file", "pred_pixels",
                                "ref_pixels", "height", "width", "error")
"""Columns of the per-file CSV (:func:`write_csv`)."""
STATUSES: tuple[str, ...] = ("ok", "error", "unmatched_prediction", "missing_prediction")
"""Row statuses: scored; not scorable (see ``error``); a prediction without a reference (ignored);
a reference without a prediction (not scored, not counted in the means)."""


@dataclass(frozen=True)
class MaskScore:
    """One stem's outcome. ``iou`` / ``dice`` in [0, 1] (None unless ``status`` is ``ok``);
    ``pred_pixels`` / ``ref_pixels``: foreground pixel counts; ``height`` / ``width``: the mask size
    (of the reference when the sizes differ); ``pred_file`` / ``ref_file``: file names in their
    folders ("" when absent); ``error``: why an ``error`` row was not scored."""

    stem: str
    status: str
    iou: float | None = None
    dice: float | None = None
    pred_file: str = ""
    ref_file: str = ""
    pred_pixels: int | None = None
    ref_pixels: int | None = None
    height: int | None = None
    width: int | None = None
    error: str = ""


@dataclass
class FolderScore:
    """Every stem's :class:`MaskScore` (sorted by stem), the files ignored (not a mask kind), and
    how many files each binarisation rule read (``rules``: rule description -> count)."""

    rows: list[MaskScore] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)

    def of(self, status: str) -> list[MaskScore]:
        return [r for r in self.rows if r.status == status]

    def summary(self) -> dict[str, Any]:
        """The JSON summary: ``task``, ``n`` (scored pairs), ``mean_iou``, ``mean_dice`` (None when
        n is 0), ``n_empty_reference`` (scored pairs whose reference is empty), ``n_errors`` with
        the first :data:`MAX_LISTED` in ``errors`` (``{"stem", "error"}``),
        ``n_unmatched_predictions`` / ``n_missing_predictions`` with ``unmatched_predictions`` /
        ``missing_predictions`` (file names), ``n_ignored`` / ``ignored``, ``empty_gt_policy`` and
        ``rules`` (how many files each binarisation rule read)."""
        ok = self.of("ok")
        errors = self.of("error")
        unmatched = self.of("unmatched_prediction")
        missing = self.of("missing_prediction")

        def mean(xs: Sequence[float | None]) -> float | None:
            vals = [float(x) for x in xs if x is not None]
            return float(np.mean(vals)) if vals else None

        return {
            "task": "segmentation",
            "n": len(ok),
            "mean_iou": mean([r.iou for r in ok]),
            "mean_dice": mean([r.dice for r in ok]),
            "n_empty_reference": sum(1 for r in ok if r.ref_pixels == 0),
            "n_errors": len(errors),
            "errors": [{"stem": r.stem, "error": r.error} for r in errors[:MAX_LISTED]],
            "n_unmatched_predictions": len(unmatched),
            "unmatched_predictions": [r.pred_file for r in unmatched[:MAX_LISTED]],
            "n_missing_predictions": len(missing),
            "missing_predictions": [r.ref_file for r in missing[:MAX_LISTED]],
            "n_ignored": len(self.ignored),
            "ignored": self.ignored[:MAX_LISTED],
            "empty_gt_policy": EMPTY_GT_POLICY,
            "rules": dict(sorted(self.rules.items())),
        }

    def summary_line(self) -> str:
        """One line: ``n=.. mean_iou=.. mean_dice=.. unmatched_predictions=.. missing_predictions=.. errors=.. ignored=..``."""
        s = self.summary()

        def f(x: float | None) -> str:
            return "nan" if x is None else f"{x:.4f}"

        return (f"n={s['n']} mean_iou={f(s['mean_iou'])} mean_dice={f(s['mean_dice'])} "
                f"unmatched_predictions={s['n_unmatched_predictions']} missing_predictions={s['n_missing_predictions']} "
                f"errors={s['n_errors']} ignored={s['n_ignored']}")


def stem_of(name: str) -> str:
    """A file name without its (case-insensitive) mask extension: ``a.b.PNG`` -> ``a.b``."""
    ext = file_extension(name)
    return name[: len(name) - len(ext)] if ext else name


def _listing(folder: Path, what: str) -> tuple[dict[str, list[str]], list[str]]:
    """``{stem: [file names]}`` of the mask files directly in ``folder`` and the names of the other
    (non-hidden) files. FileNotFoundError / NotADirectoryError name the folder."""
    if not folder.exists():
        raise FileNotFoundError(f"{what} folder not found: {folder}")
    if not folder.is_dir():
        raise NotADirectoryError(f"{what} is not a folder: {folder}")
    by_stem: dict[str, list[str]] = {}
    ignored: list[str] = []
    for p in sorted(folder.iterdir(), key=lambda q: q.name):
        if p.name.startswith(".") or p.is_dir():
            continue
        if file_extension(p.name) in MASK_EXTENSIONS:
            by_stem.setdefault(stem_of(p.name), []).append(p.name)
        else:
            ignored.append(f"{what}/{p.name}")
    return by_stem, ignored


def _from_npy(path: Path) -> tuple[npt.NDArray[np.bool_], str]:
    arr = np.asarray(open_npy(path))
    if arr.ndim != 2:
        raise ValueError(f"{path.name}: expected a 2-D (H, W) array, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return np.array(arr, dtype=bool), ".npy bool: as stored"
    if np.issubdtype(arr.dtype, np.integer):
        return np.asarray(arr > 0), ".npy integer: label > 0"
    if np.issubdtype(arr.dtype, np.floating):
        a = np.asarray(arr, np.float64)
        if not np.isfinite(a).all() or (a.size and (a.min() < 0.0 or a.max() > 1.0)):
            raise ValueError(f"{path.name}: float values outside [0, 1] or not finite: not a probability map "
                             "(apply a sigmoid to logits first)")
        return binarize(a), f".npy float: probability > {THRESHOLD:g}"
    raise ValueError(f"{path.name}: unsupported array dtype {arr.dtype} (bool, integer labels or float "
                     "probabilities)")


def read_mask(path: Path, mask_threshold: float | None = None) -> tuple[npt.NDArray[np.bool_], str]:
    """A mask file as bool (H, W) and the rule it was read with (see the module docstring;
    ``mask_threshold``: raster masks only, as the datasets' option). Raises ValueError or
    :class:`~medrobust_lib.data.sample.SampleError` (missing, unreadable, truncated, too large)."""
    if file_extension(path) == ".npy":
        return _from_npy(path)
    mask, rule = read_binary_mask(path, MaskOptions(mask_threshold=mask_threshold))
    return np.asarray(mask, dtype=bool), f"{file_extension(path)}: {rule}"


def _reason(exc: BaseException) -> str:
    text = str(exc) if not isinstance(exc, OSError) or not exc.strerror else f"{exc.strerror}"
    return "; ".join(ln.strip() for ln in text.splitlines() if ln.strip()) or type(exc).__name__


def _load(folder: Path, name: str, mask_threshold: float | None,
          rules: dict[str, int]) -> tuple[npt.NDArray[np.bool_] | None, str]:
    try:
        mask, rule = read_mask(folder / name, mask_threshold)
    except (SampleError, ValueError, OSError) as exc:
        return None, f"{name}: {_reason(exc)}"
    except Exception as exc:  # a decoder's own error type (cv2.error, ...): a row, never a crash
        return None, f"{name}: {type(exc).__name__}: {_reason(exc)}"
    rules[rule] = rules.get(rule, 0) + 1
    return mask, ""


def _score_pair(stem: str, pred_dir: Path, ref_dir: Path, pred_names: list[str], ref_names: list[str],
                mask_threshold: float | None, rules: dict[str, int]) -> MaskScore:
    pf, rf = ", ".join(pred_names), ", ".join(ref_names)
    for side, names in (("predictions", pred_names), ("references", ref_names)):
        if len(names) > 1:
            return MaskScore(stem, "error", pred_file=pf, ref_file=rf,
                             error=f"several files with stem {stem!r} in {side}: {', '.join(names)}")
    pred, perr = _load(pred_dir, pred_names[0], mask_threshold, rules)
    ref, rerr = _load(ref_dir, ref_names[0], mask_threshold, rules)
    if pred is None or ref is None:
        return MaskScore(stem, "error", pred_file=pf, ref_file=rf,
                         error="; ".join(e for e in (f"prediction {perr}" if perr else "",
                                                     f"reference {rerr}" if rerr else "") if e))
    base = MaskScore(stem, "ok", pred_file=pf, ref_file=rf, pred_pixels=int(np.count_nonzero(pred)),
                     ref_pixels=int(np.count_nonzero(ref)), height=int(ref.shape[0]), width=int(ref.shape[1]))
    if pred.shape != ref.shape:
        return replace(base, status="error", error=f"size mismatch: prediction {tuple(pred.shape)} vs reference "
                                                   f"{tuple(ref.shape)} (H, W)")
    return replace(base, iou=iou(pred, ref), dice=dice(pred, ref))


def score_folders(pred_dir: Path, ref_dir: Path, *, mask_threshold: float | None = None) -> FolderScore:
    """Score every prediction file in ``pred_dir`` against the reference file of the same stem in
    ``ref_dir`` (see the module docstring). ``mask_threshold``: raster masks' foreground threshold
    (the datasets' option ``mask_threshold``, 8-bit scale; None: their automatic rule).
    FileNotFoundError / NotADirectoryError when a folder is missing; ValueError for a threshold
    outside [0, 255); every problem with a file is a row of the result."""
    if mask_threshold is not None and not 0.0 <= mask_threshold < 255.0:
        raise ValueError(f"mask_threshold must be in [0, 255), got {mask_threshold}")
    pred_dir, ref_dir = Path(pred_dir), Path(ref_dir)
    preds, ign_p = _listing(pred_dir, "predictions")
    refs, ign_r = _listing(ref_dir, "references")
    out = FolderScore(ignored=ign_p + ign_r)
    for stem in sorted(set(preds) | set(refs)):
        p, r = preds.get(stem), refs.get(stem)
        if r is None:
            out.rows.extend(MaskScore(stem, "unmatched_prediction", pred_file=n) for n in p or [])
        elif p is None:
            out.rows.extend(MaskScore(stem, "missing_prediction", ref_file=n) for n in r)
        else:
            out.rows.append(_score_pair(stem, pred_dir, ref_dir, p, r, mask_threshold, out.rules))
    return out


def write_csv(result: FolderScore, dest: Path | TextIO) -> int:
    """Write one row per :class:`MaskScore` (columns :data:`CSV_COLUMNS`; floats with full
    precision, absent values empty) to a file path or an open text stream; returns the rows."""
    def cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return repr(v) if isinstance(v, float) else v

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in result.rows:
        w.writerow({k: cell(v) for k, v in asdict(r).items()})
    if isinstance(dest, Path):
        dest.write_text(buf.getvalue(), encoding="utf-8")
    else:
        dest.write(buf.getvalue())
    return len(result.rows)
