"""Write stored predicted masks as PNG files a researcher can open (``medrobust export-masks``).

Input: the ``segmentation_results`` rows of a results folder (optionally filtered) and the suite's
mask store (:mod:`medrobust_lib.store.pred_masks`, addressed by the rows' ``pred_mask_sha256``).
Output, in one folder: one PNG per row that has a stored mask, 8-bit grayscale 0 (background) /
255 (foreground), named ``<model>__<dataset>__<sample_id>__<perturbation>__L<level>.png`` (every
part reduced to ``[A-Za-z0-9._-]``, other characters replaced by ``_``; a name that would repeat
gets ``__2``, ``__3``, ...; an over-long name is shortened and given a short hash), and
``index.csv`` with every selected row: its keys, IoU, Dice, the mask address, the file name (empty
when the row has no stored mask) and, if the stored mask could not be read, why.

The output folder must be new, empty, or one this function wrote before (it holds the marker file
:data:`MARKER`); then the files of the previous export listed in its ``index.csv`` are replaced.
Any other non-empty folder is refused, so an export never mixes with or overwrites other files.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pandas as pd

from medrobust_lib.store import pred_masks, results

RESULTS_TABLE = "segmentation_results"
SHA_COLUMN = "pred_mask_sha256"
"""The ``segmentation_results`` column naming a row's stored mask (null: none stored)."""
MARKER = ".medrobust-export-masks"
"""File that marks a folder as written by :func:`export_masks`."""
INDEX = "index.csv"
INDEX_COLUMNS: tuple[str, ...] = ("file", "model", "checkpoint", "strategy", "dataset", "modality", "sample_id",
                                  "condition", "perturbation", "level", "status", "iou", "dice", SHA_COLUMN,
                                  "export_error")
"""Columns of ``index.csv`` (a column the table lacks is left empty)."""
FILTERS: tuple[str, ...] = ("model", "dataset", "condition", "perturbation", "level", "sample_id")
"""Columns :func:`export_masks` can filter on (equality)."""
MAX_NAME = 200
"""Longest file name written (file systems allow 255 bytes)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class ExportSummary:
    """What :func:`export_masks` did: ``n_rows`` selected rows, ``n_written`` PNG files,
    ``n_without_mask`` rows with no stored mask (null ``pred_mask_sha256``, or no such column),
    ``failed`` ``(row's file name, reason)`` for stored masks that are missing or corrupt, and the
    folder and index written."""

    out: Path
    index: Path
    n_rows: int = 0
    n_written: int = 0
    n_without_mask: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)

    def line(self) -> str:
        """One line for the command line."""
        text = (f"wrote {self.n_written} masks to {self.out} ({self.n_rows} rows selected, {self.n_without_mask} "
                f"without a stored mask")
        if self.failed:
            text += f", {len(self.failed)} stored masks missing or corrupt: see export_error in {self.index}"
        return text + ")"


def sanitize(part: object) -> str:
    """One file-name part: characters outside ``[A-Za-z0-9._-]`` become ``_`` (empty: ``_``)."""
    return _UNSAFE.sub("_", str(part)) or "_"


def _level(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return sanitize(v)
    return "na" if math.isnan(f) else (str(int(f)) if f.is_integer() else sanitize(f))


def mask_file_name(row: Mapping[str, Any]) -> str:
    """``<model>__<dataset>__<sample_id>__<perturbation>__L<level>.png`` of a result row, every part
    sanitised (:func:`sanitize`); names longer than :data:`MAX_NAME` are cut and end in a hash of
    the full name."""
    stem = "__".join([*(sanitize(row.get(k, "")) for k in ("model", "dataset", "sample_id", "perturbation")),
                      f"L{_level(row.get('level'))}"])
    if len(stem) + 4 > MAX_NAME:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:12]
        stem = f"{stem[: MAX_NAME - 4 - 14]}__{digest}"
    return stem + ".png"


def _previous_files(out: Path) -> list[Path]:
    """The files a previous export wrote into ``out`` (its index's PNG names, the index, the marker)."""
    names: list[str] = []
    try:
        with (out / INDEX).open(newline="", encoding="utf-8") as f:
            names = [r.get("file") or "" for r in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error):
        pass
    safe = [n for n in names if n and n.endswith(".png") and not _UNSAFE.search(n) and n not in (".", "..")]
    return [out / n for n in safe] + [out / INDEX]


def prepare_out(out: Path) -> None:
    """Create ``out`` (or accept it: new, empty, or written by a previous export, whose files are
    then removed). ValueError (one line) for any other non-empty folder, or a file at ``out``."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise ValueError(f"refusing to write into {out}: the folder is not empty and was not written by "
                             "export-masks (choose a new folder)")
        for p in _previous_files(out):
            if p.is_file() and not p.is_symlink():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by medrobust export-masks; the folder may be rewritten by it\n")


def select_rows(df: pd.DataFrame, filters: Mapping[str, object | None]) -> pd.DataFrame:
    """The rows of ``df`` equal to every given filter (``None``: not filtered), sorted by the file-name
    keys. ValueError naming the values present when nothing matches."""
    unknown = set(filters) - set(FILTERS)
    if unknown:
        raise ValueError(f"unknown filter(s) {sorted(unknown)}; valid: {', '.join(FILTERS)}")
    keep = pd.Series(True, index=df.index)
    for col, want in filters.items():
        if want is None:
            continue
        if col not in df.columns:
            raise ValueError(f"the {RESULTS_TABLE} table has no column {col!r}")
        if col == "level":
            vals = pd.to_numeric(df[col], errors="coerce")
            hit = vals == float(str(want))
        else:
            hit = df[col].astype(str) == str(want)
        if not bool((keep & hit).any()):
            present = sorted({str(v) for v in df.loc[keep, col].dropna().unique()})
            shown = ", ".join(present[:20]) + (", ..." if len(present) > 20 else "")
            raise ValueError(f"no {RESULTS_TABLE} rows with {col} = {want!r} (among the rows selected so far, "
                             f"{col} is one of: {shown or 'none'})")
        keep &= hit
    sel = df[keep]
    order = [c for c in ("model", "dataset", "sample_id", "condition", "perturbation", "level") if c in sel.columns]
    return sel.sort_values(order, kind="stable") if order else sel


def _png(mask: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", np.where(mask, 255, 0).astype(np.uint8), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        raise OSError("PNG encoding failed")
    return buf.tobytes()


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    try:
        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    return repr(float(v)) if isinstance(v, float | np.floating) else v


def export_masks(results_dir: Path, store_root: Path, out: Path,
                 filters: Mapping[str, object | None] | None = None) -> ExportSummary:
    """Write the stored masks of the ``segmentation_results`` rows under ``results_dir`` that match
    ``filters`` (see :data:`FILTERS`) into ``out`` (see the module docstring), reading masks from
    ``store_root``. ValueError when there is no table, nothing matches, or ``out`` is refused."""
    df = results.read_table(results_dir, RESULTS_TABLE)
    if df.empty:
        raise ValueError(f"no {RESULTS_TABLE} rows under {results_dir} (run the segmentation track first)")
    rows = select_rows(df, filters or {})
    prepare_out(out)
    summary = ExportSummary(out=out, index=out / INDEX, n_rows=len(rows))
    used: set[str] = {MARKER, INDEX}
    index_rows: list[dict[str, Any]] = []
    for record in rows.to_dict("records"):
        rec = {str(k): v for k, v in record.items()}
        sha = rec.get(SHA_COLUMN)
        entry = {c: _cell(rec.get(c)) for c in INDEX_COLUMNS}
        entry.update(file="", export_error="")
        if sha is None or not isinstance(sha, str) or sha == "":
            summary.n_without_mask += 1
            index_rows.append(entry)
            continue
        name = mask_file_name(rec)
        if name in used:
            base, k = name[:-4], 2
            while f"{base}__{k}.png" in used:
                k += 1
            name = f"{base}__{k}.png"
        try:
            mask = pred_masks.get(store_root, sha)
        except ValueError as exc:
            summary.failed.append((name, str(exc)))
            entry["export_error"] = str(exc)
            index_rows.append(entry)
            continue
        used.add(name)
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(_png(mask))
        os.replace(tmp, out / name)
        entry["file"] = name
        summary.n_written += 1
        index_rows.append(entry)
    tmp = out / f".{INDEX}.tmp"
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(INDEX_COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(index_rows)
    os.replace(tmp, out / INDEX)
    return summary
