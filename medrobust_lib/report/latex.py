"""LaTeX (booktabs) rendering of a :class:`~medrobust_lib.report.table.ReportTable`.

Needs ``\\usepackage{booktabs}``; tables wider than :data:`WIDE_COLUMNS` columns are wrapped in
``\\resizebox{\\linewidth}{!}{...}`` (``graphicx``) and tables longer than :data:`LONG_ROWS` rows use
``longtable`` (``longtable`` package) so they can break across pages. Every data row is one line
ending in ``\\\\``.
"""

from __future__ import annotations

import re

from medrobust_lib.report.table import ReportTable, display_rows, numeric_alignment

WIDE_COLUMNS = 12
LONG_ROWS = 40

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


def to_latex(table: ReportTable) -> str:
    """A complete ``table`` (or ``longtable``) environment with caption, label, ``\\toprule``,
    header, ``\\midrule``, one line per row and ``\\bottomrule``; the note becomes a footnote-size
    paragraph under the tabular (in a ``longtable``: appended to the caption)."""
    spec = "".join("r" if num else "l" for num in numeric_alignment(table))
    header = " & ".join(escape(h) for h in table.headers) + r" \\"
    body = [" & ".join(escape(c) for c in row) + r" \\" for row in display_rows(table)]
    caption = escape(table.title)
    note = escape(table.note)
    if len(body) > LONG_ROWS:
        full = f"{caption}. {note}" if note else caption
        lines = [
            "% requires \\usepackage{booktabs,longtable}",
            f"\\begin{{longtable}}{{{spec}}}",
            f"\\caption{{{full}}}\\label{{{label(table.name)}}} \\\\",
            "\\toprule", header, "\\midrule", "\\endfirsthead",
            "\\toprule", header, "\\midrule", "\\endhead",
            "\\bottomrule", "\\endfoot",
            *body,
            "\\end{longtable}",
        ]
        return "\n".join(lines) + "\n"
    tabular = [f"\\begin{{tabular}}{{{spec}}}", "\\toprule", header, "\\midrule", *body, "\\bottomrule",
               "\\end{tabular}"]
    wide = len(table.columns) > WIDE_COLUMNS
    if wide:
        tabular = ["\\resizebox{\\linewidth}{!}{%", *tabular, "}"]
    lines = [
        "% requires \\usepackage{booktabs}" + (" and \\usepackage{graphicx}" if wide else ""),
        "\\begin{table}[t]", "\\centering", f"\\caption{{{caption}}}", f"\\label{{{label(table.name)}}}",
        *tabular,
    ]
    if note:
        lines += ["\\par\\smallskip", f"{{\\footnotesize {note}\\par}}"]
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"
