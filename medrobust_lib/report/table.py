"""A paper table: raw values (written as CSV) plus display columns (Markdown, LaTeX, HTML).

A :class:`ReportTable` keeps the numbers at full precision in ``data`` (one column per value, a
confidence interval as separate ``*_ci_low`` / ``*_ci_high`` columns); the renderers format them
through :func:`display_rows`: floats with :data:`DIGITS` decimals, intervals as
``0.123 [0.100, 0.150]``, p/q-values with 3 decimals or ``<0.001``, missing values as an en dash.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

DIGITS = 3
"""Decimals of every float shown in Markdown, LaTeX and HTML (CSV keeps full precision)."""
MISSING = "–"
"""How a missing value (NULL / NaN) is shown."""
FLOOR_MARK = "†"
"""Markdown marker of a greyed-out (floor-effect) row, after its first cell."""

Kind = Literal["text", "int", "float", "ci", "pvalue"]


@dataclass(frozen=True)
class Column:
    """One displayed column: ``header`` shown to the reader, ``key`` the ``data`` column holding the
    value; ``kind`` picks the format (``ci`` also reads ``low`` and ``high``)."""

    header: str
    key: str
    kind: Kind = "text"
    low: str | None = None
    high: str | None = None


@dataclass
class ReportTable:
    """``name``: file stem (``<name>.csv/.md/.tex``) and LaTeX label suffix; ``title``: caption;
    ``data``: the CSV contents; ``columns``: what Markdown/LaTeX/HTML show; ``note``: a sentence
    printed under the table (definitions, pooling)."""

    name: str
    title: str
    data: pd.DataFrame
    columns: tuple[Column, ...]
    note: str = ""
    grey_key: str | None = None
    """A boolean ``data`` column: rows where it is true (a floor effect) are greyed out (LaTeX
    ``\\textcolor{gray}``, HTML class ``floor``) and marked :data:`FLOOR_MARK` in Markdown."""
    group_by: tuple[str, ...] = ()
    """Display columns (by ``key``) that LaTeX shows as a heading row above each run of rows sharing
    their values instead of as columns, so a long table of long names fits the page; ``data`` must be
    sorted by them. Markdown, CSV and HTML keep them as columns."""

    @property
    def headers(self) -> list[str]:
        return [c.header for c in self.columns]

    def greyed(self) -> list[bool]:
        """Per ``data`` row: whether it is greyed out."""
        if self.grey_key is None or self.grey_key not in self.data.columns:
            return [False] * len(self.data)
        return [bool(v) if not _missing(v) else False for v in self.data[self.grey_key].tolist()]


def _missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    try:
        return bool(isinstance(v, float) and math.isnan(v))
    except TypeError:
        return False


def fmt_float(v: Any, digits: int = DIGITS) -> str:
    """``v`` with ``digits`` decimals (``-0.000`` shown as ``0.000``), or :data:`MISSING`."""
    if _missing(v):
        return MISSING
    s = f"{float(v):.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0.0 else s


def fmt_pvalue(v: Any) -> str:
    """A p- or q-value: 3 decimals, ``<0.001`` below that, or :data:`MISSING`."""
    if _missing(v):
        return MISSING
    return "<0.001" if float(v) < 0.001 else f"{float(v):.3f}"


def fmt_ci(est: Any, low: Any, high: Any) -> str:
    """``0.123 [0.100, 0.150]``; just the estimate when the bounds are missing."""
    if _missing(est):
        return MISSING
    if _missing(low) or _missing(high):
        return fmt_float(est)
    return f"{fmt_float(est)} [{fmt_float(low)}, {fmt_float(high)}]"


def fmt_cell(row: Mapping[Hashable, Any], col: Column) -> str:
    """The display string of ``col`` in one ``data`` row (a dict)."""
    v: Any = row.get(col.key)
    if col.kind == "ci":
        return fmt_ci(v, row.get(col.low or ""), row.get(col.high or ""))
    if col.kind == "float":
        return fmt_float(v)
    if col.kind == "pvalue":
        return fmt_pvalue(v)
    if _missing(v):
        return MISSING
    if col.kind == "int":
        return str(int(v))
    return str(v)


def display_rows(table: ReportTable) -> list[list[str]]:
    """Display strings, one list per ``data`` row, in ``columns`` order."""
    return [[fmt_cell(r, c) for c in table.columns] for r in table.data.to_dict("records")]


def numeric_alignment(table: ReportTable) -> list[bool]:
    """Per display column: True where it holds numbers (right-aligned)."""
    return [c.kind != "text" for c in table.columns]


def to_markdown(table: ReportTable) -> str:
    """A GitHub pipe table with the title as a bold first line and the note after it."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    align = ["---:" if num else "---" for num in numeric_alignment(table)]
    lines = [f"**{esc(table.title)}**", "",
             "| " + " | ".join(esc(h) for h in table.headers) + " |",
             "|" + "|".join(align) + "|"]
    for row, grey in zip(display_rows(table), table.greyed(), strict=True):
        cells = [esc(c) for c in row]
        if grey and cells:
            cells[0] += f" {FLOOR_MARK}"
        lines.append("| " + " | ".join(cells) + " |")
    if table.note:
        lines += ["", esc(table.note)]
    return "\n".join(lines) + "\n"


def to_csv(table: ReportTable, path: Path) -> None:
    """``data`` as UTF-8 CSV, full float precision, empty cells for missing values."""
    table.data.to_csv(path, index=False, encoding="utf-8")
