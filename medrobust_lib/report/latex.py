"""LaTeX (booktabs) rendering of a :class:`~medrobust_lib.report.table.ReportTable`.

Tables never use ``\\resizebox`` (shrunken text is unreadable): every table is set in
``\\footnotesize`` with ``\\tabcolsep`` of 4 pt, or ``\\scriptsize`` with 3 pt when that is needed to
fit (:data:`SIZES`, :func:`layout`); the width is estimated from the longest cells
(:func:`estimated_width_in`). A table that fits one column (:data:`ONE_COLUMN_IN`) is a ``table``,
a wider one a ``table*`` spanning both columns (:data:`TWO_COLUMN_IN`); the report's builders keep
their tables under that (long format, not 50 columns). Tables longer than :data:`LONG_ROWS` rows
use ``longtable`` (one-column layouts; in a two-column paper put them in a one-column appendix).
Greyed rows (floor effects) are ``\\textcolor{gray}`` (``xcolor``). Needs ``\\usepackage{booktabs}``;
the first line of each file names every package it uses. Every data row is one line ending in
``\\\\``; a table with :attr:`~medrobust_lib.report.table.ReportTable.group_by` columns shows them as an
italic ``\\multicolumn`` heading line above each group instead of as columns.
"""

from __future__ import annotations

import re
from dataclasses import replace

from medrobust_lib.report.table import ReportTable, display_rows, fmt_cell, numeric_alignment

LONG_ROWS = 40
ONE_COLUMN_IN = 3.4
"""Widest table (inches) set in one column of a two-column page (3.5 in minus a margin)."""
TWO_COLUMN_IN = 7.0
"""Widest table (inches) set across both columns (7.2 in minus a margin)."""
SIZES: tuple[tuple[str, float, float], ...] = (("footnotesize", 4.0, 4.0), ("scriptsize", 3.5, 3.0))
"""Type sizes tried in order: (LaTeX size, average character width in pt, ``\\tabcolsep`` in pt);
the first whose estimated width fits both columns is used (8 pt and 7 pt type, both legible)."""

_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
    ">": r"\textgreater{}", "Δ": r"$\Delta$", "–": "--", "≥": r"$\geq$", "≤": r"$\leq$", "±": r"$\pm$",
}
_SPECIAL_RE = re.compile("|".join(re.escape(k) for k in _SPECIAL))


def escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``_`` -> ``\\_``, ``%`` -> ``\\%``, ...;
    ``Δ`` -> ``$\\Delta$``, the missing-value dash -> ``--``)."""
    return _SPECIAL_RE.sub(lambda m: _SPECIAL[m.group(0)], text)


def label(name: str) -> str:
    """The ``\\label`` of a table: ``tab:medrobust-<name>`` with ``_`` as ``-``."""
    return "tab:medrobust-" + re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def estimated_width_in(table: ReportTable, char_pt: float = SIZES[0][1], tabcolsep_pt: float = SIZES[0][2]) -> float:
    """Estimated printed width in inches: per column the longest of header and cells (in
    characters, LaTeX escapes not counted) x ``char_pt`` plus 2 x ``tabcolsep_pt``; columns shown as
    group headings (:func:`body_table`) are not counted."""
    table = body_table(table)
    rows = display_rows(table)
    total = 0.0
    for j, h in enumerate(table.headers):
        longest = max([len(h), *(len(r[j]) for r in rows)])
        total += (longest * char_pt + 2 * tabcolsep_pt) / 72
    return total


def layout(table: ReportTable) -> tuple[str, float, float]:
    """(LaTeX size, ``\\tabcolsep`` in pt, estimated width in inches): the first of :data:`SIZES`
    that fits :data:`TWO_COLUMN_IN` (else the smallest)."""
    for size, char_pt, sep in SIZES:
        width = estimated_width_in(table, char_pt, sep)
        if width <= TWO_COLUMN_IN:
            return size, sep, width
    return size, sep, width


def body_table(table: ReportTable) -> ReportTable:
    """``table`` without the columns that :attr:`ReportTable.group_by` turns into heading rows."""
    if not table.group_by:
        return table
    return replace(table, columns=tuple(c for c in table.columns if c.key not in table.group_by))


def group_headings(table: ReportTable) -> list[str | None]:
    """Per ``data`` row: the heading (the grouped columns' ``header: value`` pairs joined by
    ``, ``) when the row starts a new group, else None. All None without ``group_by``."""
    if not table.group_by:
        return [None] * len(table.data)
    cols = [c for c in table.columns if c.key in table.group_by]
    out: list[str | None] = []
    last: str | None = None
    for r in table.data.to_dict("records"):
        heading = ", ".join(f"{c.header}: {fmt_cell(r, c)}" for c in cols)
        out.append(heading if heading != last else None)
        last = heading
    return out


def _cell(text: str, grey: bool) -> str:
    return f"\\textcolor{{gray}}{{{text}}}" if grey and text else text


def to_latex(table: ReportTable) -> str:
    """A complete ``table`` / ``table*`` (or ``longtable``) environment with caption, label,
    ``\\toprule``, header, ``\\midrule``, one line per row and ``\\bottomrule``, in
    ``\\footnotesize``; the note becomes a footnote-size paragraph under the tabular (in a
    ``longtable``: appended to the caption)."""
    headings = group_headings(table)
    table = body_table(table)
    spec = "".join("r" if num else "l" for num in numeric_alignment(table))
    header = " & ".join(escape(h) for h in table.headers) + r" \\"
    greys = table.greyed()
    body: list[str] = []
    for row, g, heading in zip(display_rows(table), greys, headings, strict=True):
        if heading is not None:
            rule = ["\\addlinespace"] if body else []
            body += [*rule, f"\\multicolumn{{{len(table.columns)}}}{{l}}{{\\textit{{{escape(heading)}}}}} \\\\"]
        body.append(" & ".join(_cell(escape(c), g) for c in row) + r" \\")
    caption = escape(table.title)
    note = escape(table.note)
    packages = "booktabs" + (",xcolor" if any(greys) else "")
    size_name, sep, width = layout(table)
    size = [f"\\{size_name}", f"\\setlength{{\\tabcolsep}}{{{sep:g}pt}}"]
    if len(body) > LONG_ROWS:
        full = f"{caption}. {note}" if note else caption
        lines = [
            f"% requires \\usepackage{{{packages},longtable}}; about {width:.1f} in wide",
            "\\begingroup", *size,
            f"\\begin{{longtable}}{{{spec}}}",
            f"\\caption{{{full}}}\\label{{{label(table.name)}}} \\\\",
            "\\toprule", header, "\\midrule", "\\endfirsthead",
            "\\toprule", header, "\\midrule", "\\endhead",
            "\\bottomrule", "\\endfoot",
            *body,
            "\\end{longtable}", "\\endgroup",
        ]
        return "\n".join(lines) + "\n"
    env = "table" if width <= ONE_COLUMN_IN else "table*"
    lines = [
        f"% requires \\usepackage{{{packages}}}; about {width:.1f} in wide "
        f"({'one column' if env == 'table' else 'both columns'})",
        f"\\begin{{{env}}}[t]", "\\centering", *size, f"\\caption{{{caption}}}", f"\\label{{{label(table.name)}}}",
        f"\\begin{{tabular}}{{{spec}}}", "\\toprule", header, "\\midrule", *body, "\\bottomrule", "\\end{tabular}",
    ]
    if note:
        lines += ["\\par\\smallskip", f"{{\\footnotesize {note}\\par}}"]
    lines.append(f"\\end{{{env}}}")
    return "\n".join(lines) + "\n"
